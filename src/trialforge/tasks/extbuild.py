"""Building a repository's own extension modules in place, in a sandbox, wherever its tree changes.

A repository whose ``EnvSpec.build`` names extensions (``envdetect``: what its ``setup()`` declared when evaluated in
a sandbox) has them compiled by setuptools' ``build_ext --inplace`` before its tests run: in validation (the tree
before the fix and after it), in a rollout's start tree and before each command the policy runs, and in the
grader's fresh tree after the diff. Without it the pure-Python fallback runs and a fix in the C code cannot fail
a test before it. The build is the repository's own setup.py run with its own build commands, under the program
below: a build that fails, or that falls back to pure Python (``setup.py`` files catch compiler errors to install
anyway), is a failure, and every declared extension must exist afterwards. Cython sources are compiled to C first,
outside the tree; a spec with build requirements has the build run on them alone (``envspec.BUILD_ENV``), as pip's
isolated build does. Where it runs and what it can reach: docs/environments.md, "Extension modules".
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trialforge.envspec import BUILD_ENV, Build
from trialforge.sandbox.base import Backend, ExecResult, Limits, Sandbox, SandboxSpec
from trialforge.scratch import scratch_dir

BUILD_TIMEOUT_S = 600.0  # one build of every extension; simplejson's takes ~5 s on one CPU
BUILD_TEMP = "/tmp/trialforge-build"  # object files and Cython's C: outside /work, so no diff or export carries them
WHY_CAP = 600  # characters of the compiler's output a failure quotes
# Runs in the sandbox at /work: setup() runs setuptools' build_ext --inplace once, with the extensions the
# repository's setup.py passes it, then checks each exists and stops the process: the fallback a setup.py runs
# after a failed build (setup() again without ext_modules) never gets to run. The last stdout line is the result.
# A Cython source (a .pyx, or a .c generated from its .pyx at release time, absent from the tree) is compiled to C
# first, by the image's Cython, under TEMP: the C it writes is never in the tree (the headers beside the .pyx are
# found as they would be beside the .c, through -iquote). Started with -S: site-packages are added as the image says.
_PROGRAM = """
import json, os, runpy, site, sys
if os.path.isdir(BUILD_ENV):  # the image has the build's own requirements: they alone, as in pip's isolated build
    site.addsitedir(BUILD_ENV)
else:
    site.main()
import setuptools
def report(ok, built, why=""):
    sys.stderr.flush()
    print()
    print(json.dumps({"ok": ok, "built": built, "why": why}), flush=True)
    os._exit(0 if ok else 1)
try:
    import distutils.core as core
except ImportError:
    core = None
real = setuptools.setup
real_core = core.setup if core else None
def cythonized(ext):
    for i, source in enumerate(ext.sources):
        stem = os.path.splitext(source)[0]
        if source.endswith(".c") and not os.path.exists(source) and os.path.isfile(stem + ".pyx"):
            ext.sources[i] = stem + ".pyx"
    pyx = [source for source in ext.sources if source.endswith(".pyx")]
    if not pyx:
        return ext
    try:
        from Cython.Build import cythonize
        (ext,) = cythonize([ext], build_dir=TEMP + "/cython", force=True, quiet=True)
    except BaseException as exc:
        report(False, {}, f"Cython did not compile {', '.join(pyx)}: {type(exc).__name__}: {exc}")
    dirs = dict.fromkeys(os.path.dirname(source) or "." for source in pyx)
    ext.extra_compile_args = [*(ext.extra_compile_args or []), *(a for d in dirs for a in ("-iquote", d))]
    return ext
def setup(**kwargs):
    if not kwargs.get("ext_modules"):
        report(False, {}, "setup() was called without the extension modules (a fallback to pure Python)")
    kwargs["ext_modules"] = [cythonized(ext) for ext in kwargs["ext_modules"]]
    if core:
        core.setup = real_core  # what setuptools' own setup() calls
    try:
        dist = real(**kwargs)
    except BaseException as exc:
        report(False, {}, f"{type(exc).__name__}: {exc}")
    command = dist.get_command_obj("build_ext")
    paths = {e.name: os.path.relpath(command.get_ext_fullpath(e.name)) for e in dist.ext_modules}
    missing = sorted(name for name in NAMES if not os.path.isfile(paths.get(name, "")))
    if missing:
        report(False, {}, "not built: " + ", ".join(missing))
    report(True, {name: paths[name] for name in NAMES})
setuptools.setup = setup
if core:
    core.setup = setup
sys.argv = ["setup.py", "build_ext", "--inplace", "--force", "--build-temp", TEMP, "--build-lib", TEMP + "/lib"]
sys.path.insert(0, os.getcwd())
if os.path.isfile("setup.py"):
    runpy.run_path("setup.py", run_name="__main__")
else:
    setup()
report(False, {}, "setup() was never called")
"""


class BuildFailed(Exception):
    """The repository's extensions did not build: the compiler's error, or which of them is missing."""


@dataclass(frozen=True)
class Built:
    ok: bool
    modules: dict[str, str]  # extension name -> its built file, relative to /work
    why: str  # a failure's reason: the program's, then the tail of the compiler's output
    seconds: float


# Runs in the sandbox: a digest of every build input in /work (C and Cython sources and headers, the build
# configuration), so that a rollout rebuilds when, and only when, one of them changed; timestamps would not do
# (setuptools' own check misses an edit made within a second of the build).
_INPUTS_PROGRAM = """
import hashlib, os
digest = hashlib.sha256()
for root, dirs, files in os.walk("."):
    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    for name in sorted(files):
        path = os.path.join(root, name)
        if name.endswith(SUFFIXES) or name in NAMES or path[2:] in SOURCES:
            digest.update(path.encode() + b"\\0")
            try:
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\\0")
            except OSError:
                digest.update(b"?\\0")
print(digest.hexdigest())
"""
INPUT_SUFFIXES = (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".pyx", ".pxd", ".pxi")
INPUT_NAMES = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in")


def run_build(sandbox: Sandbox, build: Build, *, timeout_s: float = BUILD_TIMEOUT_S) -> Built:
    """Build every one of ``build``'s extensions in ``sandbox``'s /work, in place, whatever the timestamps say (a
    fresh tree's files all look older than an object planted in it)."""
    program = _PROGRAM.replace("NAMES", repr(list(build.extensions))).replace("TEMP", repr(BUILD_TEMP))
    done = sandbox.exec(["python3", "-S", "-c", program.replace("BUILD_ENV", repr(BUILD_ENV))], timeout=timeout_s)
    return _result(done, build)


def inputs_digest(sandbox: Sandbox, build: Build, *, timeout_s: float) -> str:
    """A digest of the build inputs in ``sandbox``'s /work (what a rebuild depends on); "" when it cannot be read."""
    program = _INPUTS_PROGRAM.replace("SUFFIXES", repr(INPUT_SUFFIXES)).replace("NAMES", repr(INPUT_NAMES))
    done = sandbox.exec(["python3", "-c", program.replace("SOURCES", repr(set(build.sources)))], timeout=timeout_s)
    return done.stdout.strip() if done.ok else ""


def is_build_input(rel: str, build: Build) -> bool:
    """Whether a change to ``rel`` can change what the build makes (the files ``inputs_digest`` reads)."""
    name = PurePosixPath(rel).name
    return name.endswith(INPUT_SUFFIXES) or name in INPUT_NAMES or rel in build.sources


def _result(done: ExecResult, build: Build) -> Built:
    line = done.stdout.rstrip().rpartition("\n")[2]
    try:
        found = json.loads(line)
    except json.JSONDecodeError:
        found = None
    if done.timed_out:
        return Built(False, {}, f"timed out after {done.duration_s:.0f}s", done.duration_s)
    if not isinstance(found, dict) or not isinstance(found.get("built"), dict):
        tail = _tail(done.stdout + done.stderr)
        return Built(False, {}, f"the build stopped (exit {done.exit_code}): {tail}", done.duration_s)
    modules = found["built"]
    if found.get("ok") is not True or set(modules) != set(build.extensions):
        log = done.stdout.rpartition(line)[0] + done.stderr
        return Built(False, {}, f"{str(found.get('why'))[:200]}; {_tail(log)}", done.duration_s)
    return Built(True, {str(k): str(v) for k, v in modules.items()}, "", done.duration_s)


def _tail(log: str) -> str:
    """The compiler's error lines if it printed any, else the last lines of ``log``."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return " | ".join(errors[:4] or lines[-4:])[:WHY_CAP] or "no output"


def build_tree(
    backend: Backend, image: str, tree: Path, build: Build, limits: Limits, label: str, leave_out: Collection[str] = ()
) -> dict[str, bytes]:
    """Build ``tree``'s extensions in a fresh sandbox of ``image`` (``limits``: the tests'), then bring back into
    ``tree`` the built modules alone, each checked to be where its name says (``BuildFailed`` when they did not
    build). The sandbox works on a copy (the backend's), without the files ``leave_out`` names (the grader's: the
    tests, whose expected values a setup.py could compile into the module): nothing else it wrote reaches the host's
    tree. Returns what it placed."""
    with scratch_dir("build") as tmp:
        work = tree
        if leave_out:  # a copy of our own to take them out of; else the backend's seeding copy is the only one
            work = Path(tmp) / "repo"
            shutil.copytree(tree, work, symlinks=True)
            for rel in leave_out:
                (work / rel).unlink(missing_ok=True)
        spec = SandboxSpec(image=image, workspace=work, limits=limits, labels={"purpose": label})
        sandbox = backend.create(spec)
        try:
            built = run_build(sandbox, build)
            if not built.ok:
                raise BuildFailed(built.why)
            files = {str(_checked(name, rel)): sandbox.read_file(rel) for name, rel in sorted(built.modules.items())}
        finally:
            sandbox.close()
    place(tree, files)
    return files


def place(tree: Path, files: dict[str, bytes]) -> None:
    """Write built modules (relative path -> content, as ``build_tree`` returned them) into ``tree``."""
    for rel, data in files.items():
        _place(tree, PurePosixPath(rel), data)


def _checked(name: str, rel: str) -> PurePosixPath:
    """``rel`` when it is where extension ``name`` is imported from (``pkg/_ext.<abi>.so`` for ``pkg._ext``, under
    some package root); else the build failed: a setup.py cannot make the host write anywhere else."""
    path = PurePosixPath(rel)
    *package, module = name.split(".")
    parts = path.parts
    if (
        path.is_absolute()
        or ".." in parts
        or not path.name.startswith(module + ".")
        or not path.name.endswith(".so")
        or list(parts[len(parts) - 1 - len(package) : -1]) != package
    ):
        raise BuildFailed(f"extension {name} was built at {rel!r}, not where it imports from")
    return path


def _place(tree: Path, rel: PurePosixPath, data: bytes) -> None:
    """Write a built module into ``tree`` (the host's copy): through no symlink, replacing no link."""
    target = tree
    for part in rel.parts[:-1]:
        target = target / part
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise BuildFailed(f"{rel}: {part} is not a directory of the tree")
        target.mkdir(exist_ok=True)
    path = target / rel.name
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
