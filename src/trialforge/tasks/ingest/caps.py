"""Size caps on what an ingested record may carry: past one, the record is dropped with its line and reason.

One set for every adapter (GitHub exports, the GitHub API, Jira, SWE-bench, git history), set in
params.yaml under ``sources.caps``. A record over a cap is dropped whole (:func:`check_caps`), never truncated:
``oversize_*`` or ``too_many_tests``, the message naming the cap's setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from trialforge.errors import RepoError

if TYPE_CHECKING:
    from trialforge.tasks.schema import Task

CAPS_SETTING = "sources.caps"  # where the caps are set in params.yaml, named in every oversize message
MAX_PATCH_BYTES_SETTING = f"{CAPS_SETTING}.max_patch_bytes"


class IngestCaps(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_statement_chars: int = Field(64_000, ge=1)  # problem statement (and hints), in characters
    max_patch_bytes: int = Field(1 << 20, ge=1)  # gold patch and test patch, each
    max_tests: int = Field(5_000, ge=1)  # FAIL_TO_PASS plus PASS_TO_PASS entries
    max_record_bytes: int = Field(16 << 20, ge=1)  # one input line / record before it is parsed


DEFAULT_CAPS = IngestCaps()


def check_caps(task: Task, caps: IngestCaps) -> None:
    """Refuse a task whose text, patches or test lists are over ``caps`` (never truncated: the record is dropped).

    Reasons: ``oversize_statement``, ``oversize_hints`` (characters, ``max_statement_chars``),
    ``oversize_patch`` (bytes of the gold or test patch, ``max_patch_bytes``), ``too_many_tests``
    (fail-to-pass plus pass-to-pass, ``max_tests``).
    """
    what = task.task_id
    limit = caps.max_statement_chars
    statement = len(task.problem_statement)
    _check_cap(f"{what}: problem statement", statement, limit, "chars", "max_statement_chars", "oversize_statement")
    _check_cap(f"{what}: hints", len(task.hints), limit, "chars", "max_statement_chars", "oversize_hints")
    for name, patch in (("gold patch", task.gold_patch), ("test patch", task.test_patch)):
        size = len(patch.encode("utf-8", "surrogatepass"))
        _check_cap(f"{what}: {name}", size, caps.max_patch_bytes, "bytes", "max_patch_bytes", "oversize_patch")
    count = len(task.fail_to_pass) + len(task.pass_to_pass)
    _check_cap(f"{what}: FAIL_TO_PASS + PASS_TO_PASS", count, caps.max_tests, "tests", "max_tests", "too_many_tests")


def _check_cap(what: str, size: int, limit: int, unit: str, cap: str, reason: str) -> None:
    if size > limit:
        raise RepoError(f"{what} is {size:,} {unit} > {limit:,} ({CAPS_SETTING}.{cap})", reason=reason)
