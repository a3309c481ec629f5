"""The parent run of a frozen manifest: its provenance tags, its find-or-create (never two), and
the pack's decision logged onto it.

Parent ``<pack name> @ <sha[:12]>`` in experiment ``capacity-pack/<pack name>``, created in two
steps and tagged ``capacity_pack.parent_state=complete`` when finished; find-or-create runs in
one locked section (:func:`~.store.writing`); :func:`log_parent_results` puts the decision on it.

Tags and steps: docs/tracking-server.md, "How the pack writes to a store".
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capacity_pack.io import write_json_atomic
from capacity_pack.redact import MIN_CONTAINED_SECRET, manifest_secret_values
from capacity_pack.track.scrub import (
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
    EXPERIMENT_PREFIX,
    MANIFEST_SHA,
    METRICS_WITHHELD,
    PARENT_STATE,
    REDACTED,
    RUN_KIND,
    TAG,
    artifact_location,
    experiment_name,
    log_batches,
    open_client,
    retry,
    search_all,
    sqlite_path,
    tracking_uri,
    writing,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

MANIFEST_ARTIFACT = "frozen_manifest.json"
SECTIONS = TAG + "section_sha256"
#: The MLflow UI files an experiment of measured runs under "Model training" (runs, params and
#: metrics), not under "GenAI" (traces), by this tag.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
#: Where the parent keeps the pack's files.
PACK_ARTIFACTS = "pack"
#: MLflow's run description: the UI shows this tag's Markdown on the run's page.
DESCRIPTION = "mlflow.note.content"


# --- Provenance ---


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


def check_frozen(frozen: Mapping[str, Any]) -> str:
    """The manifest sha256 of a frozen manifest; anything else raises :class:`ValueError`."""
    from capacity_pack.plan.manifest import FROZEN_FORMAT

    if not isinstance(frozen, Mapping) or frozen.get("format") != FROZEN_FORMAT:
        raise ValueError(f"expected a frozen manifest (format {FROZEN_FORMAT!r}; see freeze())")
    sha = str(frozen.get("sha256", ""))
    # The hash is quoted into search filters: only hex may pass.
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"frozen manifest sha256 {sha!r} is not a sha256 hex digest")
    return sha


def pack_name(frozen: Mapping[str, Any]) -> str:
    """The pack name of a frozen manifest."""
    return str(frozen["manifest"]["pack"]["name"])


def provenance_tags(frozen: Mapping[str, Any]) -> dict[str, str]:
    """The provenance tags of the module docstring, for a parent or child run."""
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
    tags[SECTIONS] = json.dumps(
        dict(sorted(frozen["section_sha256"].items())), separators=(",", ":")
    )
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit  # shown by the MLflow UI
    return {k: str(v) for k, v in tags.items() if v != ""}


# --- Find or create (callers hold the lock) ---


def _experiment_id(client: MlflowClient, name: str, location: str | None) -> str:
    from mlflow.exceptions import MlflowException

    exp = retry(client.get_experiment_by_name, name)
    if exp is None:
        try:
            return retry(
                client.create_experiment,
                name,
                artifact_location=location,
                tags={TAG + "pack": name.removeprefix(EXPERIMENT_PREFIX), **EXPERIMENT_KIND},
            )
        except MlflowException:
            # Created meanwhile by a process that does not share our lock (a server store).
            exp = retry(client.get_experiment_by_name, name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        retry(client.restore_experiment, exp.experiment_id)
    return exp.experiment_id


def _parents(client: MlflowClient, experiment_id: str, sha: str) -> list[Run]:
    found = search_all(
        client,
        experiment_id,
        f"tags.`{RUN_KIND}` = 'parent' and tags.`{MANIFEST_SHA}` = '{sha}'",
    )
    # Only a store written without our lock can hold two; the oldest one is the parent.
    return sorted(found, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def get_or_create_parent(
    client: MlflowClient, frozen: Mapping[str, Any], uri: str, results_dir: Path
) -> str:
    """The parent run's id, created (or finished, if a process died creating it) when needed."""
    sha = frozen["sha256"]
    pack = pack_name(frozen)
    location = artifact_location(uri, results_dir, pack)
    exp_id = _experiment_id(client, experiment_name(pack), location)
    found = _parents(client, exp_id, sha)
    if found:
        if found[0].data.tags.get(PARENT_STATE) == "complete":
            return found[0].info.run_id
        run_id = found[0].info.run_id  # a process died half-way through creating it: finish
    else:
        tags = scrub(
            _parent_tags(frozen), manifest_secret_values(frozen), []
        )  # see _complete_parent
        tags[RUN_KIND] = "parent"
        tags[MANIFEST_SHA] = sha
        run = retry(client.create_run, exp_id, tags=tags, run_name=f"{pack} @ {sha[:12]}")
        run_id = run.info.run_id
    _complete_parent(client, run_id, frozen)
    return run_id


def _parent_tags(frozen: Mapping[str, Any]) -> dict[str, str]:
    return clean_items(provenance_tags(frozen), "tags", MAX_TAG_VALUE_LENGTH)


def _complete_parent(client: MlflowClient, run_id: str, frozen: Mapping[str, Any]) -> None:
    """Params, manifest artifact, FINISHED status, then the completion tag; idempotent."""
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []
    scrub(_parent_tags(frozen), secrets, redacted)  # names the tags the creation dropped
    settings = clean_items(flatten(frozen["manifest"]), "params", MAX_PARAM_VALUE_LENGTH)
    log_batches(client, run_id, scrub(settings, secrets, redacted), {})
    text = json.dumps(frozen, sort_keys=True, ensure_ascii=False)
    if any(len(s) >= MIN_CONTAINED_SECRET and s in text for s in secrets):
        redacted.append(MANIFEST_ARTIFACT)
    else:
        with tempfile.TemporaryDirectory(prefix="capacity-pack-mlflow-") as tmp:
            path = Path(tmp) / MANIFEST_ARTIFACT
            write_json_atomic(path, frozen)
            retry(client.log_artifact, run_id, str(path))
    if redacted:
        retry(client.set_tag, run_id, REDACTED, truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH))
    # A parent is a container: finished once it holds the manifest; children still attach.
    retry(client.set_terminated, run_id, "FINISHED")
    retry(client.set_tag, run_id, PARENT_STATE, "complete")


# --- Public API ---


def ensure_parent_run(frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str]) -> str:
    """The id of the frozen manifest's parent run, created on first use (never twice)."""
    check_frozen(frozen)
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    client = open_client(uri, results)
    with writing(uri, results, always=True):
        return get_or_create_parent(client, frozen, uri, results)


def find_parent_run(
    frozen: Mapping[str, Any], *, results_dir: str | os.PathLike[str]
) -> str | None:
    """The id of the frozen manifest's parent run, or ``None``; never creates anything."""
    sha = check_frozen(frozen)
    results = Path(results_dir).resolve()
    uri = tracking_uri(results)
    db = sqlite_path(uri)
    if db is not None and not db.exists():
        return None  # opening a client would create the database
    client = open_client(uri, results)
    exp = retry(client.get_experiment_by_name, experiment_name(pack_name(frozen)))
    if exp is None or exp.lifecycle_stage != "active":
        return None
    found = _parents(client, exp.experiment_id, sha)
    return found[0].info.run_id if found else None


def log_parent_results(
    frozen: Mapping[str, Any],
    *,
    metrics: Mapping[str, Any],
    tags: Mapping[str, Any] | None = None,
    description: str | None = None,
    pack_dir: str | os.PathLike[str] | None = None,
    results_dir: str | os.PathLike[str],
) -> str:
    """Put the pack's decision on its parent run: metrics, tags, the description (Markdown the
    UI shows on the run's page) and every file of ``pack_dir``, under ``pack/`` with their
    paths relative to it (``pack/alerts/alert-rules.yaml``).

    Metrics are overwritten by a later call with the same keys (the latest decision for this
    manifest wins), as are the description and the files.
    """
    check_frozen(frozen)
    results = Path(results_dir).resolve()
    metric_values, withheld = prepare_metrics(metrics)
    secrets = manifest_secret_values(frozen)
    redacted: list[str] = []
    tag_values = clean_items(dict(tags or {}), "tags", MAX_TAG_VALUE_LENGTH)
    if description is not None:
        # A description longer than a tag holds is cut, not refused: it is a summary.
        tag_values[DESCRIPTION] = truncate(description, MAX_TAG_VALUE_LENGTH)
    tag_values = scrub(tag_values, secrets, redacted)
    if withheld:
        tag_values[METRICS_WITHHELD] = truncate(",".join(withheld), MAX_TAG_VALUE_LENGTH)
    uri = tracking_uri(results)
    client = open_client(uri, results)
    folder = [Path(pack_dir)] if pack_dir is not None else []
    files, scratch = redacted_artifacts(folder, secrets, redacted)
    if redacted:
        tag_values[REDACTED] = truncate(",".join(redacted), MAX_TAG_VALUE_LENGTH)
    with writing(uri, results, always=True):
        run_id = get_or_create_parent(client, frozen, uri, results)
        log_batches(client, run_id, {}, metric_values)
        for key, value in tag_values.items():
            retry(client.set_tag, run_id, key, value)
    for path in files:
        retry(client.log_artifacts, run_id, str(path), artifact_path=PACK_ARTIFACTS)
    del scratch  # the redacted copies (if any) are logged: remove them
    with writing(uri, results):
        # The parent ends with its finished pack (it starts when the manifest is frozen).
        retry(client.set_terminated, run_id, "FINISHED", end_time=int(time.time() * 1000))
    return run_id
