"""Facts a task has no field for (base commit, SWE-bench version...), carried losslessly in its ``Source.ref``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_EXTRAS_MARK = " extras="


def with_extras(ref: str, extras: Mapping[str, Any]) -> str:
    """``ref`` plus facts the Task has no field for (base commit, SWE-bench version...), as compact JSON.

    Temporary: ``Task`` has no free-form field, so these ride in ``Source.ref`` after a marker that
    :func:`split_extras` reverses exactly. Move them to ``Task.extra`` once it exists.
    """
    if not extras:
        return ref
    return ref + _EXTRAS_MARK + json.dumps(dict(extras), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def split_extras(ref: str) -> tuple[str, dict[str, Any]]:
    """The human part of a ref and its extras (empty when it has none)."""
    head, mark, tail = ref.partition(_EXTRAS_MARK)
    if not mark:
        return ref, {}
    return head, json.loads(tail)
