"""MLflow tracking of a pack: one experiment per pack name, one parent run per frozen manifest,
one child run per measured point and per failure drill.

This module holds the child runs and is the package's entry point: it re-exports what scripts,
rules and the CLI use of :mod:`.store` and :mod:`.parent` (:mod:`.scrub` decides what may reach
MLflow, :mod:`.records` what each job puts on its run). Child runs are named for people
(``open-r30 · cold · rep0``, ``drill · replica_kill``), their start and end the measurement
window where the record gives one. MLflow is imported inside the functions, so importing this
module stays cheap.

Runs, tags and the logging steps: docs/tracking-server.md, "How the pack writes to a store";
docs/reading.md, "MLflow".
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capacity_pack.io import file_sha256, write_json_atomic
from capacity_pack.redact import (
    MIN_CONTAINED_SECRET,
    REDACTION,
    TRACKING_URI_ENV,
    holds_secret,
    looks_secret,
    manifest_secret_values,
    redact_text,
)
from capacity_pack.track.parent import (
    MANIFEST_ARTIFACT,
    check_frozen,
    ensure_parent_run,
    find_parent_run,
    get_or_create_parent,
    git_state,
    log_parent_results,
    provenance_tags,
)
from capacity_pack.track.scrub import (
    MAX_KEY_LENGTH,
    MAX_PARAM_VALUE_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    clean_items,
    flatten,
    prepare_metrics,
    redacted_artifacts,
    scrub,
    truncate,
)
from capacity_pack.track.store import (
    ARTIFACT_DIR,
    DB_NAME,
    EXPERIMENT_PREFIX,
    FINGERPRINT,
    LOCK_TIMEOUT_S,
    MANIFEST_SHA,
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_PER_BATCH,
    METRICS_WITHHELD,
    PARENT_RUN_ID,
    PARENT_STATE,
    REDACTED,
    RETRY_DEADLINE_S,
    RUN_KIND,
    STAGE,
    TAG,
    artifact_location,
    experiment_name,
    is_server,
    log_batches,
    open_client,
    retry,
    search_all,
    tracking_uri,
    writing,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

_log = logging.getLogger(__name__)

__all__ = [
    "ARTIFACT_DIR",
    "DB_NAME",
    "EXPERIMENT_PREFIX",
    "FINGERPRINT",
    "LOCK_TIMEOUT_S",
    "MANIFEST_ARTIFACT",
    "MANIFEST_SHA",
    "MAX_KEY_LENGTH",
    "MAX_METRICS_PER_BATCH",
    "MAX_PARAMS_PER_BATCH",
    "MAX_PARAM_VALUE_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "METRICS_WITHHELD",
    "MIN_CONTAINED_SECRET",
    "PARENT_RUN_ID",
    "PARENT_STATE",
    "REDACTED",
    "REDACTION",
    "RETRY_DEADLINE_S",
    "RUN_KIND",
    "STAGE",
    "TAG",
    "TRACKING_URI_ENV",
    "artifact_location",
    "child_runs",
    "ensure_parent_run",
    "experiment_name",
    "find_parent_run",
    "git_state",
    "holds_secret",
    "identity_params",
    "is_server",
    "log_child_run",
    "log_parent_results",
    "log_stage",
    "merge_records",
    "run_stage",
    "looks_secret",
    "redact_text",
    "tracking_uri",
]


def _mark_failed(client: MlflowClient, run_id: str) -> None:
    """Best effort: the error that made the run fail is the one to report, not this one."""
    try:
        retry(client.set_terminated, run_id, "FAILED")
    except Exception as exc:
        _log.warning("could not mark MLflow run %s as FAILED: %s", run_id, exc)


def child_runs(
    frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str], stage: str | None = None
) -> list[Run]:
    """The parent's child runs (``mlflow.entities.Run``), oldest first; only ``stage`` if given."""
    parent = find_parent_run(frozen, results_dir=results_dir)
    if parent is None:
        return []
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    client = open_client(uri, results)
    exp_id = retry(client.get_run, parent).info.experiment_id
    runs = search_all(client, exp_id, f"tags.`{PARENT_RUN_ID}` = '{parent}'")
    # Stage names are caller text: filter here rather than quote them into a search string.
    return [r for r in runs if stage is None or r.data.tags.get(STAGE) == stage]


def _child_tags(
    frozen: Mapping[str, Any],
    own: Mapping[str, object],
    tags: Mapping[str, Any] | None,
    secrets: list[str],
    redacted: list[str],
) -> dict[str, str]:
    """A child's provenance and identity tags plus the caller's, which may not override them."""
    own_tags = clean_items(
        {k: v for k, v in {**provenance_tags(frozen), **own}.items() if v is not None},
        "tags",
        MAX_TAG_VALUE_LENGTH,
    )
    extra = clean_items(dict(tags or {}), "tags", MAX_TAG_VALUE_LENGTH)
    reserved = set(own_tags) | {PARENT_RUN_ID, METRICS_WITHHELD, REDACTED, "mlflow.runName"}
    clash = sorted(set(extra) & reserved)
    if clash:
        raise ValueError(f"tags {clash} are set by capacity_pack.track.tracking itself")
    return scrub({**own_tags, **extra}, secrets, redacted)


Artifact = Path | tuple[Path, str]


def _artifact_files(
    artifacts: list[Artifact] | None, secrets: list[str], redacted: list[str]
) -> tuple[list[tuple[Path, str | None]], list[Any]]:
    """(file, artifact folder or None) pairs (a file may be named with the folder it goes to),
    a secret-free copy in place of any that holds a secret; and the copies' scratch folders,
    which live as long as the caller holds them."""
    pairs = [
        (Path(a[0]), a[1]) if isinstance(a, tuple) else (Path(a), None) for a in artifacts or []
    ]
    missing = [str(p) for p, _ in pairs if not p.exists()]
    if missing:
        raise FileNotFoundError(f"artifacts do not exist: {', '.join(missing)}")
    names = [f"{folder}/{p.name}" if folder else p.name for p, folder in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"artifacts would overwrite each other (same names): {names}")
    files: list[tuple[Path, str | None]] = []
    scratch = []
    for path, folder in pairs:
        copies, holder = redacted_artifacts([path], secrets, redacted)
        files += [(copy, folder) for copy in copies]
        scratch.append(holder)
    return files, scratch


def _run_name(run_tags: Mapping[str, str]) -> str:
    """The run name repeats the (scrubbed) identifying tags for people browsing the UI."""
    label_keys = (STAGE, TAG + "job", TAG + "point", TAG + "cache_state")
    label = list(dict.fromkeys(run_tags[k] for k in label_keys if k in run_tags))  # job == point
    if TAG + "repeat" in run_tags:
        label.append("r" + run_tags[TAG + "repeat"])
    return " ".join(label) or "job"


def _finished_twin(
    client: MlflowClient, exp_id: str, parent: str, run_tags: Mapping[str, str]
) -> str | None:
    """A finished child of ``parent`` for the same job and fingerprint, if one exists."""
    same = search_all(
        client,
        exp_id,
        f"tags.`{PARENT_RUN_ID}` = '{parent}' and tags.`{FINGERPRINT}` = "
        f"'{run_tags[FINGERPRINT]}' and attributes.status = 'FINISHED'",
    )
    same = [r for r in same if r.data.tags.get(TAG + "job") == run_tags[TAG + "job"]]
    return same[0].info.run_id if same else None


def _finish(
    client: MlflowClient, uri: str, results: Path, run_id: str, files: list, end_time_ms: int | None
) -> None:
    """The run's artifacts logged, then the run marked FINISHED (FAILED if they fail). The store
    is locked only to mark the run: artifacts are file copies for a local store, no need to hold
    the lock meanwhile."""
    try:
        for path, folder in files:
            if path.is_dir():
                name = f"{folder}/{path.name}" if folder else path.name
                retry(client.log_artifacts, run_id, str(path), artifact_path=name)
            else:
                retry(client.log_artifact, run_id, str(path), artifact_path=folder)
    except BaseException:
        with writing(uri, results):
            _mark_failed(client, run_id)
        raise
    with writing(uri, results):
        retry(client.set_terminated, run_id, "FINISHED", end_time=end_time_ms)


def identity_params(frozen: Mapping[str, Any]) -> dict[str, str]:
    """What defines every run of a manifest besides its own point: the target's engine and
    model, as params (the UI's scatter and parallel-coordinates views plot params, not tags)."""
    manifest = frozen["manifest"]
    model, engine = manifest["model"], manifest["engine"]
    target = manifest.get("target") or {}
    params = {
        "target": target.get("kind"),
        # A simulated engine's performance profile is what distinguishes two sim targets.
        "target_profile": target.get("profile"),
        "engine": engine["name"],
        "engine_version": engine["version"],
        "model": model["id"],
        "model_revision": model["revision"],
    }
    return {k: str(v) for k, v in params.items() if v is not None}


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
    artifacts: list[Artifact] | None = None,
    results_dir: str | os.PathLike[str],
    fingerprint: str | None = None,
    run_name: str | None = None,
    start_time_ms: int | None = None,
    end_time_ms: int | None = None,
) -> str:
    """Record one job as a child run of the manifest's parent run; return its run id.

    ``params`` may nest (flattened to dotted keys); the manifest's :func:`identity_params` are
    added. ``metrics`` values must be finite numbers or ``None`` (withheld). ``artifacts`` are
    files or directories, logged under their own names, or ``(path, folder)`` pairs logged in
    ``folder``. ``start_time_ms`` and ``end_time_ms`` (epoch ms): the measurement's window.
    With a ``fingerprint`` (e.g. the sha256 of the job's output) a finished child of the same job
    and fingerprint is returned as is. Steps: docs/tracking-server.md, "How the pack writes...".
    """
    sha = check_frozen(frozen)
    if fingerprint is not None and not re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", fingerprint):
        raise ValueError(f"fingerprint {fingerprint!r} must be 1-200 of [A-Za-z0-9._:-]")
    results = Path(results_dir).resolve()
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []

    metric_values, withheld = prepare_metrics(metrics or {})
    if (start_time_ms is None) != (end_time_ms is None) or (
        start_time_ms is not None and end_time_ms < start_time_ms
    ):
        raise ValueError(f"run window [{start_time_ms}, {end_time_ms}] ms is not a window")
    flat_params = {**identity_params(frozen), **flatten(dict(params or {}))}
    param_values = scrub(
        clean_items(flat_params, "params", MAX_PARAM_VALUE_LENGTH), secrets, redacted
    )
    ids = {"job": job, "point": point, "cache_state": cache_state, "repeat": repeat}
    own: dict[str, object] = {RUN_KIND: "child", MANIFEST_SHA: sha, STAGE: stage}
    own |= {TAG + k: v for k, v in ids.items()} | {FINGERPRINT: fingerprint}
    run_tags = _child_tags(frozen, own, tags, secrets, redacted)
    if withheld:
        run_tags[METRICS_WITHHELD] = truncate(",".join(withheld), MAX_TAG_VALUE_LENGTH)
    # The copies live as long as ``scratch`` does: until this function returns or raises.
    files, scratch = _artifact_files(artifacts, secrets, redacted)
    if redacted:
        run_tags[REDACTED] = truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)
    run_name = scrub({"name": run_name or _run_name(run_tags)}, secrets, redacted)["name"]

    uri = tracking_uri(results)
    client = open_client(uri, results)
    with writing(uri, results, always=True):
        parent = get_or_create_parent(client, frozen, uri, results)
        run_tags[PARENT_RUN_ID] = parent
        exp_id = retry(client.get_run, parent).info.experiment_id
        if fingerprint is not None:
            twin = _finished_twin(client, exp_id, parent, run_tags)
            if twin is not None:
                return twin
        run_id = retry(
            client.create_run, exp_id, start_time=start_time_ms, tags=run_tags, run_name=run_name
        ).info.run_id
        try:
            log_batches(client, run_id, param_values, metric_values)
        except BaseException:
            _mark_failed(client, run_id)
            raise
    _finish(client, uri, results, run_id, files, end_time_ms)
    return run_id


def merge_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's keyword arguments from the shares of the jobs that make it (same ``job``).

    Params and tags are united; a key two shares set differently is an error, not a silent
    pick. Metrics are united the same way. Each share's summary goes to its ``artifact_dir``.
    The run's window is the one share that gives it; its fingerprint covers every share."""
    import hashlib

    first = records[0]
    merged: dict[str, Any] = {
        k: first[k] for k in ("stage", "job", "point", "cache_state", "repeat", "run_name")
    }
    merged = {k: v for k, v in merged.items() if v is not None}
    for key in ("params", "metrics", "tags"):
        united: dict[str, Any] = {}
        for rec in records:
            for name, value in flatten(dict(rec.get(key) or {})).items():
                if name in united and united[name] != value:
                    raise ValueError(
                        f"{first['job']}: {key[:-1]} {name!r} is {united[name]!r} in one share "
                        f"and {value!r} in another"
                    )
                united[name] = value
        merged[key] = united
    windows = {(r["start_time_ms"], r["end_time_ms"]) for r in records if "start_time_ms" in r}
    if len(windows) > 1:
        raise ValueError(f"{first['job']}: shares give different windows {sorted(windows)}")
    if windows:
        merged["start_time_ms"], merged["end_time_ms"] = windows.pop()
    merged["artifacts"] = [a for r in records for a in r["artifacts"]]
    digest = hashlib.sha256("|".join(sorted(r["fingerprint"] for r in records)).encode())
    merged["fingerprint"] = digest.hexdigest()
    return merged


def log_stage(
    frozen: Mapping[str, Any],
    record_of: Callable[[str, dict[str, Any]], dict[str, Any]],
    summary_paths: list[Path],
    *,
    results_dir: str | os.PathLike[str],
) -> dict[str, str]:
    """One child run per tracked job, from the jobs' JSON summaries; idempotent.

    ``record_of(path, summary)`` (:mod:`.records`, named by the stage table) maps a summary to
    its run's keyword arguments; records naming the same job are merged
    (:func:`merge_records`).
    """
    import json

    by_job: dict[str, list[dict[str, Any]]] = {}
    for path in summary_paths:
        record = dict(record_of(str(path), json.loads(Path(path).read_text())))
        # The summary's own bytes identify the job's result: re-tracking it logs nothing new.
        record.setdefault("fingerprint", file_sha256(path))
        folder = record.pop("artifact_dir", None)
        record["artifacts"] = [(Path(path), folder) if folder else Path(path)]
        by_job.setdefault(record["job"], []).append(record)
    runs: dict[str, str] = {}
    for job, records in by_job.items():
        record = merge_records(records) if len(records) > 1 else records[0]
        runs[job] = log_child_run(frozen, results_dir=results_dir, **record)
    return runs


def run_stage(
    *,
    frozen: str | os.PathLike[str],
    stage: str,
    record_of: Callable[[dict[str, Any]], dict[str, Any]],
    summaries: list[str | os.PathLike[str]],
    runs: str | os.PathLike[str],
    results_root: str | os.PathLike[str],
    log: logging.Logger,
) -> dict[str, str]:
    """Stage ``track``: one child run per job of ``stage`` under the parent run of ``frozen``;
    ``runs`` gets the manifest's sha256 and the child run ids by job."""
    import json

    frozen_doc = json.loads(Path(frozen).read_text())
    child = log_stage(frozen_doc, record_of, [Path(p) for p in summaries], results_dir=results_root)
    write_json_atomic(runs, {"manifest_sha256": frozen_doc["sha256"], "child_runs": child})
    log.info("%d %s jobs tracked under manifest %s", len(child), stage, frozen_doc["sha256"][:12])
    return child
