"""Regenerate the autopsy fixture: one real, small pack run, kept as the autopsy reads it.

    PYTHONPATH=workflow python tests/data/autopsy/regenerate.py [--keep DIR | --copy-from DIR]

Runs a tiny pack (two open-loop rates, one closed-loop concurrency, cold and warm, one short
drill) through the real Snakemake pipeline with ``TZ=UTC`` (Snakemake's log stamps are naive
local time, so the fixture is read back in UTC) on two cores, as the pipeline tests run it (so
measurements queue for the target's slot), then copies into this folder only what the autopsy
reads:

- ``<start>.snakemake.log``: the invocation's main log, verbatim;
- ``pack/benchmarks/**.tsv`` verbatim; ``pack/logs/**.log`` emptied (only their mtimes count);
- ``pack/raw/<point>/records.jsonl`` and ``pack/failure/<drill>/records.jsonl`` with the clock
  fields the run autopsy reads, every request; ``summary.json`` reduced to ``wall_s``,
  ``drill.json`` to ``load.wall_s``; ``pack/raw/<point>/ground_truth.jsonl`` with the fields
  the request autopsy reads, every request;
- ``pack/tables/<point>/requests.parquet`` with the columns the request autopsy reads, every
  row; ``server_metrics.parquet`` verbatim;
- ``pack.yaml``: the pack that ran; ``mtimes.json``: every copied file's mtime (git does not
  keep them, and the autopsy compares them with the log); ``mlflow_runs.json``: the MLflow
  store's runs (name, tags, start/end), recreated by the tests in a throwaway store.

The open-loop rate of 150 requests/s overloads the simulated engine, so that point has SLO
misses for the request autopsy to attribute. The tests derive their expectations from these
files (jobs counted in the log, misses counted against the pack's cutoffs), so a regenerated
fixture needs no test edits unless the pipeline's rules change. Regenerate on a quiet host: on
a starved one the plumbing jobs, not the measurements, make the critical path (no slot gates),
and the server's own stamps lag its writes (negative transport), which the tests reject.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PACK = "autopsy-fixture"
# The record fields the run autopsy reads (capacity_pack.autopsy.sources.record_clocks).
RECORD_FIELDS = (
    "request_id",
    "phase",
    "status",
    "due_ns",
    "sent_ns",
    "end_ns",
    "sent_realtime_ns",
    "end_realtime_ns",
    "t0_ns",
    "t0_realtime_ns",
)
# The ground-truth fields the request autopsy reads (capacity_pack.autopsy.requests).
GROUND_TRUTH_FIELDS = (
    "request_id",
    "clock_offset_ns",
    "preemptions",
    "arrival_ns",
    "scheduled_ns",
    "first_token_ns",
    "first_token_sent_ns",
)
# The requests-table columns the request autopsy reads.
REQUEST_COLUMNS = [
    "request_id",
    "class",
    "point",
    "cache_state",
    "repeat",
    "phase",
    "status",
    "output_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "client_delay_ms",
    "due_offset_ns",
    "sent_offset_ns",
    "sent_ns",
    "end_ns",
]


def small_pack() -> dict:
    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    data["pack"]["name"] = PACK
    # As few requests as still make every stage run: the fixture's size is its request count.
    data["client"].update(
        initial_scheduled_requests=24,
        minimum_duration_seconds=0.2,
        warmup_seconds=0.2,
        maximum_duration_seconds=3,
    )
    data["client"].pop("class_schedule_counts")
    data["acceptance"]["min_successful_samples_per_class"] = 2
    data["sweep"].pop("search", None)  # the fixture's two rates, no boundary search
    data["sweep"].update(
        open_loop_rps=[10, 150],
        closed_loop_concurrency=[1],
        repeats=1,
        closed_loop_min_requests=4,
        closed_loop_requests_per_worker=2,
    )
    data["experiments"] = []
    data["failure"].update(
        rate_rps=5, duration_s=8, baseline_s=3, warmup_s=1, window_s=1, restart_after_s=2,
        cold_start_s=1, admission_max_outstanding=16,
    )  # fmt: skip
    data["failure"]["drills"] = [{"name": "replica_kill", "kind": "replica_kill"}]
    return data


def run_pack(workdir: Path, cores: int) -> None:
    (workdir / "pack.yaml").write_text(yaml.safe_dump(small_pack(), sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"TZ": "UTC"}
    subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
         str(workdir), "--configfile", str(workdir / "pack.yaml"), "--cores", str(cores)],
        check=True, env=env, timeout=1800,
    )  # fmt: skip


def _reduced(src: Path) -> str | None:
    """The text the fixture keeps for ``src`` (None: copy the bytes)."""
    if src.name in ("records.jsonl", "ground_truth.jsonl"):
        keep = RECORD_FIELDS if src.name == "records.jsonl" else GROUND_TRUTH_FIELDS
        rows = map(json.loads, src.read_text().splitlines())
        return "".join(
            json.dumps({k: r.get(k) for k in keep}, separators=(",", ":")) + "\n" for r in rows
        )
    if src.name == "summary.json":
        return json.dumps({"wall_s": json.loads(src.read_text())["wall_s"]}) + "\n"
    if src.name == "drill.json":
        load = json.loads(src.read_text()).get("load") or {}
        return json.dumps({"load": {"wall_s": load.get("wall_s")}}) + "\n"
    if src.suffix == ".log":
        return ""
    return None


def copy_fixture(workdir: Path) -> None:
    results = workdir / "results" / PACK
    (log,) = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    for old in HERE.glob("*.snakemake.log"):
        old.unlink()
    shutil.rmtree(HERE / "pack", ignore_errors=True)
    shutil.copy2(log, HERE / log.name)
    keep = [
        *results.glob("benchmarks/**/*.tsv"),
        *results.glob("logs/**/*.log"),
        *results.glob("raw/**/records.jsonl"),
        *results.glob("raw/**/summary.json"),
        *results.glob("failure/*/records.jsonl"),
        *results.glob("failure/*/drill.json"),
        *results.glob("raw/**/ground_truth.jsonl"),
        *results.glob("tables/**/requests.parquet"),
        *results.glob("tables/**/server_metrics.parquet"),
    ]
    mtimes = {}
    for src in sorted(keep):
        rel = src.relative_to(results).as_posix()
        dst = HERE / "pack" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        text = _reduced(src)
        if src.name == "requests.parquet":
            # Without pandas' schema metadata: half the bytes, and the same dtypes read back.
            table = pa.Table.from_pandas(
                pd.read_parquet(src)[REQUEST_COLUMNS], preserve_index=False
            )
            pq.write_table(table.replace_schema_metadata(None), dst, compression="zstd")
        elif text is None:
            shutil.copyfile(src, dst)
        else:
            dst.write_text(text)
        mtimes[rel] = src.stat().st_mtime
    (HERE / "mtimes.json").write_text(json.dumps(mtimes, indent=0, sort_keys=True) + "\n")
    shutil.copyfile(workdir / "pack.yaml", HERE / "pack.yaml")
    (HERE / "mlflow_runs.json").write_text(json.dumps(mlflow_runs(workdir), indent=1) + "\n")


def mlflow_runs(workdir: Path) -> list[dict]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/results/mlflow.db")
    ids = [e.experiment_id for e in client.search_experiments()]
    out = []
    for r in client.search_runs(ids, max_results=50000):
        tags = {k: v for k, v in r.data.tags.items() if k.startswith("capacity_pack.")}
        keep = ("job", "stage", "git_commit", "git_dirty", "run_kind")
        out.append(
            {
                "name": r.info.run_name,
                "tags": {k: v for k, v in tags.items() if k.split(".", 1)[1] in keep},
                "start_ms": r.info.start_time,
                "end_ms": r.info.end_time,
            }
        )
    return sorted(out, key=lambda r: (r["start_ms"] or 0, r["name"] or ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it")
    ap.add_argument("--copy-from", type=Path, help="copy from this finished run; run nothing")
    ap.add_argument("--cores", type=int, default=2, help="Snakemake's --cores (default 2)")
    args = ap.parse_args()
    if args.copy_from:
        copy_fixture(args.copy_from)
        return
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run_pack(args.keep, args.cores)
        copy_fixture(args.keep)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_pack(Path(tmp), args.cores)
        copy_fixture(Path(tmp))


if __name__ == "__main__":
    main()
