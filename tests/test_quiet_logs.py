"""What a command shows: one line per stage by default, Prefect's state lines and library chatter with -v,
warnings always, JSON lines for machines. A real flow (ingest of three bundled tickets) runs through the CLI
against the session's Prefect server."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

import pytest
from conftest import REPO_ROOT
from support.cli_runner import invoke

from trialforge.observe.logs import STAGE_LOGGER, configure

STATE_LINE = "prefect.task_runs: Finished in state Completed()"


@pytest.fixture
def ingest_args(tmp_path, prefect_api, monkeypatch) -> Iterator[list[str]]:
    """``flow ingest`` of three bundled tickets into a store of this test's own; the flow's log lines are sent
    to the server before the next test (the session's server may stop after it)."""
    from prefect.logging.handlers import APILogWorker

    monkeypatch.chdir(REPO_ROOT)  # the flows load as flows/NAME.py
    tickets = tmp_path / "three.jsonl"
    lines = (REPO_ROOT / "tasks_src" / "tickets" / "github_issues.jsonl").read_text().splitlines()
    tickets.write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "params.yaml").write_text("{}\n")
    overrides = {
        "sources.tickets": tickets,
        "sources.repos": REPO_ROOT / "tasks_src" / "repos",
        "sources.synthesize": 0,
        "run.store": f"file://{tmp_path / 'store'}",
        "run.out_dir": tmp_path / "out",
    }
    sets = [arg for key, value in overrides.items() for arg in ("-S", f"{key}={value}")]
    yield ["flow", "ingest", "--params", str(tmp_path / "params.yaml"), *sets]
    APILogWorker.drain_all(timeout=30)


@pytest.mark.sandbox
@pytest.mark.services
def test_by_default_a_flow_shows_its_stage_lines_and_no_prefect_state_lines(ingest_args):
    result = invoke(*ingest_args)
    assert result.exit_code == 0, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("ingest: kept 3 of 3 tasks (") and line.endswith("s)")
    assert "Finished in state" not in result.output and "HTTP Request" not in result.output
    assert json.loads(result.stdout)["tasks"] == 3


@pytest.mark.sandbox
@pytest.mark.services
def test_verbose_shows_prefects_task_and_flow_state_lines_and_library_info(ingest_args):
    result = invoke("-v", *ingest_args)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines.count(f"INFO {STATE_LINE}") == 2  # ingest_sources, publish_ingested
    assert "INFO prefect.flow_runs: Finished in state Completed()" in lines
    assert any(line.startswith("INFO httpx: HTTP Request:") for line in lines)
    assert any(line.startswith("ingest: kept 3 of 3 tasks") for line in lines)


@pytest.mark.sandbox
@pytest.mark.services
def test_json_logs_are_one_object_per_line(ingest_args):
    result = invoke("--log-format", "json", "-v", *ingest_args)
    assert result.exit_code == 0, result.output
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert all(isinstance(e, dict) and {"ts", "level", "logger", "msg"} <= e.keys() for e in entries)
    stage = [e for e in entries if e["logger"] == STAGE_LOGGER]
    assert len(stage) == 1 and stage[0] | {"seconds": None, "msg": None, "ts": None} == {
        "ts": None, "level": "info", "logger": STAGE_LOGGER, "msg": None, "stage": "ingest", "seconds": None,
        "seen": 3, "kept": 3, "dropped": {},
    }  # fmt: skip
    states = [e for e in entries if e["logger"] == "prefect.task_runs"]
    assert len(states) == 2 and all(e["msg"] == "Finished in state Completed()" and e["task_run_id"] for e in states)

    quiet = invoke("--log-format", "json", *ingest_args)
    assert [json.loads(line)["logger"] for line in quiet.stderr.splitlines()] == [STAGE_LOGGER]


@pytest.mark.pure
def test_warnings_show_however_quiet_and_info_only_when_verbose(capsys, monkeypatch):
    monkeypatch.setenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "")  # so that monkeypatch removes what configure sets
    monkeypatch.delenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL")
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        for verbose in (0, 1):
            configure(verbose)
            chatty = logging.getLogger("chatty.states")
            chatty.setLevel(logging.INFO)  # a library that sets its loggers' level itself, as Prefect does
            chatty.info("Finished in state Completed()")
            logging.getLogger("httpx").warning("the server went away")
            logging.getLogger("trialforge.rollout").debug("a detail")
        assert capsys.readouterr().err.splitlines() == [
            "WARNING httpx: the server went away",
            "INFO chatty.states: Finished in state Completed()",
            "WARNING httpx: the server went away",
        ]
        assert os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"  # the first call's: for children
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
