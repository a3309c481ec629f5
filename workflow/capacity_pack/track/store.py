"""The MLflow store of a results directory: where it is, the names of its runs and tags, the
lock that serializes writes to it, and retries of "database is locked".

Default ``<results>/mlflow.db`` under ``<results>/mlflow.db.lock``; ``MLFLOW_TRACKING_URI``
overrides it, and then only ``<results>/mlflow.lock`` is local. Retries back off as
min(2 s, 0.05 s x 2^attempt) x U(0.5, 1) for up to ``RETRY_DEADLINE_S``. MLflow is imported
inside the functions.

Layout and concurrency: docs/tracking-server.md, "How the pack writes to a store" and
"Concurrency: what holds".
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from capacity_pack.redact import TRACKING_URI_ENV

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

_log = logging.getLogger(__name__)
T = TypeVar("T")

DB_NAME = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
EXPERIMENT_PREFIX = "capacity-pack/"

TAG = "capacity_pack."
RUN_KIND = TAG + "run_kind"
MANIFEST_SHA = TAG + "manifest_sha256"
PARENT_STATE = TAG + "parent_state"
METRICS_WITHHELD = TAG + "metrics_withheld"
REDACTED = TAG + "redacted"
STAGE = TAG + "stage"
FINGERPRINT = TAG + "fingerprint"
PARENT_RUN_ID = "mlflow.parentRunId"

# MLflow's limits (mlflow.utils.validation), copied so that importing this module stays cheap.
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000

LOCK_TIMEOUT_S = 600.0
RETRY_DEADLINE_S = 120.0
_LOCKED_ERROR = re.compile(r"database (table |schema )?is locked", re.IGNORECASE)


# --- Names and locations ---


def tracking_uri(results_dir: str | os.PathLike[str]) -> str:
    """The store URI: ``$MLFLOW_TRACKING_URI`` if set, else the results directory's SQLite file."""
    override = os.environ.get(TRACKING_URI_ENV, "").strip()
    if override:
        return override
    return "sqlite:///" + str(Path(results_dir).resolve() / DB_NAME)


def experiment_name(pack_name: str) -> str:
    return EXPERIMENT_PREFIX + pack_name


def is_server(uri: str) -> bool:
    """Whether ``uri`` names a tracking server (http, https, databricks) rather than a store
    that this process opens itself (a SQLite file, a PostgreSQL or MySQL database)."""
    scheme = urlsplit(uri).scheme.lower()
    return scheme in {"http", "https"} or scheme.startswith("databricks")


def artifact_location(uri: str, results_dir: str | os.PathLike[str], pack_name: str) -> str | None:
    """Where a new experiment keeps artifacts: ``<results>/mlartifacts/<pack>`` as a file URI.

    Runs land in ``<that>/<run id>/artifacts``. ``None`` for a tracking server: its own
    artifact root (``--default-artifact-root``, or ``mlflow-artifacts:/`` proxied to its
    ``--artifacts-destination``) is the one its readers can reach; a path on this machine is not.
    """
    if is_server(uri):
        return None
    return (Path(results_dir).resolve() / ARTIFACT_DIR / pack_name).as_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; ``None`` for other stores and in-memory ones."""
    if not uri.startswith("sqlite:///"):
        return None
    raw = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not raw or raw == ":memory:":
        return None
    return Path(raw).resolve()


def lock_path(uri: str, results_dir: str | os.PathLike[str]) -> Path:
    """The lock file: beside a SQLite database, else ``<results>/mlflow.lock``."""
    db = sqlite_path(uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    return Path(results_dir).resolve() / "mlflow.lock"


# --- Locking and retries ---


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing).

    Released by the kernel when its process dies; polls (a stuck holder ends in a clear error);
    not reentrant (nesting it on one path waits for the timeout).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not lock {path} within {timeout_s:.0f} s: another process "
                        "holds the MLflow store lock"
                    ) from None
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(0.1, delay * 2)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def writing(
    uri: str, results_dir: str | os.PathLike[str], *, always: bool = False
) -> Iterator[None]:
    """Serialize a write section: always for SQLite, elsewhere only when ``always``."""
    if always or sqlite_path(uri) is not None:
        with file_lock(lock_path(uri, results_dir)):
            yield
    else:
        yield


def _is_transient(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if _LOCKED_ERROR.search(str(cur)):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``, retrying "database is locked" with jittered exponential backoff.

    Safe here: SQLite rolls a locked transaction back; MLflow takes the same params and metrics
    logged twice.
    """
    deadline = time.monotonic() + RETRY_DEADLINE_S
    attempt = 0
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not _is_transient(exc) or time.monotonic() > deadline:
                raise
            delay = min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0)
            _log.warning("MLflow store busy (%s); retrying in %.2f s", exc, delay)
            time.sleep(delay)
            attempt += 1


def open_client(uri: str, results_dir: str | os.PathLike[str]) -> MlflowClient:
    """An MlflowClient on ``uri``, opened under the store lock unless ``uri`` is a server.

    Opening a database store creates or migrates MLflow's tables with no lock of its own
    (concurrent openings fail: docs/tracking-server.md); a server opens its store itself.
    """
    from mlflow import MlflowClient

    with writing(uri, results_dir, always=not is_server(uri)):
        return retry(MlflowClient, tracking_uri=uri)


# --- Store operations (callers hold the lock where one is needed) ---


def log_batches(
    client: MlflowClient, run_id: str, params: Mapping[str, str], metrics: Mapping[str, float]
) -> None:
    """Params and metrics in batches of at most MLflow's batch limits."""
    from mlflow.entities import Metric, Param

    plist = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(plist), MAX_PARAMS_PER_BATCH):
        retry(client.log_batch, run_id, params=plist[i : i + MAX_PARAMS_PER_BATCH])
    now = int(time.time() * 1000)
    mlist = [Metric(k, v, now, 0) for k, v in metrics.items()]
    for i in range(0, len(mlist), MAX_METRICS_PER_BATCH):
        retry(client.log_batch, run_id, metrics=mlist[i : i + MAX_METRICS_PER_BATCH])


def search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    """Every run of the experiment matching ``filter_string``, oldest first, over all pages."""
    runs: list[Run] = []
    token = None
    while True:
        page = retry(
            client.search_runs,
            [experiment_id],
            filter_string=filter_string,
            order_by=["attributes.start_time ASC"],
            max_results=1000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs
