"""pytest plugin: the test session must end with nothing of trialforge's left on the host.

At session start it records what exists; at the end it looks again, and fails the session
for anything new that is this session's: containers and volumes of our own or of dead
owners, Podman services started under our state dir, conmon processes of containers that are
gone, bwrap processes on our state dir, sandbox cgroups (``tf-*``, empty), and ``tf-*`` /
``trialforge-*`` directories in the system temp dir. A concurrently running test session on
the same machine owns live things too: they are told apart by owner (labels, scratch dir names,
our state dir) where the thing carries one, and otherwise by persistence: a leak stays, while
another session's in-flight cgroup or temp dir goes away within the settle time.

Scratch dirs of dead owners (``trialforge.scratch``: the kill -9 tests make them on purpose)
are removed first, the way ``trialforge reap`` would, and listed in the terminal summary.

The check runs once per session, in the process that runs it (with pytest-xdist, the controller, after every
worker is done), and fails the session (exit status 1, the leftovers in the terminal summary). At its start, the
state dirs of test sessions killed with -9 are removed, with the Podman services still running on them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex

import pytest

from trialforge.errors import SandboxError
from trialforge.owners import process_start, still_running
from trialforge.sandbox.container.backend import LABEL_OWNER
from trialforge.sandbox.container.engine import CONF_ENV, containers_conf
from trialforge.sandbox.host import reaper
from trialforge.sandbox.host.leftovers import abandoned, reap_services
from trialforge.sandbox.host.statedir import check_private
from trialforge.scratch import owner_of, reap_scratch

SETTLE_S = 20.0  # how long a new thing may take to go away (conmon's exit delay is 5 s, a cgroup's removal 10 s)
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class HostState:
    """Everything of trialforge's on the host, by kind (each entry a printable name)."""

    kinds: dict[str, set[str]] = field(default_factory=dict)

    def minus(self, before: HostState) -> HostState:
        return HostState(
            {k: v - before.kinds.get(k, set()) for k, v in self.kinds.items() if v - before.kinds.get(k, set())}
        )

    def __bool__(self) -> bool:
        return any(self.kinds.values())

    def describe(self) -> str:
        return "; ".join(f"{kind}: {sorted(names)}" for kind, names in sorted(self.kinds.items()) if names)


def snapshot(state_dir: Path, *, me: int) -> HostState:
    """What is on the host now that this session (pid ``me``, state dir ``state_dir``) would answer for."""
    containers, volumes, live_ids = _engine_objects(me)
    return HostState(
        {
            "containers": containers,
            "volumes": volumes,
            "podman services": _services(state_dir),
            "processes": _processes(state_dir, live_ids),
            "cgroups": _empty_cgroups(),
            "temp dirs": _temp_dirs(state_dir, me),
        }
    )


def settled_leftovers(before: HostState, look: Callable[[], HostState], *, settle_s: float = SETTLE_S) -> HostState:
    """What is new since ``before`` and still there after up to ``settle_s`` (in-flight things finish meanwhile)."""
    deadline = time.monotonic() + settle_s
    while True:
        new = look().minus(before)
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.5)  # poll interval while conmons, cgroups and other sessions' temp dirs go


def _ours(labels: dict[str, str], me: int) -> bool:
    """Made by this process, or by a process that is gone (a test's child: nobody else will remove it)."""
    owner = labels.get(LABEL_OWNER, "")
    return owner.split(":")[1:2] == [str(me)] or abandoned(labels)


def _engine_objects(me: int) -> tuple[set[str], set[str], set[str]]:
    """(our leftover containers, our leftover volumes, ids of every container that exists) via the podman CLI."""
    if shutil.which("podman") is None:
        return set(), set(), set()
    env = {**os.environ, CONF_ENV: str(containers_conf())}
    ps = _json(["podman", "ps", "-a", "--format", "json"], env)
    vols = _json(["podman", "volume", "ls", "--format", "json"], env)
    containers = {
        (c.get("Names") or [c["Id"]])[0]
        for c in ps
        if LABEL_OWNER in (c.get("Labels") or {}) and _ours(c["Labels"], me)
    }
    volumes = {v["Name"] for v in vols if LABEL_OWNER in (v.get("Labels") or {}) and _ours(v["Labels"], me)}
    return containers, volumes, {c["Id"] for c in ps}


def _json(argv: list[str], env: dict[str, str]) -> list[dict]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-1000:]}")
    return json.loads(done.stdout or "[]") or []


def _services(state_dir: Path) -> set[str]:
    """Podman service homes in the state dir, or in an xdist worker's dir inside it."""
    return {str(p.relative_to(state_dir)) for p in [*state_dir.glob("podman-*"), *state_dir.glob("gw*/podman-*")]}


def _processes(state_dir: Path, live_container_ids: set[str]) -> set[str]:
    """bwrap and Podman services working in our state dir; conmons of containers that no longer exist; any
    slirp4netns (a bwrap sandbox's network lives only as long as its command; the snapshot before the
    session subtracts the engine's own)."""
    found: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(argv).decode(errors="replace")
        if comm == "conmon" and "-c" in text:
            args = text.split()
            cid = args[args.index("-c") + 1] if "-c" in args[:-1] else ""
            if cid and cid not in live_container_ids:
                found.add(f"conmon {proc.name} ({cid[:12]})")
            continue
        slirp = comm == "slirp4netns" and argv[0]  # a zombie has an empty command line and holds nothing
        if slirp or (comm in ("bwrap", "podman") and str(state_dir) in text):
            found.add(f"{comm} {proc.name} {process_start(int(proc.name))}")
    return found


def _empty_cgroups() -> set[str]:
    """Sandbox cgroups (``tf-*``, any controller, any depth) with no process in them: a live one is a sandbox's."""
    found = set()
    for top, dirs, _ in os.walk(CGROUP_ROOT):  # not Path.glob: a group removed meanwhile must not end the walk
        for name in dirs:
            if not name.startswith("tf-"):
                continue
            path = Path(top) / name
            try:
                if not (path / "cgroup.procs").read_text().strip():
                    found.add(str(path))
            except OSError:
                continue
    return found


_SESSION_STATE = re.compile(r"^tf-state-(\d+)-[0-9a-f]+$")


def _temp_dirs(state_dir: Path, me: int) -> set[str]:
    """``tf-*``/``trialforge-*`` in the system temp dir; those that name a live owner other than us are not ours."""
    found = set()
    root = Path(tempfile.gettempdir())
    for path in [*root.glob("tf-*"), *root.glob("trialforge-*")]:
        if path == state_dir:
            continue
        owner = owner_of(path.name)
        if owner is not None and owner[0] != me and still_running(*owner):
            continue
        session = _SESSION_STATE.match(path.name)  # another live test session's state dir (tests/conftest.py)
        if session and int(session.group(1)) != me and Path(f"/proc/{session.group(1)}").exists():
            continue
        if path.name.startswith(_ENGINE_TMP) and _anothers_live_engine(path.name.removeprefix(_ENGINE_TMP), me):
            continue
        found.add(path.name)
    return found


_ENGINE_TMP = "tf-enginetmp-"  # a Podman service's temp dir (engine.temp_dir), named after its home podman-X


def _anothers_live_engine(home_suffix: str, me: int) -> bool:
    """The Podman service on home ``podman-<home_suffix>`` is another live process's (its ``service.json``)."""
    socket = f"/podman-{home_suffix}/podman.sock"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        url = next((arg for arg in argv if arg.startswith("unix://") and arg.endswith(socket)), None)
        if url is None or "service" not in argv:
            continue
        try:
            record = json.loads((Path(url.removeprefix("unix://")).parent / "service.json").read_text())
        except (OSError, ValueError):
            return False
        return record.get("owner_pid") != me and still_running(record["owner_pid"], record["owner_start"])
    return False


# --- the session's state dir, and the check, once per session --------------------------------------------------------
# With pytest-xdist (make test: docs/testing.md) the process that runs the session is the controller: it makes the
# session's state dir (each worker keeps its sandboxes and Podman service in a dir of its own inside, conftest.py's
# state_dir) and checks the host once all workers are done, so one worker's live sandboxes are never another's leak.

SESSION_ROOT_ENV = "TRIALFORGE_TEST_SESSION_DIR"  # the session's state dir, inherited by its xdist workers


def session_root() -> Path:
    return Path(os.environ[SESSION_ROOT_ENV])


def new_session_root() -> Path:
    """Name this process's session state dir (made by the first ``state_dir``) and hand it to its workers."""
    root = Path(tempfile.gettempdir()) / f"tf-state-{os.getpid()}-{token_hex(4)}"
    os.environ[SESSION_ROOT_ENV] = str(root)
    return root


def _runs_the_session(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # an xdist worker has one: its controller runs the session


def pytest_configure(config: pytest.Config) -> None:
    if _runs_the_session(config):  # a new one, never an inherited one: a pytest run inside a test has its own
        new_session_root()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _runs_the_session(session.config):
        return
    reaped = reap_dead_sessions()
    if reaped:
        _say(session, f"leak check: removed the state of killed test sessions: {reaped}")
    session.stash[_BEFORE] = snapshot(session_root(), me=os.getpid())


@pytest.hookimpl(trylast=True)  # after xdist has stopped its workers: their teardown is done
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The whole session ends with nothing new of ours on the host (see the module docstring); it fails otherwise."""
    if not _runs_the_session(session.config) or _BEFORE not in session.stash:
        return
    root = session_root()
    reaped = reap_scratch()  # dead owners' scratch dirs: what `trialforge reap` removes after a kill -9
    if reaped:
        _say(session, f"leak check: removed {len(reaped)} scratch dirs of killed processes: {reaped}")
    left = settled_leftovers(session.stash[_BEFORE], lambda: snapshot(root, me=os.getpid()))
    shutil.rmtree(root, ignore_errors=True)
    if left:
        _say(session, f"LEAK CHECK FAILED: the test session left behind: {left.describe()}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[HostState]()


def _say(session: pytest.Session, line: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        if reporter._tw.width_of_current_line:  # after the progress bar's last dots
            reporter.write("\n")
        reporter.write_line(line)


def reap_dead_sessions(tmp: Path | None = None) -> list[str]:
    """State dirs of test sessions whose process is gone (killed with -9: no teardown ran), removed with what
    still runs on them: their Podman services (stopped, with their containers and temp dirs) and bwrap sandboxes.
    Only dirs that pass the state dir checks (ours, private) are touched; returns their names."""
    removed = []
    for path in sorted((tmp or Path(tempfile.gettempdir())).glob("tf-state-*")):
        session = _SESSION_STATE.match(path.name)
        if not session or Path(f"/proc/{session.group(1)}").exists():
            continue
        try:
            check_private(path)
        except SandboxError:
            continue
        workers = [d for d in path.iterdir() if d.is_dir() and _WORKER.match(d.name)]
        for state in [path, *workers]:
            reap_services(state)  # their owners are dead: each is stopped
            reaper.reap(state, everything=True)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


_WORKER = re.compile(r"^gw\d+$")  # pytest-xdist's worker ids
