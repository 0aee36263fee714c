"""Size caps on what an ingested record may carry: past one, the record is dropped with its line and reason.

One set for every adapter (GitHub exports, the GitHub API, Jira, SWE-bench, git history), set in
params.yaml under ``sources.caps``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class IngestCaps(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_statement_chars: int = Field(64_000, ge=1)  # problem statement (and hints), in characters
    max_patch_bytes: int = Field(1 << 20, ge=1)  # gold patch and test patch, each
    max_tests: int = Field(5_000, ge=1)  # FAIL_TO_PASS plus PASS_TO_PASS entries
    max_record_bytes: int = Field(16 << 20, ge=1)  # one input line / record before it is parsed
