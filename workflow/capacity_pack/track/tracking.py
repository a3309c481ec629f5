"""MLflow tracking of a pack: one experiment per pack, one parent run per frozen manifest, one
child run per Snakemake job.

Layout of a results directory's store (the default; ``MLFLOW_TRACKING_URI`` overrides the URI):

- ``<results>/mlflow.db``: the SQLite tracking store, ``sqlite:///<absolute path>``;
- ``<results>/mlflow.db.lock``: the inter-process lock that serializes every write to it;
- ``<results>/mlartifacts/<pack name>/``: run artifacts (the experiment's ``artifact_location``).

With ``MLFLOW_TRACKING_URI`` naming a tracking server (``http://...``; a team's shared one is
described in docs/tracking-server.md) nothing of the store is local: a new experiment takes the
server's artifact root, and only ``<results>/mlflow.lock`` is written here. Naming a database
directly (``postgresql://...``) keeps the artifacts in ``<results>/mlartifacts``.

Runs:

- experiment ``capacity-pack/<pack name>``;
- parent run ``<pack name> @ <sha[:12]>``, tagged ``capacity_pack.run_kind=parent`` and
  ``capacity_pack.manifest_sha256=<sha>``; it carries the pack settings as params (dotted keys)
  and the frozen manifest as the artifact ``frozen_manifest.json``;
- child runs, tagged ``mlflow.parentRunId`` (what ``start_run(parent_run_id=...)`` sets),
  ``capacity_pack.run_kind=child`` and the job's stage, job, point, cache state and repeat.
  Params are settings, metrics numbers (units in their names), tags provenance, files artifacts.

Both kinds carry the provenance tags ``capacity_pack.`` + ``pack``, ``pack_size``,
``pack_label``, ``model.id``, ``model.revision``, ``model.tokenizer_revision``,
``model.precision``, ``engine.name``, ``engine.version``, ``section.<name>`` (one per section
hash), and ``git_commit`` and ``git_dirty`` of the checkout that holds this package.

Concurrency. SQLite lets one writer in at a time and MLflow migrates a new database when the
first client opens it, so parallel jobs fail with "database is locked" or half-applied
migrations. Every write, and every client opening (which may create or migrate the file), runs
under an exclusive ``flock`` on the lock file, in short sections; "database is locked" errors
(from processes that do not take the lock, e.g. ``mlflow ui``) are retried with jittered
exponential backoff. Finding-or-creating the parent run happens inside one locked section, so
two processes never create two parents. Other stores (an HTTP server, PostgreSQL) handle
concurrent writes themselves; there only the parent's find-or-create, and for a database the
client opening (which creates MLflow's tables in an empty one), are serialized, by
``<results>/mlflow.lock``, which covers the processes that share the results directory.

Metric policy: ``None`` values are skipped and their names listed in the tag
``capacity_pack.metrics_withheld`` (a percentile withheld for lack of samples is worth seeing);
NaN or infinite values raise :class:`ValueError` before anything is written, because a
non-finite capacity number is a bug upstream, not a measurement.

Secrets never reach MLflow: a param or tag is dropped when its key looks like a secret
(api_key, token, secret, password, authorization, credentials, ...) or its value equals (or, for
secrets of 8+ characters, contains) a secret: the value of an environment variable whose name
ends in ``_KEY``, ``_TOKEN``, ``_SECRET`` or ``_PASSWORD`` (``MLFLOW_TRACKING_PASSWORD``) or is
``PGPASSWORD``, of the one the manifest's ``target.api_key_env`` names (whatever its name), or
the password written into ``MLFLOW_TRACKING_URI``. The dropped keys are listed in the tag
``capacity_pack.redacted``. An artifact file holding a secret is logged as a copy with each
occurrence replaced by ``[redacted]`` (text), or not at all (binary), and listed there as
``artifact:<name>``. :func:`redact_text` does the same replacement for any text (error messages
that quote a server's answer).

MLflow is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import numbers
import os
import posixpath
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from capacity_pack.io import file_sha256, sha256_hex, write_json_atomic
from capacity_pack.redact import (
    MIN_CONTAINED_SECRET,
    TRACKING_URI_ENV,
    holds_secret,
    looks_secret,
    manifest_secret_values,
    redact_text,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

_log = logging.getLogger(__name__)
T = TypeVar("T")

DB_NAME = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
MANIFEST_ARTIFACT = "frozen_manifest.json"
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
# The module of each tracked stage, whose ``tracking_record(summary)`` makes a job's child run.
STAGE_MODULES = {
    "schedule": "plan.schedule",
    "sweep": "measure.sweep",
    "analysis": "evidence.analysis",
    "failure": "drills.render",
}

# MLflow's limits (mlflow.utils.validation), copied so that importing this module stays cheap.
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
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


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; ``None`` for other stores and in-memory ones."""
    if not uri.startswith("sqlite:///"):
        return None
    raw = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not raw or raw == ":memory:":
        return None
    return Path(raw).resolve()


def _lock_path(uri: str, results_dir: str | os.PathLike[str]) -> Path:
    db = _sqlite_path(uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    return Path(results_dir).resolve() / "mlflow.lock"


# ---------------------------------------------------------------------------------------------
# Locking and retries
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
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
def _writing(
    uri: str, results_dir: str | os.PathLike[str], *, always: bool = False
) -> Iterator[None]:
    """Serialize a write section: always for SQLite, elsewhere only when ``always``."""
    if always or _sqlite_path(uri) is not None:
        with _file_lock(_lock_path(uri, results_dir)):
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


def _retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
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


def _open_client(uri: str, results_dir: str | os.PathLike[str]) -> MlflowClient:
    """An MlflowClient on ``uri``, opened under the store lock unless ``uri`` is a server.

    Opening a database store creates MLflow's tables when they are missing and migrates old
    ones, with no lock of its own: jobs that open a fresh PostgreSQL database at once fail with
    duplicate-key errors, as SQLite ones do with "database is locked". A server opens its store
    itself (docs/tracking-server.md creates the tables first, with ``mlflow db upgrade``).
    """
    from mlflow import MlflowClient

    with _writing(uri, results_dir, always=not is_server(uri)):
        return _retry(MlflowClient, tracking_uri=uri)


# ---------------------------------------------------------------------------------------------
# Keys, values, secrets
# ---------------------------------------------------------------------------------------------


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"...[truncated: {len(text)} chars, sha256 {sha256_hex(text)[:16]}]"
    return text[: limit - len(marker)] + marker


def _clean_key(key: object) -> str:
    """A key MLflow accepts: allowed characters only, no path tricks, at most 250 characters."""
    text = re.sub(r"[^\w.\- :/]", "_", str(key)).strip()
    if posixpath.normpath(text) != text or text.startswith("/"):
        text = text.replace("/", "_")
    text = re.sub(r"^\.+", lambda m: "_" * len(m.group()), text)  # "..x" reads as a parent dir
    if not text:
        raise ValueError(f"{key!r} cannot be used as an MLflow key")
    if len(text) > MAX_KEY_LENGTH:
        # A hash suffix keeps apart two long keys that share a prefix.
        text = text[: MAX_KEY_LENGTH - 17] + "-" + sha256_hex(text)[:16]
    return text


def _format_value(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _flatten(obj: object, prefix: str = "") -> dict[str, object]:
    """Nested settings as dotted keys.

    Lists of mappings that each have a unique ``name`` are keyed by it
    (``workload.interactive.mix``), other lists of mappings by index, and lists of scalars stay
    one value (``sweep.open_loop_rps`` = ``[10.0, 20.0, 30.0]``).
    """

    def join(key: object) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    def merge(out: dict[str, object], more: dict[str, object]) -> None:
        # {"a.b": 1, "a": {"b": 2}} would otherwise lose one value without a word.
        clash = sorted(set(out) & set(more))
        if clash:
            raise ValueError(f"settings {clash} appear twice once flattened to dotted keys")
        out.update(more)

    if isinstance(obj, Mapping):
        if not obj:
            return {prefix: {}} if prefix else {}
        out: dict[str, object] = {}
        for key, value in obj.items():
            merge(out, _flatten(value, join(key)))
        return out
    if isinstance(obj, list | tuple) and obj and all(isinstance(x, Mapping) for x in obj):
        names = [x.get("name") for x in obj]
        named = all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
        out = {}
        for i, item in enumerate(obj):
            if named:
                rest = {k: v for k, v in item.items() if k != "name"}
                merge(out, _flatten(rest, join(names[i])) if rest else {join(names[i]): {}})
            else:
                merge(out, _flatten(item, join(i)))
        return out
    return {prefix: obj}


def _artifact_holds(path: Path, secrets: list[str]) -> bool:
    data = path.read_bytes()
    return any(len(s) >= MIN_CONTAINED_SECRET and s.encode() in data for s in secrets)


def _redacted_artifacts(
    files: list[Path], secrets: list[str], redacted: list[str]
) -> tuple[list[Path], tempfile.TemporaryDirectory[str] | None]:
    """``files`` (files or directories), with a secret-free copy in place of any that holds a
    secret (a binary file that holds one is left out), and the temporary directory that holds
    the copies (removed when it is garbage-collected). Names go to ``redacted``."""
    out = []
    scratch: tempfile.TemporaryDirectory[str] | None = None
    for path in files:
        members = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        leaking = [p for p in members if _artifact_holds(p, secrets)]
        if not leaking:
            out.append(path)
            continue
        if scratch is None:
            scratch = tempfile.TemporaryDirectory(prefix="capacity-pack-mlflow-")
        copy = Path(scratch.name) / path.name
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        for member in leaking:
            target = copy / member.relative_to(path) if path.is_dir() else copy
            redacted.append(f"artifact:{member.relative_to(path.parent)}")
            try:
                text = member.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                target.unlink()  # a binary file cannot be rewritten safely: withheld
                continue
            target.write_text(redact_text(text, secrets), encoding="utf-8")
        if copy.exists():
            out.append(copy)
    return out, scratch


def _scrub(items: Mapping[str, str], secrets: list[str], redacted: list[str]) -> dict[str, str]:
    """``items`` without secret-looking keys or secret values; dropped keys go to ``redacted``."""
    out = {}
    for key, value in items.items():
        key_leaks = holds_secret(key, secrets)
        if key_leaks or looks_secret(key) or holds_secret(value, secrets):
            if not key_leaks:  # a key holding a secret value is not even listed
                redacted.append(key)
            continue
        out[key] = value
    return out


def _clean_items(items: Mapping[Any, object], what: str, limit: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in items.items():
        clean = _clean_key(key)
        if clean in out:
            raise ValueError(f"two {what} map to the same MLflow key {clean!r} (one is {key!r})")
        out[clean] = _truncate(_format_value(value), limit)
    return out


def _prepare_metrics(metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """Finite floats by clean key, and the names withheld because their value is ``None``."""
    values: dict[str, float] = {}
    withheld: list[str] = []
    bad: list[str] = []
    for key, value in metrics.items():
        if value is None:
            withheld.append(str(key))
            continue
        if not isinstance(value, numbers.Real):
            raise TypeError(f"metric {key!r} must be a number, got {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number):
            bad.append(f"{key}={number}")
            continue
        clean = _clean_key(key)
        if clean in values:
            raise ValueError(f"two metrics map to the same MLflow key {clean!r} (one is {key!r})")
        values[clean] = number
    if bad:
        raise ValueError(
            f"metrics must be finite; refusing to log {', '.join(bad)} (pass None to withhold a "
            "value that could not be computed)"
        )
    return values, withheld


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def git_state() -> tuple[str, str]:
    """(commit, dirty) of the checkout holding this package; "unknown" outside a git checkout."""
    import capacity_pack

    where = str(Path(capacity_pack.__file__).resolve().parent)

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", where, *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown", "unknown"
    status = git("status", "--porcelain")
    dirty = "unknown" if status is None else ("true" if status else "false")
    return commit, dirty


def _check_frozen(frozen: Mapping[str, Any]) -> str:
    from capacity_pack.plan.manifest import FROZEN_FORMAT

    if not isinstance(frozen, Mapping) or frozen.get("format") != FROZEN_FORMAT:
        raise ValueError(f"expected a frozen manifest (format {FROZEN_FORMAT!r}; see freeze())")
    sha = str(frozen.get("sha256", ""))
    # The hash is quoted into search filters: only hex may pass.
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"frozen manifest sha256 {sha!r} is not a sha256 hex digest")
    return sha


def _pack_name(frozen: Mapping[str, Any]) -> str:
    return str(frozen["manifest"]["pack"]["name"])


def _provenance_tags(frozen: Mapping[str, Any]) -> dict[str, str]:
    manifest = frozen["manifest"]
    model, engine, pack = manifest["model"], manifest["engine"], manifest["pack"]
    commit, dirty = git_state()
    tags = {
        MANIFEST_SHA: frozen["sha256"],
        TAG + "pack": pack["name"],
        TAG + "pack_size": pack["size"],
        TAG + "pack_label": frozen.get("derived", {}).get("pack_label", ""),
        TAG + "model.id": model["id"],
        TAG + "model.revision": model["revision"],
        TAG + "model.tokenizer_revision": model["tokenizer_revision"],
        TAG + "model.precision": model["precision"],
        TAG + "engine.name": engine["name"],
        TAG + "engine.version": engine["version"],
        TAG + "git_commit": commit,
        TAG + "git_dirty": dirty,
        TAG + "tool_version": frozen.get("tool", {}).get("capacity_pack_version", "unknown"),
    }
    for section, digest in frozen["section_sha256"].items():
        tags[TAG + "section." + section] = digest
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit  # shown by the MLflow UI
    return {k: str(v) for k, v in tags.items() if v != ""}


# ---------------------------------------------------------------------------------------------
# Store operations (callers hold the lock where one is needed)
# ---------------------------------------------------------------------------------------------


def _log_batches(
    client: MlflowClient, run_id: str, params: Mapping[str, str], metrics: Mapping[str, float]
) -> None:
    from mlflow.entities import Metric, Param

    plist = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(plist), MAX_PARAMS_PER_BATCH):
        _retry(client.log_batch, run_id, params=plist[i : i + MAX_PARAMS_PER_BATCH])
    now = int(time.time() * 1000)
    mlist = [Metric(k, v, now, 0) for k, v in metrics.items()]
    for i in range(0, len(mlist), MAX_METRICS_PER_BATCH):
        _retry(client.log_batch, run_id, metrics=mlist[i : i + MAX_METRICS_PER_BATCH])


def _experiment_id(client: MlflowClient, name: str, location: str | None) -> str:
    from mlflow.exceptions import MlflowException

    exp = _retry(client.get_experiment_by_name, name)
    if exp is None:
        try:
            return _retry(
                client.create_experiment,
                name,
                artifact_location=location,
                tags={TAG + "pack": name.removeprefix(EXPERIMENT_PREFIX)},
            )
        except MlflowException:
            # Created meanwhile by a process that does not share our lock (a server store).
            exp = _retry(client.get_experiment_by_name, name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        _retry(client.restore_experiment, exp.experiment_id)
    return exp.experiment_id


def _search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = _retry(
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


def _parents(client: MlflowClient, experiment_id: str, sha: str) -> list[Run]:
    found = _search_all(
        client,
        experiment_id,
        f"tags.`{RUN_KIND}` = 'parent' and tags.`{MANIFEST_SHA}` = '{sha}'",
    )
    # Only a store written without our lock can hold two; the oldest one is the parent.
    return sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _get_or_create_parent(
    client: MlflowClient, frozen: Mapping[str, Any], uri: str, results_dir: Path
) -> str:
    sha = frozen["sha256"]
    pack = _pack_name(frozen)
    location = artifact_location(uri, results_dir, pack)
    exp_id = _experiment_id(client, experiment_name(pack), location)
    found = _parents(client, exp_id, sha)
    if found:
        if found[0].data.tags.get(PARENT_STATE) == "complete":
            return found[0].info.run_id
        run_id = found[0].info.run_id  # a process died half-way through creating it: finish
    else:
        tags = _scrub(
            _parent_tags(frozen), manifest_secret_values(frozen), []
        )  # see _complete_parent
        tags[RUN_KIND] = "parent"
        tags[MANIFEST_SHA] = sha
        run = _retry(client.create_run, exp_id, tags=tags, run_name=f"{pack} @ {sha[:12]}")
        run_id = run.info.run_id
    _complete_parent(client, run_id, frozen)
    return run_id


def _parent_tags(frozen: Mapping[str, Any]) -> dict[str, str]:
    return _clean_items(_provenance_tags(frozen), "tags", MAX_TAG_VALUE_LENGTH)


def _complete_parent(client: MlflowClient, run_id: str, frozen: Mapping[str, Any]) -> None:
    """Params, manifest artifact, FINISHED status, then the completion tag; idempotent."""
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []
    _scrub(_parent_tags(frozen), secrets, redacted)  # names the tags the creation dropped
    settings = _clean_items(_flatten(frozen["manifest"]), "params", MAX_PARAM_VALUE_LENGTH)
    _log_batches(client, run_id, _scrub(settings, secrets, redacted), {})
    text = json.dumps(frozen, sort_keys=True, ensure_ascii=False)
    if any(len(s) >= MIN_CONTAINED_SECRET and s in text for s in secrets):
        redacted.append(MANIFEST_ARTIFACT)
    else:
        with tempfile.TemporaryDirectory(prefix="capacity-pack-mlflow-") as tmp:
            path = Path(tmp) / MANIFEST_ARTIFACT
            write_json_atomic(path, frozen)
            _retry(client.log_artifact, run_id, str(path))
    if redacted:
        _retry(
            client.set_tag, run_id, REDACTED, _truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)
        )
    # A parent is a container: finished once it holds the manifest; children still attach.
    _retry(client.set_terminated, run_id, "FINISHED")
    _retry(client.set_tag, run_id, PARENT_STATE, "complete")


def _mark_failed(client: MlflowClient, run_id: str) -> None:
    """Best effort: the error that made the run fail is the one to report, not this one."""
    try:
        _retry(client.set_terminated, run_id, "FAILED")
    except Exception as exc:
        _log.warning("could not mark MLflow run %s as FAILED: %s", run_id, exc)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def ensure_parent_run(frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str]) -> str:
    """The id of the frozen manifest's parent run, created on first use (never twice)."""
    _check_frozen(frozen)
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    client = _open_client(uri, results)
    with _writing(uri, results, always=True):
        return _get_or_create_parent(client, frozen, uri, results)


def find_parent_run(
    frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str]
) -> str | None:
    """The id of the frozen manifest's parent run, or ``None``; never creates anything."""
    sha = _check_frozen(frozen)
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    db = _sqlite_path(uri)
    if db is not None and not db.exists():
        return None  # opening a client would create the database
    client = _open_client(uri, results)
    exp = _retry(client.get_experiment_by_name, experiment_name(_pack_name(frozen)))
    if exp is None or exp.lifecycle_stage != "active":
        return None
    found = _parents(client, exp.experiment_id, sha)
    return found[0].info.run_id if found else None


def child_runs(
    frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str], stage: str | None = None
) -> list[Run]:
    """The parent's child runs (``mlflow.entities.Run``), oldest first; only ``stage`` if given."""
    parent = find_parent_run(frozen, results_dir=results_dir)
    if parent is None:
        return []
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    client = _open_client(uri, results)
    exp_id = _retry(client.get_run, parent).info.experiment_id
    runs = _search_all(client, exp_id, f"tags.`{PARENT_RUN_ID}` = '{parent}'")
    # Stage names are caller text: filter here rather than quote them into a search string.
    return [r for r in runs if stage is None or r.data.tags.get(STAGE) == stage]


def log_child_run(
    frozen: Mapping[str, Any],
    *,
    stage: str,
    job: str,
    point: str | None = None,
    cache_state: str | None = None,
    repeat: int | None = None,
    params: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    tags: Mapping[str, Any] | None = None,
    artifacts: list[Path] | None = None,
    results_dir: str | os.PathLike[str],
    fingerprint: str | None = None,
) -> str:
    """Record one job as a child run of the manifest's parent run; return its run id.

    ``params`` may nest (flattened to dotted keys). ``metrics`` values must be finite numbers or
    ``None`` (withheld). ``artifacts`` are files or directories, logged under their own names.
    Everything is checked before the store is touched, so a bad call leaves no run behind.
    With a ``fingerprint`` (e.g. the sha256 of the job's output), logging is idempotent: when
    the parent already has a finished child for the same job and fingerprint, its id is returned
    and nothing new is logged.
    """
    sha = _check_frozen(frozen)
    if fingerprint is not None and not re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", fingerprint):
        raise ValueError(f"fingerprint {fingerprint!r} must be 1-200 of [A-Za-z0-9._:-]")
    results = Path(results_dir).resolve()
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []

    metric_values, withheld = _prepare_metrics(metrics or {})
    flat_params = _flatten(dict(params or {}))
    param_values = _scrub(
        _clean_items(flat_params, "params", MAX_PARAM_VALUE_LENGTH), secrets, redacted
    )
    own: dict[str, object] = {
        **_provenance_tags(frozen),
        RUN_KIND: "child",
        MANIFEST_SHA: sha,
        STAGE: stage,
        TAG + "job": job,
        TAG + "point": point,
        TAG + "cache_state": cache_state,
        TAG + "repeat": repeat,
        FINGERPRINT: fingerprint,
    }
    own_tags = _clean_items(
        {k: v for k, v in own.items() if v is not None}, "tags", MAX_TAG_VALUE_LENGTH
    )
    extra = _clean_items(dict(tags or {}), "tags", MAX_TAG_VALUE_LENGTH)
    reserved = set(own_tags) | {PARENT_RUN_ID, METRICS_WITHHELD, REDACTED, "mlflow.runName"}
    clash = sorted(set(extra) & reserved)
    if clash:
        raise ValueError(f"tags {clash} are set by capacity_pack.track.tracking itself")
    run_tags = _scrub({**own_tags, **extra}, secrets, redacted)
    if withheld:
        run_tags[METRICS_WITHHELD] = _truncate(",".join(withheld), MAX_TAG_VALUE_LENGTH)

    files = [Path(p) for p in artifacts or []]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise FileNotFoundError(f"artifacts do not exist: {', '.join(missing)}")
    names = [p.name for p in files]
    if len(set(names)) != len(names):
        raise ValueError(f"artifacts would overwrite each other (same names): {names}")
    # The copies live as long as ``scratch`` does: until this function returns or raises.
    files, scratch = _redacted_artifacts(files, secrets, redacted)
    if redacted:
        run_tags[REDACTED] = _truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)

    # The run name repeats the (scrubbed) identifying tags for people browsing the UI.
    label_keys = (STAGE, TAG + "job", TAG + "point", TAG + "cache_state")
    label = list(dict.fromkeys(run_tags[k] for k in label_keys if k in run_tags))  # job == point
    if TAG + "repeat" in run_tags:
        label.append("r" + run_tags[TAG + "repeat"])
    run_name = " ".join(label) or "job"

    uri = tracking_uri(results)
    client = _open_client(uri, results)
    with _writing(uri, results, always=True):
        parent = _get_or_create_parent(client, frozen, uri, results)
        run_tags[PARENT_RUN_ID] = parent
        exp_id = _retry(client.get_run, parent).info.experiment_id
        if fingerprint is not None:
            same = _search_all(
                client,
                exp_id,
                f"tags.`{PARENT_RUN_ID}` = '{parent}' and tags.`{FINGERPRINT}` = "
                f"'{run_tags[FINGERPRINT]}' and attributes.status = 'FINISHED'",
            )
            same = [r for r in same if r.data.tags.get(TAG + "job") == run_tags[TAG + "job"]]
            if same:
                return same[0].info.run_id
        run_id = _retry(client.create_run, exp_id, tags=run_tags, run_name=run_name).info.run_id
        try:
            _log_batches(client, run_id, param_values, metric_values)
        except BaseException:
            _mark_failed(client, run_id)
            raise
    try:
        # Artifacts are file copies for a local store: no need to hold the lock meanwhile.
        for path in files:
            if path.is_dir():
                _retry(client.log_artifacts, run_id, str(path), artifact_path=path.name)
            else:
                _retry(client.log_artifact, run_id, str(path))
    except BaseException:
        with _writing(uri, results):
            _mark_failed(client, run_id)
        raise
    with _writing(uri, results):
        _retry(client.set_terminated, run_id, "FINISHED")
    return run_id


def log_stage(
    frozen: Mapping[str, Any],
    stage: str,
    summary_paths: list[Path],
    *,
    results_dir: str | os.PathLike[str],
) -> dict[str, str]:
    """One child run per job of ``stage``, from the jobs' JSON summaries; idempotent.

    The stage's module (:data:`STAGE_MODULES`) maps a summary to the child run's keyword
    arguments with its ``tracking_record(summary)``; the summary itself is the run's artifact.
    """
    import importlib
    import json

    record_of = importlib.import_module(f"capacity_pack.{STAGE_MODULES[stage]}").tracking_record
    runs: dict[str, str] = {}
    for path in summary_paths:
        record = record_of(json.loads(Path(path).read_text()))
        # The summary's own bytes identify the job's result: re-tracking it logs nothing new.
        record.setdefault("fingerprint", file_sha256(path))
        runs[record["job"]] = log_child_run(
            frozen, artifacts=[Path(path)], results_dir=results_dir, **record
        )
    return runs


def log_parent_results(
    frozen: Mapping[str, Any],
    *,
    metrics: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
    artifacts: list[Path] | None = None,
    results_dir: str | os.PathLike[str],
) -> str:
    """Put the pack's decision on its parent run: metrics, tags and the pack files.

    Metrics are overwritten by a later call with the same keys (the latest decision for this
    manifest wins); artifacts are logged under ``pack/``.
    """
    _check_frozen(frozen)
    results = Path(results_dir).resolve()
    metric_values, withheld = _prepare_metrics(metrics)
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []
    tag_values = _scrub(
        _clean_items(dict(tags or {}), "tags", MAX_TAG_VALUE_LENGTH), secrets, redacted
    )
    if withheld:
        tag_values[METRICS_WITHHELD] = _truncate(",".join(withheld), MAX_TAG_VALUE_LENGTH)
    uri = tracking_uri(results)
    client = _open_client(uri, results)
    files, scratch = _redacted_artifacts([Path(p) for p in artifacts or []], secrets, redacted)
    if redacted:
        tag_values[REDACTED] = _truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)
    with _writing(uri, results, always=True):
        run_id = _get_or_create_parent(client, frozen, uri, results)
        _log_batches(client, run_id, {}, metric_values)
        for key, value in tag_values.items():
            _retry(client.set_tag, run_id, key, value)
    for path in files:
        _retry(client.log_artifact, run_id, str(path), artifact_path="pack")
    del scratch  # the redacted copies (if any) are logged: remove them
    return run_id
