"""Experiment tracking with MLflow: each run's params, per-iteration metrics, tags and artifacts.

One trialforge run is one MLflow run, named by the run id (tag ``trialforge.run_id``), in the experiment
``tracking.experiment`` (default: ``run.name``); metrics have step = iteration and the names ``trialforge compare``
prints with the first dot a slash (``pass_rate/repair``). Where: ``tracking.uri``, overridden by
``MLFLOW_TRACKING_URI``; the default is a SQLite store inside the run's file store. The link (``TrackingLink``, in
``runs/RUN/tracking.json``) lets a resumed run and the DVC ``report`` stage continue the same MLflow run. A tracker
never fails a run: its first error is logged once and tracking stops. What is logged and where:
docs/observability.md, "Experiment tracking with MLflow".
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import yaml
from pydantic import BaseModel

from trialforge.config import Params
from trialforge.errors import TrialforgeError
from trialforge.observe.compare import scalar_leaves
from trialforge.observe.metrics import RunNotFoundError, load_run, process_metrics
from trialforge.store.objstore import ObjectStore
from trialforge.tasks.schema import Task, task_set_version

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

# MLflow retries a failed HTTP call 7 times with exponential backoff, minutes against a dead server.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
HEALTH_TIMEOUT_S = 5.0
UI_HOST = "127.0.0.1"
UI_PORT = 5000
MLFLOW_ENV = "TRIALFORGE_MLFLOW"  # an `mlflow` executable of a full MLflow install, for `trialforge tracking ui`
MLFLOW_VENV = ".venv-mlflow"  # where `make setup` puts one (the full mlflow pins pyarrow<26, this project 26)
_PARAM_CHARS = 6000  # MLflow's longest param value
_PARAMS_PER_CALL, _METRICS_PER_CALL = 100, 1000  # MLflow's log_batch limits
_NAME = re.compile(r"[^\w.\- :]")  # what a metric, param or tag name may not hold ("/" would make it a path)


class TrackingError(TrialforgeError):
    """The tracking store cannot be reached or served."""


class TrackingTarget(NamedTuple):
    uri: str
    experiment: str
    artifacts: Path | None  # a SQLite store's artifact directory; None: the tracking server decides


class TrackingLink(BaseModel):
    """Which MLflow run tracks a trialforge run: stored at ``tracking_key(run_id)``."""

    tracking_uri: str
    experiment_id: str
    mlflow_run_id: str

    def served(self) -> bool:
        """Is the store a tracking server (with its own UI), rather than a database no server fronts yet?"""
        return _is_http(self.tracking_uri)

    def url(self, base: str | None = None) -> str:
        """The run's page in the MLflow UI at ``base`` (default: the tracking server, else the local UI that
        ``trialforge tracking ui`` starts)."""
        base = base or (self.tracking_uri if self.served() else local_ui())
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.mlflow_run_id}"


def tracking_key(run_id: str) -> str:
    return f"runs/{run_id}/tracking.json"


def read_link(store: ObjectStore, run_id: str) -> TrackingLink | None:
    """The MLflow run of ``run_id``, or None for a run that was not tracked."""
    key = tracking_key(run_id)
    return TrackingLink.model_validate_json(store.get_bytes(key)) if store.exists(key) else None


def local_ui(port: int = UI_PORT) -> str:
    return f"http://{UI_HOST}:{port}"


# --- where ---------------------------------------------------------------------------------------------------


def resolve_target(params: Params, store_url: str) -> TrackingTarget:
    """``MLFLOW_TRACKING_URI``, else ``tracking.uri``, else a SQLite store inside the run's file store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or params.tracking.uri or default_uri(store_url)
    return TrackingTarget(uri, params.tracking.experiment or params.run.name, sqlite_artifacts(uri))


def default_uri(store_url: str) -> str:
    root = Path(store_url.removeprefix("file://")) if store_url.startswith("file://") else Path(".trialforge")
    return f"sqlite:///{(root / 'mlflow' / 'mlflow.db').resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (relative to the working directory unless absolute)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(urllib.parse.unquote(uri.removeprefix("sqlite:///").split("?", 1)[0])).resolve()


def sqlite_artifacts(uri: str) -> Path | None:
    db = sqlite_path(uri)
    return None if db is None else db.parent / "mlartifacts"


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


# --- the tracker -----------------------------------------------------------------------------------------------


class RunTracker:
    """One trialforge run's MLflow run. Every method is safe to call whatever happened before: once tracking
    is off (disabled, or stopped by its first error) they do nothing."""

    def __init__(self, run_id: str, store: ObjectStore, target: TrackingTarget | None, off: str = "") -> None:
        self.run_id = run_id
        self.store = store
        self.target = target
        self.off = off  # why nothing (more) is tracked; "" while tracking
        self.link: TrackingLink | None = None
        self._client: MlflowClient | None = None
        self._logged: set[int] = set()  # iterations whose metrics the MLflow run holds
        self._closed = False  # it holds the run-wide metrics too (finished once before)

    @property
    def active(self) -> bool:
        return not self.off and self._client is not None and self.link is not None

    def _run(self) -> tuple[MlflowClient, str]:
        """The client and the MLflow run id (only while ``active``)."""
        if self._client is None or self.link is None:
            raise TrackingError(f"run {self.run_id} has no MLflow run")
        return self._client, self.link.mlflow_run_id

    # -- the hooks ------------------------------------------------------------------------------------------

    def log_iteration(self, iteration: int, update: dict[str, Any] | None = None) -> None:
        """The metrics of an iteration whose episodes are all published, and its learner step's stats."""
        if not self.active or iteration in self._logged:
            return
        with self._guard(f"logging iteration {iteration}"):
            try:
                data = load_run(self.store, self.run_id, iteration)
            except RunNotFoundError:
                return  # nothing rolled out (the last eval round of a run without held-out tasks)
            numbers = process_metrics(data.episodes, data.steps)["iterations"][str(iteration)]
            self._log_step(iteration, numbers, update)

    def finish(self, metrics: dict[str, Any], tasks: list[Task], artifacts: Iterable[Path]) -> None:
        """Close the run: iterations not logged yet (a run tracked only from its end), the run-wide metrics at
        the last step, the task set's tags, ``artifacts`` (files, or directories logged under their name)."""
        if not self.active:
            return
        with self._guard("closing the MLflow run"):
            client, run = self._run()
            updates = {u.get("iteration"): u for u in metrics.get("updates", [])}
            for key, numbers in sorted(metrics.get("iterations", {}).items(), key=lambda kv: int(kv[0])):
                if int(key) not in self._logged:
                    self._log_step(int(key), numbers, updates.get(int(key)))
            run_wide = {
                f"{section}.{name}": value
                for section in ("overall", "loop", "tasks", "quality")
                for name, value in scalar_leaves(metrics.get(section) or {}).items()
            }
            cost = (metrics.get("cost") or {}).get("overall") or {}
            run_wide |= {f"cost.{name}": value for name, value in scalar_leaves(cost).items()}
            if not self._closed:
                self._log_metrics(run_wide, step=max(self._logged, default=0))
                self._closed = True
            self._tag_taskset(tasks)
            for path in artifacts:
                if path.is_dir():
                    client.log_artifacts(run, str(path), path.name)
                elif path.exists():
                    client.log_artifact(run, str(path))
            client.set_terminated(run, "FINISHED")

    def end(self, status: str) -> None:
        """Mark the MLflow run ``FAILED`` or ``KILLED`` (the run raised)."""
        if self.active:
            with self._guard(f"marking the MLflow run {status}"):
                client, run = self._run()
                client.set_terminated(run, status)

    def summary(self) -> dict[str, Any]:
        """What the run's summary and metrics.json say about tracking."""
        link = self.link
        return {
            "uri": self.target.uri if self.target else None,
            "experiment": self.target.experiment if self.target else None,
            "mlflow_run_id": link.mlflow_run_id if link else None,
            "url": link.url() if link else None,
            "serve": None if link is None or link.served() else "trialforge tracking ui",
            "off": self.off or None,
        }

    # -- opening ----------------------------------------------------------------------------------------------

    def start(self, params: Params, tasks: list[Task]) -> None:
        """Find the run's MLflow run (the stored link, same tracking URI) or create it; log params and tags."""
        target = self.target
        if target is None or self.off:
            return
        with self._guard("opening the MLflow run"):
            client = _client(target)
            experiment = _experiment(client, target)
            known = read_link(self.store, self.run_id)
            run = None
            if known is not None and known.tracking_uri == target.uri:
                run = _existing_run(client, known.mlflow_run_id)
            if run is None:
                tags = {"trialforge.run_id": self.run_id, "trialforge.code_version": _code_version()}
                run = client.create_run(experiment, run_name=self.run_id, tags=tags)
            else:  # a resumed run: what it logged before stays, nothing twice
                client.update_run(run.info.run_id, status="RUNNING")
                self._logged = {m.step for m in client.get_metric_history(run.info.run_id, "episodes")}
                self._closed = bool(client.get_metric_history(run.info.run_id, metric_name("overall.episodes")))
            self._client = client
            self.link = TrackingLink(tracking_uri=target.uri, experiment_id=experiment, mlflow_run_id=run.info.run_id)
            self.store.put_bytes(tracking_key(self.run_id), self.link.model_dump_json().encode())
            self._log_params(params, known=run.data.params)
            self._tag_taskset(tasks)

    # -- MLflow calls -----------------------------------------------------------------------------------------

    def _log_step(self, iteration: int, numbers: dict[str, Any], update: dict[str, Any] | None) -> None:
        self._log_metrics(iteration_scalars(numbers, update), step=iteration)
        self._logged.add(iteration)

    def _log_metrics(self, values: dict[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        client, run = self._run()
        now = int(time.time() * 1000)
        found = [Metric(metric_name(k), float(v), now, step) for k, v in values.items() if v is not None]
        for at in range(0, len(found), _METRICS_PER_CALL):
            client.log_batch(run, metrics=found[at : at + _METRICS_PER_CALL])

    def _log_params(self, params: Params, known: dict[str, str]) -> None:
        from mlflow.entities import Param

        client, run = self._run()
        resolved = params.model_dump(mode="json", by_alias=True)
        fresh = [Param(k, v) for k, v in flat_params(resolved).items() if k not in known]
        for at in range(0, len(fresh), _PARAMS_PER_CALL):
            client.log_batch(run, params=fresh[at : at + _PARAMS_PER_CALL])
        if not known:
            client.log_text(run, yaml.safe_dump(resolved, sort_keys=False), "params.yaml")

    def _tag_taskset(self, tasks: list[Task]) -> None:
        from mlflow.entities import RunTag

        if not tasks:
            return
        client, run = self._run()
        tags = {"trialforge.task_set_version": task_set_version(tasks)}
        tags |= {safe_name(f"trialforge.image.{t.image}"): t.image_digest for t in tasks if t.image}
        found = [RunTag(k, v) for k, v in sorted(tags.items())]
        for at in range(0, len(found), _PARAMS_PER_CALL):
            client.log_batch(run, tags=found[at : at + _PARAMS_PER_CALL])

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """The tracker's first error stops tracking for the run, with one warning; the run goes on."""
        try:
            yield
        except Exception as exc:  # whatever broke in the tracker must not break the run
            self.off = f"{what} failed: {_brief(exc)}"
            log.warning(
                "MLflow tracking of run %s stopped: %s. The run goes on without it (tracking.uri or "
                "MLFLOW_TRACKING_URI say where to track; tracking.enabled: false turns it off)",
                self.run_id,
                self.off,
                extra={"run_id": self.run_id, "tracking_uri": self.target.uri if self.target else None},
            )


def open_tracker(params: Params, store: ObjectStore, run_id: str, tasks: list[Task] | None = None) -> RunTracker:
    """The run's tracker, its MLflow run started (or continued) with params and tags; off when disabled."""
    if not params.tracking.enabled:
        return RunTracker(run_id, store, None, off="tracking.enabled is false")
    tracker = RunTracker(run_id, store, resolve_target(params, store.url))
    tracker.start(params, tasks or [])
    return tracker


@contextmanager
def track_run(params: Params, store: ObjectStore, run_id: str, tasks: list[Task]) -> Iterator[RunTracker]:
    """``open_tracker`` for a block that runs the iterations: if it raises, the MLflow run is marked failed
    (killed on Ctrl-C) and the error goes on. ``finish_run`` finishes it."""
    tracker = open_tracker(params, store, run_id, tasks)
    try:
        yield tracker
    except BaseException as exc:
        tracker.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise


# --- names and values ----------------------------------------------------------------------------------------


def iteration_scalars(numbers: dict[str, Any], update: dict[str, Any] | None) -> dict[str, float | None]:
    """One iteration's metrics (``process_metrics``' entry for it) and its learner step's stats, as MLflow
    metrics: every number under its dotted name, the reward histogram as one count per bin."""
    found = scalar_leaves(numbers)
    hist = numbers.get("reward_hist") or {"edges": [], "counts": []}
    edges = hist["edges"]
    found |= {f"reward_hist.{edges[b]:g}-{edges[b + 1]:g}": count for b, count in enumerate(hist["counts"])}
    if update:
        found |= scalar_leaves({k: v for k, v in update.items() if k != "iteration"}, "train.", bools=True)
    return found


def flat_params(node: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Params under dotted names; a string as it is, anything else (numbers, lists, an empty mapping) as JSON."""
    flat: dict[str, str] = {}
    for key, value in node.items():
        name = safe_name(f"{prefix}{key}")
        if isinstance(value, dict) and value:
            flat |= flat_params(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            flat[name] = text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 16] + " ...(truncated)"
    return flat


def metric_name(name: str) -> str:
    """The MLflow name of a dotted metric name: its first dot becomes a slash (``pass_rate/repair``,
    ``latency/sandbox_s.p90``), so the MLflow UI gives each group of metrics a section of charts."""
    group, dot, rest = name.partition(".")
    return safe_name(group) + ("/" + safe_name(rest) if dot else "")


def safe_name(name: str) -> str:
    """A name MLflow accepts: characters it refuses (a slash too: it would make a path) become ``_``."""
    return _NAME.sub("_", name)


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _code_version() -> str:
    from trialforge.runtime import code_version

    return code_version()


def _client(target: TrackingTarget) -> MlflowClient:
    """An MLflow client on ``target``: a server is asked for /health first (no minutes of retries against a
    dead one), a SQLite store's directory is made."""
    if _is_http(target.uri):
        for name, value in HTTP_LIMITS.items():
            os.environ.setdefault(name, value)
        check_health(target.uri)
    db = sqlite_path(target.uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")  # its records go through trialforge's logging
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=target.uri)


def check_health(uri: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Raise TrackingError unless the server at ``uri`` answers (any HTTP status is an answer)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"the tracking server at {uri} does not answer ({reason})") from exc


def _experiment(client: MlflowClient, target: TrackingTarget) -> str:
    """The experiment's id: created on first use (a SQLite store's artifacts in its ``mlartifacts``), restored
    if someone deleted it."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(target.experiment)
    if found is None:
        location = target.artifacts.as_uri() if target.artifacts is not None else None
        try:
            return client.create_experiment(target.experiment, artifact_location=location)
        except MlflowException:  # another run created it meanwhile
            found = client.get_experiment_by_name(target.experiment)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


def _existing_run(client: MlflowClient, mlflow_run_id: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(mlflow_run_id)
    except MlflowException:
        return None  # deleted for good, or another database behind the same URI
    return None if run.info.lifecycle_stage == "deleted" else run


# --- links ---------------------------------------------------------------------------------------------------


def link_lines(links: dict[str, TrackingLink | None]) -> list[str]:
    """Where each run is in MLflow, one line per run, and the MLflow page that compares them when one server
    holds them all."""
    lines = []
    for run_id, link in links.items():
        if link is None:
            lines.append(f"MLflow {run_id}: not tracked")
        elif link.served():
            lines.append(f"MLflow {run_id}: run {link.mlflow_run_id} {link.url()}")
        else:
            lines.append(
                f"MLflow {run_id}: run {link.mlflow_run_id} in {link.tracking_uri} "
                f"(`trialforge tracking ui`, then {link.url()})"
            )
    known = [link for link in links.values() if link is not None]
    if len(known) > 1 and len({link.tracking_uri for link in known}) == 1:
        runs = json.dumps([link.mlflow_run_id for link in known])
        experiments = json.dumps(sorted({link.experiment_id for link in known}))
        query = f"runs={urllib.parse.quote(runs)}&experiments={urllib.parse.quote(experiments)}"
        base = known[0].tracking_uri if known[0].served() else local_ui()
        lines.append(f"MLflow side by side: {base.rstrip('/')}/#/compare-runs?{query}")
    return lines


# --- the MLflow server (`trialforge tracking ui`, the tests) ---------------------------------------------------


def mlflow_server() -> Path:
    """The ``mlflow`` executable of a full MLflow install: ``$TRIALFORGE_MLFLOW``, else ``.venv-mlflow`` of
    this checkout (``make setup`` builds it), else of the working directory."""
    if os.environ.get(MLFLOW_ENV):
        return Path(os.environ[MLFLOW_ENV])
    checkout = Path(__file__).resolve().parents[3]
    for root in (checkout, Path.cwd()):
        candidate = root / MLFLOW_VENV / "bin" / "mlflow"
        if candidate.exists():
            return candidate
    raise TrackingError(
        f"no MLflow server: `make setup` builds {checkout / MLFLOW_VENV} (the full mlflow, in a venv of its own), "
        f"or point {MLFLOW_ENV} at an `mlflow` executable"
    )


def server_argv(backend_uri: str, artifacts: Path | None, port: int, mlflow: Path | None = None) -> list[str]:
    """``mlflow server`` on 127.0.0.1:``port`` for the store at ``backend_uri`` (one worker: one user)."""
    argv = [str(mlflow or mlflow_server()), "server", "--host", UI_HOST, "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", backend_uri]
    if artifacts is not None:
        argv += ["--artifacts-destination", str(artifacts)]
    return argv


def server_env() -> dict[str, str]:
    """The server's environment: no background job runner (its jobs serve GenAI features trialforge does not use)."""
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
