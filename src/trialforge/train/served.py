"""Each version of the LM learner reaching the inference server its rollouts sample from (``train.inference``).

A rollout of version N (checkpoint ``checkpoints/RUN/lm-vN.pt``; None: the untrained base) samples through
``served_policy``, an OpenAI-compatible policy that records token ids for the trainer and whose first episode makes
sure the server holds version N (``WeightSync.ensure``), in whichever process it runs. With ``api: vllm`` each version
is a LoRA adapter ``RUN/lm-vN`` (those more than ``max_staleness + 1`` versions old are unloaded); with
``api: sglang`` full weights are swapped in place (``max_staleness`` 0) and named in ``weights_dir/current`` for a
restarted server. Step rows carry the learner's version tag (``vN``) whatever the server calls it.
Routes, reloads and restarts: docs/inference-server.md, "Training through a server: `train.inference`".
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from trialforge.errors import ConfigError, InferenceError
from trialforge.rollout.context import ContextParams
from trialforge.rollout.openai_policy import OpenAIPolicy
from trialforge.rollout.policies import EpisodePolicy, TaskView
from trialforge.store.objstore import ObjectStore
from trialforge.train import hf_checkpoint
from trialforge.train.settings import InferenceParams, TrainParams

log = logging.getLogger(__name__)

CURRENT = "current"  # in weights_dir: the full-weight directory last published
_VERSION = re.compile(r"^(?P<run>.+)/(?P<learner>[^/]+)-v(?P<version>\d+)$")


def weights_root(train: TrainParams, out_dir: str) -> Path:
    """Where versions are written for the server: ``train.inference.weights_dir``, else ``OUT_DIR/served-weights``."""
    spec = train.inference
    return Path(spec.weights_dir or Path(out_dir) / "served-weights").resolve()


def current_full_weights(root: Path) -> str | None:
    """The full-weight directory last published under ``root``, if any."""
    try:
        return (root / CURRENT).read_text().strip() or None
    except OSError:
        return None


def served_name(checkpoint: str) -> str:
    """``checkpoints/RUN/lm-vN.pt`` -> ``RUN/lm-vN``: the adapter's name on the server."""
    return hf_checkpoint.checkpoint_prefix(checkpoint).removeprefix("checkpoints/").rstrip("/")


class WeightSync:
    """Puts a version on the server and names it; safe across threads, idempotent across processes."""

    def __init__(self, spec: InferenceParams, model: str, root: Path, max_staleness: int) -> None:
        self.spec = spec
        self.base_name = spec.model_name or model
        self.model = model
        self.root = root
        self.max_staleness = max_staleness
        self.server = spec.url.removesuffix("/v1")  # SGLang's routes are at the root, vLLM's under /v1
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=spec.timeout_s, headers=spec.headers())

    def ensure(self, store: ObjectStore | None, checkpoint: str | None) -> str:
        """The name to sample version ``checkpoint`` under, once the server holds it (``InferenceError`` if the
        server cannot be reached or refuses the weights)."""
        retrying = Retrying(
            retry=retry_if_exception_type(httpx.HTTPError),  # down, restarting, or answering 5xx meanwhile
            stop=stop_after_attempt(self.spec.max_retries + 1),  # 1, 2, 4 ... 30 s apart: a restart fits
            wait=wait_exponential(multiplier=1.0, max=30.0),
            reraise=True,
        )
        with self._lock:
            try:
                return retrying(self._ensure, store, checkpoint)
            except httpx.HTTPError as exc:
                raise InferenceError(f"{self.spec.url} could not be reached to load new weights: {exc}") from exc

    def _ensure(self, store: ObjectStore | None, checkpoint: str | None) -> str:
        if self.spec.api == "vllm":
            return self._adapter(store, checkpoint)
        self._full(store, checkpoint)
        return self.base_name

    # --- LoRA adapters (vLLM) ------------------------------------------------------------------
    def _adapter(self, store: ObjectStore | None, checkpoint: str | None) -> str:
        if checkpoint is None:
            return self.base_name
        name = served_name(checkpoint)
        loaded = self._models()
        if name in loaded:
            return name
        path = self._materialize(store, checkpoint)
        load = {"lora_name": name, "lora_path": str(path)}
        answer = self._client.post(f"{self.spec.url}/load_lora_adapter", json=load)
        if answer.status_code != 200 and "already" not in answer.text:  # another process loaded it first
            raise InferenceError(f"{self.spec.url} refused adapter {name} from {path}: HTTP {answer.status_code}: "
                                 f"{answer.text[:300]}")  # fmt: skip
        log.info("inference server holds %s (%s)", name, path)
        self._unload_older(name, loaded)
        return name

    def _unload_older(self, name: str, loaded: set[str]) -> None:
        """Unload this run's adapters more than ``max_staleness + 1`` versions behind ``name``: no rollout uses them."""
        newest = _VERSION.match(name)
        assert newest is not None  # served_name of a checkpoint key
        oldest_kept = int(newest["version"]) - self.max_staleness - 1
        for other in loaded:
            old = _VERSION.match(other)
            if old and old["run"] == newest["run"] and int(old["version"]) < oldest_kept:
                self._client.post(f"{self.spec.url}/unload_lora_adapter", json={"lora_name": other})

    def _models(self) -> set[str]:
        answer = self._client.get(f"{self.spec.url}/models")
        answer.raise_for_status()
        return {str(m.get("id")) for m in answer.json().get("data", [])}

    # --- full weights (SGLang) -----------------------------------------------------------------
    def _full(self, store: ObjectStore | None, checkpoint: str | None) -> None:
        path = str(self._materialize(store, checkpoint)) if checkpoint else str(Path(self.model).resolve())
        info = self._client.get(f"{self.server}/get_model_info")
        if info.status_code == 200 and info.json().get("model_path") == path:
            return
        answer = self._client.post(f"{self.server}/update_weights_from_disk", json={"model_path": path})
        if answer.status_code != 200 or not _json(answer).get("success", False):
            raise InferenceError(f"{self.server} refused the weights in {path}: HTTP {answer.status_code}: "
                                 f"{answer.text[:300]}")  # fmt: skip
        tmp = self.root / f"{CURRENT}.part"
        self.root.mkdir(parents=True, exist_ok=True)
        tmp.write_text(path)
        tmp.replace(self.root / CURRENT)
        log.info("inference server holds the weights in %s", path)

    # --- the weights on disk -------------------------------------------------------------------
    def _materialize(self, store: ObjectStore | None, checkpoint: str) -> Path:
        """The checkpoint's ``model/`` directory under ``weights_dir`` (copied there once, whole or not at all)."""
        target = self.root / served_name(checkpoint)
        if target.is_dir():
            return target
        if store is None:
            raise ConfigError(f"checkpoint {checkpoint} is not under {self.root} and no store was given to fetch it")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part-{os.getpid()}-{threading.get_ident()}")
        with hf_checkpoint.downloaded(store, checkpoint) as (_, root):
            shutil.copytree(root / hf_checkpoint.MODEL_DIR, partial, dirs_exist_ok=True)
        try:
            partial.rename(target)
        except OSError:  # another process put it there first
            shutil.rmtree(partial, ignore_errors=True)
        return target


def _json(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class ServedPolicy:
    """The learner at one version, sampled by the inference server; each episode's first request waits until the
    server holds that version."""

    def __init__(self, sync: WeightSync, store: ObjectStore | None, checkpoint: str | None, policy: OpenAIPolicy):
        self.sync, self.store, self.checkpoint = sync, store, checkpoint
        self.policy = policy
        self.name, self.version = policy.name, policy.version
        policy.on_missing_model = self.load
        self._ready = False

    def load(self) -> None:
        self.policy.model = self.sync.ensure(self.store, self.checkpoint)
        self._ready = True

    def begin(self, view: TaskView, seed: int) -> EpisodePolicy:
        if not self._ready:
            self.load()
        return self.policy.begin(view, seed)


def served_policy(
    train: TrainParams,
    store: ObjectStore | None,
    checkpoint: str | None,
    name: str,
    *,
    out_dir: str,
    temperature: float,
    max_new_tokens: int,
    context: ContextParams,
) -> ServedPolicy:
    """The learner as of ``checkpoint`` (None: untrained), sampled by ``train.inference.url`` (module docstring),
    each turn kept within ``context`` (``rollout.context``); ``out_dir`` holds the served weights unless
    ``train.inference.weights_dir`` says where."""
    spec = train.inference
    sync = _sync(train, out_dir)
    match = _VERSION.match(served_name(checkpoint)) if checkpoint else None
    version = int(match["version"]) if match else 0
    policy = OpenAIPolicy(
        spec.url, sync.base_name, spec.api_key(), timeout_s=spec.timeout_s, max_retries=spec.max_retries,
        temperature=temperature, max_tokens=max_new_tokens, context=context, name=name,
        version=f"v{version}", token_ids=True,
    )  # fmt: skip
    return ServedPolicy(sync, store, checkpoint, policy)


def _sync(tp: TrainParams, out_dir: str) -> WeightSync:
    """One ``WeightSync`` per process and settings: its lock serialises the loads of every policy it serves."""
    root = weights_root(tp, out_dir)
    key = (tp.inference.model_dump_json(), tp.model, tp.max_staleness, str(root))
    with _syncs_lock:
        if key not in _syncs:
            _syncs[key] = WeightSync(tp.inference, tp.model, root, tp.max_staleness)
        return _syncs[key]


_syncs: dict[tuple[str, str, int, str], WeightSync] = {}
_syncs_lock = threading.Lock()
