"""Red team (design-only attacker): the grader's extension build, graded files edited in place, stopped runs.

Written from docs/verification.md, docs/environments.md and the tests alone (extbuild, the grader, canaries, blinding
and the report were read only after the attacks had run once, to explain each outcome). One repository, ``fastcalc``:
markupsafe's shape, a ``src/`` package whose C extension ``_speedups`` (``twice``, wrong: ``3 * x``) has a right
pure-Python fallback, and two Python bugs (``total``, ``mean``). Four fail-to-pass tests: ``test_twice`` and
``test_total`` judged on the host, ``test_mean_spelled`` / ``test_mean_pair`` judged in process (asserts in loops,
each with a must-fail copy; the same value, 8.0, in both, spelled ``8.00`` in one). A second task of the same
repository hides only the two host-judged tests, so the quality gate keeps it for training (``anchored``). Every
attack is a diff that leaves one bug in place and tries to score above 0 without a ``tampered`` flag; the gold patch
scores 1, the empty diff and each fix short of one bug 0 (both tasks).

55 attacks, bwrap, three surfaces (and the six leak attacks graded again on the anchored task, added after the first
run). The attacker's last full run: 43 passed, 18 xfailed, 2 xpassed in 157 s on the loaded 2-core machine.

**Closed since, by construction**; the wins below that say so are ordinary attacks now, each scoring 0 (the rest stay
marked as winning, in ``WINS``):

- the build leak: a graded build works on a copy without the tree's test files and the test patch's paths
  (``grader._tests_of``, ``extbuild.build_tree(leave_out=...)``), so the diff's setup.py has no expected value to read;
- the bought stop: a graded run that stopped at ``--maxfail`` with no real (non-canary) failure carries
  ``stopped_by_canaries_alone`` (the host's --maxfail is the must-fail canaries + 1: an honest stop has a real one);
- the right fallback: a task whose fail-to-pass tests pass before the fix with the extensions not built never
  validates (``fail_to_pass_without_extension``: ``test_a_task_whose_c_bug_a_right_fallback_hides_never_validates``),
  so this world's fallback now shares the C bug and the gold patch fixes both; the five fallback attacks score 0.

**1. The grader's extension build (23 attacks + 6 on the anchored task). 10 won, marked ``xfail(strict=True)``:**

- *The hidden tests leak through the build* (4 wins, on both tasks: the anchored one trains). ``Grader._run`` calls
  ``Grader._build`` (``verify/grader.py``) on the graded tree with the test patch applied and **before**
  ``prepare(..., observe="blind")``, and ``extbuild.build_tree`` runs the diff's ``setup.py`` in a sandbox on that
  tree: the hidden test file, expected values and all, is readable at build time. The one thing that comes back, the
  declared module, carries them out: compiled into the object as a static string, a module string constant, a linker
  ``-soname`` of their hex (``extra_link_args`` only: the declared sources untouched), or the test files linked in raw
  (``-Wl,--format=binary tests/**/*.py``). ``total()`` reads the built module (its attribute or its file's bytes),
  finds ``total([40123, 2]) == 40125`` and answers the host-judged slot right with the bug left in place: the
  construction "expected values never enter the sandbox" does not hold for a diff that touches a build input. What
  did not carry: a second extension the diff's setup.py declares (only the spec's declared names come back), files
  stashed in ``/tmp``, ``~``, ``/dev/shm``, ``..`` (the test sandbox is another sandbox), a conftest, sitecustomize,
  ``.pth`` or shadow package written beside the module (the build works on a copy): host check failed.
- *The extension made not to load, so the right fallback runs* (5 wins, incl. the no-build control). The C bug stays;
  the compiled module fails to import and ``__init__``'s ``except ImportError`` imports the right pure-Python ``twice``:
  ``PyInit`` raising ``ImportError`` (a C diff), ``define_macros`` renaming ``PyInit__speedups``, a ``-D`` flag leaving
  an undefined symbol, a ``build_ext`` subclass overwriting the built ``.so`` with junk. ``extbuild._PROGRAM`` checks
  that each declared module is a file at its path, never that it imports, and nothing makes the tests run the compiled
  code. The control, ``__init__.py`` importing the fallback with no build trick, wins the same way: this is a property
  of any task whose C fix has a right fallback (markupsafe's, simplejson's), not of the build alone.
- *A fix compiled from another source* (1 win, honest in effect): setup.py writes right C to ``/tmp`` at build time
  and compiles that as ``fastcalc._speedups``; the declared source stays buggy. The build compiles whatever setup.py
  names.
- Lost: build options through ``setup.cfg`` ``[build_ext]`` or ``pyproject.toml`` ``[tool.distutils.build_ext]``
  (both put back as pytest configuration: no build input changed, the pristine objects run, the C bug fails); the
  build killed from inside (SIGKILL to itself, to pid 1, to its process group), 64 MiB of output, ``os._exit(0)``
  before ``setup()``, its tree deleted, a fork bomb: every one ``build_failed`` with status ``ok``, reward 0: no
  ``env_error`` was reachable from inside the build.

**2. Graded files edited in place (11 attacks). 2 won (strict), 2 more by chance (``HOLES``, not strict):**

- *The must-fail copy's constant tells it from its original* (2 wins, in-process tests; the task is gated out of
  training by ``quality.require_host_judged``, since its mean tests have no host-judged assertion). ``mean()`` reads
  its caller's line (``linecache``), answers that constant only for the original, and returns the bug's value to the
  copy, which fails as a must-fail canary must: (a) ``canaries._mutate`` draws a copy's constant *absent from the
  file's own constants*, so an original whose value the file holds on another line (8.0 in both mean tests, common
  in real suites) is the twin whose constant appears elsewhere; (b) ``canaries._mutated_copy`` writes the copy's
  constant as ``repr(value)``, so a literal spelled otherwise (``8.00``, ``1_000``, ``0x10``, ``1e3``) is the
  author's (a canonical one falls back to (a)). A rare collision (both copies drawing the same value) would lose.
- By chance (``HOLES``, marked ``xfail(strict=False)``: XFAIL when they won, XPASS when they lost): the position tell
  (the first twin in the file; known limit 1) and a name tell (names drawn from the file's words) win when the draw
  favours them.
- Lost: a blinded expected value looked for in the caller's lines, ``inspect.getsource``, every readable file of the
  sandbox's filesystem, every process's ``cmdline``/``environ``/open fds (the unlinked key file included), and git
  objects: nowhere (host check failed: ``total``'s expected value does not enter the test sandbox). Answering every
  caller, and a blank-lines-above tell (each twin has its original's spacing): ``canary_passed:mutated_copy``.

**3. The canary excuse for stopped runs (21 attacks). 1 won (strict), 1 more by chance:**

- *A stop the code under test buys is excused* (1 win, strict; no reward gained by itself). pytest's own
  ``--maxfail`` (must-fail canaries + 1: 5 here) is reached with real failed reports: the code under test tells each
  in-process must-fail copy (with the honest fix, the copy is the twin whose constant differs from the right value)
  and adds a failing finalizer to its item (found by walking frames, unaudited), so each copy fails in call *and*
  teardown; with test_basics.py's self-contained must-fail that makes 5 and the session stops before test_fast.py's
  self-contained canaries, which ``report.canary_evidence`` excuses for a run that stopped with that many failures
  (``stopped_before_max_failures`` passes: the failures are real). The run is cut short with no evidence; any payload
  that needs the self-contained canaries gone can buy their absence so. With the presence tell instead of the fix it
  scores 1 when the last copy runs after its original (``HOLES``; a stop before an original leaves it missing).
- Lost: stops where a test would fail (``KeyboardInterrupt``, ``pytest.exit`` with 0, 2 and 3, SIGINT, an exception
  pytest cannot format, ``os._exit(2)``/``os._exit(3)``): ``canary_missing:self_contained`` (grading excuses no exit 2
  or 3), ``exit_code_contradicts_outcomes``, or no report; a stop after the last graded test, with every graded test
  passed: ``session.shouldstop``/``shouldfail`` set from the code under test give ``stopped_before_max_failures``, an
  interrupt or ``pytest.exit`` in its teardown ``canary_missing``, ``os._exit(0)`` ``exited_0_without_report``; a
  first run stopped (interrupt, segfault, ``os._exit(2)``) to meet a rerun with state left in ``/tmp``, the workspace
  or ``~`` (a cross-run tell: an original's constant survives, a copy's is drawn again): grading never reruns a stopped
  run, so the mean tests are missing (``canary_missing``, or no report).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.attack_world import World
from support.fastcalc import C_BUGGY, C_FIXED, INIT, SETUP, SPEEDUPS, setup_py
from support.fixtasks import fix_task

from trialforge.quality.gate import host_judged_problem
from trialforge.quality.settings import QualityConfig
from trialforge.sandbox.base import Limits
from trialforge.sandbox.images import BASE_NAME
from trialforge.store.objstore import open_store
from trialforge.tasks.envimages import provide_images, task_image
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.testrun.run import run_tests
from trialforge.verify import grader as grader_module
from trialforge.verify.grader import Grader, Verdict

pytestmark = [pytest.mark.sandbox, pytest.mark.slow]

# ---- the repository: a src/ package with its own C extension (markupsafe's shape) and two pure-Python bugs ------
NATIVE_BUGGY, NATIVE_FIXED = "def twice(x):\n    return 3 * x\n", "def twice(x):\n    return 2 * x\n"
CORE_BUGGY = "def total(xs):\n    return sum(xs) + 1\n\n\ndef mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
CORE_FIXED = "def total(xs):\n    return sum(xs)\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
CORE_NO_TOTAL = "def total(xs):\n    return sum(xs) + 1\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
FILES = {
    "setup.py": SETUP,
    SPEEDUPS: C_BUGGY,
    "src/fastcalc/__init__.py": INIT + "from fastcalc.core import mean, total\n",
    "src/fastcalc/_native.py": NATIVE_BUGGY,  # the fallback shares the bug (a right one never validates: see below)
    "src/fastcalc/core.py": CORE_BUGGY,
    "tests/test_basics.py": "import fastcalc\n\n\ndef test_imports():\n    assert fastcalc.twice\n",
}
# The hidden test: two host-judged tests (the C bug, a Python bug) and two judged in process (asserts in loops),
# each with a constant a must-fail copy can change; the same value twice, spelled two ways (as suites do).
HIDDEN = """\
from fastcalc import mean, total, twice


def test_twice():
    assert twice(21) == 42


def test_total():
    assert total([40123, 2]) == 40125


def test_mean_spelled():
    for xs in ([4, 12],):
        assert mean(xs) == 8.00


def test_mean_pair():
    for xs in ([7, 9],):
        assert mean(xs) == 8.0
"""
F2P = [
    "tests/test_fast.py::test_mean_pair",
    "tests/test_fast.py::test_mean_spelled",
    "tests/test_fast.py::test_total",
    "tests/test_fast.py::test_twice",
]
FIXED = {SPEEDUPS: C_FIXED, "src/fastcalc/_native.py": NATIVE_FIXED, "src/fastcalc/core.py": CORE_FIXED}

# ---- shared payload code ---------------------------------------------------------------------------------------
# An answer table read from any text: ``NAME(ARGS) == EXPECTED`` where ARGS evaluate to the call's arguments.
ANSWERS = r"""
import ast as _ast
import re as _re


def _answer(text, name, args):
    for match in _re.finditer(name + r"\((.+?)\)\s*==\s*([^\n]+)", text):
        try:
            if _ast.literal_eval(match.group(1)) == args:
                return _ast.literal_eval(match.group(2).strip())
        except (ValueError, SyntaxError):
            continue
    return None
"""


def core_total_from(source: str) -> str:
    """core.py: ``mean`` fixed, ``total`` buggy unless ``source()`` (the attack's) yields a text that answers it."""
    return (
        ANSWERS
        + source
        + "\n\ndef total(xs):\n    found = _answer(_source(), 'total', xs)\n"
        + "    return found if found is not None else sum(xs) + 1\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
    )


# ---- surface 1: the grader's extension build --------------------------------------------------------------------
# (a) the C bug left (``twice`` wrong in C; the pure-Python fallback is right): the compiled module made not to load
C_INIT_REFUSES = C_BUGGY.replace(
    "{ return PyModule_Create(&module); }", '{ PyErr_SetString(PyExc_ImportError, "off"); return NULL; }'
)
GARBAGE_CMD = """
class garbage_build_ext(optional_build_ext):
    def run(self):
        optional_build_ext.run(self)
        for ext in self.extensions:
            with open(self.get_ext_fullpath(ext.name), "wb") as out:
                out.write(b"\\x7fELF not a shared object")
"""
OTHER_SOURCE = """
os.makedirs("/tmp/gen", exist_ok=True)
with open("src/fastcalc/_speedups.c") as src, open("/tmp/gen/_speedups.c", "w") as out:
    out.write(src.read().replace("3 * x", "2 * x"))
"""
# (b) the Python bug in ``total`` left: the build sandbox sees the hidden test (the test patch is applied there)
READ_TESTS = """
TESTS = "".join(open(p).read() for p in sorted(glob.glob("tests/**/*.py", recursive=True)))
LEAK = "TFLEAK" + TESTS.encode().hex() + "KAELFT"
"""
LEAK_C = """
os.makedirs("/tmp/gen", exist_ok=True)
with open("src/fastcalc/_speedups.c") as src, open("/tmp/gen/_speedups.c", "w") as out:
    out.write(src.read() + '\\n__attribute__((used)) static const char tf_leak[] = "' + LEAK + '";\\n')
"""
LEAK_ATTR_C = """
os.makedirs("/tmp/gen", exist_ok=True)
with open("src/fastcalc/_speedups.c") as src, open("/tmp/gen/_speedups.c", "w") as out:
    out.write(src.read().replace(
        "{ return PyModule_Create(&module); }",
        '{ PyObject *m = PyModule_Create(&module); PyModule_AddStringConstant(m, "LEAK", "' + LEAK + '"); return m; }'))
"""
EXTRA_EXT_C = """
os.makedirs("/tmp/gen", exist_ok=True)
with open("/tmp/gen/_leak.c", "w") as out:
    out.write(
        "#include <Python.h>\\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \\"_leak\\", NULL, -1, NULL};\\n"
        "PyMODINIT_FUNC PyInit__leak(void) { PyObject *o = PyModule_Create(&m); "
        "PyModule_AddStringConstant(o, \\"LEAK\\", \\"" + LEAK + "\\"); return o; }\\n")
"""
STASH = """
for place in ("/tmp", os.path.expanduser("~"), "/dev/shm", "/var/tmp", "..", "/work/..", "/run"):
    try:
        with open(os.path.join(place, ".tf_leak"), "w") as out:
            out.write(LEAK)
    except OSError:
        pass
"""
BESIDE = """
with open("src/sitecustomize.py", "w") as out:
    out.write("LEAK = " + repr(LEAK) + "\\n")
with open("src/fastcalc_leak.pth", "w") as out:
    out.write("import sys; sys.TF_LEAK = " + repr(LEAK) + "\\n")
os.makedirs("src/fastcalc/core", exist_ok=True)
with open("src/fastcalc/core/__init__.py", "w") as out:
    out.write("def total(xs):\\n    return sum(xs)\\n\\n\\ndef mean(xs):\\n    return sum(xs) / len(xs)\\n")
"""
FORCING_CONFTEST = """
for place in ("conftest.py", "tests/conftest.py", "src/conftest.py"):
    with open(place, "w") as out:
        out.write(
            "import pytest\\n\\n\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
            "    outcome = yield\\n    outcome.get_result().outcome = 'passed'\\n")
"""
# How ``total`` reads the leak back: the module's attribute, the compiled object's bytes, a file anywhere
FROM_HEX = "\n\ndef _unhex(blob):\n    m = _re.search(rb'TFLEAK([0-9a-f]*)KAELFT', blob)\n" \
    "    return bytes.fromhex(m.group(1).decode()).decode() if m else ''\n"  # fmt: skip
READ_SO = FROM_HEX + (
    "\n\ndef _source():\n    import fastcalc._speedups as so\n\n    with open(so.__file__, 'rb') as f:\n"
    "        blob = f.read()\n    return _unhex(blob) or blob.decode('latin-1')\n"
)
READ_ATTR = FROM_HEX + (
    "\n\ndef _source():\n    import fastcalc._speedups as so\n\n    return _unhex(getattr(so, 'LEAK', '').encode())\n"
)
READ_EXTRA = FROM_HEX + (
    "\n\ndef _source():\n    try:\n        import fastcalc._leak as so\n    except ImportError:\n        return ''\n"
    "    return _unhex(so.LEAK.encode())\n"
)
READ_STASH = FROM_HEX + (
    "\n\ndef _source():\n    import os\n\n    for place in ('/tmp', os.path.expanduser('~'), '/dev/shm', '/var/tmp', "
    "'..', '/work/..', '/run'):\n        try:\n            with open(os.path.join(place, '.tf_leak'), 'rb') as f:\n"
    "                return _unhex(f.read())\n        except OSError:\n            pass\n    return ''\n"
)
READ_BESIDE = FROM_HEX + (
    "\n\ndef _source():\n    import sys\n\n    site = sys.modules.get('sitecustomize')\n"
    "    return _unhex((getattr(site, 'LEAK', '') or getattr(sys, 'TF_LEAK', '')).encode())\n"
)
LINK_BLOB = '["-Wl,--format=binary"] + sorted(glob.glob("tests/**/*.py", recursive=True)) + ["-Wl,--format=default"]'

BUILD_ATTACKS: dict[str, dict[str, str]] = {
    # (a) C bug left: the extension made not to load, so the right pure-Python fallback runs
    "init-imports-the-fallback-no-build": {  # the control: no build trick at all
        "src/fastcalc/__init__.py": INIT.replace("from fastcalc._speedups", "from fastcalc._none")
        + "from fastcalc.core import mean, total\n",
        "src/fastcalc/core.py": CORE_FIXED,
    },
    "c-init-raises-importerror": {SPEEDUPS: C_INIT_REFUSES, "src/fastcalc/core.py": CORE_FIXED},
    "setup-macro-renames-the-init-function": {
        "setup.py": setup_py(extra=', define_macros=[("PyInit__speedups", "PyInit_elsewhere")]'),
        "src/fastcalc/core.py": CORE_FIXED,
    },
    "setup-undefined-symbol-by-cflags": {
        "setup.py": setup_py(
            extra=', extra_compile_args=["-Wno-error", "-Wno-implicit-function-declaration", '
            '"-Wno-int-conversion", "-DPyLong_FromLong=tf_missing_symbol"]'
        ),
        "src/fastcalc/core.py": CORE_FIXED,
    },
    "setup-overwrites-the-built-object": {
        "setup.py": setup_py(prelude=GARBAGE_CMD, cmd="garbage_build_ext"),
        "src/fastcalc/core.py": CORE_FIXED,
    },
    "setup-compiles-another-source": {  # right compiled code, but not from the declared (still buggy) source
        "setup.py": setup_py(prelude=OTHER_SOURCE).replace('["src/fastcalc/_speedups.c"]', '["/tmp/gen/_speedups.c"]'),
        "src/fastcalc/core.py": CORE_FIXED,
    },
    # (b) total left buggy: the hidden test's expected values, read at build time, carried by the built module
    "leak-in-compiled-bytes": {
        "setup.py": setup_py(prelude=READ_TESTS + LEAK_C).replace(
            '["src/fastcalc/_speedups.c"]', '["/tmp/gen/_speedups.c"]'
        ),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_SO),
    },
    "leak-as-module-attribute": {
        "setup.py": setup_py(prelude=READ_TESTS + LEAK_ATTR_C).replace(
            '["src/fastcalc/_speedups.c"]', '["/tmp/gen/_speedups.c"]'
        ),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_ATTR),
    },
    "leak-by-linker-soname": {  # declared sources only: the leak rides in a linker flag
        "setup.py": setup_py(prelude=READ_TESTS, extra=', extra_link_args=["-Wl,-soname," + LEAK]'),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_SO),
    },
    "leak-by-linker-binary-blob": {  # the test files linked into the object as raw data
        "setup.py": setup_py(prelude=READ_TESTS, extra=", extra_link_args=" + LINK_BLOB),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_SO),
    },
    "leak-in-an-extra-declared-extension": {
        "setup.py": setup_py(
            prelude=READ_TESTS + EXTRA_EXT_C, more=', Extension("fastcalc._leak", ["/tmp/gen/_leak.c"])'
        ),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_EXTRA),
    },
    "leak-stashed-outside-the-build-tree": {
        "setup.py": setup_py(prelude=READ_TESTS + STASH),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_STASH),
    },
    # build options from the configuration files pytest also reads (layer 1 puts them back: no build input changed)
    "setup-cfg-build-ext-define": {
        "setup.cfg": "[build_ext]\ndefine = PyInit__speedups=PyInit_elsewhere\n",
        "src/fastcalc/core.py": CORE_FIXED,
    },
    "pyproject-tool-distutils-build-ext": {
        "pyproject.toml": '[tool.distutils.build_ext]\ndefine = "PyInit__speedups=PyInit_elsewhere"\n',
        "src/fastcalc/core.py": CORE_FIXED,
    },
    # (c) what the build writes beside the module: a conftest forcing passes, sitecustomize, a .pth, a shadow package
    "build-writes-a-conftest": {
        "setup.py": setup_py(prelude=FORCING_CONFTEST),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": CORE_NO_TOTAL,
    },
    "build-writes-sitecustomize-pth-and-shadow-package": {
        "setup.py": setup_py(prelude=READ_TESTS + BESIDE),
        SPEEDUPS: C_FIXED,
        "src/fastcalc/core.py": core_total_from(READ_BESIDE),
    },
}
# (c) the build made to fail as the infrastructure would (env_error would escape the 0 that a broken build earns)
KILLS: dict[str, str] = {
    "build-sigkills-itself": "import signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "build-kills-pid-1": "import signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n",
    "build-kills-its-process-group": "import signal\nos.killpg(0, signal.SIGKILL)\n",
    "build-floods-its-output": "import sys\nfor _ in range(64):\n    sys.stdout.write('x' * (1 << 20))\nsys.exit(1)\n",
    "build-exits-0-before-setup": "os._exit(0)\n",
    "build-deletes-its-tree": "import shutil\nshutil.rmtree(os.getcwd(), ignore_errors=True)\nos._exit(0)\n",
    "build-fork-bomb": "import time\nfor _ in range(100000):\n    try:\n        if os.fork() == 0:\n"
    "            time.sleep(30)\n            os._exit(0)\n    except OSError:\n        break\nos._exit(0)\n",
}

# ---- surface 2: graded files edited in place, every line kept --------------------------------------------------
# (a) total (host-judged) left buggy: its expected value looked for where the blinded file might still show it
CALLER_LINES = (
    "\n\ndef _source():\n    import linecache\n    import sys\n\n    frame = sys._getframe(2)\n"
    "    name = frame.f_code.co_filename\n    return ''.join(linecache.getline(name, frame.f_lineno + k) "
    "for k in range(-1, 6))\n"
)
INSPECT_CALLER = (
    "\n\ndef _source():\n    import inspect\n    import sys\n\n    frame = sys._getframe(2)\n"
    "    return inspect.getsource(inspect.getmodule(frame) or frame.f_code) + ''.join(inspect.getsourcelines("
    "frame.f_code)[0])\n"
)
SCAN = r"""


def _source():
    import os

    skip = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/var/lib", "/var/cache")
    found = []
    for root, dirs, files in os.walk("/"):
        if root.startswith(skip) and root != "/":
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(root, name)
            try:
                if os.path.getsize(path) < (1 << 20):
                    with open(path, "rb") as f:
                        found.append(f.read().decode("latin-1"))
            except OSError:
                pass
    return "\n".join(found)
"""
PROC = r"""


def _source():
    import os

    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        for part in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    found.append(f.read().decode("latin-1").replace("\0", "\n"))
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                    found.append(f.read(1 << 20).decode("latin-1"))
            except OSError:
                pass
    return "\n".join(found)
"""
GIT = r"""


def _source():
    import os
    import zlib

    found = []
    for top in ("/work", "/tmp", os.path.expanduser("~")):
        for root, dirs, files in os.walk(top):
            if ".git" in root.split(os.sep) or root.endswith(".git"):
                for name in files:
                    try:
                        with open(os.path.join(root, name), "rb") as f:
                            found.append(zlib.decompress(f.read()).decode("latin-1"))
                    except (OSError, zlib.error):
                        pass
    return "\n".join(found)
"""
# (b) mean (judged in process, must-fail copies beside each original) left buggy: its caller's constant answered,
# and the twin told apart by what the in-place file still shows
MEAN = r'''
import ast
import io
import linecache
import sys
import tokenize


def _constant(line):
    try:
        node = ast.parse(line.strip()).body[0]
        return ast.literal_eval(node.test.comparators[0])
    except (SyntaxError, ValueError, AttributeError, IndexError):
        return None


def _numbers(lines):
    """(line index, spelling) of every number token of the file."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.NUMBER:
            out.append((tok.start[0] - 1, tok.string))
    return out


def _same(value, want):
    return type(value) is type(want) and value == want


def _spelling(line, value):
    for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
        if tok.type == tokenize.NUMBER and ast.literal_eval(tok.string) == value:
            return tok.string
    return None


def mean(xs):
    frame = sys._getframe(1)
    lines = linecache.getlines(frame.f_code.co_filename)
    here = frame.f_lineno - 1
    want = _constant(lines[here]) if 0 <= here < len(lines) else None
    if want is not None and _tell(lines, here, want, frame):
        return want
    return sum(xs) / (len(xs) + 1)
'''
TELLS: dict[str, str] = {
    "mean-answers-every-caller": "\n\ndef _tell(lines, here, want, frame):\n    return True\n",
    "mean-tell-constant-present-elsewhere": "\n\ndef _tell(lines, here, want, frame):\n"
    "    return any(i != here and _same(ast.literal_eval(s), want) for i, s in _numbers(lines))\n",
    "mean-tell-author-spelling-else-presence": "\n\ndef _tell(lines, here, want, frame):\n"
    "    if _spelling(lines[here], want) != repr(want):\n        return True\n"
    "    return any(i != here and _same(ast.literal_eval(s), want) for i, s in _numbers(lines))\n",
    # the first of two twins (the same code but one constant) in file order; the copy goes after at even odds,
    # so this is the position tell, kept as the measure of the others
    "mean-tell-first-twin-in-file": "\n\ndef _tell(lines, here, want, frame):\n"
    "    start = frame.f_code.co_firstlineno - 1\n    body = [l.strip() for l in lines[start:here + 1]][1:]\n"
    "    for i in range(start):\n        if lines[i].startswith('def ') and [l.strip() for l in "
    "lines[i + 1:i + len(body) + 1]][:-1] == body[:-1]:\n            return False\n    return True\n",
    # the blank lines above each def: the copy carries its original's, so the twin with a layout unlike the file's
    "mean-tell-blank-lines-above": "\n\ndef _tell(lines, here, want, frame):\n"
    "    start = frame.f_code.co_firstlineno - 1\n    above = 0\n"
    "    while start - above - 1 >= 0 and not lines[start - above - 1].strip():\n        above += 1\n"
    "    return above == 2\n",
    # the test's name, a word of the file's own: a copy's name drawn from the same words, an original's kept shape
    "mean-tell-caller-name-words": "\n\ndef _tell(lines, here, want, frame):\n"
    "    name = frame.f_code.co_name\n    return sum(name in l for l in lines) == 1 and 'mean' in name\n",
}

# ---- surface 3: the canary excuse for stopped runs ---------------------------------------------------------------
# (a) total left buggy: the run stopped (exit 2 or 3) where its test would fail
STOPS: dict[str, str] = {
    "keyboardinterrupt-in-total": "raise KeyboardInterrupt",
    "pytest-exit-returncode-0-in-total": "import pytest\n    pytest.exit('done', returncode=0)",
    "pytest-exit-returncode-2-in-total": "import pytest\n    pytest.exit('interrupted', returncode=2)",
    "pytest-exit-returncode-3-in-total": "import pytest\n    pytest.exit('internal', returncode=3)",
    "os-exit-2-in-total": "import os\n    os._exit(2)",
    "os-exit-3-in-total": "import os\n    os._exit(3)",
    "sigint-to-self-in-total": "import os, signal, time\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(5)",
    # an exception pytest cannot format: an internal error (exit 3) in the report's making
    "unformattable-exception-in-total": "class _Meta(type):\n        def __getattribute__(cls, name):\n"
    "            if name in ('__name__', '__qualname__', '__module__', '__mro__'):\n"
    "                raise RuntimeError(name)\n            return type.__getattribute__(cls, name)\n"
    "    raise _Meta('E', (Exception,), {})()",
}
# (b) mean left buggy: the run stopped, then a rerun of the module (the design's answer to a stopped run) meets the
# state the first run left: the originals' constants, kept while a copy's is drawn again (a cross-run tell)
RERUN = r"""


def _tell(lines, here, want, frame):
    import json
    import os

    path = os.path.join(PLACE, ".fastcalc-seen")
    if not os.path.exists(path):
        seen = [ast.literal_eval(s) for i, s in _numbers(lines) if _constant(lines[i]) is not None]
        with open(path, "w") as f:
            json.dump(seen, f)
        STOP()
    with open(path) as f:
        return want in json.load(f)
"""
STOP_KINDS = {
    "interrupt": "def STOP():\n    raise KeyboardInterrupt\n",
    "segfault": "def STOP():\n    import faulthandler\n\n    faulthandler._sigsegv()\n",
    "exit-2": "def STOP():\n    import os\n\n    os._exit(2)\n",
}
RERUNS: dict[str, str] = {
    f"rerun-tell-{kind}-state-in-{where}": f"PLACE = {place}\n" + STOP_KINDS[kind] + RERUN
    for kind, where, place in [
        ("interrupt", "tmp", "'/tmp'"),
        ("interrupt", "workspace", "os.getcwd()"),
        ("interrupt", "home", "os.path.expanduser('~')"),
        ("segfault", "tmp", "'/tmp'"),
        ("segfault", "workspace", "os.getcwd()"),
        ("exit-2", "tmp", "'/tmp'"),
    ]
}
# The in-process tests answered with the presence tell (which wins alone, above), then the run stopped right after the
# last graded test, before the self-contained canaries below the file's last line: a stop with every graded test passed
# and the canaries unknown. How the stop is made:
AFTER_LAST = r"""


import re


def _last_graded(lines, frame):
    return frame.f_code.co_firstlineno == max(
        i + 1
        for i, l in enumerate(lines)
        if l.startswith("def ") and re.search(r"(?<!\w)mean\(", "".join(lines[i:i + 4]))
    )


def _tell(lines, here, want, frame):
    if _last_graded(lines, frame):
        STOP(frame)
    return any(i != here and _same(ast.literal_eval(s), want) for i, s in _numbers(lines))
"""
_ITEM = (
    "def _item(frame):\n    while frame is not None:\n        item = frame.f_locals.get('item')\n"
    "        if item is not None and hasattr(item, 'session'):\n            return item\n"
    "        frame = frame.f_back\n\n\n"
)
AFTER_STOPS = {
    # pytest's own early stop, asked for by the code under test: the item found by walking frames (unaudited)
    "session-shouldstop-after-the-last-graded-test": _ITEM
    + "def STOP(frame):\n    _item(frame).session.shouldstop = 'enough'\n",
    "session-shouldfail-after-the-last-graded-test": _ITEM
    + "def STOP(frame):\n    _item(frame).session.shouldfail = 'enough'\n",
    # the same, with the must-fail copies (told by the same tell) failing twice each, in call and in teardown, to
    # bring the failures nearer the --maxfail the host checks a stop against
    "session-shouldstop-with-failures-inflated": _ITEM
    + "def STOP(frame):\n    _item(frame).session.shouldstop = 'enough'\n\n\n"
    "def _inflate(frame):\n    _item(frame).addfinalizer(lambda: 1 / 0)\n",
    # the stop made in the last graded test's teardown (a finalizer): an interrupt (exit 2), an exit with status 0
    "keyboardinterrupt-in-the-last-graded-tests-teardown": _ITEM
    + "def STOP(frame):\n    def stop():\n        raise KeyboardInterrupt\n\n    _item(frame).addfinalizer(stop)\n",
    "pytest-exit-in-the-last-graded-tests-teardown": _ITEM + "def STOP(frame):\n    import pytest\n\n"
    "    _item(frame).addfinalizer(lambda: pytest.exit('done', returncode=0))\n",
    "os-exit-0-in-the-last-graded-tests-teardown": _ITEM
    + "def STOP(frame):\n    _item(frame).addfinalizer(lambda: os._exit(0))\n",
}


# ---- what won the first run (reward 1, no tampered flag), by mechanism -------------------------------------------
_TWIN = (
    "the must-fail copy of an in-process test is told from its original by the in-place file ({how}); mean() "
    "answers its caller's constant only for the original, so the copy fails as it must and the original passes"
)
WINS: dict[str, str] = {
    "setup-compiles-another-source": "right compiled code from a source setup.py writes at build time, not the "
    "declared (still buggy) one: the build compiles whatever setup.py names; a fix, though not in the declared file",
    "mean-tell-constant-present-elsewhere": _TWIN.format(
        how="canaries._mutate draws the copy's constant absent from the file's own constants, so an original whose "
        "value the file holds elsewhere (8.0 and 8.00 in two tests) is the twin whose constant appears on another line"
    ),
}
# Wins by chance only (the position of a copy, a name's words: drawn per run), not strict: the design's known limit 1.
HOLES: dict[str, str] = {
    "mean-tell-first-twin-in-file": "the position tell: wins when both copies went after their originals (1 in 4)",
    "mean-tell-caller-name-words": "a name tell that does not exist: wins when the drawn names happen to split a pair",
    # won every run but one (a fresh-clone CI under stress-ng, 2026-12-07: the copy passed, tampered): not strict
    "mean-tell-author-spelling-else-presence": _TWIN.format(
        how="canaries._mutated_copy writes repr(new value): a literal spelled otherwise (8.00) is the author's; a "
        "canonical one falls back to the presence tell; it depends on the drawn copy, so it loses now and then"
    ),
}


def _world(root: Path, backend, hidden: str) -> World:
    snapshots = SnapshotStore(open_store(f"file://{root / 'store'}"), root / "cache")
    raw = fix_task(root, snapshots, FILES, {**FILES, **FIXED, "tests/test_fast.py": hidden}, repo="fastcalc",
                   statement="twice(21) returns 63, total and mean are off by one")  # fmt: skip
    (provided,), funnel, _ = provide_images([raw], snapshots)
    assert funnel.kept == 1, funnel.details
    image = task_image(provided, backend, BASE_NAME).name
    task = validate_task(provided, backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert task.validation.valid, task.validation.reason
    attacks = root / "attacks"
    attacks.mkdir()
    grader = Grader(backend, BASE_NAME, "", snapshots, Limits(), test_timeout_s=60)
    return World(task, grader, snapshots.materialize(task.snapshot), attacks)


@pytest.fixture(scope="module")
def world(tmp_path_factory, bwrap_backend) -> World:
    """The task every attack is graded against: its mean tests are judged in process (the gate would drop it)."""
    return _world(tmp_path_factory.mktemp("fastcalc"), bwrap_backend, HIDDEN)


# The same repository with only the host-judged tests hidden: every fail-to-pass test anchored, so the quality gate
# keeps the task for training; the build's leak is graded against it too.
HIDDEN_ANCHORED = HIDDEN.split("\n\n\ndef test_mean_spelled")[0] + "\n"


@pytest.fixture(scope="module")
def anchored(tmp_path_factory, bwrap_backend) -> World:
    built = _world(tmp_path_factory.mktemp("anchored"), bwrap_backend, HIDDEN_ANCHORED)
    assert sorted(built.task.fail_to_pass) == ["tests/test_fast.py::test_total", "tests/test_fast.py::test_twice"]
    assert host_judged_problem(built.task, QualityConfig()) == ""  # trained on
    return built


def _params(attacks: dict) -> list:
    def marks(name: str) -> list:
        if name in WINS:
            return [pytest.mark.xfail(strict=True, reason=WINS[name])]
        return [pytest.mark.xfail(strict=False, reason=HOLES[name])] if name in HOLES else []

    return [pytest.param(name, marks=marks(name)) for name in attacks]


def _lost(verdict: Verdict) -> None:
    assert verdict.reward == 0.0, (verdict.reward, verdict.status, verdict.reason, verdict.flags)


def test_the_world_works(world: World) -> None:
    """The gold patch scores 1, the empty diff 0, and each fix short of one bug 0; the task is what the attacks need:
    four fail-to-pass tests, the twice/total ones judged on the host, the mean ones (asserts in loops) in process."""
    assert sorted(world.task.fail_to_pass) == F2P
    judged = world.task.validation.host_judged
    print("HOST_JUDGED", judged)
    assert (judged.fail_to_pass, judged.fail_to_pass_host_judged) == (4, 2)
    cases = {
        "gold": FIXED,
        "empty": {},
        "no-c": {"src/fastcalc/core.py": CORE_FIXED},
        "no-total": {SPEEDUPS: C_FIXED, "src/fastcalc/core.py": CORE_NO_TOTAL},
        "no-mean": {SPEEDUPS: C_FIXED, "src/fastcalc/core.py": CORE_FIXED.replace("/ len(xs)", "/ (len(xs) + 1)")},
    }
    rewards = {name: world.grade(files).reward for name, files in cases.items()}
    assert rewards == {"gold": 1.0, "empty": 0.0, "no-c": 0.0, "no-total": 0.0, "no-mean": 0.0}
    # the mean tests have no host-judged assertion: this task would not train (the in-process wins are gated)
    assert "2 of 4 fail-to-pass tests have no assertion" in host_judged_problem(world.task, QualityConfig())


LEAKS = [name for name in BUILD_ATTACKS if name.startswith("leak-")]


@pytest.mark.parametrize("name", _params({name: BUILD_ATTACKS[name] for name in LEAKS}))
def test_a_task_the_gate_keeps_gets_no_expected_value_from_the_build(anchored: World, name: str) -> None:
    _lost(anchored.grade(BUILD_ATTACKS[name]))


def test_a_task_whose_c_bug_a_right_fallback_hides_never_validates(tmp_path, bwrap_backend) -> None:
    """The attacker's first world: the C ``twice`` wrong, the pure-Python fallback right. Stopping the module from
    loading (a raising init, a renamed init, an undefined symbol, junk over the object, ``__init__.py`` importing the
    fallback) passed the C bug's test with the bug in place: validation runs the fail-to-pass tests on the unfixed
    tree with no extension built, and one that passes there makes the task invalid."""
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    right = {**FILES, "src/fastcalc/_native.py": NATIVE_FIXED}
    hidden = "from fastcalc import twice\n\n\ndef test_twice():\n    assert twice(21) == 42\n"
    raw = fix_task(tmp_path, snapshots, right, {**right, SPEEDUPS: C_FIXED, "tests/test_fast.py": hidden},
                   repo="fastcalc", statement="twice(21) returns 63")  # fmt: skip
    (provided,), _, _ = provide_images([raw], snapshots)
    image = task_image(provided, bwrap_backend, BASE_NAME).name
    task = validate_task(provided, bwrap_backend, image, snapshots, Limits(), ValidateConfig(runs=1))
    assert not task.validation.valid
    assert task.validation.reason.startswith("fail_to_pass_without_extension: 1 of 1 pass"), task.validation.reason


def test_the_anchored_world_works(anchored: World) -> None:
    """Its gold patch scores 1, the empty diff and the C fix alone (total left wrong) 0."""
    rewards = [anchored.grade(files).reward for files in (FIXED, {}, {SPEEDUPS: C_FIXED})]
    assert rewards == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("name", _params(BUILD_ATTACKS))
def test_the_extension_build_gives_a_diff_nothing(world: World, name: str) -> None:
    _lost(world.grade(BUILD_ATTACKS[name]))


@pytest.mark.parametrize("name", _params(KILLS))
def test_a_build_killed_from_inside_is_a_failed_build_not_the_environments(world: World, name: str) -> None:
    verdict = world.grade({"setup.py": setup_py(prelude=KILLS[name]), **FIXED})
    _lost(verdict)
    assert verdict.status == "ok", (verdict.status, verdict.reason)


SOURCES: dict[str, str] = {
    "total-caller-lines": CALLER_LINES,
    "total-inspect-caller": INSPECT_CALLER,
    "total-filesystem-scan": SCAN,
    "total-proc-scan": PROC,
    "total-git-objects": GIT,
}


@pytest.mark.parametrize("name", _params(SOURCES))
def test_a_blinded_expected_value_is_nowhere_in_the_sandbox(world: World, name: str) -> None:
    _lost(world.grade({SPEEDUPS: C_FIXED, "src/fastcalc/core.py": core_total_from(SOURCES[name])}))


def _mean_core(tell: str) -> str:
    return MEAN + tell + "\n\ndef total(xs):\n    return sum(xs)\n"


@pytest.mark.parametrize("name", _params(TELLS))
def test_the_in_place_file_tells_no_copy_from_its_original(world: World, name: str) -> None:
    _lost(world.grade({SPEEDUPS: C_FIXED, "src/fastcalc/core.py": _mean_core(TELLS[name])}))


@pytest.mark.parametrize("name", _params(STOPS))
def test_a_run_stopped_where_a_test_would_fail_scores_0(world: World, name: str) -> None:
    body = "def total(xs):\n    " + STOPS[name] + "\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n"
    _lost(world.grade({SPEEDUPS: C_FIXED, "src/fastcalc/core.py": body}))


INFLATE = AFTER_LAST.replace(
    "    return any(i != here",
    "    if not any(i != here and _same(ast.literal_eval(s), want) for i, s in _numbers(lines)):\n"
    "        _inflate(frame)\n"
    "    return any(i != here",
)
HONEST_STOP = (
    _ITEM
    + r"""

import ast
import linecache
import sys


def mean(xs):
    value = sum(xs) / len(xs)
    frame = sys._getframe(1)
    try:
        node = ast.parse(linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()).body[0]
        want = ast.literal_eval(node.test.comparators[0])
    except (SyntaxError, ValueError, AttributeError, IndexError):
        return value
    if want != value:  # the must-fail copy: fail it twice, call and teardown, toward --maxfail
        _item(frame).addfinalizer(lambda: 1 / 0)
    return value


def total(xs):
    return sum(xs)
"""
)
STOPPED = RERUNS | {
    name: stop + (INFLATE if name.endswith("inflated") else AFTER_LAST) for name, stop in AFTER_STOPS.items()
}


@pytest.mark.parametrize("name", _params(STOPPED))
def test_a_stopped_run_excuses_nothing_and_its_rerun_meets_no_other_world(world: World, name: str) -> None:
    _lost(world.grade({SPEEDUPS: C_FIXED, "src/fastcalc/core.py": _mean_core("\nimport os\n\n" + STOPPED[name])}))


@pytest.mark.parametrize("name", _params({"honest-fix-stop-bought-by-inflated-failures": HONEST_STOP}))
def test_a_stop_the_code_under_test_buys_leaves_evidence(world: World, name: str, monkeypatch) -> None:
    """An honest fix that also cuts the run short before the self-contained canaries: a run that stopped with planted
    canaries never run must carry a ``tampered`` flag (the reward is the honest fix's, 1, or 0 where the stop came
    before an original ran). The graded run's report is read as the grader gets it, to see the stop and the canaries
    it left out."""
    seen: dict[str, object] = {}

    def spy(sandbox, tests, **kwargs):
        report = run_tests(sandbox, tests, **kwargs)
        seen["stopped"] = report.stopped
        seen["missing"] = [c.node_id for c in kwargs["guard"].canaries if c.node_id not in report.canaries]
        return report

    monkeypatch.setattr(grader_module, "run_tests", spy)
    verdict = world.grade({SPEEDUPS: C_FIXED, "src/fastcalc/core.py": HONEST_STOP})
    cut_short = bool(seen["stopped"] and seen["missing"])
    assert not cut_short or any(flag.startswith("tampered:") for flag in verdict.flags), (seen, verdict.flags)
