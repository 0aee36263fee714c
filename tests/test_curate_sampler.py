"""Difficulty (pass@k, tiers, one record per policy version) and the batch sampler that keeps groups informative.

The unit tests check numbers worked out by hand; the last test runs real rollouts of two policies of
different strength on bundled tasks and checks that tiers and batches follow what the rollouts showed.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO_ROOT

from trialforge.curate.difficulty import count_outcomes, measure_difficulty, pass_at_k
from trialforge.curate.sampler import (
    BatchSampler,
    SamplerConfig,
    SamplerError,
    group_rewards,
    tier_shares,
    update_pass_rates,
)
from trialforge.curate.tiers import (
    PROXY,
    difficulty_for,
    expected_pass_rate,
    proxy_difficulty,
    tier_of_measured,
    tier_of_pass_rate,
    tier_tasks,
    with_difficulty,
)
from trialforge.rollout.env import EnvLimits
from trialforge.rollout.loop import Lineage, Rollout, run_batch
from trialforge.rollout.policies import EpisodePolicy, GoldPolicy, NoopPolicy, TaskView
from trialforge.sandbox.base import Limits
from trialforge.store import datasets
from trialforge.store.objstore import open_store
from trialforge.store.records import EPISODE_SCHEMA, EpisodeRecord
from trialforge.tasks.ingest.github import ingest_github_issues
from trialforge.tasks.schema import Difficulty, Source, Task, task_set_version
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.verify.grader import Grader

ONE_LINE_FIX = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def task(task_id: str, split: str = "train") -> Task:
    return Task(
        task_id=task_id,
        source=Source(kind="synthetic", ref=task_id),
        repo="r",
        problem_statement=f"fix {task_id}",
        gold_patch=ONE_LINE_FIX,
        test_patch="",
        split=split,
    )


def episode(
    task_id: str,
    reward: float | None,
    *,
    sample: int = 0,
    status: str = "ok",
    policy: str = "learner",
    version: str = "v1",
) -> EpisodeRecord:
    return EpisodeRecord(
        run_id="r", iteration=0, episode_id=f"{task_id}-{policy}-{version}-{sample}", task_id=task_id,
        task_set_version="ts", tier="unknown", policy=policy, policy_version=version, group_id=f"{task_id}/{policy}",
        sample=sample, seed=sample, backend="bwrap", image_digest="sha256:0", attempt=1, status=status, cause="",
        termination="submitted", reward=reward if status == "ok" else None, verifier_version="1",
        verifier_report="{}", integrity_flags="[]", final_diff="", steps=1, tool_calls=0, tokens_in=0, tokens_out=0,
        duration_s=0.0, sandbox_s=0.0, policy_s=0.0, exec_s=0.0, verify_s=0.0, params_hash="p", code_version="c",
    )  # fmt: skip


def group(task_id: str, rewards: list[float], **kw) -> list[EpisodeRecord]:
    return [episode(task_id, r, sample=i, **kw) for i, r in enumerate(rewards)]


# --- pass@k and tiers --------------------------------------------------------------------------------------


@pytest.mark.pure
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 2, 1, 0.5),  # pass@1 is c/n
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (5, 1, 3, 0.6),  # 1 - C(4,3)/C(5,3) = 1 - 4/10
        (10, 3, 2, 8 / 15),  # 1 - C(7,2)/C(10,2) = 1 - 21/45
        (10, 0, 5, 0.0),
        (3, 2, 2, 1.0),  # n - c = 1 < k: every k-subset holds a success
        (6, 6, 6, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.pure
@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@"):
        pass_at_k(n, c, k)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("rate", "tier"),
    [(0.0, "unsolved"), (1e-9, "hard"), (0.3499, "hard"), (0.35, "medium"), (0.6999, "medium"), (0.7, "easy"),
     (0.9999, "easy"), (1.0, "trivial")],
)  # fmt: skip
def test_tier_boundaries(rate, tier):
    assert tier_of_pass_rate(rate) == tier


@pytest.mark.pure
def test_saturated_pass_at_k_is_easy_not_trivial_while_some_episodes_fail():
    assert tier_of_measured(pass_at_k(4, 3, 2), 4, 3) == "easy"  # pass@2 = 1.0, yet one of four failed
    assert tier_of_measured(pass_at_k(4, 4, 2), 4, 4) == "trivial"
    assert tier_of_measured(pass_at_k(4, 0, 2), 4, 0) == "unsolved"


@pytest.mark.pure
def test_measure_counts_only_ok_episodes_of_the_named_policy_version():
    episodes = [
        *group("a", [1.0, 0.0, 1.0, 0.0]),
        episode("a", None, sample=4, status="env_error"),  # broken infrastructure: not a failure of the task
        episode("a", None, sample=5, status="timeout"),
        *group("a", [1.0, 1.0], version="v0"),  # another version of the same policy
        *group("a", [1.0, 1.0], policy="gold"),
        *group("b", [0.0, 0.0, 0.0]),
        *group("c", [1.0]),  # fewer episodes than k: measured at k = n
    ]
    measured = measure_difficulty(episodes, "learner", "v1", k=2)
    assert set(measured) == {"a", "b", "c"}
    assert measured["a"] == Difficulty(tier="easy", pass_at_k=round(5 / 6, 6), k=2, policy_version="learner@v1")
    assert measured["b"] == Difficulty(tier="unsolved", pass_at_k=0.0, k=2, policy_version="learner@v1")
    assert measured["c"] == Difficulty(tier="trivial", pass_at_k=1.0, k=1, policy_version="learner@v1")
    assert measure_difficulty(episodes, "learner", "v1", k=1)["a"].tier == "medium"  # pass@1 = 0.5


@pytest.mark.pure
def test_measure_reads_the_stored_episodes_table_like_the_records(tmp_path):
    episodes = [
        *group("a", [1.0, 0.0, 0.0]),
        *group("b", [1.0, 1.0, 1.0]),
        episode("b", None, sample=3, status="env_error"),
    ]
    store = open_store(f"file://{tmp_path / 'store'}")
    datasets.write_rows(
        store, "episodes", [e.row() for e in episodes], EPISODE_SCHEMA, partition={"run": "r"}, part="0"
    )
    table = datasets.read_pandas(store, "episodes", filters={"policy": "learner"})
    assert measure_difficulty(table, "learner", "v1", k=2) == measure_difficulty(episodes, "learner", "v1", k=2)
    with pytest.raises(ValueError, match="lacks columns"):
        measure_difficulty(table.drop(columns=["status"]), "learner", "v1")


@pytest.mark.pure
def test_each_task_keeps_one_record_per_policy_version():
    tasks = tier_tasks([task("a"), task("b")])
    first = measure_difficulty(group("a", [0.0, 0.0]), "learner", "v1")
    again = measure_difficulty(group("a", [1.0, 0.0]), "learner", "v1")
    gold = measure_difficulty(group("a", [1.0, 1.0], policy="gold", version="scripted"), "gold", "scripted")
    a, b = tier_tasks(tier_tasks(tier_tasks(tasks, first), gold), again)
    assert [d.policy_version for d in a.difficulty] == [PROXY, "gold@scripted", "learner@v1"]
    assert a.difficulty[-1].tier == "medium"  # the newer measurement replaced the older one, and is last
    assert [d.policy_version for d in b.difficulty] == [PROXY]
    assert with_difficulty(a, proxy_difficulty(a)).difficulty.count(proxy_difficulty(a)) == 1


@pytest.mark.pure
def test_difficulty_for_falls_back_to_an_older_version_then_to_the_proxy():
    (a,) = tier_tasks([task("a")], measure_difficulty(group("a", [1.0, 0.0, 0.0, 0.0]), "learner", "v1"))
    assert difficulty_for(a, "learner@v1").pass_at_k == 0.25
    assert difficulty_for(a, "learner@v2").policy_version == "learner@v1"
    assert difficulty_for(a, "gold@scripted").policy_version == PROXY
    assert difficulty_for(task("bare"), "learner@v1") == proxy_difficulty(task("bare"))
    assert expected_pass_rate(Difficulty(tier="easy", pass_at_k=0.75, k=2)) == pytest.approx(0.5)  # 1 - 0.25^(1/2)
    assert expected_pass_rate(proxy_difficulty(a)) == 0.8  # a one-line fix: the "easy" prior


# --- live pass rates -----------------------------------------------------------------------------------------


@pytest.mark.pure
def test_live_pass_rates_follow_an_exponential_moving_average():
    first = update_pass_rates({}, [*group("a", [1.0, 0.0, 0.0, 0.0]), *group("b", [1.0, 1.0])], "learner", 0.5)
    assert first == {"a": 0.25, "b": 1.0}
    batch = [
        *group("a", [1.0, 1.0, 1.0, 0.0], version="v2"),  # the learner's next version still counts
        episode("a", None, sample=9, status="env_error"),
        *group("a", [0.0, 0.0], policy="noop"),
        *group("c", [0.0, 0.0]),
    ]
    assert update_pass_rates(first, batch, "learner", 0.5) == {"a": 0.5 * 0.25 + 0.5 * 0.75, "b": 1.0, "c": 0.0}
    assert count_outcomes(batch, "noop")["a"].n == 2


# --- the sampler ---------------------------------------------------------------------------------------------


def pool(spec: dict[float, int]) -> tuple[list[Task], dict[str, float]]:
    """``{rate: count}`` -> tasks and their live pass rates."""
    tasks, rates = [], {}
    for rate, count in spec.items():
        for i in range(count):
            tasks.append(task(f"t{rate:.2f}-{i}"))
            rates[tasks[-1].task_id] = rate
    return tasks, rates


def ids(tasks: list[Task]) -> list[str]:
    return [t.task_id for t in tasks]


@pytest.mark.pure
def test_same_seed_gives_the_same_batches():
    tasks, rates = pool({0.0: 10, 0.3: 10, 0.5: 10, 0.9: 10, 1.0: 10})
    config = SamplerConfig(groups=6)

    def batches(seed: int) -> list[list[str]]:
        sampler = BatchSampler(tasks, config, seed)
        return [ids(sampler.begin(rates)) for _ in range(5)]

    assert batches(7) == batches(7)
    assert batches(7) != batches(8)
    assert len(set(map(tuple, batches(7)))) > 1  # consecutive batches of one sampler differ


@pytest.mark.pure
def test_eval_tasks_are_never_sampled():
    sampler = BatchSampler([task("a"), task("held", split="eval")], SamplerConfig(groups=2), 0)
    assert ids(sampler.begin()) == ["a"]
    with pytest.raises(SamplerError, match="no train-split tasks"):
        BatchSampler([task("held", split="eval")], SamplerConfig(), 0)


@pytest.mark.pure
def test_zero_variance_groups_are_dropped_and_refilled_up_to_the_bound():
    tasks, rates = pool({0.5: 20})
    sampler = BatchSampler(tasks, SamplerConfig(groups=4, max_extra_draws=3), seed=1)
    first = sampler.begin(rates)
    mixed, solved, failed, broken = ids(first)
    refill = sampler.report({mixed: [1.0, 0.0], solved: [1.0, 1.0], failed: [0.0, 0.0, 0.0], broken: [1.0, None, None]})
    assert len(refill) == 3 and not set(ids(refill)) & set(ids(first))
    assert sampler.stats.dropped_zero_variance == 3
    more = sampler.report({refill[0].task_id: [0.0, 1.0], refill[1].task_id: [0.0, 0.0]})
    assert more == []  # two kept or pending of four, but the three extra draws are spent
    assert sampler.report({refill[2].task_id: [1.0, 1.0]}) == []
    stats = sampler.stats
    assert (stats.drawn, stats.kept, stats.dropped_zero_variance, stats.extra_draws) == (7, 2, 5, 3)
    assert ids(sampler.kept) == [mixed, refill[0].task_id]
    with pytest.raises(SamplerError, match="not drawn or were already reported"):
        sampler.report({mixed: [1.0, 0.0]})


@pytest.mark.pure
def test_refill_stops_when_the_batch_is_full():
    tasks, rates = pool({0.5: 20})
    sampler = BatchSampler(tasks, SamplerConfig(groups=3, max_extra_draws=10), seed=2)
    draw = sampler.begin(rates)
    rounds = 0
    while draw:  # the first two groups of every round come back all-equal
        rounds += 1
        draw = sampler.report(
            {t.task_id: [1.0, 1.0] if i < 2 and rounds < 3 else [0.0, 1.0] for i, t in enumerate(draw)}
        )
    assert sampler.stats.kept == 3 and len(sampler.kept) == 3
    assert sampler.stats.extra_draws == sampler.stats.dropped_zero_variance == 4


@pytest.mark.pure
def test_over_sampling_fills_the_batch_and_leaves_the_surplus_out():
    tasks, rates = pool({0.5: 20})
    sampler = BatchSampler(tasks, SamplerConfig(groups=4, oversample=1.5, max_extra_draws=4), seed=3)
    first = sampler.begin(rates)
    assert len(first) == 6  # ceil(4 * 1.5)
    assert sampler.report({t.task_id: [0.0, 1.0] for t in first}) == []
    stats = sampler.stats
    assert (stats.kept, stats.surplus, stats.rounds, stats.extra_draws, stats.exhausted) == (4, 2, 1, 2, "")
    assert ids(sampler.kept) == ids(first)[:4]


@pytest.mark.pure
def test_refills_over_sample_what_is_missing_until_the_budget_is_spent():
    tasks, rates = pool({0.5: 30})
    sampler = BatchSampler(tasks, SamplerConfig(groups=4, oversample=2.0, max_extra_draws=6), seed=4)
    first = sampler.begin(rates)
    assert len(first) == 8
    flat = {t.task_id: [1.0, 1.0] for t in first}
    flat[first[0].task_id] = [0.0, 1.0]
    refill = sampler.report(flat)
    assert len(refill) == 2  # three missing, doubled, but the budget (4 + 6 groups) has two left
    assert sampler.report({t.task_id: [0.0, 0.0] for t in refill}) == []
    stats = sampler.stats
    assert (stats.drawn, stats.budget, stats.kept, stats.rounds, stats.exhausted) == (10, 10, 1, 2, "budget")


@pytest.mark.pure
def test_a_batch_short_of_tasks_says_so():
    tasks, rates = pool({0.5: 3})
    sampler = BatchSampler(tasks, SamplerConfig(groups=4, max_extra_draws=8), seed=5)
    draw = sampler.begin(rates)
    assert sampler.report({t.task_id: [0.0, 1.0] for t in draw}) == []
    assert (sampler.stats.kept, sampler.stats.exhausted) == (3, "tasks")


@pytest.mark.pure
def test_batch_expected_pass_rate_is_kept_inside_the_band():
    tasks, rates = pool({1.0: 12, 0.95: 12, 0.5: 3, 0.1: 3})

    def mean_of(batch: list[Task]) -> float:
        return sum(rates[t.task_id] for t in batch) / len(batch)

    outside = {"below": 0, "above": 0}
    for seed in range(20):
        free = BatchSampler(tasks, SamplerConfig(groups=6, band=(0.0, 1.0)), seed).begin(rates)
        sampler = BatchSampler(tasks, SamplerConfig(groups=6, band=(0.4, 0.6)), seed)
        batch = sampler.begin(rates)
        assert 0.4 <= mean_of(batch) <= 0.6 and sampler.stats.in_band and len(batch) == 6
        assert sampler.stats.expected_pass_rate == pytest.approx(mean_of(batch), abs=1e-4)
        if 0.4 <= mean_of(free) <= 0.6:  # the same seed draws the same tasks; the band only swaps when it must
            assert (ids(batch), sampler.stats.band_swaps) == (ids(free), 0)
        else:
            outside["below" if mean_of(free) < 0.4 else "above"] += 1
            assert sampler.stats.band_swaps >= 1
    assert outside["below"] and outside["above"]


@pytest.mark.pure
def test_an_unreachable_band_is_reported_not_hidden():
    tasks, rates = pool({1.0: 5})
    sampler = BatchSampler(tasks, SamplerConfig(groups=3), 0)
    assert len(sampler.begin(rates)) == 3
    assert (sampler.stats.expected_pass_rate, sampler.stats.in_band) == (1.0, False)


@pytest.mark.pure
def test_tier_shares_weight_tiers_by_p_times_one_minus_p_with_a_floor():
    # weights: medium 0.5*0.5 = 0.25, easy 0.9*0.1 = 0.09, unsolved 0; spare = 1 - 3*0.05 = 0.85
    shares = tier_shares({"unsolved": [0.0, 0.0], "medium": [0.5], "easy": [0.9, 0.9]}, floor=0.05)
    assert shares == pytest.approx(
        {"unsolved": 0.05, "medium": 0.05 + 0.85 * 0.25 / 0.34, "easy": 0.05 + 0.85 * 0.09 / 0.34}
    )
    assert tier_shares({"trivial": [1.0], "unsolved": [0.0]}, floor=0.05) == {"unsolved": 0.5, "trivial": 0.5}
    assert tier_shares({}, floor=0.05) == {}


@pytest.mark.pure
def test_tier_mix_follows_live_pass_rates():
    tasks, rates = pool({0.0: 6, 0.5: 6, 0.9: 6, 1.0: 6})
    config = SamplerConfig(groups=1, band=(0.0, 1.0), tier_floor=0.05)

    def mix(live: dict[str, float]) -> Counter[str]:
        sampler = BatchSampler(tasks, config, seed=3)
        counts: Counter[str] = Counter()
        for _ in range(400):
            sampler.begin(live)
            counts.update(sampler.stats.tier_mix)
        return counts

    before = mix(rates)
    assert before["medium"] > before["easy"] > before["trivial"] and before["medium"] > before["unsolved"]
    assert before["medium"] / 400 == pytest.approx(0.05 + 0.8 * 0.25 / 0.34, abs=0.06)  # spare = 1 - 4 * 0.05
    assert before["unsolved"] >= 5 and before["trivial"] >= 5  # the floor: no tier starves
    # The learner masters the medium tasks and the unsolved ones open up: the mix moves with the rates.
    after = mix({t: {0.5: 1.0, 0.0: 0.4}.get(r, r) for t, r in rates.items()})
    assert after["medium"] > 0.5 * 400 and after["trivial"] < 0.1 * 400


@pytest.mark.pure
def test_sampler_config_rejects_an_inverted_band():
    with pytest.raises(ValueError, match="band"):
        SamplerConfig(band=(0.8, 0.2))


# --- real rollouts -------------------------------------------------------------------------------------------

ALWAYS, SOMETIMES, NEVER = {"ledgerlite-3"}, {"textkit-21", "schedwise-52"}, {"ledgerlite-6"}


class PartialPolicy:
    """Replays the fix on ALWAYS, on every other episode (even seeds) on SOMETIMES, never on NEVER."""

    name = "partial"
    version = "t1"

    def __init__(self, tasks: list[Task]) -> None:
        self.gold = GoldPolicy(tasks)

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        solves = view.task_id in ALWAYS or (view.task_id in SOMETIMES and seed % 2 == 0)
        return (self.gold if solves else NoopPolicy()).begin(view, seed)


@pytest.fixture(scope="module")
def bundled(bwrap_backend, base_image, tmp_path_factory):
    """Four bundled tasks, validated, and a Rollout over them."""
    tmp = tmp_path_factory.mktemp("curate")
    store = open_store(f"file://{tmp / 'store'}")
    snapshots = SnapshotStore(store, tmp / "cache")
    src = REPO_ROOT / "tasks_src"
    tasks, _ = ingest_github_issues(src / "tickets" / "github_issues.jsonl", src / "repos", snapshots)
    chosen = [t for t in tasks if t.task_id in ALWAYS | SOMETIMES | NEVER]
    with ThreadPoolExecutor(max_workers=2) as workers:
        valid = list(
            workers.map(
                lambda t: validate_task(t, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1)),
                chosen,
            )
        )
    assert [t.validation.valid for t in valid] == [True] * 4, [t.validation.reason for t in valid]
    runner = Rollout(
        backend=bwrap_backend,
        image=base_image.name,
        image_digest=base_image.digest,
        snapshots=snapshots,
        grader=Grader(bwrap_backend, base_image.name, base_image.digest, snapshots, Limits()),
        limits=Limits(),
        env_limits=EnvLimits(max_turns=12),
        lineage=Lineage("curate-test", 0, task_set_version(valid), "params", "code"),
    )
    return store, valid, runner


@pytest.mark.sandbox
@pytest.mark.slow
def test_tiers_and_batches_follow_real_rollouts_of_a_strong_and_a_weak_policy(bundled):
    store, tasks, runner = bundled
    gold, partial = GoldPolicy(tasks), PartialPolicy(tasks)
    episodes = run_batch(runner, tasks, [gold, partial], group_size=4, seed=0, concurrency=2)
    assert {e.status for e in episodes} == {"ok"}, [e.cause for e in episodes if e.status != "ok"]
    rows = [e.row() for e in episodes]
    datasets.write_rows(store, "episodes", rows, EPISODE_SCHEMA, partition={"run": "curate-test"}, part="0")
    stored = datasets.read_pandas(store, "episodes", filters={"policy": "partial"})

    strong = measure_difficulty(episodes, "gold", "scripted", k=2)
    weak = measure_difficulty(stored, "partial", "t1", k=2)
    assert {d.tier for d in strong.values()} == {"trivial"} and len(strong) == 4
    tier = {t: d.tier for t, d in weak.items()}
    assert {t: tier[t] for t in ALWAYS} == {t: "trivial" for t in ALWAYS}
    assert {t: tier[t] for t in NEVER} == {t: "unsolved" for t in NEVER}
    assert {weak[t].pass_at_k for t in SOMETIMES} == {round(5 / 6, 6)}  # 2 of 4 solved: 1 - C(2,2)/C(4,2)
    tiered = tier_tasks(tier_tasks(tasks, strong), weak)
    assert {tuple(d.policy_version for d in t.difficulty) for t in tiered} == {(PROXY, "gold@scripted", "partial@t1")}

    # Against the strong policy nothing is informative, and the sampler says so.
    sampler = BatchSampler(tiered, SamplerConfig(groups=2, max_extra_draws=2), seed=0)
    sampler.begin(policy="gold@scripted")
    assert (sampler.stats.expected_pass_rate, sampler.stats.in_band) == (1.0, False)

    # A cold batch for the weak policy (proxy priors only): real rollouts reveal which groups are all-equal;
    # those are dropped and replaced until both kept groups are mixed-outcome ones.
    draw, round_, batch = sampler.begin(), 0, []
    while draw:
        round_ += 1
        rolled = run_batch(runner, draw, [partial], group_size=2, seed=round_, concurrency=2)  # one even seed each
        batch += rolled
        draw = sampler.report(group_rewards(rolled, "partial"))
    stats = sampler.stats
    assert set(ids(sampler.kept)) == SOMETIMES
    assert stats.kept == 2 and stats.dropped_zero_variance == stats.extra_draws == stats.drawn - 2

    # Warm: live rates from that batch plus the measured records; batches now favour the mixed-outcome tasks.
    rates = update_pass_rates({}, batch, "partial", alpha=0.3)
    assert {t: rates[t] for t in SOMETIMES} == {t: 0.5 for t in SOMETIMES}
    assert all(rates[t] == 1.0 for t in ALWAYS & set(rates)) and all(rates[t] == 0.0 for t in NEVER & set(rates))

    def informative_share(live: dict[str, float], policy: str) -> float:
        drawn: Counter[str] = Counter()
        for _ in range(100):
            drawn.update(ids(sampler.begin(live, policy)))
            assert sampler.stats.in_band
        return sum(drawn[t] for t in SOMETIMES) / drawn.total()

    warm = informative_share(rates, "partial@t1")
    # Tiers now come from the measured pass@2 (5/6 for the mixed-outcome tasks: easy at k=2), shares by p(1-p).
    shares = sampler.stats.tier_shares
    assert shares["easy"] > 0.8 and set(shares) == {"trivial", "easy", "unsolved"}
    assert warm >= 0.8 and warm > informative_share({}, PROXY) + 0.2  # cold: proxy priors only
