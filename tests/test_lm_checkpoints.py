"""The LM learner's LoRA option and its checkpoints: Hugging Face directories in the object store that plain
transformers and peft load, a manifest written last that commits them, and an exact resume either way.

Tiny GPT-2 models only: the random one built in ``test_train_lm`` and the saved one of the ``tiny_lm`` fixture
(with a tokenizer). The store is a real ``FileStore``.
"""

from __future__ import annotations

import json
from pathlib import Path

import peft
import pytest
import torch
import transformers
from test_train_lm import episode, sampler, tiny_model

from trialforge.config import load_params
from trialforge.errors import ConfigError, StoreError
from trialforge.loop.learner import LMLearner, open_learner
from trialforge.store.objstore import FileStore, ObjectStore, open_store
from trialforge.train.device import pick_device
from trialforge.train.hf_checkpoint import MANIFEST, checkpoint_prefix
from trialforge.train.lm import LMTrainer, OptimConfig
from trialforge.train.loss import LossConfig
from trialforge.train.settings import LoraParams

pytestmark = pytest.mark.pure

CPU = pick_device("cpu")
KEY = "checkpoints/run-a/lm-v1.pt"
LORA = LoraParams(r=4, alpha=8)


@pytest.fixture(scope="module", autouse=True)
def one_thread(tiny_lm):
    """Every test runs with the ``tiny_lm`` fixture's single torch thread (tiny models, two busy cores)."""


@pytest.fixture(scope="module")
def batch():
    policy = sampler(tiny_model())
    return [episode(policy, i, f"g{i // 2}", float(i % 2)) for i in range(4)]


def store_at(tmp_path: Path) -> ObjectStore:
    return open_store((tmp_path / "store").as_uri())


def download(store: ObjectStore, prefix: str, dest: Path) -> Path:
    """The objects under ``prefix`` as files under ``dest``, as any S3 or file copy would give them."""
    for key in store.list(prefix):
        store.get_file(key, dest / key.removeprefix(prefix))
    return dest


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 17, 3, 40, 22, 9, 31, 2]])


def test_a_full_checkpoint_loads_with_plain_transformers_and_gives_the_same_logits(batch, tiny_lm, tmp_path):
    path, _, tokenizer = tiny_lm
    store = store_at(tmp_path)
    trainer = LMTrainer(str(path), OptimConfig(lr=1e-2), device=CPU)
    trainer.update(batch)
    manifest = trainer.save(store, KEY)

    prefix = checkpoint_prefix(KEY)
    assert prefix == "checkpoints/run-a/lm-v1/"
    local = download(store, prefix, tmp_path / "copy")
    model = transformers.AutoModelForCausalLM.from_pretrained(local / "model")  # no trialforge code
    assert torch.equal(logits(model, IDS), logits(trainer.model, IDS))
    assert not torch.equal(logits(model, IDS), logits(transformers.AutoModelForCausalLM.from_pretrained(path), IDS))
    again = transformers.AutoTokenizer.from_pretrained(local / "model")  # the base model's tokenizer came along
    assert again.encode("def f(): pass") == tokenizer.encode("def f(): pass")

    state = torch.load(local / "trainer.pt", weights_only=True)
    assert (state["version"], state["cursor"], state["data_seed"]) == (1, 0, 0) and state["optimizer"]["state"]
    listed = json.loads((local / MANIFEST).read_text())
    assert (listed["kind"], listed["base_model"], listed["version"]) == ("full", str(path), 1) == (
        manifest.kind, manifest.base_model, manifest.version,
    )  # fmt: skip
    assert {"model/config.json", "model/model.safetensors", "model/tokenizer.json", "trainer.pt"} <= set(
        listed["files"]
    )
    assert sorted(k.removeprefix(prefix) for k in store.list(prefix)) == sorted([*listed["files"], MANIFEST])
    for name, entry in listed["files"].items():
        assert (local / name).stat().st_size == entry["size"] and len(entry["sha256"]) == 64


def test_a_lora_checkpoint_holds_only_adapters_and_loads_with_plain_peft(batch, tiny_lm, tmp_path):
    path, _, _ = tiny_lm
    store = store_at(tmp_path)
    trainer = LMTrainer(str(path), OptimConfig(lr=1e-2), device=CPU, lora=LORA)
    trainer.update(batch)
    assert trainer.save(store, KEY).kind == "lora"

    local = download(store, checkpoint_prefix(KEY), tmp_path / "copy")
    files = {p.name for p in (local / "model").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    assert (local / "model/adapter_model.safetensors").stat().st_size < (path / "model.safetensors").stat().st_size
    adapter = json.loads((local / "model/adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["base_model_name_or_path"]) == (4, 8, str(path))

    base = transformers.AutoModelForCausalLM.from_pretrained(path)
    untrained = logits(base, IDS)
    model = peft.PeftModel.from_pretrained(base, local / "model")  # no trialforge code
    assert torch.equal(logits(model, IDS), logits(trainer.model, IDS))
    assert not torch.equal(logits(model, IDS), untrained)


def test_lora_trains_only_the_adapters_and_changes_the_output(batch):
    trainer = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU, lora=LORA)
    named = dict(trainer.model.named_parameters())
    trainable = sorted(n for n, p in named.items() if p.requires_grad)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trainable)
    frozen = {n: p.detach().clone() for n, p in named.items() if not p.requires_grad}
    adapters = {n: named[n].detach().clone() for n in trainable}
    before = logits(trainer.model, IDS)

    assert trainer.update(batch).grad_norm > 0
    assert all(torch.equal(named[n], w) for n, w in frozen.items())  # the base model, bit for bit
    assert any(not torch.equal(named[n], w) for n, w in adapters.items())
    assert not torch.allclose(logits(trainer.model, IDS), before)


def test_lora_samples_with_the_weights_it_trains_and_copies_only_the_adapters(batch):
    trainer = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU, lora=LORA)
    trainer.update(batch)  # adapters B start at zero: one step makes them matter
    policy = sampler(trainer.sampling_copy())
    fresh = [episode(policy, 20 + i, f"h{i // 2}", float(i % 2)) for i in range(4)]
    snapshot = trainer.snapshot()
    frozen = {n for n, p in trainer.model.named_parameters() if not p.requires_grad}
    copied = dict(policy.model.named_parameters())
    assert all(copied[n] is p for n, p in trainer.model.named_parameters() if n in frozen)  # shared, not copied
    sampled = logits(policy.model, IDS)

    stats = trainer.update(fresh)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-4)  # the trainer rescored what the copy sampled, exactly
    assert torch.equal(logits(policy.model, IDS), sampled)  # the update left the rollout copy alone
    worker = LMTrainer(tiny_model(), device=CPU, lora=LORA).model
    worker.load_state_dict(snapshot)  # a snapshot loads into a copy of the model, strictly
    assert torch.equal(logits(worker, IDS), sampled)


def test_gradient_checkpointing_gives_the_same_lora_update(batch):
    plain = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU, lora=LORA)
    ckpt = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU, lora=LORA, gradient_checkpointing=True)
    plain.update(batch), ckpt.update(batch)
    assert ckpt.model.is_activation_checkpointing
    for (name, a), (_, b) in zip(plain.model.named_parameters(), ckpt.model.named_parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_resumed_lora_run_continues_bit_for_bit(batch, tmp_path):
    store = store_at(tmp_path)
    pool = [batch[:2], batch[2:], batch[1::-1], batch[:1:-1]]
    knobs = {
        "optim": OptimConfig(lr=1e-3), "loss": LossConfig(clip_low=0.99, clip_high=100.0), "device": CPU,
        "lora": LoraParams(r=4, alpha=8, dropout=0.1),  # adapter dropout too: the torch RNG must be restored
    }  # fmt: skip

    def step(t: LMTrainer) -> list[int]:
        picked = t.next_batch(len(pool), 2)
        assert t.update([ep for i in picked for ep in pool[i]]).grad_norm > 0
        return picked

    first = LMTrainer(tiny_model(0, dropout=0.1), data_seed=7, **knobs)
    step(first), step(first)
    first.save(store, "checkpoints/run-a/lm-v2.pt")
    third = step(first)
    resumed = LMTrainer.load(store, "checkpoints/run-a/lm-v2.pt", tiny_model(0, dropout=0.1), **knobs)
    assert resumed.kind == "lora" and resumed.version == 2
    assert step(resumed) == third and resumed.version == first.version == 3
    for (name, a), (_, b) in zip(first.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.next_batch(len(pool), 2) == first.next_batch(len(pool), 2)


def test_the_lm_learner_takes_lora_from_params_and_resumes_it(batch, tiny_lm, tmp_path):
    path, _, _ = tiny_lm
    params = load_params(None, {"train.model": str(path), "train.lr": 1e-3, "train.lora.r": 4, "train.lora.alpha": 8})
    store = store_at(tmp_path)
    learner = LMLearner(params, store, None)
    assert learner.trainer.kind == "lora"
    learner.update(batch, behaviour_version=0)
    learner.save(store, KEY)
    resumed = open_learner(params, store, KEY)
    assert resumed.version == 1 and resumed.trainer.kind == "lora"  # type: ignore[attr-defined]
    policy = resumed.policy()
    assert policy.version == "v1" and torch.equal(logits(policy.model, IDS), logits(learner.trainer.model, IDS))

    full = load_params(None, {"train.model": str(path), "train.lr": 1e-3})  # the setting changed under the run
    with pytest.raises(ConfigError, match=r"holds LoRA adapters of r=4, alpha=8, but full fine-tuning \(no LoRA\)"):
        open_learner(full, store, KEY)
    wider = load_params(None, {"train.model": str(path), "train.lr": 1e-3, "train.lora.r": 8, "train.lora.alpha": 8})
    with pytest.raises(ConfigError, match=r"r=4, alpha=8, but LoRA of r=8, alpha=8 was asked for"):
        open_learner(wider, store, KEY)


# --- what is refused --------------------------------------------------------------------------------


def saved(tmp_path: Path, batch) -> tuple[FileStore, LMTrainer]:
    store = store_at(tmp_path)
    trainer = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU)
    trainer.update(batch)
    trainer.save(store, KEY)
    return store, trainer  # type: ignore[return-value]


def test_a_checkpoint_without_its_manifest_does_not_exist(batch, tmp_path):
    store, _ = saved(tmp_path, batch)
    store.delete(checkpoint_prefix(KEY) + MANIFEST)
    assert store.list(checkpoint_prefix(KEY))  # every other file is there
    with pytest.raises(StoreError, match=r"no checkpoint at 'checkpoints/run-a/lm-v1.pt': .*manifest.json is missing"):
        LMTrainer.load(store, KEY, device=CPU)


def test_a_save_that_stops_part_way_leaves_no_checkpoint_even_over_an_old_one(batch, tmp_path):
    store, trainer = saved(tmp_path, batch)

    class Failing(FileStore):
        def put_file(self, key: str, path: Path) -> None:
            if key.endswith("trainer.pt"):
                raise StoreError("disk full")
            super().put_file(key, path)

    trainer.update(batch)
    with pytest.raises(StoreError, match="disk full"):
        trainer.save(Failing(store.root), KEY)  # new model files written, the old manifest no longer stands
    with pytest.raises(StoreError, match=r"manifest\.json is missing"):
        LMTrainer.load(store, KEY, device=CPU)


@pytest.mark.parametrize("name", ["model/model.safetensors", "trainer.pt"])
def test_a_corrupted_file_is_refused_by_name(batch, tmp_path, name):
    store, _ = saved(tmp_path, batch)
    target = store.root / checkpoint_prefix(KEY) / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=rf"corrupt: \S+/lm-v1/{name} has \d+ bytes with sha256"):
        LMTrainer.load(store, KEY, device=CPU)


def test_a_lora_checkpoint_needs_a_base_model(tmp_path):
    store = store_at(tmp_path)
    trainer = LMTrainer(tiny_model(), OptimConfig(lr=1e-2), device=CPU, lora=LORA)  # built in memory: no path
    trainer.save(store, KEY)
    with pytest.raises(ConfigError, match="manifest names no base model directory"):
        LMTrainer.load(store, KEY, device=CPU)
    with pytest.raises(ConfigError, match="holds LoRA adapters of r=4, alpha=8, but full fine-tuning"):
        LMTrainer.load(store, KEY, tiny_model(), device=CPU, lora=None)
    assert LMTrainer.load(store, KEY, tiny_model(), device=CPU).kind == "lora"  # no lora given: what it holds


def test_a_full_checkpoint_is_not_resumed_as_lora(batch, tmp_path):
    store, _ = saved(tmp_path, batch)
    with pytest.raises(ConfigError, match=r"holds a full model, but LoRA of r=4, alpha=8 was asked for"):
        LMTrainer.load(store, KEY, device=CPU, lora=LORA)


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        ({"r": -1}, r"train.lora.r: Input should be greater than or equal to 0"),
        ({"alpha": 0}, r"train.lora.alpha: Input should be greater than or equal to 1"),
        ({"dropout": 1.0}, r"train.lora.dropout: Input should be less than 1"),
        ({"target_modules": "q_proj"}, r"'q_proj' is neither 'all-linear' nor a list"),
        ({"target_modules": []}, r"an empty list adapts nothing"),
        ({"target_modules": ["q_proj", ""]}, r"module names must be non-empty strings"),
        ({"target_modules": ["q_proj", "q_proj"]}, r"names a module more than once"),
        ({"rank": 8}, r"train.lora.rank: Extra inputs are not permitted"),
    ],
)
def test_bad_lora_settings_are_refused(lora, message):
    knobs = {"train.model": "models/x", "train.lr": 1e-6} | {f"train.lora.{k}": v for k, v in lora.items()}
    with pytest.raises(ConfigError, match=message):
        load_params(None, knobs)


def test_lora_needs_a_language_model_and_modules_it_has():
    with pytest.raises(ConfigError, match=r"train.lora.r=8 adds LoRA adapters .* but train.model is empty"):
        load_params(None, {"train.lora.r": 8})
    lora = load_params(None, {"train.model": "m", "train.lr": 1e-6, "train.lora.r": 8}).train.lora
    assert (lora.r, lora.alpha, lora.dropout, lora.target_modules) == (8, 32, 0.0, "all-linear")
    with pytest.raises(ConfigError, match=r"cannot add LoRA adapters to GPT2LMHeadModel: .*q_proj"):
        LMTrainer(tiny_model(), device=CPU, lora=LoraParams(r=4, target_modules=["q_proj"]))
    assert LMTrainer(tiny_model(), device=CPU, lora=LoraParams(r=0)).kind == "full"  # rank 0: no adapters
