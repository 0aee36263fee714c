"""The environment spec a task runs in: detected, then overridden, per repository or per commit.

Overrides, later winning per key: the repository's own ``trialforge-env.yaml``, then params.yaml's
per-repository ``env.repos``. SWE-bench instances name the commit whose files define their environment
(``environment_setup_commit``): :func:`spec_at_commit` resolves a commit, :class:`EnvCache` each one once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trialforge.envspec import EnvSpec
from trialforge.scratch import scratch_dir
from trialforge.tasks.envdetect.decide import OVERRIDE_FILE, EnvError, detect
from trialforge.tasks.envdetect.readers import setup_literals
from trialforge.tasks.ingest.trees import materialize

PARAMS_SOURCE = "params env.repos"
OVERRIDABLE = tuple(name for name in EnvSpec.model_fields if name != "detected_from")


def resolve_env(
    repo: Path,
    repo_name: str,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    evaluate: Callable[[Path], Mapping[str, Any]] | None = None,
) -> EnvSpec:
    """The detected spec, then ``repo``'s ``trialforge-env.yaml``, then ``overrides[repo_name]``: later wins per key.

    A ``python`` set by an override is also the one markers are evaluated for, and ``requires-python``
    is not checked: the way to run a repository under a Python its metadata does not allow. ``evaluate``
    (``tasks.setupeval.setup_arguments``: a sandbox) runs a ``setup.py`` that computes its arguments.
    """
    sources = ((OVERRIDE_FILE, _override_file(repo, repo_name)), (PARAMS_SOURCE, (overrides or {}).get(repo_name)))
    layers = [_layer(values, source, repo_name) for source, values in sources if values]
    python = next((values["python"] for _, values in reversed(layers) if "python" in values), None)
    setup_args, failed = _evaluated(repo, evaluate)
    spec = detect(repo, python, setup_args)
    if failed:
        spec = spec.model_copy(update={"detected_from": (*spec.detected_from, failed)})
    for source, values in layers:
        spec = spec.model_copy(update={**values, "detected_from": (*spec.detected_from, source)})
    return spec


def _evaluated(
    repo: Path, evaluate: Callable[[Path], Mapping[str, Any]] | None
) -> tuple[Mapping[str, Any] | None, str]:
    """(``setup.py``'s evaluated arguments, or None with why when its evaluation failed): only for a
    ``setup.py`` that computes an argument envdetect reads; a failure falls back to the literal ones."""
    literals = setup_literals(repo)
    if evaluate is None or literals is None or not literals[1]:
        return None, ""
    try:
        return evaluate(repo), ""
    except EnvError as exc:
        return None, f"setup.py (evaluation failed, literal arguments read: {exc})"


def _override_file(repo: Path, repo_name: str) -> object:
    path = repo / OVERRIDE_FILE
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(errors="replace"))
    except yaml.YAMLError as exc:
        raise EnvError(f"{OVERRIDE_FILE} of {repo_name} is not valid YAML: {exc}") from None


def _layer(values: object, source: str, repo_name: str) -> tuple[str, dict[str, Any]]:
    """(source, the values it sets, validated as EnvSpec fields)."""
    where = f"{source} for {repo_name}"
    if not isinstance(values, Mapping):
        raise EnvError(f"{where}: expected a mapping with keys from {', '.join(OVERRIDABLE)}, got {values!r}")
    unknown = sorted(str(key) for key in values if key not in OVERRIDABLE)
    if unknown:
        raise EnvError(f"{where}: unknown key {', '.join(map(repr, unknown))} (known: {', '.join(OVERRIDABLE)})")
    if isinstance(values.get("python"), float):
        raise EnvError(f'{where}: python {values["python"]} is a number: quote it ("3.13"); YAML reads 3.10 as 3.1')
    try:
        checked = EnvSpec.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise EnvError(f"{where}: {problems}") from None
    return source, {key: getattr(checked, key) for key in values}


# --- a repository at a commit --------------------------------------------------------------------------


def spec_at_commit(
    mirror: Path, commit: str, repo_name: str, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> EnvSpec:
    """The resolved spec of ``mirror``'s tree at ``commit`` (for SWE-bench: ``environment_setup_commit``)."""
    with scratch_dir("envdetect") as tmp:
        tree = Path(tmp) / "tree"
        materialize(mirror, commit, tree)
        return resolve_env(tree, repo_name, overrides)


@dataclass
class EnvCache:
    """Specs by (repository, commit), failures included: the instances of one SWE-bench version share
    one environment commit, so it is materialized and read once."""

    overrides: Mapping[str, Mapping[str, Any]] | None = None
    specs: dict[tuple[str, str], EnvSpec | EnvError] = field(default_factory=dict)

    def get(self, mirror: Path, commit: str, repo_name: str) -> EnvSpec:
        key = (repo_name, commit)
        if key not in self.specs:
            try:
                self.specs[key] = spec_at_commit(mirror, commit, repo_name, self.overrides)
            except EnvError as exc:
                self.specs[key] = exc
        found = self.specs[key]
        if isinstance(found, EnvError):
            raise found
        return found
