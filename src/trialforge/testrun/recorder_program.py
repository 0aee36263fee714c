"""The test run's recorder: the program the sandbox runs as ``python3 -s -c <this source> KEYFILE [PYTEST_ARGS...]``.

Never imported by trialforge; it runs inside the sandbox with the standard library and the runner only (pytest, or
unittest with its plan in KEYFILE), and keeps no name in ``__main__`` or ``sys.modules``. Before any code under test
is imported it reads and unlinks KEYFILE, takes a private report channel, imports with the workspace off
``sys.path``, fingerprints the runner and adds an audit hook. It writes numbered ``<marker><json>`` lines (phases,
outcomes, collection errors, deselections, tamper evidence, the exit code), then leaves with ``os._exit(code)``.
The host (``trialforge.testrun.report``) checks the stream. Why each step, and how unittest runs are reported:
docs/verification.md, layers 3 to 8b and "Test commands".
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
# pytest's plugins that only add to what a report shows (log sections), never decide an outcome: a test may take
# them out and put them back (flask's tests unregister the logging plugin around each test). By class, from
# pytest's own modules, which the recorder fingerprints.
REMOVABLE_PLUGINS = {"logging-plugin": ("_pytest.logging", "LoggingPlugin")}
# What a unittest TestCase runs a test through: shadowed on a test instance, the test no longer runs as written.
TESTCASE_PROTOCOL = (
    "run", "__call__", "debug", "_callSetUp", "_callTestMethod", "_callTearDown", "_callCleanup", "doCleanups",
    "_addExpectedFailure", "_addUnexpectedSuccess", "_feedErrorsToResult", "_callMaybeAsync", "_callAsync",
)  # fmt: skip
PARTS = ("setUp", "tearDown")  # a unittest test's parts wrapped on its instance, besides its method
CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, read off the code object (inspect's helpers are patchable)
CO_VARARGS, CO_VARKEYWORDS, CO_GENERATOR, CO_ASYNC_GEN = 0x04, 0x08, 0x20, 0x200  # inspect's flags of the same names
# A generated forwarder's code matches the recorder's own compile in these (its file and lines are left out): the
# constants are compared apart, by type too.
FORWARDER_PARTS = (
    "co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount", "co_posonlyargcount",
    "co_kwonlyargcount", "co_flags", "co_nlocals", "co_name",
)  # fmt: skip
MESSAGE_CAP = 300  # characters of a collection error's first line


def _main(run_pytest, run_unittest):  # one closure on purpose: nothing of the recorder at module level
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
    if key.get("cpu_s"):  # the run's CPU budget, before any code under test: SIGXCPU at it, SIGKILL a second on
        import resource

        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        cap = key["cpu_s"] + 1 if hard == resource.RLIM_INFINITY else min(hard, key["cpu_s"] + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (min(key["cpu_s"], cap), cap))
    marker = key["marker"]
    pristine = key["pristine"]  # relative path -> sha256 of each file the diff left alone (None: all vouched for)
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

    evidence_seen = set()

    def evidence(what):
        if what not in evidence_seen:
            evidence_seen.add(what)
            emit({"e": "tamper", "what": what})

    def function_of(value):
        """The function whose code runs when ``value`` is called (a method's, a property getter's), or None."""
        value = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
        return value if hasattr(value, "__code__") else None

    def fingerprint(is_framework, classes=()):
        """[where, the dict holding them, keys, their values] per framework module and class (and ``classes``).

        Values are held, and compared by identity (one C-level pass per dict): a function replaced in
        its module or class. A function's code swapped in place is the audit hook's to see.
        """
        groups = []
        for modname, module in sorted(sys.modules.items()):
            if not is_framework(modname):
                continue
            mine = [a for a, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == modname]
            groups.append([modname, vars(module), tuple(mine), tuple(vars(module)[a] for a in mine)])
            classes = (*classes, *[vars(module)[a] for a in mine if isinstance(vars(module)[a], type)])
        for cls in classes:
            keys = tuple(name for name, member in vars(cls).items() if function_of(member) is not None)
            where = f"{cls.__module__}.{cls.__qualname__}".removeprefix("__main__.")
            groups.append([where, vars(cls), keys, tuple(vars(cls)[k] for k in keys)])
        return groups

    def check_fingerprint(groups, accept=None):
        """Evidence for each replaced function; ``accept(replacement, original)``: replacements to let be."""
        for group in groups:
            where, holder, keys, values = group
            now = tuple(map(holder.get, keys))
            if now == values:
                continue
            for index, key in enumerate(keys):  # (no zip(strict=): the recorder runs on Python 3.9 too)
                before, after = values[index], now[index]
                if after is not before and not (accept is not None and accept(after, before)):
                    evidence(f"framework_patched:{where}.{key}")
            group[3] = now  # e.g. _pytest.legacypath patches Config at configure time; evidence is given once
        if sys.gettrace() is not None or sys.getprofile() is not None:
            evidence("trace_hook")

    def in_workspace(path):
        path = os.path.abspath(path)
        return path == workspace or path.startswith(workspace + os.sep)

    codes = CodeRegistry(workspace, pristine, key["tests"], sha256, function_of)

    def pristine_code(function):
        """The function's code is one the recorder vouches for by identity: it existed before any code under
        test ran, or came from a file of the image, or the recorder compiled it from a workspace file the diff
        left alone. Never by its file name: ``compile()`` sets that to anything."""
        if pristine is None:  # the host vouches for the whole tree (its own runs)
            return True
        function = function_of(function)
        return function is not None and codes.vouched(function.__code__)

    def foreign(path):
        """``path`` relative to the workspace when it is a workspace file other than a pristine one, else None."""
        if not path or pristine is None or not in_workspace(path):
            return None  # the runner's own, and installed libraries' (their files are the image's)
        rel = os.path.relpath(os.path.abspath(path), workspace)
        return None if rel in pristine else rel

    def first_error_line(text):
        """The line that names the error: pytest's last ``E`` line, else the last line (a traceback's)."""
        lines = [line.strip() for line in str(text).splitlines() if line.strip()]
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        found = errors[-1] if errors else lines[-1] if lines else ""
        return found[:MESSAGE_CAP]

    def own_code(program):
        """Every code object of this program, by identity. Its file name (``<string>``, from ``-c``) proves
        nothing: ``collections.namedtuple`` and ``dataclasses`` generate code named the same way."""
        found, todo = [], [program]
        while todo:
            code = todo.pop()
            found.append(code)
            todo.extend(c for c in code.co_consts if type(c) is type(program))
        return tuple(found)

    class Kit:
        """What both drivers share; held by the drivers' closures, never by a module."""

    kit = Kit()
    kit.__dict__.update(
        workspace=workspace, key=key, pristine=pristine, tests=key["tests"], channel=channel, marker=marker,
        emit=emit, evidence=evidence, function_of=function_of, fingerprint=fingerprint,
        check_fingerprint=check_fingerprint, in_workspace=in_workspace, pristine_code=pristine_code,
        foreign=foreign, first_error_line=first_error_line, importlib=importlib,
        own_code=own_code(sys._getframe(1).f_code), codes=codes, current=[None], dumps=json.dumps,
    )  # fmt: skip
    install_observers(kit)

    def check_baseline(function, module, test_id):
        """A test of a pristine file runs code the recorder vouches for (``CodeRegistry``), in the globals of the
        module that code came from, and it is the function its module's body bound under the test's name, with the
        code it had then: not a function put in the test's place before collection ended (a module ``__getattr__``,
        a swapped attribute or code object, a copy of the pristine code under other globals, another test of the
        same file, a function of the standard library that passes)."""
        path = getattr(module, "__file__", None)
        if pristine is None or not path or not in_workspace(path) or foreign(path) is not None:
            return
        if function is None or not codes.as_bound(function, module, test_id):
            evidence(f"test_item_patched:{test_id}")
            return
        if not codes.vouched(function.__code__):  # hypothesis's @given: a generated forwarder to its wrapper
            if not codes.given_test(function, module):
                evidence(f"test_item_patched:{test_id}")
            return
        if id(function.__code__) not in codes.workspace_ids:
            return  # a decorator's wrapper from the image (mock.patch): its own code
        scope = function.__globals__
        home = sys.modules.get(scope.get("__name__")) if type(scope.get("__name__")) is str else None
        if home is None or vars(home) is not scope or scope.get("__file__") != function.__code__.co_filename:
            evidence(f"test_item_patched:{test_id}")

    kit.check_baseline = check_baseline

    def restore_path():
        sys.path[:] = search_path  # the code under test imports as under a plain ``python -c``

    kit.restore_path = restore_path
    named = key.get("select") or (key.get("unittest") or {}).get("select") or ()
    host_order = {test_id: index for index, test_id in enumerate(named)}

    def in_host_order(tests, id_of, case_of):
        """``tests`` with each TestCase's named tests in the order the host named them, in the places they held: both
        runners order a TestCase's methods by name, and graded tests run under drawn names, so by name they would run
        shuffled (pyparsing's example tests share parser state and failed so). Other tests, canaries among them,
        keep their places."""
        places = {}
        for index, test in enumerate(tests):
            case = case_of(test)
            if case is not None and id_of(test) in host_order:
                places.setdefault(case, []).append(index)
        for indices in places.values():
            ranked = sorted((tests[i] for i in indices), key=lambda test: host_order[id_of(test)])
            for n, index in enumerate(indices):  # (no zip(strict=): the recorder runs on Python 3.9 too)
                tests[index] = ranked[n]

    kit.in_host_order = in_host_order
    driver = run_unittest if key.get("runner") == "unittest" else run_pytest
    code, stopped = driver(kit)
    emit({"e": "end", "exit": code, "stopped": stopped})
    exit_now(code)


def _run_pytest(kit):
    """pytest in this process, with the recorder as a plugin: (exit code, whether the run stopped early)."""
    import unittest

    import pluggy
    import pytest
    from _pytest.config import default_plugins

    for name in default_plugins:
        kit.importlib.import_module("_pytest." + name)
    from traceback import format_exc

    from _pytest._code import ExceptionInfo

    emit, evidence, function_of, pristine_code = kit.emit, kit.evidence, kit.function_of, kit.pristine_code
    codes, current, key = kit.codes, kit.current, kit.key
    framework_dirs = tuple(os.path.dirname(m.__file__) + os.sep for m in (pytest, pluggy, sys.modules["_pytest"]))
    kit.exception_info = ExceptionInfo.from_exc_info
    compile_pristine_tests(codes, framework_dirs)
    # The image's plugins are loaded by the recorder (load_initial_conftests), never metadata in the workspace.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    sys.dont_write_bytecode = True

    def from_framework(value):
        """pytest's or pluggy's own code, by identity: a function compiled with a name in their directories is not."""
        function = function_of(value)
        if function is None:
            return False
        code = function.__code__
        return id(code) in codes.trusted and code.co_filename.startswith(framework_dirs)

    watched = kit.fingerprint(
        lambda modname: modname in ("pytest", "pluggy") or modname.startswith(("_pytest.", "pluggy."))
    )

    def check_framework(settle=False, wrappers=False):
        """Replacements of pytest's and pluggy's functions are evidence, but: with ``settle``, those made by pytest's
        own code (configure and unconfigure time); with ``wrappers``, an installed library's wrapper of what it
        replaces, holding the original (hypothesis's plugin wraps ``FixtureFunctionMarker.__call__`` as it loads).
        Wrappers are let be only once, as the image's plugins have loaded and before any workspace code ran: a
        library's wrapper installed later is the policy's doing (sortedcontainers' ``recursive_repr`` around
        ``Function.runtest``, its ``repr_running`` cell rebound to skip chosen tests)."""
        kit.check_fingerprint(
            watched,
            lambda after, before: (
                (settle and from_framework(after))
                or (wrappers and codes.wraps_from_image(after, before, framework_dirs))
            ),
        )

    def workspace_imported():
        """Whether a module from the workspace was imported (an early ``-p`` plugin of the repository's command)."""
        files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
        return any(isinstance(f, str) and f and kit.in_workspace(f) for f in files)

    removable = [()]  # the plugin objects of REMOVABLE_PLUGINS, as collection ended with them

    def is_removable(plugin):
        return any(plugin is p for p in removable[0])

    def hook_entry(config, name):
        """A report-path hook: its caller, the caller's executor and the implementations held with their
        functions (code swapped inside one is the audit hook's to see); then, apart, those of removable
        plugins as (plugin, function), which may go missing or come back registered anew."""
        caller = getattr(config.hook, name, None)
        impls = caller.get_hookimpls() if caller is not None else []
        held = [caller, getattr(caller, "_hookexec", None)]
        optional = []
        for impl in impls:
            if is_removable(impl.plugin):  # registered again: a new bound method of the same function
                optional.append((impl.plugin, getattr(impl.function, "__func__", impl.function)))
            else:
                held += [impl, impl.function]
        return tuple(held), tuple(optional)

    def hook_state(config):
        return (getattr(config.pluginmanager, "_inner_hookexec", None), *(hook_entry(config, n) for n in REPORT_HOOKS))

    def identical(now, then):
        """Element by element by identity: an object whose ``__eq__`` says yes to anything is no match."""
        return len(now) == len(then) and all(now[i] is then[i] for i in range(len(now)))  # (3.9: no strict zip)

    def same_entry(now, then):
        return identical(now[0], then[0]) and all(any(identical(p, q) for q in then[1]) for p in now[1])

    def same_state(now, then):
        """``now`` is ``then``, less implementations of removable plugins (or with them registered again)."""
        return now[0] is then[0] and all(map(same_entry, now[1:], then[1:]))

    def foreign_skip(report):
        """Where a skip was raised, when that is a file of the workspace other than a pristine test file."""
        where = report.longrepr[0] if report.skipped and isinstance(report.longrepr, tuple) else None
        return kit.foreign(where)

    from importlib.machinery import SourceFileLoader

    from _pytest.assertion.rewrite import AssertionRewritingHook
    from _pytest.outcomes import Skipped, XFailed

    test_loaders = (AssertionRewritingHook, SourceFileLoader)  # the classes themselves: a namesake is no match
    install_audit_hook(kit, framework_dirs, ("_pytest", "pytest", "pluggy"), ())

    # The recorder's state lives in this closure, not on the plugin object other plugins can list.
    config_of, hooks_at_start, hooks_after_collection, items = [], [()], [()], {}
    seen_reports, stopped, selecting = {}, [False], [False]

    def impls(name):
        caller = getattr(config_of[0].hook, name, None)
        return caller.get_hookimpls() if caller is not None else []

    def registered_at_start(name, impl):
        return any(held is impl for held in hooks_at_start[0][1 + REPORT_HOOKS.index(name)][0])

    def same_hooks_as_collected(name):
        """The implementations this hook call runs with are the ones collection ended with."""
        then = hooks_after_collection[0]
        if then and not same_entry(hook_entry(config_of[0], name), then[1 + REPORT_HOOKS.index(name)]):
            evidence(f"hooks_changed:{name}")

    def item_state(item):
        """The test's function, its code and globals (a unittest item rebinds its method per run: the function
        stays), how the item runs, and the test hypothesis's handle on it runs."""
        function = function_of(getattr(item, "obj", None))
        code = function.__code__ if function is not None else None
        scope = getattr(function, "__globals__", None)
        return function, code, id(scope), "runtest" in vars(item), type(item).runtest, codes.inner_test(function)

    def check_item(item):
        if items.get(item.nodeid, item_state(item)) != item_state(item):
            evidence(f"test_item_patched:{item.nodeid}")

    def observe(name, item, when):
        """A wrapper around one phase: how it really ended, before any report is made of it."""
        same_hooks_as_collected(name)
        check_item(item)
        if when == "call":
            current[0] = item.nodeid  # the test blinded observations belong to
        try:
            outcome = yield
        finally:
            current[0] = None
        error = outcome.excinfo
        ended = "ok" if error is None else "skip" if issubclass(error[0], (Skipped, XFailed)) else "raised"
        emit({"e": "ran", "id": item.nodeid, "w": when, "x": ended})

    chosen = frozenset(key.get("select") or ())

    def test_case(item):
        """The unittest TestCase class ``item`` belongs to, or None (pytest runs other classes' tests as written)."""
        cls = getattr(item, "cls", None)
        return cls if isinstance(cls, type) and issubclass(cls, unittest.TestCase) else None

    def selected(nodeid):
        """The test, its function (all its parameters), its class or its file was named."""
        if nodeid in chosen:
            return True
        parts = nodeid.split("[", 1)[0].split("::")
        return any("::".join(parts[:n]) in chosen for n in range(1, len(parts) + 1))

    def load_image_plugins(config):
        """The ``pytest11`` entry points of distributions installed in the image, as pytest's autoload would load
        them, less metadata that lives in the workspace (a ``*.dist-info`` the diff planted)."""
        from importlib import metadata

        pm = config.pluginmanager
        for dist in metadata.distributions():
            try:
                where = str(dist.locate_file(""))
            except Exception:
                continue
            if kit.in_workspace(where):
                continue
            for entry in dist.entry_points:
                if entry.group == "pytest11" and not pm.get_plugin(entry.name) and not pm.is_blocked(entry.name):
                    pm.register(entry.load(), name=entry.name)

    class Recorder:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_load_initial_conftests(self, early_config):
            """Before the first conftest (and whatever it imports) runs: the image's plugins, then the hooks as
            pytest set them up."""
            config_of.append(early_config)
            load_image_plugins(early_config)
            check_framework(wrappers=not workspace_imported())
            hooks_at_start[0] = hook_state(early_config)
            yield

        @pytest.hookimpl(trylast=True)
        def pytest_configure(self, config):
            check_framework(settle=True)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_collection_modifyitems(self, session, config, items):
            """The host's selection (from the key file: never on the command line), then deselection (-k, -m,
            --deselect, a conftest's), which happens here and only here."""
            if chosen:
                items[:] = [item for item in items if selected(item.nodeid)]
                kit.in_host_order(items, lambda item: item.nodeid, test_case)
            selecting[0] = True
            try:
                yield
            finally:
                selecting[0] = False

        def pytest_deselected(self, items):
            if not selecting[0]:
                evidence("deselected_outside_collection")
                return
            emit({"e": "deselected", "ids": [item.nodeid for item in items]})

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
            pm = session.config.pluginmanager
            removable[0] = tuple(
                plugin
                for name, (module, cls) in REMOVABLE_PLUGINS.items()
                if type(plugin := pm.get_plugin(name)) is getattr(sys.modules.get(module), cls, None)
            )
            hooks_after_collection[0] = hook_state(session.config)
            for item in session.items:
                kit.check_baseline(function_of(getattr(item, "obj", None)), getattr(item, "module", None), item.nodeid)
                items[item.nodeid] = item_state(item)
                module = getattr(item, "module", None)
                if module is not None and type(getattr(module, "__loader__", None)) not in test_loaders:
                    evidence(f"test_module_loader:{type(module.__loader__).__name__}")
                callspec = getattr(item, "callspec", None)
                if key.get("rows") and callspec is not None:  # which parametrize row each test is (validation)
                    emit({"e": "item", "id": item.nodeid, "p": dict(getattr(callspec, "indices", {}))})

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
            if report.failed:  # what the failure was, for the statement validation writes (never a verdict)
                crash = getattr(report.longrepr, "reprcrash", None)
                said = str(getattr(crash, "message", "") or "").strip().splitlines()  # the exception's own line
                event["m"] = said[0][:MESSAGE_CAP] if said else kit.first_error_line(report.longreprtext)
            origin = foreign_skip(report)
            if origin:
                event["k"] = origin
            emit(event)

        @pytest.hookimpl(trylast=True)
        def pytest_runtest_logfinish(self, nodeid):
            check_framework()
            if not same_state(hook_state(config_of[0]), hooks_after_collection[0]):
                evidence("hooks_changed")
            emit({"e": "test", "id": nodeid})

        def pytest_collectreport(self, report):
            if report.failed:
                message = kit.first_error_line(getattr(report, "longreprtext", "") or "")
                emit({"e": "collect_error", "id": report.nodeid or ".", "m": message})
            if report.skipped:  # a whole module skipped at collection (importorskip, a skip at import)
                event = {"e": "collect_skip", "id": report.nodeid or "."}
                origin = foreign_skip(report)
                if origin:
                    event["k"] = origin
                emit(event)

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus):
            stopped[0] = bool(session.shouldfail or session.shouldstop)
            finished[0] = int(exitstatus)

    kit.restore_path()
    emit({"e": "start", "pytest": pytest.__version__, "pluggy": getattr(pluggy, "__version__", "")})
    stop = ["--maxfail", str(key["maxfail"])] if key.get("maxfail") else []  # the key's: argv would count canaries
    finished = [None]  # the session's exit status, once every hook of its end ran (ours is the last)
    try:
        code = int(pytest.main([*sys.argv[1:], *stop], plugins=[Recorder()]))
    except Exception:
        # Raised once the session ended, at unconfigure: pytest 8.4+ turns an exception a __del__ raised after the
        # last test into a warning there, an error under the suite's `-W error` (tqdm's addopts). Every outcome is
        # reported by then; the run ends with the session's status, the traceback in its log.
        if finished[0] is None:
            raise
        os.write(2, format_exc().encode(errors="replace"))
        code = finished[0]
    check_framework(settle=True)  # pytest undoes its own configure-time patches at unconfigure
    return code, stopped[0]


def _run_unittest(kit):
    """unittest in this process, under the same protections: (exit code, whether the run stopped early).

    Tests are loaded as ``python -m unittest`` would (discovery, names, -k patterns), or by the ids
    the host names; each test's setUp, method and tearDown are wrapped on its instance before the
    run, so how each really ended is on the channel before the result object says anything; the
    result object is the recorder's own, and reports each test as pytest would (module docstring).
    """
    import re
    import traceback
    import unittest
    from importlib.machinery import SourceFileLoader
    from unittest import case, loader, result, suite, util

    emit, evidence, function_of, workspace = kit.emit, kit.evidence, kit.function_of, kit.workspace
    plan = kit.key["unittest"]

    def write_log(text, _write=os.write):
        data = text.encode("utf-8", "replace")
        while data:
            data = data[_write(2, data) :]

    framework_dirs = (os.path.dirname(unittest.__file__) + os.sep,)
    SkipTest, FailedTest = case.SkipTest, loader._FailedTest
    ErrorHolder, TestSuite = suite._ErrorHolder, suite.TestSuite
    fixture_error = re.compile(r"^(setUpClass|tearDownClass|setUpModule|tearDownModule) \((.+)\)$").match
    strclass, isfile, join = util.strclass, os.path.isfile, os.path.join
    relpath, abspath = os.path.relpath, os.path.abspath

    loaded_from = {}  # id(test) -> the module it was loaded from (a test class may live in another module)
    deselected = []  # node ids that -k patterns left out
    modules_loading = []

    def node_id(test, module):
        cls = type(test)
        path = getattr(module, "__file__", None) or getattr(sys.modules.get(cls.__module__), "__file__", None) or "?"
        rel = relpath(abspath(path), workspace)
        defined_in = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if defined_in and kit.in_workspace(defined_in):
            return f"{rel}::{cls.__qualname__.replace('.', '::')}::{test._testMethodName}"
        return f"{rel}::{test.id()}"  # a stdlib or library case (doctests, FunctionTestCase): its own id

    class Loader(loader.TestLoader):
        """unittest's loader, remembering which module each test came from and what -k left out."""

        def loadTestsFromModule(self, module, *args, **kwargs):
            modules_loading.append(module)
            try:
                found = super().loadTestsFromModule(module, *args, **kwargs)
            finally:
                modules_loading.pop()
            for test in flatten(found):
                loaded_from.setdefault(id(test), module)
            return found

        def getTestCaseNames(self, testCaseClass):
            names = super().getTestCaseNames(testCaseClass)
            if self.testNamePatterns and modules_loading:
                patterns, self.testNamePatterns = self.testNamePatterns, None
                try:
                    every = super().getTestCaseNames(testCaseClass)
                finally:
                    self.testNamePatterns = patterns
                module_file = getattr(modules_loading[-1], "__file__", None) or "?"
                rel = relpath(abspath(module_file), workspace)
                qual = testCaseClass.__qualname__.replace(".", "::")
                deselected.extend(f"{rel}::{qual}::{name}" for name in every if name not in names)
            return names

    def flatten(tests):
        if isinstance(tests, TestSuite):
            return [t for inner in tests for t in flatten(inner)]
        return [tests]

    class Result(result.TestResult):
        """The recorder's own result: every report a test gets is collected here, then mapped at its stop."""

        def startTest(self, test):
            self.testsRun += 1
            started(test)

        def stopTest(self, test):
            finish(test)

        def addSuccess(self, test):
            note(test, "success")

        def addFailure(self, test, err):
            note(test, "failure", err)

        def addError(self, test, err):
            note(test, "error", err)

        def addSkip(self, test, reason):
            note(test, "skip")

        def addExpectedFailure(self, test, err):
            note(test, "xfail")

        def addUnexpectedSuccess(self, test):
            note(test, "xpass")

        def addSubTest(self, test, subtest, err):
            if err is not None:
                note(test, "subskip" if issubclass(err[0], SkipTest) else "subfailure", err)

        def addDuration(self, test, elapsed):
            pass

    result_methods = frozenset(name for name in vars(Result) if not name.startswith("__"))
    watched = kit.fingerprint(
        lambda modname: (modname == "unittest" or modname.startswith("unittest.")) and modname != "unittest.mock",
        (Result, Loader),
    )
    install_audit_hook(kit, framework_dirs, ("unittest",), ("unittest.mock",), (Result, Loader))
    # The recorder's state lives in this closure, not on the result object the tests can reach.
    ids, planned, state, reports, origins, finished, order = {}, [], {}, {}, {}, set(), []
    said = {}  # test id -> its first failure's exception line
    failures, stopped, the_result = [0], [False], []

    def ran(test_id, when, error):
        """Called by a test's wrappers: how this part of it ended, on the channel at once."""
        ended = "ok" if error is None else "skip" if isinstance(error, SkipTest) else "raised"
        if ended == "skip":
            origin = skip_origin(error)
            if origin:
                origins[test_id] = origin
        emit({"e": "ran", "id": test_id, "w": when, "x": ended})

    def skip_origin(error):
        """The workspace file (other than a pristine one) that raised or asked for a skip, or None."""
        tb, where = error.__traceback__, None
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if not path.startswith((*framework_dirs, "<")):
                where = path
            tb = tb.tb_next
        return kit.foreign(where)

    def observer(test_id, when, original, awaits):
        """``original`` (a bound method) wrapped: how it ended goes to ``ran``. Everything it uses is a default
        argument (replacing a function's defaults is audited; closure cells are not). ``awaits``: the test
        case awaits a coroutine method (IsolatedAsyncioTestCase); any other case calls it, as unittest does."""
        function = getattr(original, "__func__", original)
        flags = getattr(getattr(function, "__code__", None), "co_flags", 0)
        current = kit.current if when == "call" else [None]  # the test blinded observations belong to
        if flags & CO_COROUTINE and awaits:

            async def observed(_original=original, _ran=ran, _id=test_id, _when=when, _current=current):
                _current[0] = _id
                try:
                    value = await _original()
                except BaseException as error:
                    _current[0] = None
                    _ran(_id, _when, error)
                    raise
                _current[0] = None
                _ran(_id, _when, None)
                return value

        else:

            def observed(_original=original, _ran=ran, _id=test_id, _when=when, _current=current):
                _current[0] = _id
                try:
                    value = _original()
                except BaseException as error:
                    _current[0] = None
                    _ran(_id, _when, error)
                    raise
                _current[0] = None
                _ran(_id, _when, None)
                return value

        observed.__dict__.update(getattr(function, "__dict__", {}))  # __unittest_skip__, expecting failure
        observed.__name__ = getattr(function, "__name__", when)
        observed.__doc__ = getattr(function, "__doc__", None)
        return observed

    def item_state(test):
        function = function_of(getattr(type(test), test._testMethodName, None))
        shadowed = tuple(name for name in TESTCASE_PROTOCOL if name in vars(test))
        return function, getattr(function, "__code__", None), shadowed, tuple(map(vars(test).get, PARTS))

    def plan_test(test, module):
        test_id = node_id(test, module)
        if test_id in state:
            return  # loaded twice (the same class in two suites of one module): run once, as pytest does
        method, awaits = test._testMethodName, hasattr(type(test), "_callMaybeAsync")
        wrappers = {
            "setUp": observer(test_id, "setup", test.setUp, awaits),
            "tearDown": observer(test_id, "teardown", test.tearDown, awaits),
            method: observer(test_id, "call", getattr(test, method), awaits),
        }
        for name, wrapper in wrappers.items():
            object.__setattr__(test, name, wrapper)
        ids[id(test)] = test_id
        planned.append(test)
        state[test_id] = (*item_state(test), wrappers[method])
        mod = module or sys.modules.get(type(test).__module__)
        kit.check_baseline(function_of(getattr(type(test), method, None)), mod, test_id)
        path = getattr(mod, "__file__", None)
        if path and kit.in_workspace(path) and type(getattr(mod, "__loader__", None)) is not SourceFileLoader:
            evidence(f"test_module_loader:{type(getattr(mod, '__loader__', None)).__name__}")

    def check_test(test, test_id):
        now = (*item_state(test), vars(test).get(test._testMethodName))
        if now != state[test_id]:
            evidence(f"test_item_patched:{test_id}")

    def check_result():
        kit.check_fingerprint(watched)
        if the_result and any(name in result_methods for name in vars(the_result[0])):
            evidence("result_patched")

    def started(test):
        test_id = ids.get(id(test))
        if test_id is None:
            return
        check_result()
        check_test(test, test_id)
        reports.setdefault(test_id, [])

    def note(test, kind, err=None):
        if isinstance(test, ErrorHolder):
            fixture(test, kind)
            return
        test_id = open_id(getattr(test, "test_case", test))  # a subtest's report belongs to its test
        if test_id is None:
            return
        reports.setdefault(test_id, []).append(kind)
        if err is not None and kind in ("failure", "error", "subfailure"):
            log_failure(test_id, err)

    def log_failure(test_id, err):
        """The failure as ``pytest --tb=short`` shows it, to the log (what problem statements are written from)."""
        frames = [f for f in traceback.extract_tb(err[2]) if not f.filename.startswith((*framework_dirs, "<"))]
        lines = [f"{'_' * 20} {test_id.split('::', 1)[-1].replace('::', '.')} {'_' * 20}"]
        for frame in frames:
            lines += [f"{relpath(abspath(frame.filename), workspace)}:{frame.lineno}: in {frame.name}"]
            lines += [f"    {frame.line}"] if frame.line else []
        message = "".join(traceback.format_exception_only(err[0], err[1])).rstrip()
        lines += [f"E   {line}" for line in message.splitlines()]
        said.setdefault(test_id, message.strip().splitlines()[0][:MESSAGE_CAP] if message.strip() else "")
        write_log("\n".join(lines) + "\n")

    def phase(test_id, when, outcome, origin=None):
        event = {"e": "phase", "id": test_id, "w": when, "o": outcome}
        if origin:
            event["k"] = origin
        if outcome == "failed" and said.get(test_id):  # the first failure's line, for validation's statement
            event["m"] = said[test_id]
        emit(event)
        if outcome == "failed":
            failures[0] += 1
            if plan.get("maxfail") and failures[0] >= plan["maxfail"] and the_result:
                the_result[0].shouldStop = True
                stopped[0] = True

    def open_id(test):
        """The test's id while it may still report; None for a test not ours, or one already finished (evidence)."""
        test_id = ids.get(id(test))
        if test_id is not None and test_id in finished:
            evidence(f"test_reported_twice:{test_id}")
            return None
        return test_id

    def finish(test):
        test_id = open_id(test)
        if test_id is None:
            return
        kinds = reports.get(test_id, [])
        if any(k in ("failure", "error", "xpass", "subfailure") for k in kinds):
            phase(test_id, "call", "failed")
        elif "success" in kinds:
            for when in ("setup", "call", "teardown"):  # each must have been seen to end well
                phase(test_id, when, "passed")
        elif kinds:  # skipped, an expected failure, or skipped subtests only
            phase(test_id, "call", "skipped", origins.get(test_id))
        finished.add(test_id)
        order.append(test)
        emit({"e": "test", "id": test_id})
        check_result()

    def owner(test, level):
        return strclass(type(test)) if level == "Class" else type(test).__module__

    def fixture(holder, kind):
        """A class or module fixture's error or skip: to the tests it kept from running, or the last that ran."""
        found = fixture_error(str(getattr(holder, "description", "")))
        if found is None:
            return
        method, parent = found.groups()
        level = "Class" if method.endswith("Class") else "Module"
        if method.startswith("setUp"):
            for test in planned:
                test_id = ids[id(test)]
                if test_id not in finished and test_id not in reports and owner(test, level) == parent:
                    phase(test_id, "setup", "skipped" if kind == "skip" else "failed")
                    finished.add(test_id)
                    emit({"e": "test", "id": test_id})
        elif kind != "skip":
            last = [t for t in order if owner(t, level) == parent]
            if last:
                phase(ids[id(last[-1])], "teardown", "failed")

    def file_of(name, top):
        base = join(top, *name.split("."))
        for path in (base + ".py", join(base, "__init__.py")):
            if isfile(path):
                return relpath(path, workspace)
        return name

    def load(the_loader, top):
        """The planned tests, the modules that failed to import and those skipped at import."""
        errors, skipped = [], []

        def take(found, label=None):
            for test in flatten(found):
                if isinstance(test, FailedTest):
                    text = str(getattr(test, "_exception", ""))
                    errors.append((label or file_of(test._testMethodName, top), kit.first_error_line(text)))
                    write_log(f"ERROR collecting {errors[-1][0]}\n{text}\n")
                elif type(test).__name__ == "ModuleSkipped" and type(test).__module__ == "unittest.loader":
                    skipped.append(label or file_of(test._testMethodName, top))
                else:
                    plan_test(test, loaded_from.get(id(test)))

        def attempt(label, call, per_module=False):
            """``per_module``: a discovery, whose failed modules are named by the loader, not ``label``."""
            try:
                take(call(), None if per_module else label)
            except SkipTest:
                skipped.append(label)
            except BaseException as error:  # SystemExit at import too, as under pytest
                errors.append((label, kit.first_error_line(f"{type(error).__name__}: {error}")))
                trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
                write_log(f"ERROR collecting {label}\n{trace}\n")

        selection = plan.get("select") or []
        if selection:
            files = list(dict.fromkeys(t.split("::", 1)[0] for t in selection))
            for rel in files:
                name = relpath(join(workspace, rel), top)[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")
                attempt(rel, lambda name=name: the_loader.loadTestsFromName(name))
            chosen = set(selection)
            keep = [t for t in planned if _selected(ids[id(t)], chosen)]
            kit.in_host_order(keep, lambda test: ids[id(test)], type)
            planned[:] = keep
        elif plan.get("names"):
            for name in plan["names"]:
                if isfile(name) and name.lower().endswith(".py"):
                    name = relpath(name)[: -len(".py")].replace(os.sep, ".")
                attempt(file_of(name, top), lambda name=name: the_loader.loadTestsFromName(name))
        else:
            discover = the_loader.discover
            attempt(plan["start"], lambda: discover(plan["start"], plan["pattern"], plan.get("top")), per_module=True)
        return errors, skipped

    def _selected(test_id, chosen):
        parts = test_id.split("::")
        return any("::".join(parts[:n]) in chosen for n in range(1, len(parts) + 1))

    the_loader = Loader()
    if plan.get("patterns"):
        the_loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in plan["patterns"]]
    top = abspath(plan.get("top") or (plan["start"] if not plan.get("select") and not plan.get("names") else "."))
    kit.restore_path()
    if plan.get("select") and top not in sys.path:
        sys.path.insert(0, top)  # what discovery does for its top-level directory
    emit({"e": "start", "unittest": sys.version.split()[0]})
    errors, skipped = load(the_loader, top)
    for rel in dict.fromkeys(skipped):
        emit({"e": "collect_skip", "id": rel})
    for rel, message in errors:
        emit({"e": "collect_error", "id": rel, "m": message})
    if deselected:
        emit({"e": "deselected", "ids": deselected})
    check_result()
    failures[0] = len(errors)  # pytest counts collection errors as failures, toward --maxfail too
    if plan.get("maxfail") and errors and failures[0] >= plan["maxfail"]:
        return 1, True
    if not planned:
        return (1 if errors else 5), False  # 5: pytest's "no tests collected"
    outcome = Result()
    the_result.append(outcome)
    TestSuite(planned).run(outcome)
    check_result()
    return (1 if failures[0] else 0), stopped[0]


class CodeRegistry:
    """Code objects the recorder vouches for, by identity, never by file name (``compile()`` sets that to
    anything): ``trusted``, every function's code that exists before any code under test runs (the standard
    library, the recorder's imports) and every module imported later from a file the sandbox cannot write
    (the runner, the image's libraries), the latter also ``image``; ``workspace``, what the recorder compiled
    itself from workspace files the diff left alone (their bytes hash to the host's); ``tests``, those of the
    pristine test files.

    A pristine workspace file is compiled from its source here, never from a ``.pyc`` the code under test
    could have written next to it. What the body of a pristine test module bound (``bodies``: every name, and
    the members of its classes, with each function's code then) is held as it was when the body ended.
    """

    def __init__(self, workspace, pristine, tests, sha256, function_of):
        import gc
        from importlib.machinery import SourceFileLoader
        from types import CodeType, FunctionType

        self.workspace, self.pristine, self.tests, self.sha256 = workspace, pristine, frozenset(tests), sha256
        self.trusted, self.workspace_ids, self.test_ids, self.kept, self.code_type = set(), set(), set(), [], CodeType
        self.image, self.getset_type = set(), type(FunctionType.__dict__["__code__"])
        self.function_of, self.function_type = function_of, FunctionType
        self.test_paths, self.bodies, self.classes, self.code_then = set(), {}, {}, {}
        for obj in gc.get_objects():
            if type(obj) is FunctionType:
                self.add(obj.__code__, self.trusted)
        registry, original = self, SourceFileLoader.get_code

        def get_code(loader, fullname, _original=original, _registry=registry):
            path = getattr(loader, "path", "")
            data = _registry.pristine_bytes(path)
            if data is not None:
                code = compile(data, path, "exec", dont_inherit=True)
                _registry.adopt(code, path)
                return code
            code = _original(loader, fullname)
            if code is not None and not _registry.in_workspace(path) and not _registry.writable(path):
                _registry.add(code, _registry.trusted)
                _registry.add(code, _registry.image)
            return code

        SourceFileLoader.get_code = get_code
        run_body = SourceFileLoader.exec_module

        def exec_module(loader, module, _original=run_body, _registry=registry):
            _original(loader, module)
            _registry.body_ran(module)

        SourceFileLoader.exec_module = exec_module

    def add(self, code, into):
        todo = [code]
        while todo:
            one = todo.pop()
            if id(one) in into:
                continue
            into.add(id(one))
            self.kept.append(one)  # held, so no other object is ever given its id
            todo.extend(c for c in one.co_consts if type(c) is self.code_type)

    def in_workspace(self, path):
        path = os.path.abspath(path)
        return path == self.workspace or path.startswith(self.workspace + os.sep)

    def writable(self, path):
        return os.access(path, os.W_OK) or os.access(os.path.dirname(path) or ".", os.W_OK)

    def pristine_bytes(self, path):
        """The file's bytes when it is a workspace file the diff left alone (or the host vouches for all)."""
        if not path or not self.in_workspace(path):
            return None
        rel = os.path.relpath(os.path.abspath(path), self.workspace)
        if self.pristine is not None and rel not in self.pristine:
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        if self.pristine is not None and self.sha256(data).hexdigest() != self.pristine[rel]:
            return None
        return data

    def adopt(self, code, path):
        self.add(code, self.workspace_ids)
        if os.path.relpath(os.path.abspath(path), self.workspace) in self.tests:
            self.add(code, self.test_ids)
            self.test_paths.add(os.path.abspath(path))

    def vouched(self, code):
        return id(code) in self.trusted or id(code) in self.workspace_ids

    def wraps_from_image(self, value, original, framework_dirs):
        """``value`` replaces ``original`` with code of an installed library (read from a file of the image after the
        recorder started: never the workspace's, the standard library's already loaded, nor generated), other than
        the runner's own, and holds the original it wraps (a cell of its closure, or a global its code names), as
        hypothesis's plugin wraps ``FixtureFunctionMarker.__call__``. What the policy writes can do neither."""
        function = self.function_of(value)
        if function is None or original is None:
            return False
        code = function.__code__
        if id(code) not in self.image or code.co_filename.startswith(framework_dirs):
            return False
        held = [cell.cell_contents for cell in function.__closure__ or () if self.full(cell)]
        scope = function.__globals__
        held += [scope[name] for name in code.co_names if name in scope]
        return any(one is original for one in held)

    def forwarded(self, function):
        """The function that ``function``'s code only calls, passing its arguments on as they came, or None.

        hypothesis's ``@given`` binds at the test's name a function it generates (``exec``) with the signature that
        remains, whose body is ``return f(<the parameters>)``: code no file vouches for. It is vouched for by what
        it is: the recorder compiles that body itself for the code's own signature and names, and every part of the
        two code objects but their file and lines must match."""
        import keyword

        code = function.__code__
        flags = code.co_flags
        if len(code.co_freevars) != 1 or code.co_cellvars or flags & (CO_COROUTINE | CO_GENERATOR | CO_ASYNC_GEN):
            return None
        total = code.co_argcount + code.co_kwonlyargcount + bool(flags & CO_VARARGS) + bool(flags & CO_VARKEYWORDS)
        names = (code.co_name, *code.co_freevars, *code.co_varnames[:total])
        if any(type(n) is not str or not n.isidentifier() or keyword.iskeyword(n) for n in names):
            return None
        varnames = list(code.co_varnames[:total])
        positional = varnames[: code.co_argcount]
        params, passed = list(positional), list(positional)
        if code.co_posonlyargcount:
            params.insert(code.co_posonlyargcount, "/")
        at = code.co_argcount + code.co_kwonlyargcount
        if flags & CO_VARARGS:
            params.append("*" + varnames[at])
            passed.append("*" + varnames[at])
        elif code.co_kwonlyargcount:
            params.append("*")
        kwonly = varnames[code.co_argcount : at]
        params += kwonly
        passed += [f"{n}={n}" for n in kwonly]
        if flags & CO_VARKEYWORDS:
            params.append("**" + varnames[-1])
            passed.append("**" + varnames[-1])
        callee = code.co_freevars[0]
        source = (
            f"def accept({callee}):\n    def {code.co_name}({', '.join(params)}):\n"
            f"        return {callee}({', '.join(passed)})\n    return {code.co_name}\n"
        )
        try:
            outer = compile(source, "<forwarder>", "exec", dont_inherit=True).co_consts[0]
        except (SyntaxError, ValueError):
            return None
        mine = next(c for c in outer.co_consts if type(c) is self.code_type)
        for part in FORWARDER_PARTS:
            if getattr(code, part) != getattr(mine, part):
                return None
        consts = code.co_consts
        if len(consts) != len(mine.co_consts) or not all(
            type(consts[i]) is type(c) and type(c) in (type(None), int, str) and consts[i] == c
            for i, c in enumerate(mine.co_consts)
        ):
            return None
        cell = function.__closure__[0] if function.__closure__ and len(function.__closure__) == 1 else None
        return cell.cell_contents if cell is not None and self.full(cell) else None

    def given_test(self, forwarder, module):
        """``forwarder`` is hypothesis's ``@given`` test of a test the pristine module ``module`` defined: it only calls
        (``forwarded``) a function of an installed library's code (read from a file of the image after the recorder
        started) made for it (whose closure holds it), and the test its handle runs (``.hypothesis.inner_test``,
        read from its instance dict, never through code of its class) is that module's function of the same name."""
        wrapper = self.function_of(self.forwarded(forwarder))
        if wrapper is None or id(wrapper.__code__) not in self.image:
            return False
        if not any(self.full(cell) and cell.cell_contents is forwarder for cell in wrapper.__closure__ or ()):
            return False
        test = self.function_of(self.inner_test(forwarder))
        return (
            test is not None
            and id(test.__code__) in self.test_ids
            and test.__code__.co_name == forwarder.__code__.co_name
            and test.__globals__ is getattr(module, "__dict__", None)
        )

    def inner_test(self, function):
        """What hypothesis's handle on ``function`` runs as the test (None: no handle, or one whose class could
        run code when read). Its attributes are reassignable by design: the item's state holds this too."""
        handle = vars(function).get("hypothesis") if type(function) is self.function_type else None
        cls = type(handle)
        if handle is None or type(cls) is not type:
            return None
        for klass in cls.__mro__[:-1]:
            members = vars(klass)
            if "__getattribute__" in members or "__getattr__" in members or "inner_test" in members:
                return None
            if "__dict__" in members and type(members["__dict__"]) is not self.getset_type:
                return None
        state = object.__getattribute__(handle, "__dict__")
        return state.get("inner_test") if type(state) is dict else None

    @staticmethod
    def full(cell):
        try:
            return cell.cell_contents is cell.cell_contents
        except ValueError:  # a cell not yet (or no longer) set
            return False

    def body_ran(self, module):
        """Hold what a pristine test module's body bound, now that it has run: its names, its classes' members,
        and the code of every function among them."""
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if not origin or os.path.abspath(origin) not in self.test_paths:
            return
        scope = vars(module)
        self.bodies[id(scope)] = (scope, dict(scope))
        for value in list(scope.values()):
            self.hold_code(value)
            if isinstance(value, type) and id(value) not in self.classes:
                members = dict(vars(value))
                self.classes[id(value)] = (value, members)
                for member in members.values():
                    self.hold_code(member)

    def hold_code(self, value):
        """The code a function (or a static or class method's) has now, if it is one: never an attribute read of any
        other object, whose ``__getattr__`` may do anything."""
        if type(value) in (staticmethod, classmethod):
            value = value.__func__
        if type(value) is self.function_type:
            self.code_then[id(value)] = (value, value.__code__)

    def as_bound(self, function, module, test_id):
        """``function`` is what the body of the test's module bound at the test's name (in its classes), with the
        same code; True when that body is not one this registry holds, or bound nothing there (nothing to compare)."""
        body = self.bodies.get(id(getattr(module, "__dict__", None)))
        parts = test_id.split("[", 1)[0].split("::")[1:]
        if body is None or body[0] is not vars(module) or not parts or parts[0] not in body[1]:
            return True
        value = body[1][parts[0]]
        for name in parts[1:]:
            if not isinstance(value, type):
                return True
            value = next((self.member(klass, name) for klass in value.__mro__ if name in self.member(klass)), None)
        bound = self.function_of(value) if value is not None else None
        if bound is None:
            return True
        held = self.code_then.get(id(bound))  # none for a method inherited from a class no body of ours made
        return bound is function and (held is None or held[1] is function.__code__)

    def member(self, klass, name=None):
        """A class's members as its module's body left them (as they are now, for a class no body of ours made);
        with ``name``, that member."""
        members = self.classes.get(id(klass), (None, vars(klass)))[1]
        return members if name is None else members[name]


def compile_pristine_tests(codes, framework_dirs):
    """pytest's assertion rewriting of test modules and conftests, from the bytes of pristine files (never a
    cached ``.pyc`` the code under test could have written): their code objects are ``codes``' by identity."""
    import ast
    from pathlib import Path

    from _pytest.assertion import rewrite

    hook = rewrite.AssertionRewritingHook
    original = hook.exec_module

    def exec_module(self, module, _original=original, _codes=codes, _rewrite=rewrite, _parse=ast.parse, _Path=Path):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        data = _codes.pristine_bytes(origin)
        if data is None:
            return _original(self, module)
        names = self._rewritten_names
        if isinstance(names, dict):  # pytest 7+: name -> path; pytest 6: a set of names
            names[module.__name__] = _Path(origin)
        else:
            names.add(module.__name__)
        tree = _parse(data, filename=origin)
        _rewrite.rewrite_asserts(tree, data, origin, self.config)
        code = compile(tree, origin, "exec", dont_inherit=True)
        _codes.adopt(code, origin)
        exec(code, module.__dict__)
        _codes.body_ran(module)

    hook.exec_module = exec_module


def install_observers(kit):
    """What a blinded test calls (``trialforge.testrun.blinding``), as builtins: report a value, an exception or
    the test's end on the channel, for the host to judge. The host holds the expected values; nothing here
    decides anything.

    A value is encoded by its exact type, never by calling a method of it: builtin scalars and containers,
    ``Decimal``, ``Fraction``, dates and times; a subclass of a builtin that overrides none of the methods a
    comparison uses, as its builtin value; anything else as opaque (its class's name), which the host accepts
    for nothing. An exception: the qualified names of its classes, its ``args`` and which builtin class gives it
    its ``__str__``.
    """
    import builtins
    import collections
    import datetime
    import decimal
    import enum
    import fractions

    try:
        from zoneinfo import ZoneInfo as zone_info
    except ImportError:  # Python 3.8
        zone_info = None
    current = kit.current
    # Observations need no secret (forging one still needs the right value), so the observers hold their own marker and
    # a descriptor of their own: nothing reachable from these builtins (their closures) writes the run's report.
    obs_fd, obs_marker, obs_write, obs_dumps = os.dup(kit.channel), kit.key["obs_marker"], os.write, kit.dumps
    os.set_inheritable(obs_fd, False)

    def emit(event):
        data = (obs_marker + obs_dumps(event, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[obs_write(obs_fd, data) :]

    type_mro = type.__dict__["__mro__"].__get__
    type_dict = type.__dict__["__dict__"].__get__
    type_module = type.__dict__["__module__"].__get__
    type_qualname = type.__dict__["__qualname__"].__get__
    type_flags = type.__dict__["__flags__"].__get__
    object_getattribute = object.__getattribute__
    member_type = type(fractions.Fraction.__dict__["_numerator"])  # a __slots__ member descriptor
    HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
    enum_base = enum.Enum
    exception_args = BaseException.__dict__["args"].__get__
    dict_items, float_hex, str_copy = dict.items, float.hex, str.__str__
    budget = [kit.key.get("observe_bytes", 64 << 20)]  # what all observations of a run may take on the channel
    node_cap, text_cap = 100000, 1 << 20
    comparisons = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__len__",
                   "__contains__", "__iter__", "__getitem__", "__index__", "__int__", "__float__")  # fmt: skip
    containers = {list: "l", tuple: "t", set: "S", frozenset: "F", collections.deque: "q"}
    mappings = {dict: "d", collections.OrderedDict: "od", collections.Counter: "cn", collections.defaultdict: "dd"}
    bases = (bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict)

    def name_of(cls):
        module, qualname = type_module(cls), type_qualname(cls)
        module = module if type(module) is str else "?"
        return module + "." + (qualname if type(qualname) is str else "?")

    def plain_base(cls):
        """The builtin ``cls`` derives from without changing how it compares, or None."""
        for klass in type_mro(cls):
            if klass in bases:
                return klass
            if any(name in type_dict(klass) for name in comparisons):
                return None
        return None

    def hexint(value):
        return format(int.__int__(value), "x")

    def encode(value, state):
        state[0] += 1
        if state[0] > node_cap:
            raise OverflowError
        cls = type(value)
        if value is None:
            return ["n"]
        if cls is bool:
            return ["b", 1 if value is True else 0]
        if cls is int:
            return ["i", hexint(value)]
        if cls is float:
            return ["f", float_hex(value)]
        if cls is complex:
            return ["c", float_hex(value.real), float_hex(value.imag)]
        if cls is str:
            state[1] += len(value)
            if state[1] > text_cap:
                raise OverflowError
            return ["s", value]
        if cls is bytes or cls is bytearray:
            state[1] += 2 * len(value)
            if state[1] > text_cap:
                raise OverflowError
            return ["y" if cls is bytes else "ya", bytes.hex(value)]
        if cls in containers:
            return [containers[cls], [encode(item, state) for item in cls.__iter__(value)]]
        if cls in mappings:
            return [mappings[cls], [[encode(k, state), encode(v, state)] for k, v in dict_items(value)]]
        if cls is decimal.Decimal:
            return ["D", decimal.Decimal.__str__(value)]
        if cls is fractions.Fraction:
            return ["Q", hexint(value._numerator), hexint(value._denominator)]
        if cls is range:
            return ["r", hexint(value.start), hexint(value.stop), hexint(value.step)]
        if cls is datetime.timedelta:
            return ["dt", "td", [hexint(value.days), hexint(value.seconds), hexint(value.microseconds)]]
        if cls is datetime.timezone:  # timezones compare by their offset alone
            return ["dt", "tz", [float_hex(datetime.timedelta.total_seconds(datetime.timezone.utcoffset(value, None)))]]
        if cls is zone_info:
            return ["dt", "zi", [zone_info.key.__get__(value)]]
        if cls is datetime.date:
            return ["dt", "d", [hexint(value.year), hexint(value.month), hexint(value.day), ["n"]]]
        if cls is datetime.datetime:
            fields = (value.year, value.month, value.day, value.hour, value.minute, value.second, value.microsecond,
                      value.fold)  # fmt: skip
            return ["dt", "dt", [*map(hexint, fields), encode_tz(value.tzinfo, state)]]
        if cls is datetime.time:
            fields = (value.hour, value.minute, value.second, value.microsecond, value.fold)
            return ["dt", "t", [*map(hexint, fields), encode_tz(value.tzinfo, state)]]
        base = plain_base(cls)
        if base is not None:
            return encode(base_value(base, value), state)
        if cls is type:
            return ["T", name_of(value)]
        fields = instance_state(value, cls)
        if fields is None:
            return ["o", name_of(cls)]
        return ["u", name_of(cls), [[k, encode(v, state)] for k, v in fields], enum_base in type_mro(cls)]

    def instance_state(value, cls):
        """Its ``__dict__`` and slots, when every class it derives from (but ``object``) is defined in Python:
        a C base keeps state this cannot see, so such an object is opaque."""
        mro = type_mro(cls)
        if any(not type_flags(klass) & HEAPTYPE for klass in mro if klass is not object):
            return None
        fields = {}
        try:
            own = object_getattribute(value, "__dict__")
        except AttributeError:
            own = {}
        if type(own) is not dict:
            return None
        for name, field in dict_items(own):
            if type(name) is not str:
                return None
            fields[name] = field
        for klass in mro:
            for name, member in dict_items(dict(type_dict(klass))):
                if type(member) is member_type and type(name) is str:
                    try:
                        fields[name] = member.__get__(value, cls)
                    except AttributeError:
                        continue  # a slot never set
        return sorted(dict_items(fields))

    def encode_tz(tz, state):
        return ["n"] if tz is None else encode(tz, state)

    def base_value(base, value):
        if base in (list, tuple, set, frozenset):
            return base(base.__iter__(value))
        if base is dict:
            return dict(dict_items(value))
        if base in (bytes, bytearray):
            return base(bytes.__bytes__(value) if base is bytes else bytearray.__iter__(value))
        return {bool: bool.__bool__, int: int.__int__, float: float.__float__, complex: complex.__complex__,
                str: str_copy}[base](value)  # fmt: skip

    def encoded(value):
        state = [0, 0]
        try:
            found = encode(value, state)
        except (OverflowError, RecursionError):
            return ["o", "too_large"]
        except Exception:
            return ["o", "unreadable"]
        budget[0] -= state[1] + 8 * state[0]
        return found if budget[0] > 0 else ["o", "over_budget"]

    def encoded_exception(error):
        classes = [name_of(cls) for cls in type_mro(type(error))]
        provider = None
        for cls in type_mro(type(error)):
            if "__str__" in type_dict(cls):
                provider = name_of(cls) if type_module(cls) == "builtins" else None
                break
        return ["x", classes, provider, [encoded(arg) for arg in tuple.__iter__(exception_args(error))]]

    def observe(index, value):
        test = current[0]
        if test is not None:
            emit({"e": "obs", "id": test, "k": index, "v": encoded(value)})
        return value

    def truth(index, value):
        """``assert value``: its truth as the code under test makes it (its ``__bool__``, as the assert would)."""
        falsy = not value  # the interpreter's own truth test: no name another module could rebind
        test = current[0]
        if test is not None:
            emit({"e": "obs", "id": test, "k": index, "v": ["b", 0 if falsy else 1]})
        return value

    def classes(index, value):
        """``isinstance(value, ...)``: the classes of the value; which one the test wants stays on the host."""
        test = current[0]
        if test is not None:
            names = [name_of(c) for c in type_mro(type(value))]
            emit({"e": "obs", "id": test, "k": index, "v": ["x", names, None, []]})
        return value

    def expect(index, value):
        """A recorded slot's expected side, as the (validated) code computes it: the host keeps it for grading."""
        test = current[0]
        if test is not None:
            emit({"e": "exp", "id": test, "k": index, "v": encoded(value)})
        return value

    class Caught:
        """What ``with __tf_raises__(...) as caught`` gives a test that reads the exception afterwards: unittest's
        ``cm.exception`` and, under pytest, everything of pytest's ``ExceptionInfo`` (``value``, ``match``...)."""

        value = exception = type = tb = None

        def __getattr__(self, name):
            info = self.__dict__.get("info")
            if info is None:
                raise AttributeError(name)
            return getattr(info, name)

    class Raises:
        def __init__(self, index, suppress):
            self.index, self.suppress, self.caught = index, suppress, Caught()

        def __enter__(self):
            return self.caught

        def __exit__(self, kind, error, tb):
            test = current[0]
            if test is not None:
                seen = ["none"] if kind is None else encoded_exception(error)
                emit({"e": "obs", "id": test, "k": self.index, "v": seen})
            if kind is not None:
                self.caught.value = self.caught.exception = error
                self.caught.type, self.caught.tb = kind, tb
                make_info = getattr(kit, "exception_info", None)
                if make_info is not None:
                    self.caught.info = make_info((kind, error, tb))
            return bool(self.suppress and kind is not None)

    def raises_call(index, function, suppress):
        def call(*args, **kwargs):
            with Raises(index, suppress):
                return function(*args, **kwargs)

        return call

    def end():
        test = current[0]
        if test is not None:
            emit({"e": "obs_end", "id": test})

    builtins.__tf_observe__ = observe
    builtins.__tf_expect__ = expect
    builtins.__tf_truth__ = truth
    builtins.__tf_classes__ = classes
    builtins.__tf_raises__ = Raises
    builtins.__tf_raises_call__ = raises_call
    builtins.__tf_end__ = end


def install_audit_hook(kit, framework_dirs, framework_packages, excluded_modules, own_types=()):
    """An audit hook (PEP 578: once added, never removed) that reports tampering as it happens.

    It sees what the fingerprints between tests cannot: a patch made and undone within one test,
    a function's code swapped, the collector walked for the recorder's objects, memory read raw.
    Only calls made by the code under test count: the nearest caller that is neither the runner, the
    standard library, generated code (``<...>``) nor a pristine test file, or a thread that holds
    none of those (started by whom, then?). Generated code counts as its caller's: with no pristine
    test and no file of the package below it, only the runner or an installed library (it ran as a
    callback: of the collector, a weakref, a hook), it is the code under test's, whatever name it was
    compiled under. Everything it uses is bound as a default argument: immutable values, and
    replacing a function's defaults or code is itself an audited event.
    ``framework_packages``: the runner's packages, whose classes are watched (less ``excluded_modules``);
    ``own_types``: the recorder's classes.
    """
    stdlib = os.path.dirname(os.__file__) + os.sep
    codes = kit.codes
    own_ids = frozenset(id(code) for code in kit.own_code)

    def audit(
        event,
        args,
        _events=AUDITED,
        _skip=(*framework_dirs, stdlib),
        _guarded=framework_dirs,  # the runner's code (stdlib's is its own)
        _own_ids=own_ids,  # the recorder's: known by identity, never by its file name
        _own_code=kit.own_code,  # (held, so the ids above stay theirs)
        _packages=tuple(framework_packages),
        _excluded=tuple(excluded_modules),
        _own=tuple(own_types),
        _trusted=codes.trusted,  # code objects by identity (CodeRegistry): a file name proves nothing
        _tests=codes.test_ids,
        _vouched=kit.pristine is None,
        _frame=sys._getframe,
        _write=os.write,
        _fd=kit.channel,
        _prefix=kit.marker,
    ):
        if event not in _events or _vouched:
            return
        if event == "object.__setattr__":
            target, name = args[0], args[1]
            code = getattr(target, "__code__", None)
            origin = str(getattr(target, "__module__", None) or "")
            framework_class = isinstance(target, type) and (
                any(target is own for own in _own) or (origin.split(".")[0] in _packages and origin not in _excluded)
            )
            guarded_code = code is not None and (
                (id(code) in _trusted and code.co_filename.startswith(_guarded))
                or id(code) in _tests
                or id(code) in _own_ids
            )
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
        frame, generated = _frame(1), False
        while frame is not None:
            code = frame.f_code
            if id(code) in _tests:
                return  # a pristine test's doing (or that of code it generated)
            library = id(code) in _trusted and not code.co_filename.startswith(_skip)  # its file name is real
            if id(code) in _own_ids or library:
                if generated:  # code generated at run time that no test and no file of the package called: a
                    break  # callback (gc, weakref, a hook) the code under test planted, under a name like "<string>"
                return  # the runner's own doing, or an installed library's
            if id(code) not in _trusted:
                if not code.co_filename.startswith("<"):
                    break  # the code under test: a workspace file's, or code compiled under any other name
                generated = True  # its caller decides
            frame = frame.f_back
        _write(_fd, (_prefix + '{"e":"tamper","what":"' + what.replace('"', "'") + '"}\n').encode())

    sys.addaudithook(audit)


AUDITED = frozenset(
    {
        "object.__setattr__",  # a framework class's attribute, or any guarded function's code, replaced
        "sys.settrace",
        "sys.setprofile",
        "gc.get_objects",  # walking the collector: how in-process code finds the recorder and the runner's state
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "open",  # only /proc/<pid>/mem: reading the process's memory raw
        "ctypes.dlsym",  # only the interpreter's own API (Py*): rewriting frames and objects from C
        "ctypes.cdata",
        "ctypes.string_at",
    }
)


globals().pop("_main")(globals().pop("_run_pytest"), globals().pop("_run_unittest"))
