"""The LM trainer on a tiny random GPT-2 (built here, nothing downloaded), and the bounded-staleness coordinator.

Episodes are made the way a local HF policy makes them: ``HFPolicy.sample`` draws each step's tokens and
records their log-probabilities, and each next prompt extends the last with made-up observation tokens.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
import torch

from trialforge.loop.staleness import train_bounded
from trialforge.store.objstore import open_store
from trialforge.store.records import EpisodeRecord, StepRecord
from trialforge.train.device import pick_device
from trialforge.train.lm import LMTrainer, OptimConfig, episode_sequences
from trialforge.train.loss import LossConfig

pytestmark = pytest.mark.pure

transformers = pytest.importorskip("transformers")

VOCAB, EOS = 48, 0


def tiny_model(seed: int = 0, dropout: float = 0.0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=96, n_embd=16, n_layer=2, n_head=2,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=EOS, eos_token_id=EOS,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def sampler(model):
    from trialforge.rollout.hf_policy import HFPolicy

    return HFPolicy(model, SimpleNamespace(eos_token_id=EOS), max_new_tokens=5, temperature=0.9)


def episode(policy, idx: int, group: str, reward: float | None, status: str = "ok", steps: int = 2) -> EpisodeRecord:
    gen = torch.Generator().manual_seed(idx)
    prompt = torch.randint(1, VOCAB, (6,), generator=gen).tolist()
    rows = []
    for k in range(steps):
        ids, lps, _ = policy.draw(prompt, gen)
        info = {"prompt_ids": prompt, "token_ids": ids, "token_logprobs": lps, "temperature": policy.temperature}
        rows.append(StepRecord("run", 0, f"e{idx}", k, "run", "{}", "obs", False, 0, 0, len(prompt), len(ids),
                               sum(lps), json.dumps(info)))  # fmt: skip
        prompt = prompt + ids + torch.randint(1, VOCAB, (4,), generator=gen).tolist()  # the observation
    return EpisodeRecord(
        "run", 0, f"e{idx}", "t", "ts", "easy", "hf", "v0", group, idx, idx, "bwrap", "", 0, status, "", "submitted",
        reward, "", "{}", "[]", "", steps, steps, 0, 0, 0, 0, 0, 0, 0, "", "", step_rows=rows,
    )  # fmt: skip


@pytest.fixture(scope="module")
def batch():
    policy = sampler(tiny_model())
    return [episode(policy, i, f"g{i // 2}", float(i % 2)) for i in range(4)]


def trainer(seed: int = 0, **kwargs) -> LMTrainer:
    kwargs = {"optim": OptimConfig(lr=1e-2), "device": pick_device("cpu"), **kwargs}
    return LMTrainer(tiny_model(seed, kwargs.pop("dropout", 0.0)), **kwargs)


def params(t: LMTrainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in t.model.parameters()])


def grads(t: LMTrainer) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None])


def test_cpu_is_picked_without_cuda_and_runs_float32():
    device = pick_device() if not torch.cuda.is_available() else pick_device("cpu")
    assert (device.kind, device.autocast_dtype, device.describe()) == ("cpu", None, "cpu float32")


def test_the_sequence_masks_exactly_the_generated_tokens(batch):
    ep = batch[0]
    (seq,) = episode_sequences(ep, 0)
    s0, s1 = (json.loads(s.info) for s in ep.step_rows)
    assert seq.ids == s1["prompt_ids"] + s1["token_ids"]
    expected_mask = [0] * 6 + [1] * len(s0["token_ids"]) + [0] * 4 + [1] * len(s1["token_ids"])
    assert seq.mask == expected_mask
    recorded = [lp for lp, m in zip(seq.logprobs, seq.mask, strict=True) if m]
    assert recorded == s0["token_logprobs"] + s1["token_logprobs"]


def test_a_prompt_that_does_not_extend_the_sequence_starts_a_new_one(batch):
    ep = batch[0]
    second = json.loads(ep.step_rows[1].info)
    second["prompt_ids"] = second["prompt_ids"][3:]  # the policy dropped old context
    ep2 = EpisodeRecord(**{**ep.__dict__, "step_rows": [ep.step_rows[0],
                        StepRecord(**{**ep.step_rows[1].__dict__, "info": json.dumps(second)})]})  # fmt: skip
    first, again = episode_sequences(ep2, 0)
    assert again.ids == second["prompt_ids"] + second["token_ids"] and sum(again.mask) == len(second["token_ids"])
    assert len(first.ids) == 6 + len(json.loads(ep.step_rows[0].info)["token_ids"])


def test_on_policy_logprobs_are_recomputed_exactly_and_observations_get_no_gradient(batch):
    t = trainer()
    rows = [r for i, ep in enumerate(batch) for r in episode_sequences(ep, i)]
    grads = []

    def keep_grad(module, inputs, logits):
        logits.register_hook(grads.append)

    t.model.lm_head.register_forward_hook(keep_grad)
    stats = t.update(batch)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)  # recomputed log-probs == the sampler's, token by token
    (g,) = grads  # d loss / d logits, [B, L, V]: row t predicts token t + 1
    for b, row in enumerate(rows):
        predicts_generated = torch.tensor(row.mask[1:], dtype=torch.bool)
        assert torch.all(g[b, : len(row.ids) - 1][~predicts_generated] == 0)  # prompt and observation targets
        assert torch.all(g[b, len(row.ids) - 1 :] == 0)  # padding
        assert g[b, : len(row.ids) - 1][predicts_generated].abs().sum() > 0


def test_non_ok_episodes_never_enter_the_loss(batch):
    policy = sampler(tiny_model())
    broken = [episode(policy, 10 + i, "g0", None, status="env_error") for i in range(2)]
    broken[0].step_rows[0].info = "{}"  # not even parsed
    a, b = trainer(), trainer()
    sa, sb = a.update(batch), b.update(batch + broken)
    assert torch.equal(params(a), params(b))
    assert (sb.excluded_not_ok, sb.episodes, sb.tokens) == (2, 6, sa.tokens)


def test_two_micro_batches_of_one_equal_one_of_two(batch):
    two = batch[:2]  # one group, rewards 0 and 1
    whole, split = trainer(), trainer(grad_accum_steps=2)
    s1, s2 = whole.update(two), split.update(two)
    assert s2.micro_batches == 2 and s1.micro_batches == 1
    assert s1.loss == pytest.approx(s2.loss, abs=1e-6) and s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4)
    assert torch.allclose(grads(whole), grads(split), atol=1e-7)  # not the weights: Adam's first step is ~lr*sign(g)


def test_the_gradient_is_clipped_to_max_grad_norm(batch):
    t = trainer(max_grad_norm=1e-3)
    stats = t.update(batch)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in t.model.parameters() if p.grad is not None]))
    assert stats.grad_norm > 1e-2 and float(after) <= 1e-3 * (1 + 1e-4)


def test_gradient_checkpointing_gives_the_same_update(batch):
    plain, ckpt = trainer(), trainer(gradient_checkpointing=True)
    plain.update(batch), ckpt.update(batch)
    assert ckpt.model.is_activation_checkpointing and torch.allclose(params(plain), params(ckpt), atol=1e-6)


def test_a_resumed_run_continues_bit_for_bit(batch, tmp_path):
    store = open_store(tmp_path.as_uri())
    pool = [batch[:2], batch[2:], batch[1::-1], batch[:1:-1]]  # the "data": pick 2 of 4 groups per step

    def step(t: LMTrainer) -> list[int]:
        picked = t.next_batch(len(pool), 2)
        assert t.update([ep for i in picked for ep in pool[i]]).grad_norm > 0  # clipping has not silenced the gradient
        return picked

    # dropout on: the torch RNG must be restored too; wide clip range: every token keeps its gradient
    knobs = {"optim": OptimConfig(lr=1e-3), "loss": LossConfig(clip_low=0.99, clip_high=100.0)}
    first = trainer(dropout=0.1, data_seed=7, **knobs)
    step(first), step(first)
    key = "checkpoints/run-a/lm-v2.pt"
    first.save(store, key)
    third = step(first)
    resumed = LMTrainer.load(store, key, device=pick_device("cpu"), **knobs)  # a full checkpoint is its own model
    assert resumed.version == 2
    assert step(resumed) == third and resumed.version == first.version == 3
    assert torch.equal(params(resumed), params(first))
    assert resumed.next_batch(len(pool), 2) == first.next_batch(len(pool), 2)


def test_a_stale_batch_is_importance_weighted_by_the_truncation_cap(batch):
    capped = LossConfig(tis_cap=1e-3)
    fresh, stale = trainer(loss=capped), trainer(loss=capped)
    stale.version = 3  # produced by v1, trained at v3: old log-probs recomputed, recorded ones are behaviour
    sf, ss = fresh.update(batch, behaviour_version=0), stale.update(batch, behaviour_version=1)
    assert not sf.stale and ss.stale
    assert ss.grad_norm <= 1.01e-3 * sf.grad_norm  # every token's weight exp(old - behaviour) is capped at 1e-3


@pytest.mark.parametrize("bound", [0, 2])
def test_rollouts_never_run_more_than_the_bound_behind(bound):
    """Each update waits until the producer has started every batch the bound allows: no clock involved."""
    batches = 12
    started: list[tuple[int, int]] = []  # (batch index, snapshot version it was rolled out with)
    progress = threading.Condition()

    def rollout(snapshot: int, index: int) -> int:
        with progress:
            started.append((index, snapshot))
            progress.notify_all()
        return snapshot

    def update(tagged):
        allowed = min(tagged.index + bound, batches - 1)  # the furthest batch the producer may start now
        with progress:
            assert progress.wait_for(lambda: len(started) > allowed, timeout=60), "the producer stopped short"
            assert len(started) == allowed + 1, "the producer ran past the bound"
        return tagged.index + 1, tagged.index + 1  # (snapshot, version): one version per update

    stats = train_bounded(rollout, update, snapshot=0, version=0, batches=batches, max_staleness=bound)
    assert stats.staleness == [min(i, bound) for i in range(batches)]  # ran ahead exactly to the bound, never past
    assert all(index - snapshot <= bound for index, snapshot in started)
    assert 0 <= stats.trainer_idle_fraction <= 1 and 0 <= stats.rollout_idle_fraction <= 1


def test_a_failed_rollout_is_raised_in_the_trainer():
    def rollout(snapshot, index):
        if index == 2:
            raise RuntimeError("sandbox pool gone")
        return index

    with pytest.raises(RuntimeError, match="sandbox pool gone"):
        train_bounded(rollout, lambda t: (0, t.index + 1), snapshot=0, version=0, batches=5, max_staleness=1)
