"""The test run's recorder: the program the sandbox runs as ``python3 -s -c <this source> KEYFILE PYTEST_ARGS...``.

Never imported by trialforge; it runs inside the sandbox with the standard library and pytest only.
Everything it needs it takes before any code under test is imported, and it keeps no name in
``__main__`` or ``sys.modules``:

- the run's secret report marker and the hashes of the pristine test files come from KEYFILE,
  which it reads and unlinks first (never the environment or argv: ``/proc/self/environ`` and
  ``/proc/self/cmdline`` stay readable all run);
- the report channel is a private duplicate of the original stdout (close-on-exec, so no child
  inherits it); fd 1 then points at stderr, so whatever the code under test prints is only a log;
- everything it imports is imported with the workspace off ``sys.path`` (no ``pytest.py`` or
  ``json.py`` of the repository's can stand in), then the path is restored for the code under test;
- a fingerprint of pytest's and pluggy's functions is taken right after importing them, and an
  audit hook (PEP 578, never removable) is added, before collection runs any code under test.

It writes numbered lines (``<marker><json>``): per test phase how it really ended (seen by its
outermost wrappers) and what was reported of it, per finished test, per collection error or skip,
per piece of tamper evidence (framework functions replaced, report-path hooks changed or foreign,
test items or their modules swapped, a report changed after it was made, trace hooks), and at the
end pytest's exit code; the audit hook writes unnumbered evidence lines of its own. Then it leaves
with ``os._exit(code)``: no atexit handler, thread or finaliser of the code under test runs after the
report. The host (``trialforge.testrun.report``) checks the stream, the process's real exit status
and the canaries; docs/verification.md has the threat model.
"""

import os  # os and sys: loaded by the interpreter itself, before any path is searched
import sys

REPORT_HOOKS = (
    "pytest_runtestloop",
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_runtest_logstart",
    "pytest_runtest_logfinish",
    "pytest_report_teststatus",
    "pytest_pyfunc_call",
    "pytest_collection_modifyitems",
    "pytest_sessionfinish",
    "pytest_assertrepr_compare",
)


def _main():  # one closure on purpose: nothing of the recorder at module level
    # Nothing in the workspace may stand in for what the recorder imports (a json.py, a pytest.py at the
    # repository root, or on a PYTHONPATH entry inside it): import with the workspace off the path.
    workspace = os.getcwd()
    search_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if p and os.path.commonpath([os.path.abspath(p), workspace]) != workspace]
    import hashlib
    import importlib
    import json

    key_path = sys.argv.pop(1)
    with open(key_path, encoding="utf-8") as fh:
        key = json.load(fh)
    os.unlink(key_path)
    marker = key["marker"]
    pristine = key["pristine"]  # relative path -> sha256 of each file the diff left alone (None: all vouched for)
    tests = key["tests"]  # which of them are test files
    channel = os.dup(1)
    os.dup2(2, 1)
    write, dumps, exit_now, sha256 = os.write, json.dumps, os._exit, hashlib.sha256
    seq = [0]

    def emit(event):
        event["s"] = seq[0]
        seq[0] += 1
        data = (marker + dumps(event, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[write(channel, data) :]

    import pluggy
    import pytest
    from _pytest.config import default_plugins

    for name in default_plugins:
        importlib.import_module("_pytest." + name)

    framework_dirs = tuple(os.path.dirname(m.__file__) + os.sep for m in (pytest, pluggy, sys.modules["_pytest"]))

    def function_of(value):
        """The function whose code runs when ``value`` is called (a method's, a property getter's), or None."""
        value = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
        return value if hasattr(value, "__code__") else None

    def framework_functions():
        """[where, the dict holding them, keys, their values] per module and class of pytest and pluggy.

        Values are held, and compared by identity (one C-level pass per dict): a function replaced in
        its module or class. A function's code swapped in place is the audit hook's to see.
        """
        groups = []
        for modname, module in sorted(sys.modules.items()):
            if not (modname in ("pytest", "pluggy") or modname.startswith(("_pytest.", "pluggy."))):
                continue
            mine = [a for a, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == modname]
            groups.append([modname, vars(module), tuple(mine), tuple(vars(module)[a] for a in mine)])
            for cls in [vars(module)[a] for a in mine if isinstance(vars(module)[a], type)]:
                keys = tuple(name for name, member in vars(cls).items() if function_of(member) is not None)
                groups.append([f"{modname}.{cls.__name__}", vars(cls), keys, tuple(vars(cls)[k] for k in keys)])
        return groups

    def from_framework(value):
        function = function_of(value)
        return function is not None and function.__code__.co_filename.startswith(framework_dirs)

    watched = framework_functions()
    evidence_seen = set()

    def evidence(what):
        if what not in evidence_seen:
            evidence_seen.add(what)
            emit({"e": "tamper", "what": what})

    def check_framework(settle=False):
        """Evidence for each replaced function; ``settle``: accept replacements made by pytest's own code."""
        for group in watched:
            where, holder, keys, values = group
            now = tuple(map(holder.get, keys))
            if now == values:
                continue
            for key, before, after in zip(keys, values, now, strict=True):
                if after is not before and not (settle and from_framework(after)):
                    evidence(f"framework_patched:{where}.{key}")
            group[3] = now  # e.g. _pytest.legacypath patches Config at configure time; evidence is given once
        if sys.gettrace() is not None or sys.getprofile() is not None:
            evidence("trace_hook")

    def hook_state(config):
        """The report path's hook callers and implementations, held (equality is identity for functions;
        code swapped inside one is the audit hook's to see)."""
        state = [getattr(config.pluginmanager, "_inner_hookexec", None)]
        for name in REPORT_HOOKS:
            caller = getattr(config.hook, name, None)
            impls = caller.get_hookimpls() if caller is not None else []
            state.append((caller, getattr(caller, "_hookexec", None), tuple((i, i.function) for i in impls)))
        return tuple(state)

    hashes = {}

    def in_workspace(path):
        return os.path.abspath(path).startswith(workspace + os.sep)

    def pristine_code(function):
        """The function comes from a file of the image (outside the workspace: the diff cannot touch it) or
        from a test file the host wrote, unchanged. Generated code (``<string>``) is neither."""
        if pristine is None:  # the host vouches for the whole tree (its own runs)
            return True
        function = function_of(function)
        if function is None:
            return False
        path = function.__code__.co_filename
        if not in_workspace(path):
            return os.path.isabs(path) and os.path.isfile(path)
        rel = os.path.relpath(path, workspace)
        if rel not in hashes:
            try:
                with open(path, "rb") as fh:
                    hashes[rel] = sha256(fh.read()).hexdigest()
            except OSError:
                hashes[rel] = None
        return hashes[rel] is not None and pristine.get(rel) == hashes[rel]

    def foreign_skip(report):
        """Where a skip was raised, when that is a file of the workspace other than a pristine test file."""
        where = report.longrepr[0] if report.skipped and isinstance(report.longrepr, tuple) else None
        if not where or pristine is None or not in_workspace(where):
            return None  # pytest's own skips, and installed libraries' (their files are the image's)
        rel = os.path.relpath(os.path.abspath(where), workspace)
        return None if rel in pristine else rel

    from importlib.machinery import SourceFileLoader

    from _pytest.assertion.rewrite import AssertionRewritingHook
    from _pytest.outcomes import Skipped, XFailed

    test_loaders = (AssertionRewritingHook, SourceFileLoader)  # the classes themselves: a namesake is no match
    install_audit_hook(pristine is None, tests, framework_dirs, workspace, channel, marker, sys._getframe(0).f_code)

    # The recorder's state lives in this closure, not on the plugin object other plugins can list.
    config_of, hooks_at_start, hooks_after_collection, items = [], [()], [()], {}
    seen_reports, stopped = {}, [False]

    def impls(name):
        caller = getattr(config_of[0].hook, name, None)
        return caller.get_hookimpls() if caller is not None else []

    def registered_at_start(name, impl):
        return any(entry[0] is impl for entry in hooks_at_start[0][1 + REPORT_HOOKS.index(name)][2])

    def same_hooks_as_collected(name):
        """The implementations this hook call runs with are the ones collection ended with."""
        index = 1 + REPORT_HOOKS.index(name)
        now = tuple((i, i.function) for i in impls(name))
        if hooks_after_collection[0] and now != hooks_after_collection[0][index][2]:
            evidence(f"hooks_changed:{name}")

    def item_state(item):
        """The test's function and code (a unittest item rebinds its method per run: the function stays)."""
        function = function_of(getattr(item, "obj", None))
        code = function.__code__ if function is not None else None
        return function, code, "runtest" in vars(item), type(item).runtest

    def check_item(item):
        if items.get(item.nodeid, item_state(item)) != item_state(item):
            evidence(f"test_item_patched:{item.nodeid}")

    def observe(name, item, when):
        """A wrapper around one phase: how it really ended, before any report is made of it."""
        same_hooks_as_collected(name)
        check_item(item)
        outcome = yield
        error = outcome.excinfo
        ended = "ok" if error is None else "skip" if issubclass(error[0], (Skipped, XFailed)) else "raised"
        emit({"e": "ran", "id": item.nodeid, "w": when, "x": ended})

    class Recorder:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_load_initial_conftests(self, early_config):
            """Before the first conftest (and whatever it imports) runs: the hooks as pytest set them up."""
            config_of.append(early_config)
            hooks_at_start[0] = hook_state(early_config)
            yield

        @pytest.hookimpl(trylast=True)
        def pytest_configure(self, config):
            check_framework(settle=True)

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session):
            """Hooks added since the first conftest must be pytest's or come from pristine test files."""
            check_framework()
            for name in REPORT_HOOKS:
                for impl in impls(name):
                    if registered_at_start(name, impl) or from_framework(impl.function):
                        continue
                    if not pristine_code(impl.function):
                        evidence(f"foreign_hookimpl:{name}:{impl.plugin_name}")
            hooks_after_collection[0] = hook_state(session.config)
            for item in session.items:
                items[item.nodeid] = item_state(item)
                module = getattr(item, "module", None)
                if module is not None and type(getattr(module, "__loader__", None)) not in test_loaders:
                    evidence(f"test_module_loader:{type(module.__loader__).__name__}")

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            yield from observe("pytest_runtest_setup", item, "setup")

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            yield from observe("pytest_runtest_call", item, "call")

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item):
            yield from observe("pytest_runtest_teardown", item, "teardown")

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_makereport(self, item, call):
            same_hooks_as_collected("pytest_runtest_makereport")
            outcome = yield
            report = outcome.get_result()
            seen_reports[id(report)] = (report, report.outcome)

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_logreport(self, report):
            """The report as made is the report as logged; per phase, to the host, which aggregates."""
            made = seen_reports.pop(id(report), None)
            if made is None or made[0] is not report or made[1] != report.outcome:
                evidence(f"report_changed_after_it_was_made:{report.nodeid}")
            event = {"e": "phase", "id": report.nodeid, "w": report.when, "o": report.outcome}
            origin = foreign_skip(report)
            if origin:
                event["k"] = origin
            emit(event)

        @pytest.hookimpl(trylast=True)
        def pytest_runtest_logfinish(self, nodeid):
            check_framework()
            if hook_state(config_of[0]) != hooks_after_collection[0]:
                evidence("hooks_changed")
            emit({"e": "test", "id": nodeid})

        def pytest_collectreport(self, report):
            if report.failed:
                emit({"e": "collect_error", "id": report.nodeid or "."})
            if report.skipped:  # a whole module skipped at collection (importorskip, a skip at import)
                event = {"e": "collect_skip", "id": report.nodeid or "."}
                origin = foreign_skip(report)
                if origin:
                    event["k"] = origin
                emit(event)

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session):
            stopped[0] = bool(session.shouldfail or session.shouldstop)

    sys.path[:] = search_path  # the code under test imports as under a plain ``python -c``
    emit({"e": "start", "pytest": pytest.__version__, "pluggy": getattr(pluggy, "__version__", "")})
    code = int(pytest.main(sys.argv[1:], plugins=[Recorder()]))
    check_framework(settle=True)  # pytest undoes its own configure-time patches at unconfigure
    emit({"e": "end", "exit": code, "stopped": stopped[0]})
    exit_now(code)


def install_audit_hook(vouched, tests, framework_dirs, workspace, channel, marker, main_code):
    """An audit hook (PEP 578: once added, never removed) that reports tampering as it happens.

    It sees what the fingerprints between tests cannot: a patch made and undone within one test,
    a function's code swapped, the collector walked for the recorder's objects, memory read raw.
    Only calls made by the code under test count: the nearest caller that is neither pytest, the
    standard library, generated code (``<...>``) nor a pristine test file, or a thread that holds
    none of those (started by whom, then?). Everything it uses is bound as a default argument:
    immutable values, and replacing a function's defaults or code is itself an audited event.
    """
    stdlib = os.path.dirname(os.__file__) + os.sep
    allowed = frozenset(os.path.join(workspace, rel) for rel in tests)  # test code may monkeypatch anything

    def audit(
        event,
        args,
        _events=AUDITED,
        _skip=(*framework_dirs, stdlib, "<"),
        _guarded=(*framework_dirs, "<string>"),  # pytest's and the recorder's own code (stdlib's is its own)
        _allowed=allowed,
        _workspace=workspace + os.sep,
        _vouched=vouched,
        _main=main_code,
        _frame=sys._getframe,
        _write=os.write,
        _fd=channel,
        _prefix=marker,
    ):
        if event not in _events or _vouched:
            return
        if event == "object.__setattr__":
            target, name = args[0], args[1]
            code = getattr(target, "__code__", None)
            origin = str(getattr(target, "__module__", None) or "")
            framework_class = isinstance(target, type) and origin.split(".")[0] in ("_pytest", "pytest", "pluggy")
            guarded_code = code is not None and (code.co_filename.startswith(_guarded) or code.co_filename in _allowed)
            if not (framework_class or guarded_code):
                return
            what = f"patched_live:{getattr(target, '__qualname__', '?')}.{name}"
        elif event == "open":
            if not (str(args[0]).startswith("/proc/") and str(args[0]).endswith("/mem")):
                return
            what = "process_memory_read"
        elif event == "ctypes.dlsym" and not str(args[1]).startswith(("Py", "_Py")):
            return
        else:
            what = event
        frame = _frame(1)
        while frame is not None:
            path = frame.f_code.co_filename
            if frame.f_code is _main or path in _allowed:
                return  # pytest's own doing, or a pristine test's
            if not path.startswith(_skip):
                if path.startswith(_workspace):
                    break  # the code under test
                return  # an installed library's
            frame = frame.f_back
        _write(_fd, (_prefix + '{"e":"tamper","what":"' + what.replace('"', "'") + '"}\n').encode())

    sys.addaudithook(audit)


AUDITED = frozenset(
    {
        "object.__setattr__",  # a framework class's attribute, or any guarded function's code, replaced
        "sys.settrace",
        "sys.setprofile",
        "gc.get_objects",  # walking the collector: how in-process code finds the recorder and pytest's state
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "open",  # only /proc/<pid>/mem: reading the process's memory raw
        "ctypes.dlsym",  # only the interpreter's own API (Py*): rewriting frames and objects from C
        "ctypes.cdata",
        "ctypes.string_at",
    }
)


globals().pop("_main")()
