"""What the quality gate found about a task: the record a ``Task`` carries (``Task.quality``).

A leaf module (pydantic only), so the task schema can hold the record without importing the
gate: ``quality`` and ``verify`` depend on ``tasks``, never the reverse.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from trialforge.tasks.host_judged import HostJudged

Gate = Literal["weak_tests", "leaks", "shortcuts", "underspecified"]
GATES: tuple[Gate, ...] = ("weak_tests", "leaks", "shortcuts", "underspecified")
LeakKind = Literal["added_line", "new_identifier", "expected_value"]
LEAK_KINDS: tuple[LeakKind, ...] = ("added_line", "new_identifier", "expected_value")


class Attempt(BaseModel):
    """One candidate diff (a wrong fix, a shortcut, the gold control) and what the real verifier gave it."""

    kind: str  # partial_revert | a mutation family | const_return | a shortcut strategy | gold
    note: str  # what exactly was changed, for a person reading the record
    diff: str = ""
    reward: float | None = None  # None: not graded, or the verifier could not decide
    status: str = "not_applicable"  # the verdict's status (ok | verifier_error | env_error) or not_applicable
    reason: str = ""
    duration_s: float = 0.0

    @property
    def scores(self) -> bool:
        return self.status == "ok" and self.reward == 1.0

    @property
    def undecided(self) -> bool:
        return self.status not in ("ok", "not_applicable")


class LeakSpan(BaseModel):
    """Where the statement (or hints) gives part of the answer away: ``text == <field>[start:end]``."""

    field: Literal["problem_statement", "hints"]
    kind: LeakKind
    start: int
    end: int
    text: str
    source: str  # what leaked: the gold patch's line, the new identifier or the expected literal


class QualityRecord(BaseModel):
    """Everything the quality gate found about one task, and its verdict."""

    task_id: str
    gates_run: list[Gate] = Field(default_factory=list)
    # gate -> why it did not run although asked for: the task had already failed an enforced gate
    skipped: dict[Gate, str] = Field(default_factory=dict)
    control: Attempt | None = None  # the gold patch through the same verifier: the audits mean nothing without it
    weak: bool = False
    mutants: list[Attempt] = Field(default_factory=list)  # every wrong fix graded
    leaks: list[LeakSpan] = Field(default_factory=list)
    # what the fail-to-pass tests require that the statement never states (``StatementRecord``): types, literals
    underspecified: list[str] = Field(default_factory=list)
    shortcuts: list[Attempt] = Field(default_factory=list)  # one per strategy of the panel
    verifier_version: str = ""
    verifier_runs: int = 0
    candidate_timeout_s: float | None = None  # the test timeout wrong fixes and shortcuts ran under
    verdict: Literal["pass", "fail"] = "pass"
    failed_gates: list[str] = Field(default_factory=list)  # gates whose check failed, enforced or not; audit_error
    reasons: list[str] = Field(default_factory=list)
    duration_s: float = 0.0
    host_judged: HostJudged | None = None  # the task's validation record: how much of its verdict the host judges

    @property
    def mutants_tried(self) -> int:
        return len(self.mutants)

    @property
    def passing_mutants(self) -> list[Attempt]:
        return [m for m in self.mutants if m.scores]

    @property
    def solving_shortcuts(self) -> list[Attempt]:
        return [s for s in self.shortcuts if s.scores]
