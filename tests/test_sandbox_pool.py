"""The pool: warm reuse that really resets, bounds that hold under load, group forks, creation retries."""

from __future__ import annotations

import json
import threading
import time

import pytest

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits
from trialforge.sandbox.pool import PoolConfig, SandboxPool

pytestmark = pytest.mark.sandbox

LIMITS = Limits(memory_mb=256, pids=64, disk_mb=16, exec_timeout_s=20)


@pytest.fixture
def seed(tmp_path):
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "task.txt").write_text("base\n")
    return tmp_path / "seed"


def test_released_sandbox_is_reused_with_a_clean_workspace(bwrap_backend, base_image, seed):
    pool = SandboxPool(bwrap_backend, LIMITS, PoolConfig(warm_per_image=1))
    try:
        with pool.sandbox(base_image.name, seed) as first:
            first.write_file("junk.txt", b"left over")
            first_id = first.id
        with pool.sandbox(base_image.name, seed) as second:
            assert second.id == first_id
            assert second.exec(["ls"]).stdout == "task.txt\n"
        assert (pool.stats.created, pool.stats.reused) == (1, 1)
    finally:
        pool.close()


def test_warm_sandboxes_live_longer_and_are_retired_before_they_could_outlive_their_deadline(
    bwrap_backend, base_image, seed
):
    """A reaper removes sandboxes past their deadline, in use or not: reuse must never cross one."""
    fresh_only = SandboxPool(bwrap_backend, LIMITS, PoolConfig(warm_per_image=0))
    before = time.time()
    with fresh_only.sandbox(base_image.name, seed) as once:  # deadlines bracketed by clock reads, not a slack
        assert before + LIMITS.episode_timeout_s <= once.deadline <= time.time() + LIMITS.episode_timeout_s
    fresh_only.close()

    warm = SandboxPool(bwrap_backend, LIMITS, PoolConfig(warm_per_image=1, warm_lifetime_s=7200))
    try:
        before = time.time()
        with warm.sandbox(base_image.name, seed) as first:
            assert before + 7200 <= first.deadline <= time.time() + 7200
            record = json.loads((first.home / "record.json").read_text())  # what reapers read
            assert record["deadline"] == first.deadline
        with warm.sandbox(base_image.name, seed) as again:
            assert again is first
        assert (warm.stats.reused, warm.stats.retired) == (1, 0)
    finally:
        warm.close()

    short = SandboxPool(
        bwrap_backend, LIMITS, PoolConfig(warm_per_image=1, warm_lifetime_s=LIMITS.episode_timeout_s - 1)
    )
    try:
        with short.sandbox(base_image.name, seed) as first:
            pass
        with short.sandbox(base_image.name, seed) as second:
            assert second is not first and not first.alive()
            assert second.exec(["cat", "task.txt"]).stdout == "base\n"
        assert (short.stats.created, short.stats.reused, short.stats.retired) == (2, 0, 1)
    finally:
        short.close()


def test_unhealthy_warm_sandbox_is_replaced(bwrap_backend, base_image, seed):
    pool = SandboxPool(bwrap_backend, LIMITS, PoolConfig(warm_per_image=1))
    try:
        with pool.sandbox(base_image.name, seed) as sb:
            doomed = sb
        doomed.close()  # dies while idle in the pool
        with pool.sandbox(base_image.name, seed) as fresh:
            assert fresh is not doomed
            assert fresh.exec(["cat", "task.txt"]).stdout == "base\n"
        assert pool.stats.unhealthy == 1
    finally:
        pool.close()


def test_concurrency_never_exceeds_the_bound(bwrap_backend, base_image, seed):
    pool = SandboxPool(bwrap_backend, LIMITS, PoolConfig(max_sandboxes=3, max_starting=2))
    live = peak = 0
    lock = threading.Lock()

    def episode() -> None:
        nonlocal live, peak
        with pool.sandbox(base_image.name, seed) as sb:
            with lock:
                live += 1
                peak = max(peak, live)
            sb.exec(["sleep", "0.2"])
            with lock:
                live -= 1

    threads = [threading.Thread(target=episode) for _ in range(10)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert peak == 3
        assert pool._live <= 3
    finally:
        pool.close()
    assert pool._live == 0


def test_group_fork_starts_every_member_from_the_post_setup_state(bwrap_backend, base_image, seed):
    pool = SandboxPool(bwrap_backend, LIMITS)
    group = pool.fork_group(base_image.name, seed, 4, setup=lambda sb: sb.exec(["sh", "-c", "echo ready > setup.txt"]))
    try:
        assert len({sb.id for sb in group}) == 4
        for i, sb in enumerate(group):
            assert sb.read_file("setup.txt") == b"ready\n"
            sb.write_file("mine.txt", str(i).encode())
        assert [sb.read_file("mine.txt") for sb in group] == [b"0", b"1", b"2", b"3"]
    finally:
        for sb in group:
            pool.release(sb, base_image.name)
        pool.close()


class FlakyBackend:
    """Fails the first ``failures`` creations: a real backend whose engine hiccups."""

    def __init__(self, inner, failures: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.failures = failures
        self.calls = 0

    def create(self, spec):
        self.calls += 1
        if self.calls <= self.failures:
            raise SandboxError("engine refused to start the container", cause="start")
        return self.inner.create(spec)


def test_creation_is_retried_with_backoff(bwrap_backend, base_image, seed):
    flaky = FlakyBackend(bwrap_backend, failures=2)
    pool = SandboxPool(flaky, LIMITS, PoolConfig(create_retries=3, backoff_s=0.01))
    try:
        with pool.sandbox(base_image.name, seed) as sb:
            assert sb.exec(["cat", "task.txt"]).stdout == "base\n"
        assert flaky.calls == 3 and pool.stats.create_failures == 2
        # The waits chosen: 0.01 then 0.02, each plus jitter up to as much again.
        assert 0.03 <= pool.stats.create_wait_s <= 0.06
    finally:
        pool.close()


def test_creation_gives_up_with_a_cause_after_its_retries(bwrap_backend, base_image, seed):
    pool = SandboxPool(FlakyBackend(bwrap_backend, failures=5), LIMITS, PoolConfig(create_retries=2, backoff_s=0.01))
    with pytest.raises(SandboxError, match="after 2 attempts") as err:
        pool.acquire(base_image.name, seed)
    assert err.value.cause == "start" and pool.stats.create_failures == 2
    assert pool._live == 0
    pool.close()
