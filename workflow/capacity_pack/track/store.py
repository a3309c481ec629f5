"""The MLflow store of a results directory: where it is, the names of its runs and tags, the
lock that serializes writes to it, and retries of "database is locked".

Layout of a results directory's store (the default; ``MLFLOW_TRACKING_URI`` overrides the URI):

- ``<results>/mlflow.db``: the SQLite tracking store, ``sqlite:///<absolute path>``;
- ``<results>/mlflow.db.lock``: the inter-process lock that serializes every write to it;
- ``<results>/mlartifacts/<pack name>/``: run artifacts (the experiment's ``artifact_location``).

With ``MLFLOW_TRACKING_URI`` naming a tracking server (``http://...``; a team's shared one is
described in docs/tracking-server.md) nothing of the store is local: a new experiment takes the
server's artifact root, and only ``<results>/mlflow.lock`` is written here. Naming a database
directly (``postgresql://...``) keeps the artifacts in ``<results>/mlartifacts``.

Concurrency. SQLite lets one writer in at a time and MLflow migrates a new database when the
first client opens it, so parallel jobs fail with "database is locked" or half-applied
migrations. Every write, and every client opening (which may create or migrate the file), runs
under an exclusive ``flock`` on the lock file, in short sections; "database is locked" errors
(from processes that do not take the lock, e.g. ``mlflow ui``) are retried with jittered
exponential backoff (delay min(2 s, 0.05 s x 2^attempt) x U(0.5, 1), for up to
``RETRY_DEADLINE_S``). Other stores (an HTTP server, PostgreSQL) handle concurrent writes
themselves; there only the parent's find-or-create, and for a database the client opening
(which creates MLflow's tables in an empty one), are serialized, by ``<results>/mlflow.lock``,
which covers the processes that share the results directory.

MLflow is imported inside the functions, so importing this module stays cheap.
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


# ---------------------------------------------------------------------------------------------
# Names and locations
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Locking and retries
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing).

    The kernel releases a flock when its process dies, so a crashed job never leaves the store
    locked. It polls rather than blocks so that a stuck holder ends in a clear error. Not
    reentrant: each open() is a new owner, so nesting it on one path waits for the timeout.
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

    Safe for every call made here: SQLite rolls a locked transaction back, and MLflow accepts
    the same params and metrics logged twice.
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

    Opening a database store creates MLflow's tables when they are missing and migrates old
    ones, with no lock of its own: jobs that open a fresh PostgreSQL database at once fail with
    duplicate-key errors, as SQLite ones do with "database is locked". A server opens its store
    itself (docs/tracking-server.md creates the tables first, with ``mlflow db upgrade``).
    """
    from mlflow import MlflowClient

    with writing(uri, results_dir, always=not is_server(uri)):
        return retry(MlflowClient, tracking_uri=uri)


# ---------------------------------------------------------------------------------------------
# Store operations (callers hold the lock where one is needed)
# ---------------------------------------------------------------------------------------------


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
