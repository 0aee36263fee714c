"""SWE-bench-style instances (JSON lines or a JSON array) -> tasks, and tasks -> instances, losslessly.

The base state is the instance's ``base_commit`` from a local mirror (or a clone URL), kept once both patches are
shown to apply. Fields with a Task slot map to it; everything else, and the original form of mapped fields, is kept
as JSON in ``Task.source.ref`` after an ``extras=`` marker (``extras.with_extras``), which ``task_to_swebench``
restores while it still decodes to the task's value. :func:`env_commit` names the commit whose files define an
instance's environment. Mapping and bad input: docs/ingest.md, "SWE-bench".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trialforge.errors import PatchError, RepoError, TaskError
from trialforge.funnel import IngestFunnel
from trialforge.tasks.envdetect.decide import EnvError
from trialforge.tasks.envdetect.resolve import EnvCache
from trialforge.tasks.ingest.caps import DEFAULT_CAPS, MAX_PATCH_BYTES_SETTING, IngestCaps, check_caps
from trialforge.tasks.ingest.extras import split_extras, with_extras
from trialforge.tasks.ingest.git import Mirrors, RepoSource, resolve_commit
from trialforge.tasks.ingest.records import read_json_records
from trialforge.tasks.ingest.trees import snapshot_at
from trialforge.tasks.patches import vet_patch
from trialforge.tasks.schema import Source, Task
from trialforge.tasks.snapshots import SnapshotStore

log = logging.getLogger(__name__)

# SWE-bench field -> Task field, for fields with a slot of the same type.
TEXT_FIELDS = {
    "instance_id": "task_id",
    "repo": "repo",
    "problem_statement": "problem_statement",
    "patch": "gold_patch",
    "test_patch": "test_patch",
    "hints_text": "hints",
    "created_at": "created_at",
}
LIST_FIELDS = {"FAIL_TO_PASS": "fail_to_pass", "PASS_TO_PASS": "pass_to_pass"}
REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
# Written for a task that did not come from SWE-bench, so the harness finds every key it reads.
DEFAULTS: dict[str, Any] = {"base_commit": "", "version": "", "environment_setup_commit": ""}
_FORMS = "_forms"  # extras key: original forms of mapped fields ({"hints_text": null, "FAIL_TO_PASS": "[...]"})
_ABSENT = "_absent"  # extras key: mapped fields the instance did not have


def task_from_swebench(instance: Mapping[str, Any]) -> Task:
    """One SWE-bench instance as a Task (no snapshot yet); a ``TaskError`` names a missing or mistyped field."""
    missing = [name for name in REQUIRED if instance.get(name) is None]
    if missing:
        raise TaskError(f"instance lacks required field(s) {missing}")
    values: dict[str, Any] = {}
    forms: dict[str, Any] = {}
    absent = [name for name in (*TEXT_FIELDS, *LIST_FIELDS) if name not in instance]
    for name, slot in TEXT_FIELDS.items():
        raw = instance.get(name)
        if name in instance and raw is None:
            forms[name] = None
        values[slot] = "" if raw is None else raw
    for name, slot in LIST_FIELDS.items():
        raw = instance.get(name)
        if isinstance(raw, str) or (name in instance and raw is None):
            forms[name] = raw
        values[slot] = _test_list(name, raw)
    extras = {k: v for k, v in instance.items() if k not in TEXT_FIELDS and k not in LIST_FIELDS}
    if forms:
        extras[_FORMS] = forms
    if absent:
        extras[_ABSENT] = absent
    ref = with_extras(str(instance["instance_id"]), extras)
    try:
        return Task(source=Source(kind="swebench", ref=ref), **values)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise TaskError(f"field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def task_to_swebench(task: Task) -> dict[str, Any]:
    """A Task as a SWE-bench instance; for a task made by ``task_from_swebench`` this is the original dict."""
    _, extras = split_extras(task.source.ref)
    forms: dict[str, Any] = extras.pop(_FORMS, {})
    absent = set(extras.pop(_ABSENT, []))
    out: dict[str, Any] = {} if task.source.kind == "swebench" else dict(DEFAULTS)
    out.update(extras)
    for name, slot in TEXT_FIELDS.items():
        _put(out, name, getattr(task, slot), forms, absent, _text)
    for name, slot in LIST_FIELDS.items():
        _put(out, name, getattr(task, slot), forms, absent, partial(_test_list, name))
    return out


def env_commit(task: Task) -> str | None:
    """The commit whose files define ``task``'s environment: ``environment_setup_commit``, else ``base_commit``.

    None when the task's extras name neither (a task that did not come from a repository at a commit).
    """
    _, extras = split_extras(task.source.ref)
    commit = extras.get("environment_setup_commit") or extras.get("base_commit")
    return str(commit) if commit else None


def _text(raw: Any) -> str:
    return "" if raw is None else raw


def _put(
    out: dict[str, Any], name: str, value: Any, forms: dict[str, Any], absent: set[str], decode: Callable[[Any], Any]
) -> None:
    """Write ``value`` under ``name`` in its original form while that form still means the same value."""
    if name in absent and value in ("", []):
        return
    if name in forms and decode(forms[name]) == value:
        out[name] = forms[name]
    elif name in forms and isinstance(forms[name], str):
        out[name] = json.dumps(value)  # the dataset's form: a list as JSON text
    else:
        out[name] = value


def _test_list(name: str, raw: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list, or JSON text of one (as the published dataset stores them)."""
    if raw is None:
        return []
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else []
        except json.JSONDecodeError as exc:
            raise TaskError(f"{name} is not a JSON list: {exc}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TaskError(f"{name} must be a list of test ids, got {raw!r:.80}")
    return value


def ingest_swebench(
    path: Path,
    repos: Mapping[str, RepoSource],
    snapshots: SnapshotStore,
    *,
    clone_dir: Path | None = None,
    caps: IngestCaps = DEFAULT_CAPS,
    env_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[Task], IngestFunnel]:
    """Every usable instance of ``path`` as a task with its base-state snapshot.

    ``repos`` maps an instance's ``repo`` (``owner/name``) to a local git mirror or a clone URL.
    A bad instance is dropped with its ``file:line`` and the reason; every other one is kept.
    An instance whose ``environment_setup_commit`` is not its base commit gets the environment spec
    read at that commit (once per commit: the instances of one ``version`` share it); the others
    get theirs from their base tree in the images step.
    """
    funnel = IngestFunnel("ingest.swebench")
    tasks: list[Task] = []
    seen: set[str] = set()
    envs = EnvCache(env_overrides)
    with Mirrors(repos, clone_dir) as mirrors:
        for record in read_json_records(path, funnel, caps=caps):
            try:
                task = _with_env(_instance_task(record.data, mirrors, snapshots, caps), record.data, mirrors, envs)
            except EnvError as exc:
                funnel.drop(record.where, "no_environment", str(exc))
                continue
            except (RepoError, PatchError) as exc:
                funnel.drop(record.where, exc.reason, str(exc))
                continue
            except TaskError as exc:
                funnel.drop(record.where, "invalid_record", str(exc))
                continue
            if task.task_id in seen:
                funnel.drop(record.where, "duplicate", f"instance {task.task_id} appears again")
                continue
            seen.add(task.task_id)
            tasks.append(task)
            funnel.keep()
            funnel.link(task.task_id, task.task_id, str(record.data["base_commit"]), 1.0, "swebench instance")
    log.info(
        "ingest.swebench %s: kept %d of %d", path.name, funnel.kept, funnel.seen, extra={"funnel": funnel.as_dict()}
    )
    return tasks, funnel


def _with_env(task: Task, instance: Mapping[str, Any], mirrors: Mirrors, envs: EnvCache) -> Task:
    setup, base = instance.get("environment_setup_commit"), instance.get("base_commit")
    if not setup or setup == base:
        return task
    spec = envs.get(mirrors.get(task.repo), str(setup), task.repo)
    where = f"environment_setup_commit {str(setup)[:12]} (version {instance.get('version') or '?'})"
    return task.model_copy(update={"env": spec.model_copy(update={"detected_from": (*spec.detected_from, where)})})


def _instance_task(instance: dict[str, Any], mirrors: Mirrors, snapshots: SnapshotStore, caps: IngestCaps) -> Task:
    task = task_from_swebench(instance)
    if instance.get("FAIL_TO_PASS") is not None and not task.fail_to_pass:
        raise RepoError(
            f"{task.task_id}: FAIL_TO_PASS is given as {instance['FAIL_TO_PASS']!r}: no test shows the fix "
            "(leave the field out to have validation find the tests)",
            reason="empty_fail_to_pass",
        )
    check_caps(task, caps)
    for name, patch in (("patch", task.gold_patch), ("test_patch", task.test_patch)):
        vet_patch(patch, f"{task.task_id} {name}", max_bytes=caps.max_patch_bytes, setting=MAX_PATCH_BYTES_SETTING)
    repo = mirrors.get(task.repo)
    commit = resolve_commit(repo, str(instance["base_commit"]))
    digest = snapshot_at(repo, commit, [task.test_patch, task.gold_patch], snapshots)
    return task.model_copy(update={"snapshot": digest})
