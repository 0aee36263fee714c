"""What a ``setup.py`` passes to ``setup()``, found by running it in a sandbox, as packaging tools do.

An older ``setup.py`` computes its requirements (``tests_require = [...]; setup(extras_require={"test":
tests_require})``, lists joined, dicts merged), which no literal reading sees. The file runs under the base
image's Python and setuptools with ``setup()`` replaced by one that records its arguments, in a bwrap sandbox
like any test run (a copy of the tree, no network, the sandbox's own uid, cgroup and disk quota); never on the
host. Core metadata (PEP 517 ``prepare_metadata_for_build_wheel``) would not do: it has no ``tests_require``.
docs/environments.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trialforge.errors import SandboxError
from trialforge.sandbox.base import Limits, SandboxSpec
from trialforge.sandbox.bwrap.backend import BwrapBackend
from trialforge.sandbox.images import base_image
from trialforge.tasks.envdetect.decide import EnvError
from trialforge.tasks.envdetect.readers import SETUP_ARGS

OUTPUT_CAP = 1 << 20  # the arguments' JSON: requirement lists, never megabytes
# Runs in the sandbox: setup() (setuptools' and distutils') records its arguments; the last stdout line is
# them as JSON, strings, lists and dicts only (a set of requirements becomes a sorted list; an Extension its name
# and its sources and depends).
_PROGRAM = """
import json, os, runpy, sys
got = {}
def setup(**kwargs):
    got.update(kwargs)
import setuptools
setuptools.setup = setup
try:
    import distutils.core
    distutils.core.setup = setup
except ImportError:
    pass
def plain(value):
    if hasattr(value, "sources") and isinstance(getattr(value, "name", None), str):  # an Extension
        return {"name": value.name, "sources": plain([*value.sources, *(getattr(value, "depends", None) or [])])}
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(str(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return None
sys.argv = ["setup.py", "--name"]
sys.path.insert(0, os.getcwd())
try:
    runpy.run_path("setup.py", run_name="__main__")
except SystemExit:
    pass
if not got:
    sys.exit("setup() was never called")
print()
print(json.dumps({k: plain(got[k]) for k in KEYS if k in got}))
"""


class SetupEvalError(EnvError):
    """``setup.py`` did not run to ``setup()`` in the sandbox (an import it needs, Python 2 code, a timeout)."""


def setup_arguments(tree: Path, *, timeout_s: float = 120.0) -> dict[str, Any]:
    """The ``setup()`` arguments envdetect reads (``readers.SETUP_ARGS``) that ``tree``'s ``setup.py`` passes."""
    program = _PROGRAM.replace("KEYS", repr(SETUP_ARGS))
    backend = BwrapBackend(base_image())
    spec = SandboxSpec(image=backend.image.name, workspace=tree, limits=Limits(network=False),
                       labels={"purpose": "setupeval"})  # fmt: skip
    try:
        with backend.create(spec) as sandbox:
            done = sandbox.exec(["python3", "-c", program], timeout=timeout_s)
    except SandboxError as exc:
        raise SetupEvalError(f"setup.py could not run in a sandbox: {exc}") from exc
    finally:
        backend.close()
    if done.timed_out:
        raise SetupEvalError(f"setup.py did not finish in {timeout_s:.0f}s")
    if done.exit_code != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.exit_code}"])[-1]
        raise SetupEvalError(f"setup.py failed: {last[:300]}")
    return _parsed(done.stdout)


def _parsed(stdout: str) -> dict[str, Any]:
    line = stdout.rstrip().rpartition("\n")[2]
    try:
        found = json.loads(line[:OUTPUT_CAP])
    except json.JSONDecodeError:
        found = None
    if not isinstance(found, dict):
        raise SetupEvalError("setup.py's arguments did not come back")
    return {key: value for key, value in found.items() if key in SETUP_ARGS and value is not None}
