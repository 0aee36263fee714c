"""The quality gate's settings (``quality`` in params.yaml). ``Params`` embeds ``QualityConfig`` as is; the gate
(``quality.gate``) reads it directly."""

from __future__ import annotations

from pydantic import Field

from trialforge.section import Section
from trialforge.tasks.quality_record import Gate, LeakKind


class QualityConfig(Section):
    # audits that run and are recorded (underspecified reads the statement record validation wrote: no verifier run)
    gates: list[Gate] = ["weak_tests", "leaks", "shortcuts", "underspecified"]
    # of the gates that run, those whose failure drops the task (to keep weak tasks, with their record saying so,
    # leave weak_tests out). underspecified is reported, not enforced: its check reads test source for what a
    # statement must name, and a heuristic that misses what an agent can derive should not cost tasks unasked
    enforce: list[Gate] = ["weak_tests", "leaks", "shortcuts"]
    max_mutants: int = Field(8, ge=0)  # wrong fixes graded per task in the weak-test audit (one verifier run each)
    # What counts as a leak: the fix's code or a name it introduces. An expected value in a bug report is its
    # specification more often than its answer: opt in with "expected_value".
    leak_kinds: list[LeakKind] = ["added_line", "new_identifier"]
    # Wrong fixes and shortcuts get this many times the gold control's grading time for their tests (at least
    # min_timeout_s, at most the verifier's own timeout): one that hangs has failed, whenever it is stopped.
    timeout_factor: float = Field(10.0, ge=1)
    min_timeout_s: float = Field(20.0, gt=0)
    # Least share of a task's fail-to-pass tests whose every assertion the host judges (docs/verification.md);
    # a task below it is dropped as host_judged. 0: report the share only.
    min_host_judged: float = Field(0.0, ge=0, le=1)
    # A task one of whose fail-to-pass tests has no assertion judged on the host with a value no one could guess is
    # dropped as host_judged: that test's verdict would be in process, where a forged report needs no right value.
    require_host_judged: bool = True
