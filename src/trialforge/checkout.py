"""The checkout trialforge is installed from: its bundled sources (``tasks_src/``), its Prefect flows (``flows/``)
and the Podman configuration its engine runs with (``images/podman/``).

``make setup`` installs the package in place (``pip install -e``), so the checkout is two levels above it. The
flows are always taken from there (they match the library that runs them), and a relative path under
``tasks_src/`` that the working directory lacks is the checkout's: a run outside the checkout still finds the
bundled demo. Anything else that is missing is a ConfigError of one line, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

from trialforge.errors import ConfigError

CHECKOUT = Path(__file__).resolve().parents[2]
BUNDLED = "tasks_src"


def source_path(path: str, setting: str) -> Path:
    """``path`` as the working directory holds it, else (a bundled ``tasks_src/...`` path) the checkout's."""
    given = Path(path)
    if given.exists():
        return given
    bundled = not given.is_absolute() and given.parts[:1] == (BUNDLED,)
    if bundled and (CHECKOUT / given).exists():
        return CHECKOUT / given
    where = f"in {Path.cwd()}" + (f" nor in the checkout {CHECKOUT}" if bundled else "")
    raise ConfigError(f"{setting}: {path} does not exist {where}; name an existing path, or null for none")


def flow_entrypoint(name: str) -> str:
    """``PATH:FLOW`` of the Prefect flow ``name`` (``flows/NAME.py``), for ``load_flow_from_entrypoint``."""
    path = CHECKOUT / "flows" / f"{name}.py"
    if not path.is_file():
        raise ConfigError(f"the Prefect flows are not beside this trialforge ({path} is missing): install it from "
                          "a checkout with `make setup`")  # fmt: skip
    return f"{path}:{name}"
