"""What a ``setup.py`` passes to ``setup()``, found by running it in a sandbox, as packaging tools do.

An older ``setup.py`` computes its requirements (``tests_require = [...]; setup(extras_require={"test":
tests_require})``, lists joined, dicts merged), which no literal reading sees. The file runs under the base
image's Python and setuptools with ``setup()`` replaced by one that records its arguments: a copy of the tree,
a read-only root filesystem, no network, the unprivileged sandbox account; never on the host. Core metadata
(PEP 517 ``prepare_metadata_for_build_wheel``) would not do: it has no ``tests_require``. docs/environments.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from trialforge.sandbox.bwrap.confinement import environment, identity, namespaces, tool
from trialforge.sandbox.host.identity import SANDBOX_UID, sandbox_identity
from trialforge.sandbox.images import base_image
from trialforge.scratch import scratch_dir
from trialforge.tasks.envdetect.decide import EnvError
from trialforge.tasks.envdetect.readers import SETUP_ARGS

WORK = "/work"
OUTPUT_CAP = 1 << 20  # the arguments' JSON: requirement lists, never megabytes
# Runs in the sandbox: setup() (setuptools' and distutils') records its arguments; the last stdout line is
# them as JSON, strings, lists and dicts only (a set of requirements becomes a sorted list).
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
    with scratch_dir("setupeval") as tmp:
        os.chmod(tmp, 0o711)  # the sandbox account binds the copy: it passes through, lists nothing
        work = Path(tmp) / "work"
        shutil.copytree(tree, work, symlinks=True)
        _hand_over(work)
        argv = [*_launcher(), *_bwrap(base_image().rootfs, work), "python3", "-c", program]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise SetupEvalError(f"setup.py did not finish in {timeout_s:.0f}s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
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


def _hand_over(work: Path) -> None:
    """The copy belongs to the sandbox account: a ``setup.py`` may write (a version file, an egg-info)."""
    host = sandbox_identity()
    if host is None:
        return
    for root, dirs, files in os.walk(work):
        for name in (root, *(os.path.join(root, n) for n in dirs + files)):
            os.lchown(name, host.uid, host.gid)


def _launcher() -> list[str]:
    """As root, drop to the sandbox account first: the sandbox is never host root (``sandbox.host.identity``)."""
    host = sandbox_identity()
    return identity(host.uid, host.gid, None) if host is not None else []


def _bwrap(rootfs: Path, work: Path) -> list[str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return [
        tool("bwrap"), "--ro-bind", str(rootfs), "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--bind", str(work), WORK, *namespaces(uid=SANDBOX_UID), *environment(env, cwd=WORK),
    ]  # fmt: skip
