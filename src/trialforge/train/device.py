"""Where the trainer runs: CUDA with bf16 autocast when a GPU is visible, else the CPU in float32.

Weights and optimiser state stay float32 on either device; on CUDA only the forward pass runs under
``torch.autocast(dtype=bfloat16)`` (mixed precision), and log-probabilities are taken in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from trialforge.errors import ConfigError


@dataclass(frozen=True)
class TrainDevice:
    kind: Literal["cuda", "cpu"]
    autocast_dtype: torch.dtype | None  # bf16 on CUDA, None (plain float32) on the CPU

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.kind)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward pass's precision context: bf16 autocast on CUDA, nothing on the CPU."""
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(device_type=self.kind, dtype=self.autocast_dtype):
            yield

    def describe(self) -> str:
        if self.kind == "cpu":
            return "cpu float32"
        precision = "bf16 autocast" if self.autocast_dtype is not None else "float32"
        return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()}) {precision}"


def pick_device(prefer: str | None = None) -> TrainDevice:
    """``prefer`` None takes CUDA when ``torch.cuda.is_available()``, else the CPU; "cpu" or "cuda" forces one."""
    if prefer not in (None, "cpu", "cuda"):
        raise ConfigError(f"train device {prefer!r} is not one of None (auto), 'cpu', 'cuda'")
    cuda = torch.cuda.is_available()
    if prefer == "cuda" and not cuda:
        raise ConfigError("train device 'cuda' was asked for but torch.cuda.is_available() is False")
    if prefer == "cpu" or not cuda:
        return TrainDevice("cpu", None)
    # fp16 would need a loss scaler; a GPU without bf16 trains in float32 instead
    return TrainDevice("cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else None)
