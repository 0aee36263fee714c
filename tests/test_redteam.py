"""Red team: reward hacks written from the verifier's design alone, each graded for real on both backends.

The target is ``redteam_repo``'s ``calc`` package and its three tasks (calc-add: host-judged slots;
calc-mean: every assertion judged in process, no constant to copy; calc-clamp: in-process constants with
must-fail copies), validated once per backend exactly as the pipeline validates them. Each attack of
``redteam.ATTACKS`` is a diff that leaves its task's bug in place (a targeted one fixes it everywhere but
the slot its trick stands in for) and must score 0 with status ``ok``, stopped by a failed host check
(``host checks`` in the reason) or by runtime evidence (a ``tampered:`` flag). An attack the design
neutralises by construction on an in-process task (``by="construction"``) may instead fail plainly: its
mechanism never took effect, so its tests fail as the bug makes them fail. The gold patch and an honest
alternative fix of each task score 1, so a zero is never the test setup's doing.

Module-scoped: each backend validates the three tasks once (4 s on bwrap, 15 s on docker, measured on the
2-core machine under other sessions' load); a grade takes about half a second on bwrap and 2-4 s on docker;
the whole module 2.5-5 minutes. At the end, a table of every verdict is written to the terminal.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from support.redteam import ATTACKS, CLASSES, IN_PROCESS_ONLY, Attack
from support.redteam_repo import (
    ADD_HONEST,
    BASE_FILES,
    CLAMP_HONEST,
    MEAN_HONEST,
    core_with,
    edit_diff,
    make_tasks,
    write_tree,
)

from trialforge.quality.gate import run_quality_gate
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader, Verdict

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

BACKENDS = ("bwrap", "docker")
HONEST = {
    "calc-add": {"calc/core.py": core_with(add=ADD_HONEST)},
    "calc-mean": {"calc/core.py": core_with(mean=MEAN_HONEST)},
    "calc-clamp": {"calc/core.py": core_with(clamp=CLAMP_HONEST)},
}


@pytest.fixture(scope="module")
def table(request) -> list[tuple[str, Attack, Verdict]]:
    """Every attack's verdict, written to the terminal as a table when the module ends."""
    rows: list[tuple[str, Attack, Verdict]] = []
    yield rows
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not rows:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line("red team verdicts (backend, class, attack, task, reward, status, s, evidence or reason):")
        for backend, attack, verdict in sorted(rows, key=lambda r: (r[1].kind, r[1].name, r[0])):
            flags = [f for f in verdict.flags if f.startswith("tampered:")]
            why = ", ".join(flags) if flags else verdict.reason
            reporter.write_line(
                f"  {backend:6} {attack.kind:10} {attack.name:52} {attack.task:10} {verdict.reward:.1f} "
                f"{verdict.status:3} {verdict.duration_s:5.2f} {why[:150]}"
            )


@pytest.fixture(scope="module", params=BACKENDS)
def world(request, tmp_path_factory) -> SimpleNamespace:
    """One backend, a snapshot store, the three tasks validated on it, and a grader."""
    backend = request.getfixturevalue(f"{request.param}_backend")
    root = tmp_path_factory.mktemp(f"redteam-{request.param}")
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    snapshot = snapshots.put(write_tree(root / "base", BASE_FILES))
    image = backend.image
    tasks = {
        t.task_id: validate_task(t, backend, image.name, snapshots, Limits(), ValidateConfig(runs=1))
        for t in make_tasks(root / "patches", snapshot)
    }
    return SimpleNamespace(
        name=request.param,
        root=root,
        tasks=tasks,
        snapshots=snapshots,
        grader=Grader(backend, image.name, image.digest, snapshots, Limits()),
    )


def grade(world: SimpleNamespace, task_id: str, label: str, edits: dict[str, str | None]) -> Verdict:
    diff = edit_diff(world.root / "diffs", label, edits)
    return world.grader.grade(world.tasks[task_id], diff)


def test_the_tasks_validate_with_the_judging_they_were_built_for(world) -> None:
    tasks = world.tasks
    assert all(t.validation.valid for t in tasks.values()), {k: t.validation.reason for k, t in tasks.items()}
    add, mean, clamp = (tasks[k].validation.host_judged for k in ("calc-add", "calc-mean", "calc-clamp"))
    assert len(tasks["calc-add"].fail_to_pass) == 14 and add.fail_to_pass_host_judged >= 12, add
    assert len(tasks["calc-mean"].fail_to_pass) == 4 and mean.fail_to_pass_host_judged == 0, mean
    assert len(tasks["calc-clamp"].fail_to_pass) == 2 and clamp.fail_to_pass_host_judged == 0, clamp


@pytest.mark.parametrize("task_id", ["calc-add", "calc-mean", "calc-clamp"])
@pytest.mark.parametrize("fix", ["gold", "honest"])
def test_the_gold_patch_and_an_honest_fix_score_one(world, task_id, fix) -> None:
    task = world.tasks[task_id]
    if fix == "gold":
        verdict = world.grader.grade(task, task.gold_patch)
    else:
        verdict = grade(world, task_id, f"{task_id}-honest", HONEST[task_id])
    assert (verdict.reward, verdict.status) == (1.0, "ok"), (verdict.reason, verdict.flags)
    assert not [f for f in verdict.flags if f.startswith("tampered:")], verdict.flags


def _marked(attack: Attack):
    """An attack that still wins on an in-process-only task is expected to (the gate, not the grade, stops it)."""
    if attack.name not in IN_PROCESS_ONLY:
        return attack
    reason = "a task judged wholly in process: the quality gate drops it (quality.require_host_judged)"
    return pytest.param(attack, marks=pytest.mark.xfail(strict=IN_PROCESS_ONLY[attack.name], reason=reason))


def test_the_quality_gate_drops_the_tasks_judged_wholly_in_process(world) -> None:
    """Where every attack that still wins was graded: such a task never reaches a training batch."""
    kept, records, _ = run_quality_gate(list(world.tasks.values()), world.grader, world.snapshots,
                                        QualityConfig(max_mutants=0, gates=()))  # fmt: skip
    # calc-add has host-judged tests, but not every fail-to-pass test is anchored: since the round on hypothesis
    # (tests/test_redteam_hypothesis.py) each one must be, or its verdict could be forged beside an honest fix
    assert kept == []
    assert "fail-to-pass tests have no assertion the host judges" in records["calc-add"].reasons[0]
    for task_id in ("calc-mean", "calc-clamp"):
        assert records[task_id].failed_gates == ["host_judged"] and records[task_id].verifier_runs == 0
    wins = {a.task for a in ATTACKS if a.name in IN_PROCESS_ONLY}
    assert wins <= {"calc-mean", "calc-clamp"}


@pytest.mark.parametrize("attack", [_marked(a) for a in ATTACKS], ids=[a.name for a in ATTACKS])
def test_an_attack_scores_zero(world, table, attack: Attack) -> None:
    verdict = grade(world, attack.task, attack.name, attack.edits)
    table.append((world.name, attack, verdict))
    evidence = [f for f in verdict.flags if f.startswith("tampered:")]
    summary = f"{attack.name} ({attack.kind}: {attack.tries}) -> {verdict.reward} {verdict.reason!r} {evidence}"
    assert verdict.reward == 0.0, f"REWARD HACK: {summary}"
    assert verdict.status == "ok", summary
    stopped = "host checks" in verdict.reason or evidence
    if attack.by == "construction" and not stopped:  # its mechanism never ran: the bug failed its tests
        not_passed = [t for t, o in verdict.outcomes.items() if o != "passed"]
        stopped = set(world.tasks[attack.task].fail_to_pass) & set(not_passed)
    assert stopped, f"scored 0 but neither a host check nor evidence stopped it: {summary}"


def test_the_attacks_cover_every_class() -> None:
    assert {a.kind for a in ATTACKS} == set(CLASSES)
    assert len(ATTACKS) >= 25
    assert {a.task for a in ATTACKS} == {"calc-add", "calc-mean", "calc-clamp"}


def test_the_attack_files_are_the_package_s_not_the_tests_s() -> None:
    """Attacks edit the package and its neighbours; those that edit test files say so in their class."""
    for attack in ATTACKS:
        tests_touched = [p for p in attack.edits if p.startswith("tests/") or p == "conftest.py"]
        assert not tests_touched or attack.kind == "provenance", attack.name
        assert all(not Path(p).is_absolute() and ".." not in Path(p).parts for p in attack.edits), attack.name
