"""``fastcalc``: the shape of markupsafe and simplejson, a ``src/`` package with its own C extension ``_speedups``
(``twice``; the bug: ``3 * x``) whose ``setup.py`` installs the pure-Python fallback when the compile fails, and an
``__init__`` that imports the fallback when the module does not load. tests/test_extbuild.py and
tests/test_redteam_build.py build their tasks from it."""

from __future__ import annotations

SPEEDUPS = "src/fastcalc/_speedups.c"


def twice_module(name: str, factor: int) -> str:
    """The C source of extension module ``name`` whose ``twice(x)`` returns ``factor * x``."""
    return f"""#include <Python.h>
static PyObject *twice(PyObject *self, PyObject *args) {{
    long x; if (!PyArg_ParseTuple(args, "l", &x)) return NULL; return PyLong_FromLong({factor} * x);
}}
static PyMethodDef methods[] = {{{{"twice", twice, METH_VARARGS, ""}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&module); }}
"""


C_BUGGY, C_FIXED = twice_module("_speedups", 3), twice_module("_speedups", 2)
SETUP_HEAD = """import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildFailed(Exception):
    pass


class optional_build_ext(build_ext):
    def run(self):
        try:
            build_ext.run(self)
        except Exception:
            raise BuildFailed()
"""
SETUP_TAIL = """

def run_setup(with_binary):
    setup(
        name="fastcalc",
        version="1.0",
        package_dir={"": "src"},
        packages=["fastcalc"],
        cmdclass={"build_ext": CMD},
        ext_modules=EXTENSIONS if with_binary else [],
    )


try:
    run_setup(True)
except BuildFailed:
    run_setup(False)
"""
EXT = 'Extension("fastcalc._speedups", ["src/fastcalc/_speedups.c"]{extra})'


def setup_py(prelude: str = "", extra: str = "", cmd: str = "optional_build_ext", more: str = "") -> str:
    """The repository's setup.py, with an attack's code before ``setup()`` and its Extension's extra arguments."""
    extensions = f"EXTENSIONS = [{EXT.format(extra=extra)}{more}]\nCMD = {cmd}\n"
    return SETUP_HEAD + prelude + "\n" + extensions + SETUP_TAIL


SETUP = setup_py()
INIT = """try:
    from fastcalc._speedups import twice
except ImportError:
    from fastcalc._native import twice
"""
