"""Cost accounting over episode rows: what each figure divides by, and who pays for the failures."""

from __future__ import annotations

import pandas as pd
import pytest

from trialforge.config import Prices, load_params
from trialforge.errors import ConfigError
from trialforge.observe.cost import CostRates, cost_metrics, run_costs

pytestmark = pytest.mark.pure

RATES = CostRates(
    cpus=2.0, memory_gb=0.5, prices=Prices(cpu_hour=3.6, memory_gb_hour=7.2, gpu_hour=36.0, per_million_tokens=2.0)
)


def episodes() -> pd.DataFrame:
    """Four episodes of one iteration: two valid (rewards 1 and 0), an env_error and a timeout."""
    rows = [
        ("ok", 1.0, "", "easy", 100.0, 10.0, 1, 1000, 500),
        ("ok", 0.0, "", "hard", 50.0, 5.0, 1, 0, 0),
        ("env_error", None, "start: cannot start sandbox", "hard", 30.0, 0.0, 2, 0, 0),
        ("timeout", None, "episode wall time exceeded", "easy", 20.0, 0.0, 1, 0, 0),
    ]
    columns = ["status", "reward", "cause", "tier", "duration_s", "verify_s", "attempt", "tokens_in", "tokens_out"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.assign(iteration=0)


def test_a_valid_trajectory_carries_the_cost_of_the_failed_ones() -> None:
    cost = cost_metrics(episodes(), RATES, gpu_s=100.0)
    totals = cost["totals"]
    assert (
        totals["sandbox_s"] == 200.0 and totals["reserved_cpu_s"] == 400.0 and totals["reserved_memory_gb_s"] == 100.0
    )
    assert totals["verify_s"] == 15.0 and totals["retries"] == 1 and totals["tokens"] == 1500
    # 400 CPU-s at 3.6/h = 0.4; 100 GB-s at 7.2/h = 0.2; 1,500 tokens at 2/M = 0.003; 100 GPU-s at 36/h = 1.0
    assert totals["money"] == pytest.approx(0.603) and cost["money"] == pytest.approx(1.603)
    assert cost["valid"] == 2 and cost["per_valid_trajectory"]["sandbox_s"] == 100.0  # all 200 s over 2 valid
    assert cost["per_valid_trajectory"]["all_in"] == pytest.approx(0.8015)
    assert cost["per_unit_reward"]["all_in"] == pytest.approx(1.603)  # one unit of reward in all
    assert cost["per_episode"]["sandbox_s"] == 50.0
    assert cost["wasted_sandbox_share"] == pytest.approx(0.25)  # 50 of 200 sandbox-seconds gave nothing


def test_cost_splits_by_tier_and_by_failure_cause() -> None:
    cost = cost_metrics(episodes(), RATES)
    assert {t: (g["episodes"], g["valid"], g["sandbox_s"]) for t, g in cost["by_tier"].items()} == {
        "easy": (2, 1, 120.0),
        "hard": (2, 1, 80.0),
    }
    assert cost["by_tier"]["easy"]["sandbox_s_per_valid"] == 120.0
    assert {c: g["sandbox_s"] for c, g in cost["by_failure"].items()} == {
        "environment:start": 30.0,
        "timeout:episode wall time exceeded": 20.0,
    }


def test_no_valid_trajectory_or_reward_gives_no_ratio_rather_than_a_division_by_zero() -> None:
    failed = episodes().iloc[2:]
    cost = cost_metrics(failed, RATES)
    assert cost["valid"] == 0 and cost["per_valid_trajectory"]["all_in"] is None
    assert cost["per_unit_reward"]["money"] is None and cost["wasted_sandbox_share"] == 1.0
    assert cost_metrics(failed.iloc[:0], RATES) == {"episodes": 0}


def test_gpu_time_is_priced_from_cuda_updates_per_iteration_only() -> None:
    updates = [
        {"iteration": 0, "device": "cuda:0 (NVIDIA H200) bf16 autocast", "seconds": 360.0},
        {"iteration": 1, "device": "cpu float32", "seconds": 900.0},
    ]
    run = run_costs(episodes(), RATES, updates)
    assert run["overall"]["totals"]["training_gpu_s"] == 360.0
    assert run["iterations"]["0"]["totals"]["training_money"] == pytest.approx(3.6)


def test_prices_come_from_params_checked_and_never_change_a_runs_digest() -> None:
    priced = load_params(None, {"observe.prices": {"cpu_hour": 0.05, "currency": "EUR"}, "sandbox.memory_mb": 2048})
    rates = CostRates.from_params(priced)
    assert (rates.prices.cpu_hour, rates.prices.currency, rates.memory_gb, rates.cpus) == (0.05, "EUR", 2.0, 1.0)
    assert priced.digest() == load_params(None, {"sandbox.memory_mb": 2048}).digest()
    for bad in ({"cpu_hour": -1}, {"currency": "dollars"}, {"per_gpu": 1}):
        with pytest.raises(ConfigError, match=r"observe\.prices"):
            load_params(None, {"observe.prices": bad})


def test_used_cpu_is_counted_over_the_measured_episodes_only_and_unknown_is_not_zero() -> None:
    measured = episodes().assign(cpu_s=[4.0, 2.0, None, 1.0], verify_cpu_s=[2.0, 1.0, 0.0, 0.0])
    cost = cost_metrics(measured, RATES)
    assert cost["totals"]["used_cpu_s"] == 10.0 and cost["cpu_measured"] == 3  # the env_error's sandbox was lost
    assert cost["per_episode"]["used_cpu_s"] == pytest.approx(10 / 3, rel=1e-5)  # six significant digits
    # the valid ones carry the timeout's CPU too: 10 CPU-s over the 2 valid, and over 1 unit of reward
    assert cost["per_valid_trajectory"]["used_cpu_s"] == 5.0 and cost["per_unit_reward"]["used_cpu_s"] == 10.0
    assert cost["cpu_used_share"] == pytest.approx(10 / 340, rel=1e-5)  # of 2 CPUs x (100 + 50 + 20) s reserved
    unmeasured = cost_metrics(episodes(), RATES)  # rows from before the counters (no columns at all)
    assert unmeasured["totals"]["used_cpu_s"] is None and unmeasured["cpu_measured"] == 0
    assert unmeasured["cpu_used_share"] is None and unmeasured["per_episode"]["used_cpu_s"] is None
