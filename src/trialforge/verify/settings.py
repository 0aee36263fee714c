"""The verifier's settings (``verify`` in params.yaml): how long a graded run may take. ``Params`` embeds
``VerifyConfig`` as is; the grader (``verify.grader``) holds it as its ``timing``."""

from __future__ import annotations

from pydantic import Field

from trialforge.section import Section


class VerifyConfig(Section):
    """How long a graded run may take (``verify`` in params.yaml).

    A task's graded run gets timeout_factor x its slowest validated suite run, at least min_timeout_s: an edit
    that loops forever fails either way, and waiting the full timeout only burns sandbox time. Its test process
    gets timeout_factor x that run in CPU-seconds, at least min_cpu_s: CPU time does not stretch with the
    machine's load as wall time does, so this floor can be far lower than min_timeout_s.
    """

    timeout_factor: float = Field(10.0, ge=1.0)
    min_timeout_s: float = Field(20.0, gt=0)
    min_cpu_s: float = Field(3.0, gt=0)
