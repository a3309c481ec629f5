"""MLflow tracking of a pack: one experiment per pack, one parent run per frozen manifest, one
child run per Snakemake job.

This module holds the child runs and is the package's entry point: it re-exports what scripts,
rules and the CLI use of the others (the store's location and names from :mod:`.store`, the
parent run from :mod:`.parent`; :mod:`.scrub` decides what may reach MLflow).

Runs:

- experiment ``capacity-pack/<pack name>``;
- parent run ``<pack name> @ <sha[:12]>``, tagged ``capacity_pack.run_kind=parent`` and
  ``capacity_pack.manifest_sha256=<sha>``; it carries the pack settings as params (dotted keys)
  and the frozen manifest as the artifact ``frozen_manifest.json`` (:mod:`.parent`);
- child runs, tagged ``mlflow.parentRunId`` (what ``start_run(parent_run_id=...)`` sets),
  ``capacity_pack.run_kind=child`` and the job's stage, job, point, cache state and repeat.
  Params are settings, metrics numbers (units in their names), tags provenance, files artifacts.

Both kinds carry the provenance tags listed in :mod:`.parent`. A child is logged in steps so a
bad call leaves nothing behind and a failure leaves a FAILED run, not a RUNNING one: every
input is checked (and scrubbed, :mod:`.scrub`) first; then, under the store lock
(:mod:`.store`), the parent is found or created, a finished twin (same job and fingerprint) is
returned as is, or the run is created with its params and metrics; artifacts are logged outside
the lock; the run is then marked FINISHED.

MLflow is imported inside the functions, so importing this module stays cheap.
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
    "is_server",
    "log_child_run",
    "log_parent_results",
    "log_stage",
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


def _checked_artifacts(artifacts: list[Path] | None) -> list[Path]:
    files = [Path(p) for p in artifacts or []]
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise FileNotFoundError(f"artifacts do not exist: {', '.join(missing)}")
    names = [p.name for p in files]
    if len(set(names)) != len(names):
        raise ValueError(f"artifacts would overwrite each other (same names): {names}")
    return files


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


def _log_files(client: MlflowClient, run_id: str, files: list[Path]) -> None:
    for path in files:
        if path.is_dir():
            retry(client.log_artifacts, run_id, str(path), artifact_path=path.name)
        else:
            retry(client.log_artifact, run_id, str(path))


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
    sha = check_frozen(frozen)
    if fingerprint is not None and not re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", fingerprint):
        raise ValueError(f"fingerprint {fingerprint!r} must be 1-200 of [A-Za-z0-9._:-]")
    results = Path(results_dir).resolve()
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []

    metric_values, withheld = prepare_metrics(metrics or {})
    flat_params = flatten(dict(params or {}))
    param_values = scrub(
        clean_items(flat_params, "params", MAX_PARAM_VALUE_LENGTH), secrets, redacted
    )
    own: dict[str, object] = {
        RUN_KIND: "child",
        MANIFEST_SHA: sha,
        STAGE: stage,
        TAG + "job": job,
        TAG + "point": point,
        TAG + "cache_state": cache_state,
        TAG + "repeat": repeat,
        FINGERPRINT: fingerprint,
    }
    run_tags = _child_tags(frozen, own, tags, secrets, redacted)
    if withheld:
        run_tags[METRICS_WITHHELD] = truncate(",".join(withheld), MAX_TAG_VALUE_LENGTH)
    # The copies live as long as ``scratch`` does: until this function returns or raises.
    files, scratch = redacted_artifacts(_checked_artifacts(artifacts), secrets, redacted)
    if redacted:
        run_tags[REDACTED] = truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)
    run_name = _run_name(run_tags)

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
        run_id = retry(client.create_run, exp_id, tags=run_tags, run_name=run_name).info.run_id
        try:
            log_batches(client, run_id, param_values, metric_values)
        except BaseException:
            _mark_failed(client, run_id)
            raise
    try:
        # Artifacts are file copies for a local store: no need to hold the lock meanwhile.
        _log_files(client, run_id, files)
    except BaseException:
        with writing(uri, results):
            _mark_failed(client, run_id)
        raise
    with writing(uri, results):
        retry(client.set_terminated, run_id, "FINISHED")
    return run_id


def log_stage(
    frozen: Mapping[str, Any],
    record_of: Callable[[dict[str, Any]], dict[str, Any]],
    summary_paths: list[Path],
    *,
    results_dir: str | os.PathLike[str],
) -> dict[str, str]:
    """One child run per job of a stage, from the jobs' JSON summaries; idempotent.

    ``record_of`` is the stage's ``tracking_record(summary)`` (the stage table,
    :mod:`capacity_pack.stages`, names it): it maps a summary to the child run's keyword
    arguments; the summary itself is the run's artifact.
    """
    import json

    runs: dict[str, str] = {}
    for path in summary_paths:
        record = record_of(json.loads(Path(path).read_text()))
        # The summary's own bytes identify the job's result: re-tracking it logs nothing new.
        record.setdefault("fingerprint", file_sha256(path))
        runs[record["job"]] = log_child_run(
            frozen, artifacts=[Path(path)], results_dir=results_dir, **record
        )
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
