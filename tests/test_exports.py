"""Exports for verl and TRL and the read helpers, over a small run's stored episodes and steps.

The run is written the way the pipeline writes it (``datasets.write_rows`` with the record
schemas), on file:// and on a real S3 server, then exported and read back as a trainer would.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trialforge.errors import StoreError
from trialforge.rollout.env import TOOLS
from trialforge.store import datasets, query
from trialforge.store.objstore import ObjectStore, open_store
from trialforge.store.records import EPISODE_SCHEMA, STEP_SCHEMA, EpisodeRecord, StepRecord
from trialforge.tasks.schema import Source, Task, task_set_version
from trialforge.tasks.taskset import to_table
from trialforge.train import exports

TASKS = [
    Task(
        task_id=f"demo/{n}",
        source=Source(kind="github", ref=f"#{n}"),
        repo="demo",
        problem_statement=f"Issue {n}: add() returns the wrong sum",
        gold_patch=f"diff --git a/m{n}.py b/m{n}.py\n",
        test_patch=f"diff --git a/test_m{n}.py b/test_m{n}.py\n",
        fail_to_pass=[f"test_m{n}.py::test_add"],
        pass_to_pass=[f"test_m{n}.py::test_sub"],
    )
    for n in (1, 2)
]
VERSION = task_set_version(TASKS)
FIX = ("replace", {"path": "m.py", "old": "a - b", "new": "a + b"}, "replaced 1 occurrence in m.py")
LOOK = ("view", {"path": "m.py"}, "    1  def add(a, b): return a - b")
SUBMIT = ("submit", {}, "submitted")


STEP_TIMINGS = {"action_error": False, "exec_s": 0.01, "policy_s": 0.001, "tokens_in": 0, "tokens_out": 0}
EPISODE_RUNTIME = {
    "tier": "easy", "seed": 7, "backend": "bwrap", "image_digest": "sha256:abc", "attempt": 1, "cause": "",
    "termination": "submitted", "verifier_version": "v3", "verifier_report": "{}", "integrity_flags": "[]",
    "final_diff": "", "tokens_in": 0, "tokens_out": 0, "duration_s": 1.0, "sandbox_s": 0.1, "policy_s": 0.0,
    "exec_s": 0.1, "verify_s": 0.5, "params_hash": "p123", "code_version": "c456",
}  # fmt: skip


def record(
    run: str, iteration: int, task: Task, policy: str, version: str, calls: list, *, status: str = "ok",
    reward: float | None = 1.0, said: str = "",
) -> EpisodeRecord:  # fmt: skip
    """``said``: the text an LLM policy sends with each call (stored in the step's info, as OpenAIPolicy does)."""
    episode_id = f"ep-{run}-{iteration}-{task.task_id.split('/')[1]}-{policy}-0"
    info = json.dumps({"content": said} if said else {"choice": 1})
    steps = [
        StepRecord(run, iteration, episode_id, i, tool, json.dumps(args), obs, **STEP_TIMINGS, logprob=-0.5, info=info)
        for i, (tool, args, obs) in enumerate(calls)
    ]
    return EpisodeRecord(
        run_id=run, iteration=iteration, episode_id=episode_id, task_id=task.task_id, task_set_version=VERSION,
        policy=policy, policy_version=version, group_id=f"{task.task_id}/{policy}", sample=0, status=status,
        reward=reward, steps=len(steps), tool_calls=len(steps) - 1, step_rows=steps, **EPISODE_RUNTIME,
    )  # fmt: skip


t1, t2 = TASKS
RUN = [
    record("r1", 0, t1, "gold", "scripted", [FIX, SUBMIT]),
    record("r1", 0, t2, "gold", "scripted", [FIX, SUBMIT]),
    record("r1", 0, t1, "noop", "scripted", [SUBMIT], reward=0.0),
    record("r1", 0, t1, "repair", "v0", [LOOK, FIX, SUBMIT]),
    record("r1", 0, t2, "repair", "v0", [LOOK], status="env_error", reward=None),
    record("r1", 1, t1, "repair", "v1", [LOOK, FIX, SUBMIT], reward=0.0, said="Checking m.py first."),
    record("r2", 0, t2, "gold", "scripted", [FIX, SUBMIT]),
]
OK = [e for e in RUN if e.status == "ok"]


def write_run(store: ObjectStore, *, publish_tasks: bool = True) -> None:
    for run, iteration in sorted({(e.run_id, e.iteration) for e in RUN}):
        batch = [e for e in RUN if (e.run_id, e.iteration) == (run, iteration)]
        partition = {"run": run, "iteration": str(iteration)}
        datasets.write_rows(store, "episodes", [e.row() for e in batch], EPISODE_SCHEMA, partition=partition, part="b0")
        steps = [vars(s) for e in batch for s in e.step_rows]
        datasets.write_rows(store, "steps", steps, STEP_SCHEMA, partition=partition, part="b0")
    if publish_tasks:
        datasets.write_part(store, "tasks", to_table(TASKS), partition={"task_set": VERSION}, part="all")


@pytest.fixture
def file_store(tmp_path: Path) -> ObjectStore:
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture(params=[pytest.param("file", marks=pytest.mark.pure), pytest.param("s3", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def run_store(file_store: ObjectStore) -> ObjectStore:
    write_run(file_store)
    return file_store


def read_back(store: ObjectStore, export: exports.Export) -> list[dict]:
    """What a trainer sees: the Parquet file itself, read without trialforge."""
    return pq.read_table(io.BytesIO(store.get_bytes(export.key))).to_pylist()


def lineage_of(episode: EpisodeRecord) -> dict:
    return {name: getattr(episode, name) for name in exports.LINEAGE}


def assert_conversation(messages: list[dict], episode: EpisodeRecord, task: Task) -> None:
    assert messages[0]["role"] == "user" and task.problem_statement in messages[0]["content"]
    assert messages[0]["content"] == exports.opening(task.problem_statement)
    turns = messages[1:]
    assert len(turns) == 2 * len(episode.step_rows)
    for step, call, result in zip(episode.step_rows, turns[::2], turns[1::2], strict=True):
        assert call["role"] == "assistant" and len(call["tool_calls"]) == 1
        assert call["content"] == json.loads(step.info).get("content", "")
        tool_call = call["tool_calls"][0]
        assert tool_call["type"] == "function" and tool_call["function"]["name"] == step.tool
        assert json.loads(tool_call["function"]["arguments"]) == json.loads(step.args)
        assert result["role"] == "tool" and result["content"] == step.observation
        assert result["tool_call_id"] == tool_call["id"] and result["name"] == step.tool


# --- verl --------------------------------------------------------------------------------


def test_verl_export_has_one_row_per_ok_episode_with_conversation_and_lineage(store: ObjectStore) -> None:
    write_run(store)
    export = exports.export_verl(store, "nightly")
    assert export.key == "datasets/verl/export=nightly/part-all.parquet" and export.uri == store.uri(export.key)
    rows = read_back(store, export)
    assert export.rows == len(rows) == len(OK)
    assert list(rows[0]) == ["data_source", "prompt", "ability", "reward_model", "extra_info", "messages"]
    found = {row["extra_info"]["episode_id"]: row for row in rows}
    assert set(found) == {e.episode_id for e in OK}  # the env_error episode has no reward and stays out
    assert [row["extra_info"]["index"] for row in rows] == list(range(len(rows)))
    for episode in OK:
        row = found[episode.episode_id]
        task = next(t for t in TASKS if t.task_id == episode.task_id)
        assert row["data_source"] == "trialforge" and row["ability"] == "coding"
        assert row["prompt"] == [{"role": "user", "content": exports.opening(task.problem_statement)}]
        assert row["reward_model"]["style"] == "rule"
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth == {"task_id": task.task_id, "fail_to_pass": task.fail_to_pass, "pass_to_pass": task.pass_to_pass}
        info = row["extra_info"]
        assert info["reward"] == episode.reward and info["split"] == "train"
        assert {name: info[name] for name in exports.LINEAGE} == lineage_of(episode)
        assert_conversation(row["messages"], episode, task)
    published = datasets.read_table(store, "verl", filters={"export": "nightly"}).drop_columns(["export"])
    assert published.to_pylist() == rows


# --- TRL ---------------------------------------------------------------------------------


def test_trl_prompt_completion_and_messages_layouts(store: ObjectStore) -> None:
    write_run(store)
    split = read_back(store, exports.export_trl(store, "pc"))
    whole = read_back(store, exports.export_trl(store, "lm", layout="messages"))
    assert len(split) == len(whole) == len(OK)
    assert {"prompt", "completion", "tools", "reward", *exports.LINEAGE} == set(split[0])
    assert {"messages", "tools", "reward", *exports.LINEAGE} == set(whole[0])
    for pc, lm in zip(split, whole, strict=True):
        episode = next(e for e in OK if e.episode_id == pc["episode_id"])
        task = next(t for t in TASKS if t.task_id == episode.task_id)
        assert lm["episode_id"] == pc["episode_id"]
        assert pc["prompt"] == [{"role": "user", "content": exports.opening(task.problem_statement)}]
        assert pc["completion"][0]["role"] == "assistant"
        assert_conversation(lm["messages"], episode, task)
        assert [m["content"] for m in lm["messages"]] == [m["content"] for m in pc["prompt"] + pc["completion"]]
        assert json.loads(pc["tools"]) == TOOLS
        assert pc["reward"] == lm["reward"] == episode.reward
        assert {name: pc[name] for name in exports.LINEAGE} == lineage_of(episode)


@pytest.mark.pure
def test_an_unknown_trl_layout_is_refused(run_store: ObjectStore) -> None:
    with pytest.raises(StoreError, match=r"unknown TRL layout 'chat'.*messages.*prompt_completion"):
        exports.export_trl(run_store, "x", layout="chat")  # type: ignore[arg-type]


@pytest.mark.pure
def test_a_system_prompt_opens_every_conversation_and_belongs_to_the_prompt(run_store: ObjectStore) -> None:
    system = "You fix bugs by calling tools."
    selection = query.Selection(runs=("r1",), iterations=(1,))
    (trl,) = read_back(run_store, exports.export_trl(run_store, "sys", selection, system_prompt=system))
    (verl,) = read_back(run_store, exports.export_verl(run_store, "sys", selection, system_prompt=system))
    opening = {"role": "user", "content": exports.opening(t1.problem_statement)}
    assert trl["prompt"] == verl["prompt"] == [{"role": "system", "content": system}, opening]
    assert [m["role"] for m in trl["completion"]] == ["assistant", "tool"] * 3
    assert trl["completion"][0]["content"] == "Checking m.py first."
    assert [m["content"] for m in verl["messages"][:2]] == [system, opening["content"]]


# --- selection, tasks, idempotence -----------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (query.Selection(policies=("repair",)), {"ep-r1-0-1-repair-0", "ep-r1-1-1-repair-0"}),
        (query.Selection(policy_versions=("v1",)), {"ep-r1-1-1-repair-0"}),
        (query.Selection(runs=("r2",)), {"ep-r2-0-2-gold-0"}),
        (query.Selection(runs=("r1",), iterations=(0,), policies=("gold", "noop")),
         {"ep-r1-0-1-gold-0", "ep-r1-0-2-gold-0", "ep-r1-0-1-noop-0"}),
        (query.Selection(task_set_versions=(VERSION,), statuses=("env_error",)), {e.episode_id for e in OK}),
    ],
)  # fmt: skip
def test_an_export_holds_exactly_the_selected_ok_episodes(
    run_store: ObjectStore, selection: query.Selection, expected: set[str]
) -> None:
    rows = read_back(run_store, exports.export_trl(run_store, "sel", selection))
    assert {row["episode_id"] for row in rows} == expected


@pytest.mark.pure
def test_a_selection_without_ok_episodes_is_an_error(run_store: ObjectStore) -> None:
    with pytest.raises(StoreError, match="nothing to export: no ok episodes"):
        exports.export_verl(run_store, "none", query.Selection(task_set_versions=("other",)))
    assert datasets.list_parts(run_store, "verl") == []


@pytest.mark.pure
def test_tasks_come_from_the_published_task_set_or_the_caller(file_store: ObjectStore) -> None:
    write_run(file_store, publish_tasks=False)
    with pytest.raises(StoreError, match=rf"task set {VERSION} is not published .*pass tasks="):
        exports.export_verl(file_store, "a")
    assert exports.export_verl(file_store, "a", tasks=TASKS).rows == len(OK)
    with pytest.raises(StoreError, match=r"ran task 'demo/2', which the given tasks does not hold"):
        exports.export_verl(file_store, "b", tasks=[t1])


@pytest.mark.pure
def test_exporting_a_name_again_replaces_it(run_store: ObjectStore) -> None:
    first = exports.export_verl(run_store, "weekly")
    data = run_store.get_bytes(first.key)
    again = exports.export_verl(run_store, "weekly")
    assert again == first and run_store.get_bytes(again.key) == data
    assert [p["key"] for p in datasets.list_parts(run_store, "verl")] == [first.key]
    other = exports.export_verl(run_store, "gold-only", query.Selection(policies=("gold",)))
    assert [p["key"] for p in datasets.list_parts(run_store, "verl")] == sorted([first.key, other.key])
    assert len(read_back(run_store, other)) == 3


# --- read helpers --------------------------------------------------------------------------


@pytest.mark.pure
def test_episodes_are_selected_by_run_policy_and_versions(run_store: ObjectStore) -> None:
    ids = lambda sel: set(query.episodes(run_store, sel)["episode_id"].to_pylist())  # noqa: E731
    assert ids(query.ALL) == {e.episode_id for e in RUN}
    assert ids(query.Selection(policies=("repair",), statuses=("ok",))) == {"ep-r1-0-1-repair-0", "ep-r1-1-1-repair-0"}
    assert ids(query.Selection(policy_versions=("v0",))) == {"ep-r1-0-1-repair-0", "ep-r1-0-2-repair-0"}
    assert ids(query.Selection(runs=("r1",), iterations=(1,))) == {"ep-r1-1-1-repair-0"}
    assert ids(query.Selection(task_set_versions=("other",))) == set()
    frame = query.episodes_pandas(run_store, query.Selection(runs=("r2",)), columns=["episode_id", "reward"])
    assert frame.to_dict("records") == [{"episode_id": "ep-r2-0-2-gold-0", "reward": 1.0}]


@pytest.mark.pure
def test_steps_of_a_selection_come_in_order_and_join_their_episodes(run_store: ObjectStore) -> None:
    repair = query.Selection(policies=("repair",))
    steps = query.steps(run_store, repair)
    expected = [(e.episode_id, s.step, s.tool) for e in RUN if e.policy == "repair" for s in e.step_rows]
    assert list(zip(*(steps[c].to_pylist() for c in ("episode_id", "step", "tool")), strict=True)) == sorted(expected)
    assert steps.column_names == STEP_SCHEMA.names
    joined = query.trajectory_steps(run_store, repair)
    assert joined.num_rows == steps.num_rows
    assert set(query.STEP_CONTEXT) <= set(joined.column_names)
    for row in joined.to_pylist():
        episode = next(e for e in RUN if e.episode_id == row["episode_id"])
        assert (row["policy_version"], row["status"], row["reward"]) == (
            episode.policy_version, episode.status, episode.reward)  # fmt: skip
    assert len(query.trajectory_steps_pandas(run_store, query.Selection(runs=("r2",)))) == 2
    assert query.steps(run_store, query.Selection(runs=("nope",))).num_rows == 0


@pytest.mark.pure
def test_published_uris_leave_out_a_part_that_was_never_published(run_store: ObjectStore) -> None:
    partition = {"run": "r3", "iteration": "0"}
    orphan = datasets.part_key("episodes", partition, "crashed")
    table = pa.Table.from_pylist([RUN[0].row() | {"run_id": "r3"}], schema=EPISODE_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    run_store.put_bytes(orphan, sink.getvalue())  # a writer died between the part and its manifest entry
    uris = query.published_uris(run_store, "episodes")
    assert len(uris) == 3 and run_store.uri(orphan) not in uris
    assert all(uri.startswith(run_store.url + "/datasets/episodes/run=") for uri in uris)
    root = Path(run_store.url.removeprefix("file://"))
    globbed = sorted(root.glob("datasets/episodes/run=*/iteration=*/part-*.parquet"))
    assert len(globbed) == 4  # what a reader that globs the directory would see
    assert query.published_uris(run_store, "episodes", filters={"run": "r2"}) == [
        run_store.uri(datasets.part_key("episodes", {"run": "r2", "iteration": "0"}, "b0"))
    ]
