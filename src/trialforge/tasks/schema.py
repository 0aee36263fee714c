"""The task record: one executable, verifiable unit of training or evaluation.

Stored as Parquet rows (nested fields as JSON text, see ``to_row``); converts
losslessly to and from SWE-bench instances.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from trialforge.envspec import EnvSpec
from trialforge.tasks.host_judged import HostJudged
from trialforge.tasks.quality_record import QualityRecord
from trialforge.tasks.statement_record import StatementRecord

SCHEMA_VERSION = 3  # 3: ``env`` (the environment spec) replaced ``test_cmd``

Split = Literal["train", "eval"]


class Source(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str  # github | jira | swebench | git | synthetic
    ref: str  # ticket id / URL / commit
    link_confidence: float = 1.0


class Validation(BaseModel):
    runs: int = 0
    valid: bool = False
    reason: str = ""
    fail_to_pass_rates: dict[str, float] = Field(default_factory=dict)  # pass rate with the fix
    pass_to_pass_rates: dict[str, float] = Field(default_factory=dict)
    flaky_tests: list[str] = Field(default_factory=list)
    duration_s: float = 0.0
    slowest_run_s: float = 0.0  # the slowest whole-suite run with the fix: grading time limits scale from it
    not_importing: list[str] = Field(default_factory=list)  # test modules that fail to collect with the fix
    unstable_ids: int = 0  # test ids not reported by every run (validate._unstable): in neither test list
    unstable_examples: list[str] = Field(default_factory=list)  # the first of them, sorted
    # runs that stopped before their last test (after running their modules alone: validate._isolated), and the
    # tests that pass after the fix in neither list because such a run never reported them (absent is unknown)
    stopped_runs: int = 0
    unknown_outcome: int = 0
    unknown_examples: list[str] = Field(default_factory=list)  # the first of them, sorted
    # in-process evidence the task's own trees gave (testrun.baseline): grading flags it, and zeroes only the rest
    baseline_evidence: list[str] = Field(default_factory=list)
    host_judged: HostJudged | None = None  # None: validated before blinding (graded with every slot blinded)
    # test modules that do not import before the fix and import after it: their tests are all fail-to-pass, and
    # count as one unit each in ``fail_to_pass_units`` (what a task tests, not how many functions one file holds)
    fail_to_pass_modules_not_importing: list[str] = Field(default_factory=list)
    fail_to_pass_units: int = 0


class Decontamination(BaseModel):
    verdict: Literal["clean", "contaminated", "unchecked"] = "unchecked"
    matches: list[dict[str, Any]] = Field(default_factory=list)


class Difficulty(BaseModel):
    tier: str = "unknown"
    pass_at_k: float | None = None
    k: int = 0
    policy_version: str = "proxy"


class Task(BaseModel):
    task_id: str
    source: Source
    repo: str
    snapshot: str = ""  # content digest of the base-state repository in the object store
    image: str = ""
    image_digest: str = ""
    problem_statement: str
    hints: str = ""
    gold_patch: str
    test_patch: str
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    env: EnvSpec | None = None  # what its code needs (None: not resolved yet); ``image``/``image_digest``: its build
    created_at: str = ""
    split: Split = "train"
    validation: Validation = Field(default_factory=Validation)
    decontamination: Decontamination = Field(default_factory=Decontamination)
    difficulty: list[Difficulty] = Field(default_factory=list)
    quality: QualityRecord | None = None
    statement: StatementRecord | None = None  # None: not validated since statements were recorded
    schema_version: int = SCHEMA_VERSION

    def family(self) -> str:
        """The kind of bug: a synthetic task's mutation family (``source.ref`` is FAMILY:path:line), else
        ``ticket:<source kind>``. Splits are stratified by it; reports break pass rates down by it."""
        if self.source.kind == "synthetic":
            return self.source.ref.partition(":")[0] or "synthetic"
        return f"ticket:{self.source.kind}"

    # --- Parquet rows -------------------------------------------------------------
    _NESTED: ClassVar[tuple[str, ...]] = (
        "source", "validation", "decontamination", "difficulty", "quality", "fail_to_pass", "pass_to_pass", "env",
        "statement",
    )  # fmt: skip

    def to_row(self) -> dict[str, Any]:
        row = self.model_dump()
        for name in self._NESTED:
            row[name] = json.dumps(row[name], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        data = dict(row)
        for name in cls._NESTED:
            if isinstance(data.get(name), str):
                data[name] = json.loads(data[name])
        return cls.model_validate(data)

    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_row(), sort_keys=True).encode()).hexdigest()


# Validation's timings: what one machine measured, not what the task is. A task set validated again is the same
# version; grading still keys on ``content_hash`` (its time limits scale from them).
_MEASURED = {"duration_s": 0.0, "slowest_run_s": 0.0}


def task_set_version(tasks: list[Task]) -> str:
    """Content hash of a task set, timings left out: same tasks in any order give the same version."""
    digest = hashlib.sha256()
    unmeasured = (t.model_copy(update={"validation": t.validation.model_copy(update=_MEASURED)}) for t in tasks)
    for h in sorted(t.content_hash() for t in unmeasured):
        digest.update(h.encode())
    return digest.hexdigest()[:16]
