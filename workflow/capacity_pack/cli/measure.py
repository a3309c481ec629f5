"""Commands that measure a point against its target (one shard of a sharded point too) or
import one from another tool's per-request export."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capacity_pack.cli.common import (
    Fail,
    die_on_manifest_error,
    lock_options,
    lock_settings,
    quiet_log,
    stage_entry,
)


# Over 80 lines only with its options: a click command's options are its signature.
@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--point", "point_id", required=True, help="Point id, e.g. open-r16, closed-c8.")
@click.option("--cache-state", type=click.Choice(["cold", "warm"]), required=True)
@click.option("--repeat", type=int, default=0, show_default=True)
@click.option(
    "--schedule",
    "schedule_path",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Use this schedule parquet instead of generating it.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for records.jsonl, metrics.parquet and summary.json.",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Live progress line on standard error.",
)
@click.option(
    "--shards",
    type=click.IntRange(1, 64),
    default=None,
    help="Client processes for an open-loop point (default: the pack's client.shards).",
)
@lock_options
@die_on_manifest_error
def load(
    config: Path,
    point_id: str,
    cache_state: str,
    repeat: int,
    schedule_path: Path | None,
    output: Path,
    progress: bool,
    shards: int | None,
    no_wait: bool,
    lock_timeout: float,
) -> None:
    """Measure one point of CONFIG against its target; record every attempted request.

    One measurement per target at a time: while another one (of any pipeline or command of
    this user on this host) holds the target, this waits, or fails with --no-wait.
    """
    import pandas as pd

    from capacity_pack.measure.inputs import SweepInputs
    from capacity_pack.measure.lock import LockError, TargetBusy
    from capacity_pack.plan import schedule as sched
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.stages import STAGES

    pack = load_pack(config)
    if shards is not None:
        pack = pack.model_copy(update={"client": pack.client.model_copy(update={"shards": shards})})
    point = sched.find_point(pack, point_id, cache_state, repeat)
    frame = (
        pd.read_parquet(schedule_path)
        if schedule_path is not None
        else sched.build_schedule(pack, point)
    )
    from capacity_pack.measure.interrupt import Interrupted

    files = STAGES["sweep"].outputs
    try:
        summary = stage_entry("sweep")(
            inputs=SweepInputs.for_point(pack, point),
            point=point.point_id,
            cache_state=point.cache_state,
            repeat=point.repeat,
            schedule=frame,
            records=output / files["records"],
            summary=output / files["summary"],
            log=quiet_log(),
            progress=progress,
            lock=lock_settings(no_wait, lock_timeout),
        )
    except (TargetBusy, LockError) as err:
        raise Fail(str(err)) from None
    except Interrupted as stop:
        # Exit status 130 or 143 (SystemExit), no traceback; the partial results say so.
        where = f"; partial results in {output}" if stop.summary else ""
        click.echo(f"{output}: {stop}{where}", err=True)
        raise
    except KeyboardInterrupt:  # outside the run (the target starting or stopping)
        click.echo(f"{output}: interrupted by SIGINT outside the measurement", err=True)
        sys.exit(130)
    late = summary["dispatch_lateness_ms"]["p99"]
    # A closed-loop point has no due times, so no dispatch lateness.
    late_text = f"{late:.3f} ms" if late is not None else "n/a (closed loop)"
    click.echo(
        f"{output}: {summary['requests_recorded']} requests recorded, "
        f"{summary['failed']} failed, dispatch lateness p99 {late_text}"
        + (" (CLIENT-BOUND: not a server result)" if summary["client_bound"] else "")
    )


@click.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def shard(spec: Path) -> None:
    """Run one shard of a sharded point from its SPEC (JSON the measurement job writes).

    The measurement job starts one per shard, locally or through client.shard_launcher
    (e.g. srun); each meets the others in the spec's rendezvous directory and starts at the
    shared time.
    """
    from capacity_pack.measure.shards import ShardError, ShardSpec, run_shard

    try:
        summary = run_shard(ShardSpec.model_validate_json(spec.read_text()))
    except ShardError as err:
        raise Fail(str(err)) from None
    late = summary["dispatch_lateness_ms"]["p99"]
    click.echo(
        f"shard {summary['shard']}/{summary['shards']}: {summary['requests_recorded']} "
        f"recorded, {summary['failed']} failed, lateness p99 "
        + (f"{late:.3f} ms" if late is not None else "n/a")
    )


@click.command("import")
@click.argument("tool", type=click.Choice(["aiperf", "vllm-bench"]))
@click.argument("export", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Pack whose workload classes the requests are assigned to.",
)
@click.option("--point", "point_id", required=True, help="Point name for the imported rows.")
@click.option(
    "--class-name",
    default=None,
    help="Pack class for requests neither the export nor their lengths assign to one.",
)
@click.option(
    "--cache-state", type=click.Choice(["cold", "warm"]), default="cold", show_default=True
)
@click.option("--repeat", type=int, default=0, show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for requests.parquet, chunks.parquet, requests.csv, provenance.json.",
)
@die_on_manifest_error
def import_export(
    tool: str,
    export: Path,
    config: Path,
    point_id: str,
    class_name: str | None,
    cache_state: str,
    repeat: int,
    output: Path,
) -> None:
    """Import TOOL's per-request EXPORT (AIPerf profile_export.jsonl, or a vllm bench serve
    --save-detailed result JSON) as one point's tables, with their provenance."""
    from capacity_pack.evidence.imports import IMPORTERS, ExportFormatError, write_imported
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.tables import TableValidationError

    pack = load_pack(config)
    try:
        imported = IMPORTERS[tool](
            export,
            workload=pack,
            point=point_id,
            cache_state=cache_state,
            repeat=repeat,
            class_name=class_name,
        )
    except (ExportFormatError, TableValidationError) as err:
        raise Fail(str(err)) from None
    write_imported(imported, output)
    p, window = imported.provenance, imported.summary["measured_window_s"]
    click.echo(
        f"{output}: {p.records} requests from {p.tool} {p.tool_version or '(version unknown)'} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(p.status_counts.items()))}); "
        + (f"measured window {window:.3f} s" if window is not None else "no measured requests")
    )
