"""The demo's learnable repair policy: candidate edits, features from what the environment shows, and GRPO
updates that move probability toward the edits that earned reward."""

from __future__ import annotations

import json
import math

import pytest

from trialforge.rollout.env import CodingEnv, EnvLimits
from trialforge.rollout.policies import TaskView
from trialforge.rollout.reach import gold_edit
from trialforge.rollout.repair import ATTEMPTS, RandomEditPolicy, RepairPolicy, candidates_seen, score, softmax
from trialforge.rollout.repair_edits import FEATURES, N_FEATURES, line_edits, viewed_functions
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.tasks.schema import Source, Task
from trialforge.train.repair_trainer import RepairTrainer
from trialforge.train.settings import TrainParams

SPAN = (
    "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\n"
    "def between(x, lo, hi):\n    return clamp(x, lo, hi) == x and x < hi\n"
)
SPAN_TESTS = (
    "from pkg.span import between, clamp\n\n\n"
    "def test_clamp():\n    assert clamp(7, 1, 5) == 5\n\n\n"
    "def test_between_includes_the_upper_bound():\n"
    "    assert between(5, 1, 5)\n    assert not between(0, 1, 5)\n    assert not between(6, 1, 5)\n"
)
TEST_OUTPUT = """.F                                                                       [100%]
=================================== FAILURES ===================================
___________________ test_between_includes_the_upper_bound ____________________
tests/test_span.py:9: in test_between_includes_the_upper_bound
    assert between(5, 1, 5)
E   assert False
E    +  where False = between(5, 1, 5)
=========================== short test summary info ============================
FAILED tests/test_span.py::test_between_includes_the_upper_bound - assert False
1 failed, 1 passed in 0.02s
"""
SPECTRUM = "spectrum: 1 failing, 1 passing\npkg/span.py:2-2 1 1\npkg/span.py:6-6 1 0\n"  # what the tracer prints
LISTING = "\n".join(f"{n:>5}  {line}" for n, line in enumerate(SPAN.splitlines(), start=1))


def feature(name: str) -> int:
    return FEATURES.index(name)


@pytest.mark.pure
def test_line_edits_include_the_inverse_of_single_token_bugs() -> None:
    bug_and_fix = [
        ("    if a <= b:", "    if a < b:"),
        ("    return x is not None", "    return x is None"),
        ("    ok = key in seen", "    ok = key not in seen"),
        ("    return a and b", "    return a or b"),
        ("    txn = make(date, name, amount)", "    txn = make(name, date, amount)"),
        ("    txn = make(date, name, amount)", "    txn = make(date, amount, name)"),
        ("    end = start + 1", "    end = start"),
        ("    n = size - 3", "    n = size - 2"),
        ("    n = size + 3", "    n = size + 1"),  # a constant that should be 0 or 1 is reached in one edit
        ("    move(day, memo, source, target, amount)", "    move(day, memo, target, source, amount)"),  # any pair
        ("    return max(xs)", "    return min(xs)"),
        ("    s = text.upper()", "    s = text.lower()"),
        ("    total -= cost", "    total += cost"),
        ("    if not (x > 0):", "    if (x > 0):"),
        ("    if x > 0:", "    if not (x > 0):"),
    ]
    for bug, fix in bug_and_fix:
        assert fix in [new for _, new in line_edits(bug)], bug


@pytest.mark.pure
def test_a_name_the_function_binds_and_never_reads_is_put_back_where_a_value_was_dropped() -> None:
    listing = "\n".join(f"{n:6d}  {text}" for n, text in enumerate([
        "def fill(words, width, break_long):",
        "    lines = []",
        "    for i, word in enumerate(words):",
        "        lines.extend(wrap(word, width))",
        "    best = max(lines, key=len)",
        "    def key(line):",
        "        return len(line) + i",  # a read in a nested function is a read
        "    return None",
    ], 1))  # fmt: skip
    (fill, key) = viewed_functions("m.py", listing)
    assert fill.unread == ("break_long", "best") and key.unread == ()
    returned = line_edits("    return None", fill.unread)
    assert ("return_name", "    return best") in returned and ("return_name", "    return break_long") in returned
    passed = [new for family, new in line_edits("        lines.extend(wrap(word, width))", ("break_long",))]
    assert "        lines.extend(wrap(word, width, break_long))" in passed
    assert "        lines.extend(wrap(word, width, break_long=break_long))" in passed
    assert line_edits("    return None") == [("negation", "    return not (None)")]  # nothing unread: nothing put back


@pytest.mark.pure
def test_removing_a_not_and_adding_one_are_told_apart_and_commuting_arguments_are_not_swapped() -> None:
    assert dict((new, family) for family, new in line_edits("    while key not in seen:")) == {
        "    while key in seen:": "unnegate",
        "    while not (key not in seen):": "negation",
    }
    assert [new for _, new in line_edits("    low = min(a, b)")] == ["    low = max(a, b)"]  # no min(b, a)


@pytest.mark.pure
def test_line_edits_leave_out_edits_that_break_the_syntax() -> None:
    edits = [new for _, new in line_edits("    for item in items[1:]:")]
    assert "    for item not in items[1:]:" not in edits  # a loop's `in` is not a membership test
    assert "    for item in items[0:]:" in edits and "    for item in items[2:]:" in edits
    assert line_edits("    name = value") == []


def run_episode(policy: RepairPolicy, observations: list[str]):
    """Feed the environment's answers to one episode; return its decisions."""
    episode = policy.begin(TaskView("t", "between() excludes its upper bound"), seed=0)
    return episode, [episode.act(obs) for obs in observations]


@pytest.mark.pure
def test_the_policy_localises_by_the_tests_spectrum_and_edits_only_lines_a_failing_test_ran() -> None:
    episode, (test, spectrum, view, edit) = run_episode(RepairPolicy(), ["", TEST_OUTPUT, SPECTRUM, LISTING])

    assert test.action.args["command"].startswith("python3 -m pytest")
    assert "sys.settrace" in spectrum.action.args["command"]  # run the suite again under the line tracer
    assert (view.action.tool, view.action.args) == ("view", {"path": "pkg/span.py"})
    assert edit.logprob is not None and edit.tokens_out == 1
    features = edit.info["features"]
    assert len(features) == len(episode.candidates) + 1 and all(len(f) == N_FEATURES for f in features)
    candidates = [*episode.candidates, episode.applied]
    assert {c.line_no for c in candidates} == {2, 6}  # both functions ran; `def` lines are not edits
    assert "    return clamp(x, lo, hi) == x and x <= hi" in {c.new_line for c in candidates}  # the fix
    for c in candidates:
        on_failing_line = c.line_no == 6
        assert c.features[feature("suspiciousness")] == (1.0 if on_failing_line else 1 / math.sqrt(2))
        assert c.features[feature("most_suspicious")] == float(on_failing_line)
        assert c.features[feature("run_by_passing")] == float(not on_failing_line)
        assert c.features[feature("named_in_output")] == float(on_failing_line)  # `between(5, 1, 5)` in the output
        assert c.features[feature("in_return")] == 1.0
    # The chosen edit is sampled uniformly at first: its log-probability is that of one among all candidates.
    assert math.isclose(edit.logprob, -math.log(len(features)))


@pytest.mark.pure
def test_a_recorded_episode_replays_into_the_candidates_it_ranked_and_the_gold_fix_is_found_among_them() -> None:
    """What the learning benchmark's ceiling is fitted on: candidates rebuilt from a recorded episode's answers."""
    view = TaskView("t", "between() excludes its upper bound")
    episode, _ = run_episode(RepairPolicy(), ["", TEST_OUTPUT, SPECTRUM, LISTING])
    answers = [TEST_OUTPUT, SPECTRUM, LISTING, "rc=1"]  # what the environment answered its four actions
    candidates, attempts = candidates_seen(view, answers)
    assert attempts == ATTEMPTS
    assert sorted(candidates, key=repr) == sorted([*episode.candidates, episode.applied], key=repr)
    fix = "    return clamp(x, lo, hi) == x and x <= hi"
    gold = (
        "diff --git a/pkg/span.py b/pkg/span.py\n--- a/pkg/span.py\n+++ b/pkg/span.py\n@@ -6 +6 @@\n"
        f"-    return clamp(x, lo, hi) == x and x < hi\n+{fix}\n"
    )
    task = Task(task_id="t", source=Source(kind="synthetic", ref="flip_compare:pkg/span.py:6"), repo="r",
                problem_statement=view.problem_statement, gold_patch=gold, test_patch="")  # fmt: skip
    assert candidates[gold_edit(task, candidates)].new_line == fix
    assert gold_edit(task, [c for c in candidates if c.new_line != fix]) is None  # not among them: not found
    # No test fails (the failing tests are hidden, the bug only described): the functions the issue names and those
    # they call (a bug in a helper shows through the function named), each edit checked against the visible suite.
    passing = "2 passed in 0.02s\n"
    described, attempts = candidates_seen(view, [passing, "./pkg/span.py:5:def between(x, lo, hi):", LISTING])
    assert attempts == ATTEMPTS and {c.line_no for c in described} == {2, 6} and fix in {c.new_line for c in described}
    named = {c.line_no: c.features[feature("named_in_output")] for c in described}
    assert named == {2: 0.0, 6: 1.0}  # the callee's lines are candidates, told apart from the named function's


@pytest.mark.pure
def test_the_random_edit_baseline_edits_any_library_line_uniformly_without_localising() -> None:
    episode = RandomEditPolicy().begin(TaskView("t", "between() excludes its upper bound"), seed=0)
    test, listing, view, edit = (
        episode.act(obs) for obs in ["", TEST_OUTPUT, "./pkg/span.py\n./tests/test_span.py\n", LISTING]
    )
    assert (
        test.action.args["command"].startswith("python3 -m pytest") and "find . -name" in listing.action.args["command"]
    )
    assert (view.action.tool, view.action.args) == ("view", {"path": "pkg/span.py"})  # never a test file
    candidates = [*episode.candidates, episode.applied]
    assert {c.line_no for c in candidates} == {2, 6}  # every line of the viewed functions
    assert math.isclose(edit.logprob, -math.log(len(candidates))) and math.isclose(
        edit.info["entropy"], math.log(len(candidates))
    )
    assert episode.phase == "check"  # checked against the failing test like the learner's edits


@pytest.mark.pure
def test_a_refuted_edit_is_undone_with_the_next_one_and_a_confirmed_edit_is_submitted() -> None:
    episode, decisions = run_episode(RepairPolicy(attempts=2), ["", TEST_OUTPUT, SPECTRUM, LISTING, ""])
    first, check = episode.applied, decisions[-1].action.args["command"]
    assert "tests/test_span.py::test_between_includes_the_upper_bound" in check and "&&" in check
    # an endless loop is stopped by its CPU budget (any load), or by ten seconds of wall time, never the episode
    assert check.startswith("ulimit -t 3; timeout 10 python3 -m pytest")

    second = episode.act("rc=1")  # the tests still fail: revert the first edit in the same command
    assert second.logprob is not None and first.old_line in second.action.args["command"]
    episode.act("")
    assert episode.act("rc=1").action.tool == "submit"  # the budget of two edits is spent

    episode, _ = run_episode(RepairPolicy(attempts=2), ["", TEST_OUTPUT, SPECTRUM, LISTING, ""])
    assert episode.act("rc=0").action.tool == "submit"


@pytest.mark.pure
def test_with_the_failing_tests_hidden_the_visible_suite_refutes_edits_and_the_issue_names_the_function() -> None:
    """A synthesized or mined task's failing tests are not in the workspace: the issue quotes the function and lists
    the tests; an edit the visible suite refutes is undone, the first it does not refute is submitted."""
    test = "tests/test_span.py::test_between_upper_bound"
    issue = (f"`between` gives wrong results\n\nFailing tests (1):\n- {test}\n\n"
             f"Observed behaviour (the test suite, run before the fix):\n- `{test}` fails: assert False\n")  # fmt: skip
    episode = RepairPolicy(attempts=2).begin(TaskView("t", issue), seed=0)
    answers = ["", "1 passed in 0.02s\n", "./pkg/span.py:5:def between(x, lo, hi):", LISTING, ""]
    _, grep, view, _, check = (episode.act(obs) for obs in answers)
    assert "between" in grep.action.args["command"] and view.action.args == {"path": "pkg/span.py"}
    assert episode.evidence.test_words == [{"between", "upper", "bound"}]  # the listed test's name
    command = check.action.args["command"]
    assert "&&" not in command and "test_between" not in command and "python3 -m pytest -x -q" in command
    second = episode.act("rc=1")  # the suite fails: the edit is undone with the next one
    assert second.logprob is not None and episode.applied is not None
    episode.act("")
    assert episode.act("rc=0").action.tool == "submit"


@pytest.mark.pure
def test_learned_weights_rank_the_most_suspicious_lines_first() -> None:
    weights = [0.0] * N_FEATURES
    weights[feature("most_suspicious")] = 4.0
    _, decisions = run_episode(RepairPolicy(weights), ["", TEST_OUTPUT, SPECTRUM, LISTING])
    features = decisions[-1].info["features"]
    probs = softmax([score(weights, tuple(f)) for f in features])
    on_failing_line = sum(p for p, f in zip(probs, features, strict=True) if f[feature("most_suspicious")])
    assert on_failing_line > 0.9


@pytest.mark.pure
def test_each_edit_records_the_entropy_of_the_softmax_it_was_sampled_from() -> None:
    _, decisions = run_episode(RepairPolicy(), ["", TEST_OUTPUT, SPECTRUM, LISTING])
    uniform = decisions[-1].info
    assert math.isclose(uniform["entropy"], math.log(len(uniform["features"])))  # zero weights: uniform over n

    weights = [0.0] * N_FEATURES
    weights[feature("most_suspicious")] = 4.0
    _, decisions = run_episode(RepairPolicy(weights), ["", TEST_OUTPUT, SPECTRUM, LISTING])
    favoured = decisions[-1].info
    probs = softmax([score(weights, tuple(f)) for f in favoured["features"]])
    assert math.isclose(favoured["entropy"], -sum(p * math.log(p) for p in probs))
    assert 0 < favoured["entropy"] < uniform["entropy"] - 0.25  # mass gathers on the most suspicious line


# --- training ------------------------------------------------------------------------------------------------

A, B = [1.0] + [0.0] * (N_FEATURES - 1), [0.0] * 3 + [1.0] + [0.0] * (N_FEATURES - 4)  # compare / constant edits


def episode_record(group: str, chosen: int, reward: float | None, status: str = "ok") -> EpisodeRecord:
    """An episode with one decision between candidates A (index 0) and B (index 1)."""
    step = StepRecord("r", 0, "e", 1, "run", "{}", "", False, 0.0, 0.0, 0, 1, -0.6931471805599453,
                      json.dumps({"features": [A, B], "chosen": chosen}))  # fmt: skip
    text = dict.fromkeys(["run_id", "episode_id", "task_set_version", "tier", "policy", "policy_version", "backend",
                          "image_digest", "cause", "termination", "verifier_version", "verifier_report",
                          "integrity_flags", "final_diff", "params_hash", "code_version"], "")  # fmt: skip
    numbers = dict.fromkeys(["iteration", "sample", "seed", "attempt", "steps", "tool_calls", "tokens_in",
                             "tokens_out", "duration_s", "sandbox_s", "policy_s", "exec_s", "verify_s"], 0)  # fmt: skip
    return EpisodeRecord(**text, **numbers, task_id=group, group_id=group, status=status, reward=reward,  # type: ignore[arg-type]
                         step_rows=[step])  # fmt: skip


def prob_of_a(trainer: RepairTrainer) -> float:
    weights = trainer.weights.detach().tolist()
    return softmax([score(weights, tuple(A)), score(weights, tuple(B))])[0]


@pytest.mark.pure
def test_an_update_moves_probability_toward_the_rewarded_edit_and_ignores_broken_episodes() -> None:
    trainer = RepairTrainer(TrainParams(lr=0.3, epochs=4))
    batch = [episode_record("t1", 0, 1.0), episode_record("t1", 1, 0.0), episode_record("t1", 1, 0.0),
             episode_record("t1", 0, 1.0), episode_record("t1", 0, None, status="env_error"),
             episode_record("t2", 1, 0.0), episode_record("t2", 1, 0.0)]  # fmt: skip
    stats = trainer.update(batch)

    assert prob_of_a(trainer) > 0.7  # from 0.5
    assert (stats.excluded_not_ok, stats.zero_variance_groups, stats.trained_on) == (1, 1, 4)
    assert stats.policy_version == "v1" and trainer.policy().version == "v1"


@pytest.mark.pure
def test_an_sgd_step_follows_the_gradient_where_adams_first_step_moves_every_weight_alike() -> None:
    """Two groups: one says A beats B strongly (4 episodes), the other weakly (2): A's and B's gradients differ in
    size. Adam's first step moves both weights by exactly lr (sign descent); SGD's by lr times the gradient."""
    batch = [episode_record("t1", 0, 1.0), episode_record("t1", 1, 0.0), episode_record("t1", 0, 1.0),
             episode_record("t1", 1, 0.0), episode_record("t2", 0, 1.0), episode_record("t2", 0, 0.0)]  # fmt: skip
    adam, sgd = (
        RepairTrainer(TrainParams(lr=0.5, epochs=1)),
        RepairTrainer(TrainParams(lr=0.5, epochs=1, optimizer="sgd")),
    )
    for trainer in (adam, sgd):
        trainer.update(batch)
    moved_a, moved_b = (abs(w) for w in adam.weights.detach().tolist()[:4:3])  # compare, constant
    assert math.isclose(moved_a, 0.5, rel_tol=1e-6) and math.isclose(moved_b, 0.5, rel_tol=1e-6)
    step = sgd.weights.detach().tolist()
    assert step[0] > 0 > step[3] and 0 < step[0] < 0.5 and step[4:] == [0.0] * (N_FEATURES - 4)
    assert prob_of_a(sgd) > 0.5


@pytest.mark.pure
def test_a_batch_of_broken_episodes_changes_nothing() -> None:
    trainer = RepairTrainer(TrainParams(lr=0.3, epochs=4))
    stats = trainer.update([episode_record("t1", 0, None, "env_error"), episode_record("t1", 1, None, "timeout")])
    assert prob_of_a(trainer) == 0.5 and stats.trained_on == 0


# --- in a sandbox --------------------------------------------------------------------------------------------


@pytest.mark.sandbox
def test_the_policy_finds_and_fixes_a_bug_in_a_real_sandbox(bwrap_backend, base_image, tmp_path) -> None:
    """The tracer, the line edits and the checks run as they are in the image's Python and pytest."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "span.py").write_text(SPAN)
    (repo / "tests" / "test_span.py").write_text(SPAN_TESTS)
    weights = [0.0] * N_FEATURES
    weights[feature("most_suspicious")], weights[feature("compare")] = 4.0, 3.0
    episode = RepairPolicy(weights, attempts=3).begin(TaskView("t", "between() excludes its upper bound"), seed=1)
    sandbox = bwrap_backend.create(SandboxSpec(image=base_image.name, workspace=repo, limits=Limits(pids=64)))
    try:
        env = CodingEnv(sandbox, "between() excludes its upper bound", EnvLimits())
        observation, tools = env.first_observation(), []
        while True:
            action = episode.act(observation).action
            tools.append(action.tool)
            outcome = env.step(action)
            if outcome.done:
                break
            observation = outcome.observation
        fixed = sandbox.read_file("pkg/span.py").decode()
    finally:
        sandbox.close()
    assert episode.evidence.spectrum[("pkg/span.py", 6)] == (1, 0)  # what the tracer printed, parsed
    assert fixed == SPAN.replace("x < hi", "x <= hi")
    assert tools[:3] == ["run", "run", "view"] and tools[-1] == "submit"


@pytest.mark.pure
def test_with_no_function_named_the_module_named_like_the_failing_tests_module_is_read() -> None:
    """``tests/test_span.py`` tests ``span.py``: with the tests hidden and no function named, the policy finds that
    module and every function in it is a suspect."""
    issue = "`pkg` gives wrong results\n\nFailing tests (1):\n- tests/test_span.py::test_upper_bound_is_in\n"
    episode = RepairPolicy(attempts=2).begin(TaskView("t", issue), seed=0)
    _, find, view, edit = (episode.act(obs) for obs in ["", "1 passed in 0.02s\n", "./pkg/span.py:0:\n", LISTING])
    assert "-name 'span.py'" in find.action.args["command"] and view.action.args == {"path": "pkg/span.py"}
    assert {c.line_no for c in [*episode.candidates, episode.applied]} == {2, 6} and edit.logprob is not None
