"""The task side's settings: where tasks come from (``sources`` in params.yaml), each repository's environment
(``env``) and how a task is validated (``validate``). ``Params`` embeds these sections as they are."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from trialforge.envspec import EnvSpec
from trialforge.section import Section
from trialforge.tasks.ingest.caps import IngestCaps
from trialforge.tasks.ingest.sources import SourceEntry


class SourceParams(Section):
    """The bundled sources (paths relative to the working directory, a ``tasks_src/...`` one else the checkout's:
    ``trialforge.checkout``); null or "" turns one off."""

    tickets: str | None = "tasks_src/tickets/github_issues.jsonl"  # a GitHub issue export, fixes in `repos`
    repos: str | None = "tasks_src/repos"  # a directory of repositories: the tickets' fixes, synthesis's sources
    eval_set: str | None = "tasks_src/eval/heldout.jsonl"  # held-out references beside HumanEval (SWE-bench JSONL)
    synthesize: int = Field(0, ge=0)  # bug-injection tasks to make per repository under `repos` (0: none)
    extra: list[SourceEntry] = []  # more sources, by `kind` (tasks/ingest/sources.py), ingested after `tickets`
    caps: IngestCaps = IngestCaps()  # size caps on an ingested record, every source

    @field_validator("tickets", "repos", "eval_set")
    @classmethod
    def _none_when_empty(cls, path: str | None) -> str | None:
        return path or None

    @model_validator(mode="after")
    def _repos_when_needed(self) -> SourceParams:
        if self.repos is None and self.tickets is not None:
            raise ValueError("sources.tickets needs sources.repos (the repositories of its fixes): set both, or null")
        if self.repos is None and self.synthesize:
            raise ValueError(f"sources.synthesize is {self.synthesize} but sources.repos is null: set it to 0")
        return self


class EnvParams(Section):
    """Task environments: detected from each repository, overridden here per repository name."""

    repos: dict[str, dict[str, Any]] = {}  # repo name -> EnvSpec fields over the detected ones
    build_timeout_s: float = Field(1800.0, gt=0)  # one environment image's build, network included

    @field_validator("repos")
    @classmethod
    def _specs(cls, repos: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, fields in repos.items():
            try:
                EnvSpec.model_validate(fields)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"env.repos.{name}: {problems}") from exc
        return repos


class ValidateConfig(Section):
    """How a task is validated (``validate`` in params.yaml).

    Time limits follow the suite: the first run of the fixed tree measures it with ``max_duration_s`` to run in (a
    suite slower than that is rejected, ``suite_too_slow``), and every later run of the task, validation's and the
    graded runs alike, gets the task's own limit (``limit_for``): ``suite_timeout_factor`` x that time, at least
    ``test_timeout_s``, at most ``max_duration_s``. docs/pipeline.md, "Time limits".
    """

    runs: int = Field(3, ge=1)  # each configuration runs this many times; outcome changes = flaky
    max_duration_s: float = Field(900.0, gt=0)  # the slowest suite run a task may have (its measuring run's limit)
    test_timeout_s: float = Field(120.0, gt=0)  # the least a task's own limit is, however fast its suite
    suite_timeout_factor: float = Field(3.0, ge=1.0)  # a task's own limit: this x its measured suite run

    @model_validator(mode="after")
    def _floor_under_ceiling(self) -> ValidateConfig:
        if self.test_timeout_s > self.max_duration_s:
            raise ValueError(
                f"validate.test_timeout_s ({self.test_timeout_s}) is above validate.max_duration_s "
                f"({self.max_duration_s}): the floor of a task's time limit must be under its ceiling"
            )
        return self

    def limit_for(self, measured_s: float) -> float:
        """The time limit of a task whose fixed tree's suite ran in ``measured_s`` when validation measured it."""
        return min(self.max_duration_s, max(self.test_timeout_s, self.suite_timeout_factor * measured_s))
