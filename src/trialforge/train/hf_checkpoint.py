"""A language model's checkpoint in the Hugging Face format, in the object store: loadable without trialforge.

A checkpoint named ``K`` (``loop.records.checkpoint_key``: ``checkpoints/RUN/lm-vN.pt``) is the objects under ``K``
less its ``.pt``, plus ``/``: ``model/`` (``save_pretrained()``'s output, full weights or LoRA adapters, with the
base model's tokenizer files), ``trainer.pt`` (the trainer's state, a plain dict for ``torch.load(weights_only=True)``)
and ``manifest.json``, the commit marker: deleted first, written last, listing every file's size and sha256. A
checkpoint without one does not exist. Loading checks every listed file (and reads no other) in a scratch directory
under ``TMPDIR`` that ``trialforge reap`` removes after a kill -9, naming the file that differs.
Layout and use: docs/learning.md, "Training a language model: LoRA or full, checkpoints".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from trialforge.errors import ConfigError, StoreError
from trialforge.scratch import scratch_dir
from trialforge.store.objstore import ObjectStore

FORMAT = "trialforge-lm-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_DIR = "model"
TRAINER_STATE = "trainer.pt"
# Copied from the base model's directory into model/, so transformers and vLLM load the directory as it is.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "chat_template.jinja", "chat_template.json",
)  # fmt: skip

Kind = Literal["full", "lora"]


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    kind: Kind
    base_model: str  # the local directory of the base model ("" when the model was built in memory)
    version: int  # the policy version the checkpoint holds
    files: dict[str, FileEntry]  # path under the prefix -> its size and digest
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
                raise ValueError(
                    f"format {raw.get('format')!r} version {raw.get('format_version')!r}, "
                    f"this trialforge reads {FORMAT!r} version {FORMAT_VERSION}"
                )
            files = {path: FileEntry(int(e["size"]), str(e["sha256"])) for path, e in raw["files"].items()}
            if raw["kind"] not in ("full", "lora"):
                raise ValueError(f"kind {raw['kind']!r} is neither 'full' nor 'lora'")
            return cls(raw["kind"], str(raw["base_model"]), int(raw["version"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StoreError(f"the checkpoint manifest {where} is not one trialforge can read: {exc}") from exc


def checkpoint_prefix(key: str) -> str:
    """The prefix of the objects of checkpoint ``key``: ``checkpoints/RUN/lm-v3.pt`` -> ``checkpoints/RUN/lm-v3/``."""
    return key.removesuffix("/").removesuffix(".pt") + "/"


def _digest(path: Path) -> FileEntry:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return FileEntry(path.stat().st_size, sha.hexdigest())


def write_checkpoint(
    store: ObjectStore, key: str, model: Any, state: dict[str, Any], *, kind: Kind, base_model: str, version: int
) -> Manifest:
    """Write ``model`` (a transformers or peft model) and the trainer's ``state`` as checkpoint ``key``."""
    prefix = checkpoint_prefix(key)
    store.delete(prefix + MANIFEST)  # from here until the new manifest lands, no checkpoint exists at ``key``
    with scratch_dir("ckpt") as tmp:
        root = Path(tmp)
        model.save_pretrained(root / MODEL_DIR, safe_serialization=True)
        base = Path(base_model) if base_model else None
        if base is not None and base.is_dir():
            for name in TOKENIZER_FILES:
                if (base / name).is_file():
                    shutil.copyfile(base / name, root / MODEL_DIR / name)
        torch.save(state, root / TRAINER_STATE)
        files = {p.relative_to(root).as_posix(): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}
        for path in files:
            store.put_file(prefix + path, root / path)
    manifest = Manifest(kind, base_model, version, files)
    store.put_bytes(prefix + MANIFEST, manifest.to_json())
    return manifest


def read_manifest(store: ObjectStore, key: str) -> Manifest:
    where = store.uri(checkpoint_prefix(key) + MANIFEST)
    if not store.exists(checkpoint_prefix(key) + MANIFEST):
        raise StoreError(
            f"no checkpoint at {key!r}: {where} is missing, so its save never finished (or it was never written); "
            "resume from an earlier checkpoint"
        )
    return Manifest.from_json(store.get_bytes(checkpoint_prefix(key) + MANIFEST), where)


@contextlib.contextmanager
def downloaded(store: ObjectStore, key: str) -> Iterator[tuple[Manifest, Path]]:
    """Checkpoint ``key`` in a temporary directory (``model/``, ``trainer.pt``), every file checked against the
    manifest; removed on exit."""
    manifest = read_manifest(store, key)
    prefix = checkpoint_prefix(key)
    with scratch_dir("ckpt") as tmp:
        root = Path(tmp)
        for path, expected in manifest.files.items():
            store.get_file(prefix + path, root / path)
            got = _digest(root / path)
            if got != expected:
                raise StoreError(
                    f"checkpoint {key!r} is corrupt: {store.uri(prefix + path)} has {got.size} bytes with sha256 "
                    f"{got.sha256}, but its manifest recorded {expected.size} bytes with sha256 {expected.sha256}; "
                    "resume from an earlier checkpoint"
                )
        yield manifest, root


def load_model(model_dir: Path, manifest: Manifest, base: Any = None) -> Any:
    """The checkpoint's model, trainable: from ``model_dir`` alone (full), or its adapters on ``base`` (LoRA).

    ``base`` (LoRA only): the base model, an object (the adapters are injected into it) or a local path;
    None loads the directory the manifest names.
    """
    from transformers import AutoModelForCausalLM

    if manifest.kind == "full":
        return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    base = base if base is not None else manifest.base_model
    if isinstance(base, str) and not base:
        raise ConfigError(
            "a LoRA checkpoint holds adapters only, and its manifest names no base model directory "
            "(the model was built in memory): pass the base model"
        )
    if isinstance(base, str | Path):
        base = AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True)
    from peft import PeftModel

    return PeftModel.from_pretrained(base, model_dir, is_trainable=True)
