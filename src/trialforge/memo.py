"""One computation per key, shared by concurrent and later askers (thread-safe)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class OncePerKey(Generic[T]):
    """Results by key: the first asker computes, concurrent askers wait for it, later ones reuse it.

    A result that ``keep`` rejects (an infrastructure fault, say) is handed to whoever
    waited but not remembered, and neither is an exception: the next asker computes again.
    """

    def __init__(self, keep: Callable[[T], bool] = lambda _: True) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._results: dict[str, Future[T]] = {}
        self.hits = 0  # answers that did not compute

    def __len__(self) -> int:
        with self._lock:
            return len(self._results)

    def get(self, key: str, compute: Callable[[], T]) -> T:
        with self._lock:
            future = self._results.get(key)
            mine = future is None
            if mine:
                future = self._results[key] = Future()
            else:
                self.hits += 1
        if not mine:
            return future.result()
        try:
            result = compute()
        except BaseException as exc:
            self._forget(key)
            future.set_exception(exc)
            raise
        if not self._keep(result):
            self._forget(key)
        future.set_result(result)
        return result

    def _forget(self, key: str) -> None:
        with self._lock:
            self._results.pop(key, None)
