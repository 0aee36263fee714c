import subprocess
import textwrap
from pathlib import Path

import pytest

from trialforge.envspec import PYTEST_CMD, SUITES, UNITTEST_CMD
from trialforge.tasks.envdetect.decide import RELEASED_PYTHON, EnvError, detect
from trialforge.tasks.envdetect.resolve import EnvCache, resolve_env, spec_at_commit

pytestmark = pytest.mark.pure

BUNDLED = Path(__file__).resolve().parents[1] / "tasks_src" / "repos"


def make(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


PYTEST_TEST = "def test_one():\n    assert 1\n"
UNITTEST_TEST = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_one(self):\n        pass\n"


def test_every_image_python_has_its_debian_release_version() -> None:
    assert set(RELEASED_PYTHON) == set(SUITES)
    assert all(full.startswith(f"{short}.") for short, full in RELEASED_PYTHON.items())


@pytest.mark.parametrize("name", ["ledgerlite", "schedwise", "textkit"])
def test_bundled_repositories_need_only_the_base_image(name: str) -> None:
    spec = detect(BUNDLED / name)
    assert spec.is_base()
    assert spec.env == {}
    assert spec.test_cmd == PYTEST_CMD
    assert spec.detected_from == ("pyproject.toml",)


def test_bundled_repositories_are_the_three_tested() -> None:
    assert sorted(p.name for p in BUNDLED.iterdir() if p.is_dir()) == ["ledgerlite", "schedwise", "textkit"]


def test_src_layout_puts_src_on_the_path(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {"pyproject.toml": '[project]\nname = "pkg"\n', "src/pkg/__init__.py": "", "tests/test_a.py": PYTEST_TEST},
    )
    spec = detect(repo)
    assert spec.env == {"PYTHONPATH": "/work/src"}
    assert spec.is_base()
    assert spec.detected_from == ("src/", "tests/test_a.py")


def test_src_dir_shadowed_by_a_top_level_package_is_not_a_src_layout(tmp_path: Path) -> None:
    repo = make(tmp_path, {"src/pkg/__init__.py": "", "pkg/__init__.py": ""})
    assert detect(repo).env == {}


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("pyproject.toml", '[tool.setuptools]\npackage-dir = {"" = "lib"}\n'),
        ("pyproject.toml", '[tool.setuptools.packages.find]\nwhere = ["lib"]\n'),
        ("pyproject.toml", '[tool.hatch.build.targets.wheel]\npackages = ["lib/pkg"]\n'),
        ("pyproject.toml", '[tool.poetry]\npackages = [{include = "pkg", from = "lib"}]\n'),
        ("setup.cfg", "[options]\npackage_dir =\n    =lib\n"),
        ("setup.cfg", "[options.packages.find]\nwhere = lib\n"),
    ],
)
def test_configured_package_dir_is_put_on_the_path(tmp_path: Path, name: str, config: str) -> None:
    spec = detect(make(tmp_path, {name: config}))
    assert spec.env == {"PYTHONPATH": "/work/lib"}
    assert spec.detected_from == (name,)


def test_pytest_config_outweighs_unittest_style_tests(tmp_path: Path) -> None:
    repo = make(tmp_path, {"setup.cfg": "[tool:pytest]\naddopts = -q\n", "tests/test_a.py": UNITTEST_TEST})
    assert detect(repo).test_cmd == (*PYTEST_CMD, "-q")


FLAT_CFG = {
    "setup.cfg": """
        [metadata]
        name = flat
        [options]
        install_requires =
            attrs>=21
            importlib-metadata; python_version < "3.10"
        [options.extras_require]
        testing = hypothesis
        docs = sphinx
    """,
    "requirements.txt": """
        # runtime
        requests>=2.0  # http
        colorama; sys_platform == "win32"
        -e .
        attrs>=21
    """,
    "flat/__init__.py": "",
}


def test_flat_layout_with_setup_cfg_and_requirements_txt(tmp_path: Path) -> None:
    spec = detect(make(tmp_path, FLAT_CFG))
    assert spec.python == "3.11"
    assert spec.requirements == ("attrs>=21", "hypothesis", "requests>=2.0")
    assert spec.env == {}
    assert spec.detected_from == ("setup.cfg", "requirements.txt")


def test_markers_are_judged_for_the_chosen_python(tmp_path: Path) -> None:
    setup_cfg = textwrap.dedent(FLAT_CFG["setup.cfg"]).replace("[options]\n", "[options]\npython_requires = <3.10\n")
    files = FLAT_CFG | {"setup.cfg": setup_cfg}
    spec = detect(make(tmp_path, files))
    assert spec.python == "3.9"
    assert 'importlib-metadata; python_version < "3.10"' in spec.requirements


def test_setup_py_is_read_for_literals_only_and_never_run(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "setup.py": """
                from setuptools import setup
                open("ran", "w").close()
                setup(
                    name="legacy",
                    python_requires=">=3.12",
                    install_requires=["six>=1.10", "numpy"],
                    tests_require=["mock"],
                    extras_require=compute_extras(),
                    package_dir={"": "src"},
                )
            """,
        },
    )
    spec = detect(repo)
    assert not (repo / "ran").exists()
    assert spec.python == "3.13"
    assert spec.requirements == ("six>=1.10", "numpy", "mock")
    assert spec.env == {"PYTHONPATH": "/work/src"}
    assert spec.detected_from == ("setup.py (extras_require not literal: ignored)", "setup.py")


def test_tox_unittest_command_decides_the_runner(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "tox.ini": """
                [testenv]
                deps = -r{toxinidir}/test-requirements.txt
                commands =
                    python -m unittest discover -s tests {posargs}
            """,
            "test-requirements.txt": "freezegun\n",
            "tests/test_a.py": PYTEST_TEST,
        },
    )
    spec = detect(repo)
    assert spec.test_cmd == (*UNITTEST_CMD, "discover", "-s", "tests")
    assert spec.requirements == ("freezegun",)
    assert spec.detected_from == ("test-requirements.txt", "tox.ini")


def test_tox_pytest_command_keeps_options_and_drops_the_test_dir(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "tox.ini": """
                [testenv]
                deps =
                    pytest
                    pytest-cov
                    py38: mock
                commands =
                    pip list
                    - coverage run -m pytest -x --tb=short --cov tests {posargs:tests} tests
            """,
            "tests/test_a.py": PYTEST_TEST,
        },
    )
    spec = detect(repo)
    assert spec.test_cmd == (*PYTEST_CMD, "-x", "--tb=short", "--cov", "tests")
    assert spec.requirements == ("pytest-cov",)


# tqdm's tox.ini of 2024: its notebook through nbval, then the rest without the slow perf tests
TQDM_2024_PARTS = {
    "tox.ini": """
        [testenv]
        commands=
            pytest --cov=pkg -W=ignore tests_notebook.ipynb --nbval --nbval-current-env
            pytest --cov=pkg --cov-append -k "not perf"
    """,
    "tests_notebook.ipynb": "{}",
    "tests/test_a.py": PYTEST_TEST,
}


def test_a_suite_run_in_parts_runs_as_the_part_that_names_no_test_file(tmp_path: Path) -> None:
    spec = detect(make(tmp_path, TQDM_2024_PARTS))
    assert spec.test_cmd == (*PYTEST_CMD, "--cov=pkg", "--cov-append", "-k", "not perf")
    assert spec.detected_from == (
        "tox.ini (runs its suite in parts: the part that names no test file, not pytest --cov=pkg -W=ignore "
        "tests_notebook.ipynb --nbval --nbval-current-env)",
        "tox.ini",
    )


def test_tox_posargs_default_with_spaces_is_what_tox_runs_without_arguments(tmp_path: Path) -> None:
    # dateutil's tox.ini: a default of several quoted words, split into pieces before its braces were seen
    repo = make(
        tmp_path,
        {
            "tox.ini": """
                [testenv]
                commands = python -m pytest {posargs: "{toxinidir}/tests" "{toxinidir}/docs" --cov=pkg} -ra {posargs}
            """,
            "tests/test_a.py": PYTEST_TEST,
            "docs/conf.py": "",
        },
    )
    assert detect(repo).test_cmd == (*PYTEST_CMD, "docs", "--cov=pkg", "-ra")


def test_a_root_level_tests_module_of_unittest_cases_runs_under_unittest(tmp_path: Path) -> None:
    # itsdangerous in 2011: itsdangerous.py beside tests.py, run by `python tests.py`; pytest collects no tests.py
    repo = make(tmp_path, {"lib.py": "", "tests.py": UNITTEST_TEST, "Makefile": "test:\n\tpython tests.py\n"})
    spec = detect(repo)
    assert spec.test_cmd == UNITTEST_CMD
    assert spec.detected_from == ("test files (unittest.TestCase only)",)


def test_tox_configuration_in_pyproject_is_read_with_its_section_references(tmp_path: Path) -> None:
    # tqdm: tox.ini moved into pyproject.toml, the plugins the suite's addopts need listed in a [core] section
    repo = make(
        tmp_path,
        {
            "pyproject.toml": """
                [tool.pytest.ini_options]
                addopts = "--asyncio-mode=strict"

                [tool.tox]
                legacy_tox_ini = \"\"\"
                [core]
                deps=
                    pytest-asyncio
                    pytest-timeout
                    git+https://github.com/casperdcl/nbval

                [testenv]
                deps=
                    {[core]deps}
                    rich
                commands=
                    {envpython} -m pytest -k "not perf"
                \"\"\"
            """,
            "tests/test_a.py": PYTEST_TEST,
        },
    )
    spec = detect(repo)
    assert spec.requirements == ("pytest-asyncio", "pytest-timeout", "nbval", "rich")
    assert spec.test_cmd == (*PYTEST_CMD, "-k", "not perf", "--asyncio-mode=strict")


@pytest.mark.parametrize(
    ("line", "name"),
    [("git+https://github.com/casperdcl/nbval", "nbval"), ("git+https://example.org/a/b.git@v1.2#egg=pkg-b", "pkg-b"),
     ("hg+https://example.org/x/tool.git", "tool")],
)  # fmt: skip
def test_a_vcs_requirement_is_installed_from_the_index_by_its_name(tmp_path: Path, line: str, name: str) -> None:
    # the image builds from the package index and has no git: tqdm's fork of nbval failed the whole build
    repo = make(tmp_path, {"requirements-test.txt": f"{line}\n", "tests/test_a.py": PYTEST_TEST})
    spec = detect(repo)
    assert spec.requirements == (name,)
    assert f"requirements-test.txt ({line} installed as {name} from the package index)" in spec.detected_from


def test_unittest_only_tests_run_under_unittest_discovering_from_their_plain_directory(tmp_path: Path) -> None:
    repo = make(tmp_path, {"pkg/__init__.py": "", "tests/test_a.py": UNITTEST_TEST, "tests/test_b.py": UNITTEST_TEST})
    spec = detect(repo)
    # plain `python -m unittest` descends only into packages: it would find none of these
    assert spec.test_cmd == (*UNITTEST_CMD, "discover", "-s", "tests")
    assert spec.detected_from == ("test files (unittest.TestCase only)",)
    (repo / "tests" / "__init__.py").write_text("")
    assert detect(repo).test_cmd == UNITTEST_CMD  # a test package: plain discovery finds it


def test_one_plain_test_function_makes_it_pytest(tmp_path: Path) -> None:
    repo = make(tmp_path, {"tests/test_a.py": UNITTEST_TEST, "tests/test_b.py": PYTEST_TEST})
    spec = detect(repo)
    assert spec.test_cmd == PYTEST_CMD
    assert spec.detected_from == ("tests/test_b.py",)


def test_pytest_in_test_dependencies_outweighs_unittest_style_tests(tmp_path: Path) -> None:
    repo = make(tmp_path, {"requirements-dev.txt": "pytest-mock\n", "tests/test_a.py": UNITTEST_TEST})
    assert detect(repo).test_cmd == PYTEST_CMD


def test_makefile_unittest_command_decides_the_runner(tmp_path: Path) -> None:
    repo = make(tmp_path, {"Makefile": "test:\n\t@$(PYTHON) -m unittest -v $(TESTS)\n", "tests/test_a.py": PYTEST_TEST})
    spec = detect(repo)
    assert spec.test_cmd == (*UNITTEST_CMD, "-v")
    assert spec.detected_from == ("Makefile",)


def test_pytest_kept_only_when_versioned_plugins_always(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "pkg"
                dependencies = ["click"]
                [project.optional-dependencies]
                test = ["pytest", "pytest-xdist"]
                dev = ["pkg[test,lint]", "black"]
                lint = ["ruff"]
                docs = ["sphinx"]
                [dependency-groups]
                testing = ["pytest>=8", {include-group = "extra"}]
                extra = ["responses"]
            """,
        },
    )
    spec = detect(repo)
    assert spec.requirements == ("click", "pytest-xdist", "pytest>=8", "responses")  # no dev: a test group exists
    assert not spec.is_base()


def test_dev_group_is_read_only_where_no_test_group_exists(tmp_path: Path) -> None:
    # pallets/click's pyproject.toml (2025): the dev group is ruff, tox and tox-uv; the tests group pytest
    click = """
        [project]
        name = "click"
        requires-python = ">=3.10"
        [dependency-groups]
        dev = ["ruff", "tox", "tox-uv"]
        docs = ["sphinx", "sphinx-tabs"]
        tests = ["pytest"]
    """
    assert detect(make(tmp_path / "click", {"pyproject.toml": click})).is_base()
    dev_only = """
        [project]
        name = "pkg"
        [project.optional-dependencies]
        dev = ["pkg[lint]", "pytest-xdist", "black"]
        lint = ["flake8-bugbear", "responses"]
    """
    spec = detect(make(tmp_path / "dev_only", {"pyproject.toml": dev_only}))
    assert spec.requirements == ("pytest-xdist", "responses")
    assert spec.detected_from == (
        "pyproject.toml",
        "pyproject.toml (developer tools not installed: black, flake8-bugbear)",
    )


def test_developer_tools_stay_when_the_project_needs_them_or_its_tests_import_them(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "sphinx-ext"
                dependencies = ["sphinx>=7"]
                [project.optional-dependencies]
                tests = ["sphinx-testing", "mypy", "tox", "pre-commit"]
            """,
            "tests/test_ext.py": "from mypy import api\nimport sphinx_testing\n\n\ndef test_one():\n    pass\n",
        },
    )
    spec = detect(repo)
    assert spec.requirements == ("sphinx>=7", "sphinx-testing", "mypy")
    assert "pyproject.toml (developer tools not installed: tox, pre-commit)" in spec.detected_from


def test_requirements_files_follow_includes_inside_the_repository(tmp_path: Path) -> None:
    repo = make(
        tmp_path / "repo",
        {
            "requirements.txt": "-r requirements/base.txt\n",
            "requirements/base.txt": "idna==3.4 \\\n    --hash=sha256:abc\n",
            "requirements/test.txt": """
                -r base.txt
                -r ../../outside.txt
                -c constraints.txt
                --index-url https://pypi.example/simple
                -e git+https://example.org/x.git#egg=x
                ==bad==
                ./vendored
                responses
            """,
        },
    )
    (tmp_path / "outside.txt").write_text("evil\n")
    spec = detect(repo)
    assert spec.requirements == ("idna==3.4", "x", "responses")  # the image has no git: x from the index
    assert spec.pip_args == ("--index-url", "https://pypi.example/simple")
    assert spec.detected_from == (
        "requirements/base.txt",
        "outside.txt (outside the repository or missing: ignored)",
        "requirements/test.txt (constraints constraints.txt ignored)",
        "requirements/test.txt",
        "requirements/test.txt (git+https://example.org/x.git#egg=x installed as x from the package index)",
        "requirements/test.txt ('==bad==' is not a requirement: ignored)",
    )


# pallets/jinja's requirements/ in December 2024 (ab8218c7), pins abridged: pip-compiled files for the tests,
# for the tests under Python 3.7, and a dev superset; tox reads tests.txt, and tests37.txt for py37 only.
JINJA_2024 = {
    "pyproject.toml": '[project]\nname = "Jinja2"\nrequires-python = ">=3.7"\ndependencies = ["MarkupSafe>=2.0"]\n',
    "tox.ini": """
        [testenv]
        deps = -r requirements/tests.txt
        commands = pytest -v --tb=short --basetemp={envtmpdir} {posargs}

        [testenv:py37,py3.7]
        deps = -r requirements/tests37.txt
    """,
    "requirements/tests.in": "pytest\ntrio\n",
    "requirements/tests.txt": "attrs==24.3.0\n    # via trio\npackaging==24.2\npytest==8.3.4\ntrio==0.27.0\n",
    "requirements/tests37.txt": "attrs==24.2.0\npackaging==24.0\npytest==7.4.4\ntrio==0.22.2\n",
    "requirements/dev.txt": "alabaster==1.0.0\nattrs==24.3.0\npre-commit==4.0.1\npytest==8.3.4\ntox==4.23.2\n",
    "requirements/docs.txt": "alabaster==1.0.0\nsphinx==8.1.3\n",
    "requirements/typing.txt": "mypy==1.14.0\npytest==8.3.4\n",
    "src/jinja2/__init__.py": "",
}


def test_requirements_dir_gives_one_tests_file_not_another_pythons_nor_dev(tmp_path: Path) -> None:
    spec = detect(make(tmp_path, JINJA_2024))
    assert spec.python == "3.11"
    assert spec.requirements == ("MarkupSafe>=2.0", "attrs==24.3.0", "packaging==24.2", "pytest==8.3.4", "trio==0.27.0")
    assert spec.detected_from == (
        "pyproject.toml",
        "requirements/dev.txt (not read: requirements/tests.txt is)",
        "requirements/tests.txt",
        "requirements/tests37.txt (for Python 3.7: not read)",
        "tox.ini",
        "src/",
    )


def test_requirements_dir_variants_of_the_tests_file_are_not_read(tmp_path: Path) -> None:
    # pallets/flask's requirements/ in November 2024 (6b054f8f): dev.txt pins 60 packages
    files = {
        "requirements/dev.txt": "alabaster==1.0.0\npytest==8.3.3\nsphinx==8.1.3\ntox==4.23.2\n",
        "requirements/tests.txt": "asgiref==3.8.1\npytest==8.3.3\npython-dotenv==1.0.1\n",
        "requirements/tests-dev.txt": "https://github.com/pallets/werkzeug/archive/refs/heads/main.tar.gz\n",
        "requirements/tests-min.txt": "werkzeug==3.1.0\n",
    }
    spec = detect(make(tmp_path, files))
    assert spec.requirements == ("asgiref==3.8.1", "pytest==8.3.3", "python-dotenv==1.0.1")
    assert spec.detected_from == (
        "requirements/dev.txt (not read: requirements/tests.txt is)",
        "requirements/tests-dev.txt (not read: requirements/tests.txt is)",
        "requirements/tests-min.txt (not read: requirements/tests.txt is)",
        "requirements/tests.txt",
    )


def test_a_requirements_file_in_the_test_directory_is_the_suites_own(tmp_path: Path) -> None:
    # hukkin/tomli in 2021: tests/requirements.txt, read by its CI, holds what the suite imports
    files = {"tests/requirements.txt": "python-dateutil\n", "tests/test_extras.py": "import dateutil\n"}
    spec = detect(make(tmp_path, files))
    assert spec.requirements == ("python-dateutil",)
    assert "tests/requirements.txt" in spec.detected_from


@pytest.mark.parametrize(
    ("requires", "python", "pin"), [(">=3.7", "3.11", "8.3.2"), ("<3.10", "3.9", "8.3.3"), (">=3.12", "3.13", "8.3.4")]
)
def test_tests_file_named_for_the_chosen_python_is_preferred_to_the_plain_one(
    tmp_path: Path, requires: str, python: str, pin: str
) -> None:
    files = {
        "setup.cfg": f"[options]\npython_requires = {requires}\n",
        "requirements/tests.txt": "pytest==8.3.4\n",
        "requirements/tests39.txt": "pytest==8.3.3\n",
        "requirements/tests-py3.11.txt": "pytest==8.3.2\n",
    }
    spec = detect(make(tmp_path, files))
    assert (spec.python, spec.requirements) == (python, (f"pytest=={pin}",))


def test_dev_requirements_file_is_read_only_without_a_tests_file(tmp_path: Path) -> None:
    files = {"requirements-dev.txt": "pytest-mock==3.14.0\ntox==4.23.2\nsphinx-rtd-theme==3.0.2\n"}
    spec = detect(make(tmp_path / "dev", files))
    assert spec.requirements == ("pytest-mock==3.14.0",)
    assert spec.detected_from == (
        "requirements-dev.txt",
        "requirements-dev.txt (developer tools not installed: tox==4.23.2, sphinx-rtd-theme==3.0.2)",
    )
    spec = detect(make(tmp_path / "both", files | {"test-requirements.txt": "freezegun\n"}))
    assert spec.requirements == ("freezegun",)
    assert spec.detected_from == ("requirements-dev.txt (not read: test-requirements.txt is)", "test-requirements.txt")


def test_a_distribution_pinned_twice_keeps_the_first_files_pin_and_says_so(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "requirements.txt": 'packaging==24.1\nattrs>=23\nimportlib-metadata==6.7.0; python_version < "3.8"\n',
            "requirements/tests.txt": """
                packaging==24.0
                attrs==24.2.0
                importlib-metadata==8.5.0; python_version >= "3.8"
            """,
        },
    )
    spec = detect(repo)
    assert spec.requirements == (
        "packaging==24.1",
        "attrs>=23",
        "attrs==24.2.0",
        'importlib-metadata==8.5.0; python_version >= "3.8"',
    )
    assert spec.detected_from == (
        "requirements.txt",
        "requirements/tests.txt (packaging==24.0 conflicts with ==24.1 from requirements.txt: ignored)",
        "requirements/tests.txt",
    )


# 23andMe/Yamale in June 2021 (ad71384): pytest<6 cannot rewrite assertions on Python 3.10 and later.
YAMALE_2021 = {
    "setup.py": """
        from setuptools import setup
        setup(name="yamale", install_requires=["pyyaml"], python_requires=">=3.6")
    """,
    "requirements.txt": "tox==3.15.2\n",
    "tox.ini": """
        [testenv]
        commands = py.test --cov yamale --cov-report term-missing yamale
        deps =
          ruamel.yaml<1
          pytest<6
          pytest-cov<3
    """,
    "yamale/__init__.py": "",
}


def test_python_is_one_the_pinned_pytest_runs_on(tmp_path: Path) -> None:
    spec = detect(make(tmp_path, YAMALE_2021))
    assert spec.python == "3.9"
    assert spec.requirements == ("pyyaml", "ruamel.yaml<1", "pytest<6", "pytest-cov<3")
    assert spec.detected_from == (
        "setup.py",
        "requirements.txt",
        "tox.ini",
        "requirements.txt (developer tools not installed: tox==3.15.2)",
        "tox.ini (pytest<6: no pytest it allows runs on Python 3.10+, 6.2.4 is the first: Python 3.9)",
    )


@pytest.mark.parametrize(
    ("pin", "requires", "python"),
    [
        ("pytest<6", ">=3.6", "3.9"),
        ("pytest==6.2.3", ">=3.6", "3.9"),
        ("pytest==5.*", ">=3.6", "3.9"),
        ("pytest~=6.1.0", ">=3.6", "3.9"),
        ("pytest<7", ">=3.6", "3.11"),
        ("pytest~=6.2", ">=3.6", "3.11"),
        ("pytest<=6.2.4", ">=3.6", "3.11"),
        ("pytest!=6.*", ">=3.6", "3.11"),
        ('pytest==5.4.3; python_version < "3.10"', ">=3.6", "3.11"),
        ("pytest<8", ">=3.12", "3.13"),
    ],
)
def test_python_allowed_by_the_pytest_pin(tmp_path: Path, pin: str, requires: str, python: str) -> None:
    repo = make(
        tmp_path,
        {
            "pyproject.toml": f'[project]\nname = "p"\nrequires-python = "{requires}"\n',
            "requirements-test.txt": f"{pin}\n",
        },
    )
    assert detect(repo).python == python


def test_pytest_pin_no_allowed_python_runs_is_relaxed_and_recorded(tmp_path: Path) -> None:
    setup_py = YAMALE_2021["setup.py"].replace(">=3.6", ">=3.10")
    spec = detect(make(tmp_path, YAMALE_2021 | {"setup.py": setup_py}))
    assert spec.python == "3.11"
    assert spec.requirements == ("pyyaml", "ruamel.yaml<1", "pytest==6.2.4", "pytest-cov<3")
    assert spec.detected_from[-1] == (
        "tox.ini (pytest<6 relaxed to pytest==6.2.4: no pytest it allows runs on Python 3.10+, 6.2.4 is the first: "
        "Python 3.11)"
    )


# jmespath/jmespath.py's requirements.txt of 2017, whose tox.ini runs nosetests: on Python 3.11 pytest cannot start
# (py's "AttributeError: __spec__"), nose and hypothesis fail to import and coverage fails as it starts.
JMESPATH_2017 = {
    "setup.py": "from setuptools import setup\nsetup(name='jmespath', packages=['jmespath'])\n",
    "requirements.txt": "".join(
        f"{pin}\n"
        for pin in ("nose==1.2.1", "py==1.4.12", "tox==1.4.2", "wheel==0.24.0", "coverage==3.7.1", "hypothesis==3.1.0")
    ),
    "tox.ini": "[testenv]\ncommands = nosetests\ndeps =\n    nose\n    mock\n",
    "jmespath/__init__.py": "",
}


def test_old_test_tool_pins_are_relaxed_each_with_its_reason(tmp_path: Path) -> None:
    spec = detect(make(tmp_path, JMESPATH_2017))
    relaxed = ("nose==1.3.7", "py==1.11.0", "wheel==0.24.0", "coverage==4.4", "hypothesis==4.40.0", "nose", "mock")
    assert (spec.python, spec.requirements) == ("3.11", relaxed)
    assert [line for line in spec.detected_from if " relaxed to " in line] == [
        "requirements.txt (nose==1.2.1 relaxed to nose==1.3.7: no nose it allows runs on Python 3.9+, 1.3.7 is the "
        "first: Python 3.11)",
        "requirements.txt (py==1.4.12 relaxed to py==1.11.0: no py it allows runs on Python 3.11+, 1.11.0 is the "
        "first: Python 3.11)",
        "requirements.txt (coverage==3.7.1 relaxed to coverage==4.4: no coverage it allows runs on Python 3.8+, 4.4 "
        "is the first: Python 3.11)",
        "requirements.txt (hypothesis==3.1.0 relaxed to hypothesis==4.40.0: no hypothesis it allows runs on Python "
        "3.8+, 4.40.0 is the first: Python 3.11)",
    ]


def test_runtime_dependency_is_never_relaxed(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "setup.py": (
                "from setuptools import setup\n"
                "setup(name='p', python_requires='>=3.10', install_requires=['py==1.4.12'])\n"
            ),
            "requirements-test.txt": "pytest==3.0.7\n",
        },
    )
    spec = detect(repo)
    assert spec.requirements == ("py==1.4.12", "pytest==6.2.4")
    assert (
        "setup.py (py==1.4.12 not relaxed, a runtime dependency: no py it allows runs on Python 3.11+, 1.11.0 is "
        "the first: Python 3.11)" in spec.detected_from
    )


def test_relaxed_pin_keeps_its_marker_and_extras(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "p"\nrequires-python = ">=3.12"\n',
            "requirements-test.txt": 'pytest[testing]==3.0.7; sys_platform != "win32"\n',
        },
    )
    spec = detect(repo)
    assert (spec.python, spec.requirements) == ("3.13", ('pytest[testing]==7.3.2; sys_platform != "win32"',))


def test_forced_python_leaves_pins_as_written(tmp_path: Path) -> None:
    repo = make(tmp_path, {"requirements-test.txt": "pytest==3.0.7\n"})
    assert detect(repo, "3.11").requirements == ("pytest==3.0.7",)


@pytest.mark.parametrize(
    ("name", "config"),
    [
        # jazzband/prettytable (2024-10), python-humanize/humanize (2024-09): hatch-vcs
        ("pyproject.toml", '[tool.hatch.build.hooks.vcs]\nversion-file = "src/pkg/_version.py"\n'),
        ("pyproject.toml", '[tool.hatch]\nbuild.hooks.vcs.version-file = "src/pkg/_version.py"\n'),
        ("pyproject.toml", '[tool.setuptools_scm]\nwrite_to = "src/pkg/_version.py"\n'),
        ("pyproject.toml", '[tool.setuptools_scm]\nversion_file = "src/pkg/_version.py"\n'),
        ("setup.py", 'from setuptools import setup\nsetup(use_scm_version={"write_to": "src/pkg/_version.py"})\n'),
    ],
)
def test_version_file_written_at_build_time_is_named(tmp_path: Path, name: str, config: str) -> None:
    repo = make(tmp_path, {name: config, "src/pkg/__init__.py": "from ._version import __version__\n"})
    spec = detect(repo)
    assert spec.env == {"PYTHONPATH": "/work/src"}
    assert (
        f"{name} (version-file src/pkg/_version.py is generated at build time: not in the tree)" in spec.detected_from
    )
    (repo / "src/pkg/_version.py").write_text("__version__ = '1.0'\n")
    spec = detect(repo)
    assert spec.env == {"PYTHONPATH": "/work/src"}
    assert not any("version-file" in source for source in spec.detected_from)


@pytest.mark.parametrize(
    ("requires", "python"), [(">=3.12", "3.13"), ("<3.10", "3.9"), (">=3.8", "3.11"), (">=3.9.1,<3.10", "3.9")]
)
def test_python_is_3_11_when_allowed_else_the_newest_allowed(tmp_path: Path, requires: str, python: str) -> None:
    repo = make(tmp_path, {"pyproject.toml": f'[project]\nname = "p"\nrequires-python = "{requires}"\n'})
    assert detect(repo).python == python


def test_python_no_image_has_is_an_error_naming_requirement_file_and_choices(tmp_path: Path) -> None:
    repo = make(tmp_path, {"pyproject.toml": '[project]\nname = "p"\nrequires-python = ">=3.14"\n'})
    with pytest.raises(EnvError) as caught:
        detect(repo)
    message = str(caught.value)
    assert "'>=3.14' in pyproject.toml" in message
    assert all(f"{version} (Debian {suite}" in message for version, suite in SUITES.items())
    assert "trialforge-env.yaml" in message


def test_override_file_then_params_win_per_key(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "requirements.txt": "attrs\n",
            "trialforge-env.yaml": "requirements: [attrs, lxml]\nsystem_packages: [libxml2-dev]\nenv: {TZ: UTC}\n",
        },
    )
    spec = resolve_env(
        repo, "acme/widgets", {"acme/widgets": {"requirements": ["attrs==23.1"]}, "other": {"python": "3.9"}}
    )
    assert spec.requirements == ("attrs==23.1",)
    assert spec.system_packages == ("libxml2-dev",)
    assert spec.env == {"TZ": "UTC"}
    assert spec.python == "3.11"
    assert spec.detected_from == ("requirements.txt", "trialforge-env.yaml", "params env.repos")


def test_python_override_lifts_requires_python_and_judges_markers(tmp_path: Path) -> None:
    repo = make(
        tmp_path,
        {
            "pyproject.toml": """
                [project]
                name = "p"
                requires-python = ">=3.14"
                dependencies = ['tomli; python_version < "3.11"', 'typing-extensions; python_version < "3.13"']
            """,
            "trialforge-env.yaml": 'python: "3.9"\n',
        },
    )
    spec = resolve_env(repo, "p", {"p": {"python": "3.13"}})
    assert spec.python == "3.13"
    assert spec.requirements == ()
    assert resolve_env(repo, "p").requirements == (
        'tomli; python_version < "3.11"',
        'typing-extensions; python_version < "3.13"',
    )


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("pyhton: '3.13'\n", "trialforge-env.yaml for r: unknown key 'pyhton'"),
        ("detected_from: [x]\n", "unknown key 'detected_from'"),
        ("python: '2.7'\n", "trialforge-env.yaml for r: python: Value error, no image for Python 2.7"),
        ("python: 3.10\n", "quote it"),
        ("- python\n", "expected a mapping"),
        ("python: [\n", "not valid YAML"),
    ],
)
def test_invalid_override_file_is_an_error_naming_it(tmp_path: Path, yaml_text: str, expected: str) -> None:
    repo = make(tmp_path, {"trialforge-env.yaml": yaml_text})
    with pytest.raises(EnvError, match=r"trialforge-env\.yaml") as caught:
        resolve_env(repo, "r")
    assert expected in str(caught.value)


def test_invalid_params_override_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match=r"params env\.repos for r: env\.X: Input should be a valid string"):
        resolve_env(tmp_path, "r", {"r": {"env": {"X": 1}}})


def git(repo: Path, *args: str) -> str:
    argv = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo), *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def commit_pyproject(repo: Path, text: str) -> str:
    (repo / "pyproject.toml").write_text(textwrap.dedent(text))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "env")
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def two_commits(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "mirror"
    repo.mkdir()
    git(repo, "init", "-q")
    make(repo, {"pkg/__init__.py": "", "tests/test_a.py": PYTEST_TEST})
    first = commit_pyproject(repo, '[project]\nname = "pkg"\ndependencies = ["attrs"]\n')
    second = commit_pyproject(
        repo, '[project]\nname = "pkg"\nrequires-python = ">=3.12"\ndependencies = ["attrs", "requests>=2"]\n'
    )
    return repo, first, second


def test_spec_at_commit_reads_that_commits_files(two_commits: tuple[Path, str, str]) -> None:
    repo, first, second = two_commits
    old, new = spec_at_commit(repo, first, "pkg"), spec_at_commit(repo, second, "pkg")
    assert (old.python, old.requirements) == ("3.11", ("attrs",))
    assert (new.python, new.requirements) == ("3.13", ("attrs", "requests>=2"))


def test_env_cache_resolves_each_commit_once(
    two_commits: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, first, second = two_commits
    calls: list[str] = []

    def counting(mirror: Path, commit: str, repo_name: str, overrides: object = None):
        calls.append(commit)
        return spec_at_commit(mirror, commit, repo_name, overrides)

    monkeypatch.setattr("trialforge.tasks.envdetect.resolve.spec_at_commit", counting)
    cache = EnvCache(overrides={"pkg": {"python": "3.9"}})
    specs = [cache.get(repo, commit, "pkg") for commit in (first, second, first, second)]
    assert calls == [first, second]
    assert specs[0] is specs[2]
    assert [s.python for s in specs] == ["3.9"] * 4


def test_env_cache_remembers_failures(two_commits: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, _, second = two_commits
    calls: list[str] = []

    def failing(mirror: Path, commit: str, repo_name: str, overrides: object = None):
        calls.append(commit)
        raise EnvError("no python")

    monkeypatch.setattr("trialforge.tasks.envdetect.resolve.spec_at_commit", failing)
    cache = EnvCache()
    for _ in range(2):
        with pytest.raises(EnvError, match="no python"):
            cache.get(repo, second, "pkg")
    assert calls == [second]


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-m 'not stress' -ra\"\n"),
        ("pyproject.toml", '[tool.pytest]\naddopts = ["-m", "not stress", "-ra"]\n'),
        ("pytest.ini", "[pytest]\naddopts = -m 'not stress' -ra\n"),
        ("tox.ini", "[pytest]\naddopts = -m 'not stress' -ra\n"),
        ("setup.cfg", "[tool:pytest]\naddopts = -m 'not stress' -ra\n"),
    ],
)
def test_the_suites_own_pytest_addopts_join_its_command(tmp_path: Path, name: str, config: str) -> None:
    # pallets/click: addopts = "-m 'not stress'" leaves 31,000 stress cases out; the recorder runs with
    # -o addopts=, so they reach the run only through the command (where testrun.command vets each option)
    spec = detect(make(tmp_path, {name: config, "tests/test_a.py": "def test_a():\n    pass\n"}))
    assert spec.test_cmd == (*PYTEST_CMD, "-m", "not stress", "-ra")
    assert f"{name} (pytest addopts: -m 'not stress' -ra)" in spec.detected_from


def test_addopts_come_from_the_file_pytest_reads_first(tmp_path: Path) -> None:
    files = {"pytest.ini": "[pytest]\naddopts = -ra\n", "setup.cfg": "[tool:pytest]\naddopts = -x\n"}
    assert detect(make(tmp_path, files)).test_cmd == (*PYTEST_CMD, "-ra")
