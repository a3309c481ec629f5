"""``capacity-pack compare``'s two sides: a finished pack read from a results folder
(``results/<pack>``, its ``pack/``, a ``results/`` folder holding one pack, or the work directory
above it) or ``mlflow:<parent run id>`` (its ``pack/`` artifacts, frozen manifest and child runs'
SLO reports downloaded to a temporary folder: :func:`open_sources`). A source that is not a
readable pack raises :class:`CompareError`, naming it and what was expected.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_pack.artifacts import Artifact, ArtifactError, Capacity, FailureTest, Plan, SloReport
from capacity_pack.errors import StatedError

#: The prefix of an MLflow parent run as a compare source.
MLFLOW_PREFIX = "mlflow:"


class CompareError(StatedError):
    """A compare source that is not a readable pack: the message names it and what was expected."""


@dataclass
class Source:
    """One side of the comparison, read from a results folder or an MLflow parent run."""

    label: str
    origin: str
    pack_dir: Path
    capacity: dict[str, Any]
    plan: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    manifest_sha256: str | None = None
    manifest_from: str | None = None
    #: Per-point SLO reports, keyed (cache state, offered rps, repeat); open loop only.
    reports: dict[tuple[str, float, int], dict[str, Any]] = field(default_factory=dict)
    reports_from: str | None = None

    @property
    def name(self) -> str:
        return str(self.capacity.get("pack") or "?")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file; expected the pack's {what}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: not readable as JSON ({err}); expected {what}") from None
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: a JSON {type(doc).__name__}, expected an object ({what})")
    return doc


def _artifact(model: type[Artifact], path: Path) -> dict[str, Any]:
    """The artifact's dump, validated by its model."""
    try:
        return model.read(path).dump()
    except ArtifactError as err:
        raise CompareError(str(err)) from None


def _optional_artifact(model: type[Artifact], path: Path) -> dict[str, Any] | None:
    """:func:`_artifact`, or None where the pack has no such file."""
    return _artifact(model, path) if path.is_file() else None


def _pack_folders(path: Path) -> list[Path]:
    """The pack folders ``path`` names: itself, its ``pack/``, or one level or two down (a
    ``results/`` folder, a work directory)."""
    if (path / "capacity.json").is_file():
        return [path]
    for pattern in ("pack", "*/pack", "results/*/pack"):
        found = sorted(p for p in path.glob(pattern) if (p / "capacity.json").is_file())
        if found:
            return found
    return []


def load_folder(text: str, label: str) -> Source:
    """A pack from a results folder (``results/<pack>``, its ``pack/``, a ``results/`` holding
    one pack, or the work directory above it)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise CompareError(
            f"{text}: no such folder; expected a results folder (results/<pack>), its pack/ "
            f"subfolder or {MLFLOW_PREFIX}<parent run id>"
        )
    if not path.is_dir():
        raise CompareError(f"{text}: a file, not a folder; expected a results folder or its pack/")
    found = _pack_folders(path)
    if not found:
        raise CompareError(
            f"{text}: not a capacity pack: no capacity.json in it, in its pack/ subfolder or in "
            "results/<pack>/pack/ below it (has the pipeline reached its capacity stage?)"
        )
    if len(found) > 1:
        names = ", ".join(str(p.parent.name) for p in found)
        raise CompareError(f"{text}: holds {len(found)} packs ({names}); name one of them")
    pack_dir = found[0]
    src = _read_pack_dir(pack_dir, label, origin=str(path))
    results = pack_dir.parent
    frozen = results / "manifest" / "frozen.json"
    if frozen.is_file():
        doc = _read_json(frozen, "frozen manifest")
        src.manifest, src.manifest_sha256 = doc.get("manifest"), doc.get("sha256")
        src.manifest_from = str(frozen)
    reports = sorted(results.glob("reports/*/*/rep*/slo-report.json"))
    if reports:
        src.reports = _index_reports(_artifact(SloReport, p) for p in reports)
        src.reports_from = str(results / "reports")
    return src


def _read_pack_dir(pack_dir: Path, label: str, origin: str) -> Source:
    capacity = _optional_artifact(Capacity, pack_dir / "capacity.json")
    if capacity is None:
        raise CompareError(f"{pack_dir / 'capacity.json'}: no such file; expected the pack's")
    src = Source(
        label=label,
        origin=origin,
        pack_dir=pack_dir,
        capacity=capacity,
        plan=_optional_artifact(Plan, pack_dir / "plan.json"),
        failure=_optional_artifact(FailureTest, pack_dir / "failure-test.json"),
    )
    manifest = pack_dir / "workload-manifest.yaml"
    if manifest.is_file():
        from capacity_pack.plan.manifest import load_yaml

        data = load_yaml(manifest)
        if isinstance(data, dict):
            src.manifest_sha256 = data.get("frozen_sha256")
            src.manifest = {k: v for k, v in data.items() if k != "frozen_sha256"}
            src.manifest_from = str(manifest)
    return src


def _index_reports(docs) -> dict[tuple[str, float, int], dict[str, Any]]:
    out = {}
    for r in docs:
        if r.get("mode") == "open" and r.get("offered_rps") is not None:
            out[(str(r["cache_state"]), float(r["offered_rps"]), int(r["repeat"]))] = r
    return out


def tracking_uri(option: str | None) -> str:
    """``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else ``results/mlflow.db`` here."""
    uri = (option or os.environ.get("MLFLOW_TRACKING_URI", "")).strip()
    if uri:
        return uri
    local = Path("results") / "mlflow.db"
    if local.is_file():
        return "sqlite:///" + str(local.resolve())
    raise CompareError(
        "no MLflow tracking store: pass --tracking-uri or set MLFLOW_TRACKING_URI (no "
        "results/mlflow.db in this folder)"
    )


def load_mlflow(text: str, label: str, tracking: str | None, scratch: Path) -> Source:
    """A pack from an MLflow parent run: its ``pack/`` artifacts, its frozen manifest and the
    per-point reports of its ``analyze`` child runs, downloaded under ``scratch``."""
    run_id = text[len(MLFLOW_PREFIX) :].strip()
    if not run_id:
        raise CompareError(f"{text}: no run id; expected {MLFLOW_PREFIX}<parent run id>")
    uri = tracking_uri(tracking)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        # Opening a client on a missing SQLite file would create an empty store.
        raise CompareError(f"{uri}: no such MLflow store (the SQLite file does not exist)")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise CompareError(f"{text}: no such run in the MLflow store {uri}") from None
    tags = run.data.tags
    if tags.get("capacity_pack.run_kind") != "parent":
        parent = tags.get("mlflow.parentRunId")
        hint = f"; its parent is {MLFLOW_PREFIX}{parent}" if parent else ""
        raise CompareError(
            f"{text}: not a capacity-pack parent run (tag capacity_pack.run_kind is "
            f"{tags.get('capacity_pack.run_kind')!r}, expected 'parent'){hint}"
        )
    where = scratch / label
    where.mkdir(parents=True)
    try:
        pack_dir = Path(client.download_artifacts(run_id, "pack", str(where)))
    except (MlflowException, OSError):
        pack_dir = where / "pack"
    if not (pack_dir / "capacity.json").is_file():
        raise CompareError(
            f"{text}: the parent run has no pack/capacity.json artifact; expected a pack the "
            "pipeline finished (its report stage logs pack/)"
        )
    src = _read_pack_dir(pack_dir, label, origin=text)
    if src.manifest is None:
        with contextlib.suppress(MlflowException, OSError):
            frozen = Path(client.download_artifacts(run_id, "frozen_manifest.json", str(where)))
            doc = _read_json(frozen, "frozen manifest")
            src.manifest, src.manifest_sha256 = doc.get("manifest"), doc.get("sha256")
            src.manifest_from = f"{text} frozen_manifest.json"
    src.manifest_sha256 = src.manifest_sha256 or tags.get("capacity_pack.manifest_sha256")
    src.reports = _mlflow_reports(client, run, where / "reports")
    if src.reports:
        src.reports_from = f"{text} child runs"
    return src


#: Where a child run keeps its point's SLO report: the analyze job's own run, or the point's
#: run with a folder per job.
REPORT_ARTIFACTS = ("slo-report.json", "analysis/slo-report.json")


def _mlflow_reports(client, run, where: Path) -> dict[tuple[str, float, int], dict[str, Any]]:
    """The newest ``slo-report.json`` of each open-loop point among the parent's child runs."""
    from mlflow.exceptions import MlflowException

    try:
        children = client.search_runs(
            [run.info.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'",
            order_by=["attributes.start_time ASC"],
        )
    except MlflowException:
        return {}
    docs = []
    for child in children:  # oldest first: a newer report of the same point replaces it
        point = child.data.tags.get("capacity_pack.point")
        if point is not None and not point.startswith("open-"):
            continue
        with contextlib.suppress(MlflowException, OSError, CompareError):
            path = _report_artifact(client, child.info.run_id)
            if path is not None:
                local = client.download_artifacts(
                    child.info.run_id, path, str(where / child.info.run_id)
                )
                docs.append(_artifact(SloReport, Path(local)))
    return _index_reports(docs)


def _report_artifact(client, run_id: str) -> str | None:
    """Which of :data:`REPORT_ARTIFACTS` the run holds (listed, not downloaded: most child runs
    are other jobs' and hold none)."""
    for path in REPORT_ARTIFACTS:
        folder = path.rpartition("/")[0] or None
        if any(f.path == path for f in client.list_artifacts(run_id, folder)):
            return path
    return None


@contextlib.contextmanager
def _quiet_downloads() -> Iterator[None]:
    """MLflow draws a progress bar per download on stderr: dozens of them here."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def open_sources(a: str, b: str, tracking: str | None = None) -> Iterator[tuple[Source, Source]]:
    """Both sources, read; MLflow downloads live in a temporary folder until the block ends."""
    with tempfile.TemporaryDirectory(prefix="capacity-pack-compare-") as tmp:
        out = []
        for text, label in ((a, "A"), (b, "B")):
            if text.startswith(MLFLOW_PREFIX):
                with _quiet_downloads():
                    out.append(load_mlflow(text, label, tracking, Path(tmp)))
            else:
                out.append(load_folder(text, label))
        yield out[0], out[1]
