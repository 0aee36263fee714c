"""How much of a task's verdict the host judges: the record validation writes (``tasks/calibration.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class HostJudged(BaseModel):
    """What validation learned of a task's blinded assertions (``testrun/blinding.py``): which stay in process,
    each parametrized graded test's row, and how much of the verdict the host judges (expected values that
    never enter the sandbox) rather than the test process."""

    in_process: list[str] = Field(default_factory=list)  # slot keys the gold patch's runs showed the host can't judge
    param_rows: dict[str, int] = Field(default_factory=dict)  # graded parametrized test id -> its row
    # slot key -> the expected value the gold patch's runs computed for a slot whose expected side is code
    recorded: dict[str, Any] = Field(default_factory=dict)
    fail_to_pass: int = 0
    fail_to_pass_host_judged: int = 0  # every assertion of the test judged on the host
    # at least one assertion of the test judged on the host with an expected value a forger cannot guess: forging
    # the whole run's report then still needs that value
    fail_to_pass_anchored: int = 0
    unanchored: dict[str, str] = Field(default_factory=dict)  # fail-to-pass test id -> why it has no anchor
    pass_to_pass: int = 0
    pass_to_pass_host_judged: int = 0
    assertions: int = 0  # assertions in the graded tests' bodies
    assertions_host_judged: int = 0
    weak: int = 0  # host-judged assertions whose expected value is guessable (truthiness, None, a bool)

    @property
    def fail_to_pass_share(self) -> float:
        return self.fail_to_pass_host_judged / self.fail_to_pass if self.fail_to_pass else 0.0

    @property
    def assertion_share(self) -> float:
        return self.assertions_host_judged / self.assertions if self.assertions else 0.0
