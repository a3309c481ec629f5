"""The ``capacity-pack`` command line: the library's functions for use outside Snakemake.

Imports of heavy modules (pandas, mlflow, numpy, starlette) happen inside each command so that
``capacity-pack --help`` starts fast. Every command exits non-zero with a message that names the
file and field when its input is bad, and writes its outputs atomically. What a command writes to
its standard output and error passes through :func:`capacity_pack.logs.redact_console`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


class _Fail(click.ClickException):
    """A user-facing error: printed without a traceback, exit status 1, secrets redacted."""

    def format_message(self) -> str:
        from capacity_pack.redact import redact_text

        return redact_text(self.message)


def _die_on_manifest_error(func):
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from capacity_pack.plan.manifest import ManifestError

        try:
            return func(*args, **kwargs)
        except ManifestError as err:
            raise _Fail(str(err)) from None

    return wrapper


def _stage(name: str):
    """The entry point of pipeline stage ``name`` (capacity_pack.stages), as its rule runs it."""
    from capacity_pack.stages import entry

    return entry(name)


def _lock_options(func):
    """``--no-wait`` and ``--lock-timeout``: what a measurement does when its target is busy."""
    from capacity_pack.measure.lock import DEFAULT_TIMEOUT_S

    func = click.option(
        "--lock-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        help="Seconds to wait for another measurement of the same target to end.",
    )(func)
    return click.option(
        "--no-wait",
        is_flag=True,
        help="Fail at once when another measurement holds the target, instead of waiting.",
    )(func)


def _lock_settings(no_wait: bool, lock_timeout: float):
    from capacity_pack.measure.lock import LockSettings

    try:
        return LockSettings(wait=not no_wait, timeout_s=lock_timeout)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--lock-timeout") from None


def _quiet_log():
    """The logger a stage entry point gets here: the command prints its own lines."""
    import logging

    log = logging.getLogger("capacity_pack.cli.stage")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    log.propagate = False
    return log


class LazyGroup(click.Group):
    """A group whose larger subcommand groups are imported only when invoked."""

    # name -> "module:attribute"; keeps `capacity-pack --help` free of server/engine imports.
    lazy_subcommands = {
        "sim": "capacity_pack.sim.cli:sim",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_subcommands])

    def invoke(self, ctx: click.Context):
        from capacity_pack.errors import StatedError

        # An error the user fixes (a server that does not answer, a bad table row): its one
        # line, no traceback, exit status 1.
        try:
            return super().invoke(ctx)
        except StatedError as err:
            raise _Fail(str(err)) from None

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            import importlib

            module_name, attr = self.lazy_subcommands[cmd_name].split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as err:
                # Only a missing optional group is tolerated, never a broken import inside it.
                if err.name and module_name.startswith(err.name):
                    return None
                raise
            return getattr(module, attr)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="capacity-pack")
def main() -> None:
    """Build defensible inference capacity packs for OpenAI-compatible endpoints."""
    from capacity_pack.logs import redact_console

    # Everything a command prints (messages, warnings, tracebacks, MLflow's lines) is redacted.
    redact_console()


@main.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the schema here instead of standard output.",
)
def schema(output: Path | None) -> None:
    """Write the JSON schema of the pack configuration (for editors)."""
    import json

    from capacity_pack.engines import cache_reset_names
    from capacity_pack.io import write_text_atomic
    from capacity_pack.plan.manifest import json_schema

    schema = json_schema(cache_resets=cache_reset_names())
    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output, text)


@main.command("trace-sample")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(["mooncake", "azure"]))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--rows", type=click.IntRange(min=2), default=300, show_default=True)
@click.option(
    "--seconds", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True
)
@click.option("--seed", type=click.IntRange(min=0), default=20261203, show_default=True)
@click.option(
    "--burstiness",
    type=click.FloatRange(min=0, min_open=True),
    default=1.5,
    show_default=True,
    help="Coefficient of variation of the inter-arrival gaps (1: Poisson).",
)
def trace_sample(
    fmt: str, output: Path, rows: int, seconds: float, seed: int, burstiness: float
) -> None:
    """Write a seeded sample trace in a public layout (mooncake JSONL, azure CSV) to OUTPUT."""
    from capacity_pack.io import file_sha256
    from capacity_pack.plan.trace_samples import write_sample

    write_sample(fmt, output, rows=rows, seconds=seconds, seed=seed, burstiness=burstiness)
    click.echo(f"{output}: {rows} requests over {seconds:g} s, sha256 {file_sha256(output)}")


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Frozen manifest JSON to write.",
)
@_die_on_manifest_error
def freeze(config: Path, output: Path) -> None:
    """Validate CONFIG, refuse mutable revisions, and write its canonical frozen manifest."""
    from capacity_pack.engines import check_cache_reset
    from capacity_pack.io import write_json_atomic
    from capacity_pack.plan.manifest import freeze as do_freeze
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    if problem := check_cache_reset(pack.target):
        raise _Fail(f"{config}: invalid pack configuration: {problem}")
    doc = do_freeze(pack, str(config))
    write_json_atomic(output, doc)
    click.echo(f"{output}: sha256 {doc['sha256']}")


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option(
    "--no-predict",
    is_flag=True,
    help="Skip the preflight prediction (the planned rates run in virtual time).",
)
@_die_on_manifest_error
def lint(config: Path, as_json: bool, no_predict: bool) -> None:
    """Report benchmark anti-patterns in CONFIG (a pack or a plain benchmark description).

    A pack is first validated as `freeze` validates it: what freeze refuses, lint reports.
    Exit status 1 when any finding is reported or the pack is invalid. A pack's planned
    open-loop rates are then predicted in virtual time (capacity_pack.twin.preflight): a
    prediction that no planned rate passes, or that every one does, prints a `warning:` line
    naming the predicted bracket and leaves the exit status alone (a prediction is not an
    anti-pattern); --no-predict skips it.
    """
    import json

    from capacity_pack.engines import check_cache_reset
    from capacity_pack.plan.lint import is_pack_data, lint_data, lint_notes
    from capacity_pack.plan.manifest import load_yaml, unwrap_frozen, validate_pack

    data = unwrap_frozen(load_yaml(config))
    pack = (
        validate_pack(data, str(config)) if isinstance(data, dict) and is_pack_data(data) else None
    )
    if pack is not None and (problem := check_cache_reset(pack.target)):
        raise _Fail(f"{config}: invalid pack configuration: {problem}")
    findings = lint_data(data, str(config))
    notes = lint_notes(pack) if pack is not None else []
    if as_json:
        click.echo(json.dumps([f.model_dump() for f in findings], indent=2))
    elif not findings:
        click.echo(f"{config}: no findings")
    else:
        for f in findings:
            mark = " (extra: not one of the six anti-patterns)" if f.extra else ""
            click.echo(f"{config}: {f.code}{mark}: {f.message}\n    why: {f.reason}")
    if not as_json:
        for note in notes:
            click.echo(f"{config}: note: {note}")
        if pack is not None and not no_predict:
            from capacity_pack.twin.preflight import lint_warnings

            for line in lint_warnings(pack):
                click.echo(f"{config}: {line}")
    if findings:
        sys.exit(1)


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--list", "list_points", is_flag=True, help="List the pack's schedule points.")
@click.option("--point", "point_id", default=None, help="Point id, e.g. open-r16, closed-c8.")
@click.option("--cache-state", type=click.Choice(["cold", "warm"]), default=None)
@click.option("--repeat", type=int, default=0, show_default=True)
@click.option(
    "--extension-blocks",
    type=int,
    default=0,
    show_default=True,
    help="Append this many extension blocks from the same seeded stream.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Schedule parquet to write (a .json summary is written beside it).",
)
@_die_on_manifest_error
def schedule(
    config: Path,
    list_points: bool,
    point_id: str | None,
    cache_state: str | None,
    repeat: int,
    extension_blocks: int,
    output: Path | None,
) -> None:
    """Generate the seeded arrival schedule of one measurement point of CONFIG."""
    from capacity_pack.plan import schedule as sched
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    points = sched.points(pack)
    if list_points:
        for p in points:
            click.echo(p.key)
        return
    if point_id is None or output is None:
        raise _Fail("give --point and --output (or --list to see the points)")
    matches = sched.match_points(pack, point_id, cache_state, repeat)
    if not matches:
        raise _Fail(
            f"{config}: no point {point_id!r} (cache {cache_state}, repeat {repeat}); "
            f"known: {', '.join(sorted({p.point_id for p in points}))}"
        )
    point = matches[0]
    summary = _stage("schedule")(
        inputs=sched.ScheduleInputs.for_point(pack, point),
        point=point.point_id,
        cache_state=point.cache_state,
        repeat=point.repeat,
        schedule=output,
        summary=output.with_suffix(".json"),
        log=_quiet_log(),
        extension_blocks=extension_blocks,
    )
    click.echo(f"{output}: {summary['requests']} requests, {summary['duration_s']:.1f} s")


@main.command()
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
@_lock_options
@_die_on_manifest_error
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
        summary = _stage("sweep")(
            inputs=SweepInputs.for_point(pack, point),
            point=point.point_id,
            cache_state=point.cache_state,
            repeat=point.repeat,
            schedule=frame,
            records=output / files["records"],
            summary=output / files["summary"],
            log=_quiet_log(),
            progress=progress,
            lock=_lock_settings(no_wait, lock_timeout),
        )
    except (TargetBusy, LockError) as err:
        raise _Fail(str(err)) from None
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


@main.command()
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
        raise _Fail(str(err)) from None
    late = summary["dispatch_lateness_ms"]["p99"]
    click.echo(
        f"shard {summary['shard']}/{summary['shards']}: {summary['requests_recorded']} "
        f"recorded, {summary['failed']} failed, lateness p99 "
        + (f"{late:.3f} ms" if late is not None else "n/a")
    )


@main.command()
@click.option("--url", required=True, help="The server's base URL, e.g. http://127.0.0.1:8000.")
@click.option(
    "--api-key-env",
    default=None,
    help="Name of the environment variable holding the API key (the key itself never).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("pack.yaml"),
    show_default=True,
)
@click.option("--name", default=None, help="pack.name (default: from the model and engine).")
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists.")
def init(url: str, api_key_env: str | None, output: Path, name: str | None, force: bool) -> None:
    """Probe a running server and write a pack skeleton for it.

    Asks the server (GET only, plus one POST /tokenize of a short text) for its models, engine
    and version, /metrics, /tokenize and prefix-cache reset, and writes OUTPUT: what it found,
    as commented YAML, and null where only you can decide (the SLO cutoffs; the model revision
    and precision when the server does not report them). `capacity-pack lint OUTPUT` names
    what is left.
    """
    import os

    from capacity_pack.engines.http import auth_headers
    from capacity_pack.engines.onboard import skeleton, survey
    from capacity_pack.io import write_text_atomic
    from capacity_pack.redact import watch_env

    if output.exists() and not force:
        raise _Fail(f"{output} exists: choose another --output, or --force to overwrite it")
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise _Fail(f"--api-key-env {api_key_env}: no such variable in this environment")
        watch_env(api_key_env)
    found = survey(url, auth_headers(key))
    write_text_atomic(output, skeleton(found, api_key_env=api_key_env, name=name))
    click.echo(f"wrote {output}: {found.engine_name or 'unknown engine'} serving {found.model}")
    for line in (found.metrics_note, found.tokenize_note, found.reset_note, *found.notes):
        click.echo(f"  {line}")
    click.echo("still yours to decide: " + ", ".join(found.todo))
    click.echo(f"then: capacity-pack lint {output}")


@main.command()
@click.argument("requests_csv", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("duration_seconds", type=float)
@click.argument("queue_trend")
@click.option(
    "--manifest",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=(
        "Take classes, cutoffs and gates from this pack (default: interactive 500/40 ms, 128 "
        "tokens; long_context 2500/50 ms, 256; generation_heavy 800/45 ms, 1024; gates 0.95 "
        "attainment, 2,000 successes per class, 1% errors)."
    ),
)
def analyze(
    requests_csv: Path, duration_seconds: float, queue_trend: str, manifest: Path | None
) -> None:
    """Per-class SLO report and capacity gate of a requests.csv (prints JSON).

    REQUESTS_CSV has columns request_id, class, ttft_ms, tpot_ms, e2e_ms, output_tokens, status,
    and optionally output_tokens_expected (each row's scheduled output length, which a
    successful row must match; a pack's own requests.csv has it);
    DURATION_SECONDS is the whole cohort's window; QUEUE_TREND is flat or growing. A successful
    request passes when its TTFT and TPOT are within its class's cutoffs; a class passes with
    attainment >= the gate over at least the minimum successful rows; the capacity gate also
    needs the global error rate within its cap and a flat queue. Percentiles are nearest-rank;
    P99 is withheld for a class with fewer successful rows than its sample gate (10,000).

    The JSON report holds counts, error rate, goodput and throughputs, the gate verdicts,
    and per class its counts, attainment and percentiles.
    """
    # Also answered without this module (capacity_pack.quick_commands) when no option is given.
    from capacity_pack.quick_commands import analyze_json

    click.echo(analyze_json(requests_csv, duration_seconds, queue_trend, manifest))


@main.command("import")
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
@_die_on_manifest_error
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
        raise _Fail(str(err)) from None
    write_imported(imported, output)
    p, window = imported.provenance, imported.summary["measured_window_s"]
    click.echo(
        f"{output}: {p.records} requests from {p.tool} {p.tool_version or '(version unknown)'} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(p.status_counts.items()))}); "
        + (f"measured window {window:.3f} s" if window is not None else "no measured requests")
    )


def _check_twin(profile: Path, validation: Path) -> None:
    """Refuse, in one line, a --twin pair that is not a calibrated profile and its validation."""
    import json

    from capacity_pack.sim.profile import ProfileError, load_profile

    try:
        load_profile(profile)
    except ProfileError as err:
        first, *problems = str(err).splitlines()
        listed = "; ".join(p.strip().removeprefix("- ") for p in problems)
        raise _Fail(f"--twin PROFILE: {first} {listed}".strip()) from None
    try:
        doc = json.loads(validation.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _Fail(f"--twin VALIDATION {validation}: not JSON ({err})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("trusted"), bool):
        raise _Fail(
            f"--twin VALIDATION {validation}: not a twin validation (expected the JSON object "
            "of results/<pack>/twin/validation.json, with `trusted` true or false)"
        )


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--drill", "name", required=True, help="Drill name from the pack's failure section.")
@click.option(
    "--capacity",
    "capacity_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="capacity.json whose selected point sets the rate (else failure.rate_rps).",
)
@click.option(
    "--report",
    "report_paths",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="slo-report.json of the capacity point (its in-flight count sets admission control).",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="plan.json whose required_replicas the plan drill (plan_replica_kill) runs.",
)
@click.option(
    "--twin",
    "twin_paths",
    nargs=2,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="PROFILE VALIDATION",
    help="The pack's calibrated twin (results/<pack>/twin/profile.yaml and validation.json): "
    "a real target's plan drill too large to run live is predicted on it when its validation "
    "trusts it.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the drill's records, scrapes, events, drill.json, drill-report.json and "
    "timeline.png.",
)
@_lock_options
@_die_on_manifest_error
def drill(
    config: Path,
    name: str,
    capacity_path: Path | None,
    report_paths: tuple[Path, ...],
    plan_path: Path | None,
    twin_paths: tuple[Path, Path] | None,
    output: Path,
    no_wait: bool,
    lock_timeout: float,
) -> None:
    """Run one failure drill of CONFIG and write its failure-test fields (drill-report.json).

    The drill holds its target as a measured point does (see ``load``: --no-wait).
    """
    from capacity_pack.drills.analyze import DrillAnalysisSpec
    from capacity_pack.drills.plan import DrillError, DrillInputs, DrillNumbers
    from capacity_pack.drills.queries import DashboardError
    from capacity_pack.measure.lock import LockError, TargetBusy
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.stages import STAGES

    pack = load_pack(config)
    log = _quiet_log()
    drill_json = output / STAGES["failure_drill"].outputs["drill"]
    profile, validation = twin_paths or (None, None)
    absent = None
    if twin_paths is None:
        from capacity_pack.twin.calibrate import twin_absent_reason

        absent = twin_absent_reason(pack) or "none given (--twin PROFILE VALIDATION)"
    else:
        _check_twin(*twin_paths)
    try:
        inputs = DrillInputs.for_drill(pack, name, absent)
        _stage("failure_drill")(
            inputs=inputs,
            numbers=DrillNumbers.from_files(inputs, capacity_path, report_paths, plan_path),
            drill=drill_json,
            log=log,
            lock=_lock_settings(no_wait, lock_timeout),
            twin_profile=profile,
            twin_validation=validation,
        )
        rules = output / "alert-rules.yaml"
        _stage("dashboard")(inputs=pack, rules=rules, log=log)
        report = _stage("failure_analyze")(
            spec=DrillAnalysisSpec.of(pack),
            drill=drill_json,
            rules=rules,
            report=output / STAGES["failure_analyze"].outputs["report"],
            timeline=output / STAGES["failure_analyze"].outputs["timeline"],
            log=log,
        )
    except (DrillError, DashboardError, TargetBusy, LockError) as err:
        raise _Fail(str(err)) from None
    if report.get("skipped"):
        click.echo(f"{name}: skipped: {report['skipped']}")
        return
    if report.get("n_plus_one"):
        click.echo(f"{name} ({report['execution']}): {report['n_plus_one']['sentence']}")
    click.echo(
        f"{name}: injected at {report['injection_time_s']:.2f} s, alerts fired "
        f"{', '.join(report['alerts_fired']) or 'none'}; expected alert fired: "
        f"{report['expected_alert_fired']}; recovery at {report['recovery_time_s']} s"
    )


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the Prometheus alerting rules here.",
)
@click.option(
    "--dashboard",
    "dashboard_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the Grafana dashboard JSON here.",
)
@_die_on_manifest_error
def alerts(config: Path, rules_path: Path, dashboard_path: Path | None) -> None:
    """Alert rules (and a Grafana dashboard) for CONFIG's engine, workload and gates."""
    from capacity_pack.drills.queries import DashboardError
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    try:
        omitted = _stage("dashboard")(
            inputs=pack, rules=rules_path, dashboard_path=dashboard_path, log=_quiet_log()
        )
    except DashboardError as err:
        raise _Fail(str(err)) from None
    for o in omitted:
        click.echo(f"left out: {o['alert']} ({o['scope']}): {o['reason']}", err=True)
    click.echo(f"{rules_path}" + (f", {dashboard_path}" if dashboard_path else ""))


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--results",
    "results_root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Results root holding <pack name>/ and mlflow.db.",
)
@click.option(
    "--log-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path(".snakemake/log"),
    show_default=True,
    help="Snakemake's main logs of the run.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write autopsy.md here (and autopsy.json beside it).",
)
@_die_on_manifest_error
def autopsy(config: Path, results_root: Path, log_dir: Path, output: Path) -> None:
    """Performance autopsy of CONFIG's last measuring run: where the wall clock and each SLO
    miss went."""
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    results = results_root / pack.pack.name
    if not results.is_dir():
        raise _Fail(f"{results}: no results for pack {pack.pack.name!r}; run the pipeline first")
    _stage("autopsy")(
        pack=pack,
        results_dir=results,
        log_dir=log_dir,
        repo_dir=Path.cwd(),
        markdown=output,
        json_path=output.with_suffix(".json"),
        log=_quiet_log(),
    )
    click.echo(f"{output}, {output.with_suffix('.json')}")


#: ``compare --exit-code``: the status when a difference exceeds run-to-run variation (1 is an
#: error, 2 a usage error).
COMPARE_DIFFERS_STATUS = 3


@main.command()
@click.argument("pack_a")
@click.argument("pack_b")
@click.option(
    "--tracking-uri",
    default=None,
    help="MLflow store of mlflow:<run id> sources (default: $MLFLOW_TRACKING_URI, else "
    "results/mlflow.db here).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the Markdown here instead of standard output.",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a self-contained HTML page here.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the comparison as JSON here.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1, max_open=True),
    default=0.95,
    show_default=True,
    help="Family-wise confidence of the attainment and latency tests.",
)
@click.option(
    "--exit-code",
    is_flag=True,
    help=f"Exit {COMPARE_DIFFERS_STATUS} when a difference exceeds run-to-run variation.",
)
def compare(
    pack_a: str,
    pack_b: str,
    tracking_uri: str | None,
    output: Path | None,
    html_path: Path | None,
    json_path: Path | None,
    confidence: float,
    exit_code: bool,
) -> None:
    """Compare pack B against pack A and say whether they differ beyond run-to-run variation.

    PACK_A and PACK_B are results folders (results/<pack> or its pack/ subfolder) or MLflow
    parent runs (mlflow:<run id>). The capacity per cache state, each class's attainment and P95
    latencies at the rates both measured, the plan, the drills and the manifest fields that
    differ, with the verdict on the first line; the method is in docs/metrics.md.
    """
    from capacity_pack.decide.compare import run_compare

    text, doc = run_compare(
        pack_a,
        pack_b,
        tracking=tracking_uri,
        confidence=confidence,
        markdown=output,
        html_path=html_path,
        json_path=json_path,
    )
    if output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"{doc['summary']}\n{output}" + (f", {html_path}" if html_path else ""))
    if exit_code and doc["beyond"]:
        sys.exit(COMPARE_DIFFERS_STATUS)


def _echo_json(obj) -> None:
    import json

    click.echo(json.dumps(obj, indent=2, sort_keys=True))


def _sizing_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError as err:
        raise _Fail(str(err)) from None


@main.command()
@click.option("--peak-rps", type=float, required=True, help="Forecast peak load (RPS).")
@click.option(
    "--capacity-per-replica",
    type=float,
    required=True,
    help="SLO-compliant capacity of one replica (RPS).",
)
@click.option("--target-utilization", type=float, required=True, help="e.g. 0.75")
@click.option("--gpus-per-replica", type=int, required=True)
@click.option(
    "--redundancy", type=int, default=0, show_default=True, help="N+k: replicas added for failures."
)
@click.option(
    "--warm-pool",
    type=int,
    default=0,
    show_default=True,
    help="Replicas kept warm for cold starts.",
)
def plan(
    peak_rps: float,
    capacity_per_replica: float,
    target_utilization: float,
    gpus_per_replica: int,
    redundancy: int,
    warm_pool: int,
) -> None:
    """Replicas and GPUs for a peak load with headroom (prints JSON)."""
    from capacity_pack.decide.sizing import plan_replicas

    result = _sizing_call(
        plan_replicas,
        peak_rps,
        capacity_per_replica,
        target_utilization,
        gpus_per_replica,
        redundancy_replicas=redundancy,
        warm_pool_replicas=warm_pool,
    )
    _echo_json(result.model_dump())


@main.command()
@click.option("--memory-gb", type=float, required=True, help="Accelerator memory.")
@click.option("--margin-gb", type=float, required=True, help="Declared margin.")
@click.option("--weights-gb", type=float, required=True)
@click.option("--kv-gb", type=float, required=True, help="KV cache at the target context/batch.")
@click.option("--overhead-gb", type=float, required=True, help="Runtime overhead.")
def fit(
    memory_gb: float, margin_gb: float, weights_gb: float, kv_gb: float, overhead_gb: float
) -> None:
    """Fit probe: does weights + KV + overhead fit in memory - margin? (prints JSON)"""
    from capacity_pack.decide.sizing import fit_probe

    _echo_json(
        _sizing_call(fit_probe, memory_gb, margin_gb, weights_gb, kv_gb, overhead_gb).model_dump()
    )


@main.command()
@click.option(
    "--bytes-per-token-gb", type=float, required=True, help="Bytes moved per generated token (GB)."
)
@click.option(
    "--effective-bandwidth-gbps",
    type=float,
    required=True,
    help="Measured effective bandwidth (GB/s).",
)
@click.option("--spec-bandwidth-gbps", type=float, default=None, help="Vendor spec (GB/s).")
def bandwidth(
    bytes_per_token_gb: float, effective_bandwidth_gbps: float, spec_bandwidth_gbps: float | None
) -> None:
    """Decode tokens/s from effective bandwidth, and MBU (prints JSON)."""
    from capacity_pack.decide.sizing import bandwidth as compute

    _echo_json(
        _sizing_call(
            compute, bytes_per_token_gb, effective_bandwidth_gbps, spec_bandwidth_gbps
        ).model_dump()
    )


@main.command()
@click.option("--rate", type=float, required=True, help="Arrival/completion rate (per s).")
@click.option("--mean-seconds", type=float, required=True, help="Mean time in system (s).")
def little(rate: float, mean_seconds: float) -> None:
    """Little's Law: average in flight = rate x mean time (prints JSON)."""
    from capacity_pack.decide.sizing import little_in_flight

    _echo_json(
        {
            "rate": rate,
            "mean_seconds": mean_seconds,
            "average_in_flight": _sizing_call(little_in_flight, rate, mean_seconds),
        }
    )


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--mix",
    "mix_items",
    multiple=True,
    metavar="CLASS=SHARE",
    help="A class's new share; the other classes keep their relative shares. Repeatable.",
)
@click.option("--replicas", type=int, default=None, help="Run the fleet with this many replicas.")
@click.option("--max-num-seqs", type=int, default=None, help="The engine's running-sequence cap.")
@click.option(
    "--max-num-batched-tokens", type=int, default=None, help="The engine's token budget per step."
)
@click.option(
    "--rate",
    "rates",
    type=float,
    multiple=True,
    help="Predict these open-loop rates (RPS) instead of the capacity bracket. Repeatable.",
)
@click.option(
    "--cache-state",
    "cache_states",
    type=click.Choice(["cold", "warm"]),
    multiple=True,
    help="Only these cache states (default: the pack's).",
)
@click.option(
    "--profile",
    default=None,
    help="Engine model to predict on (profile name or YAML); default: the pack's calibrated "
    "twin (results/<pack>/twin/profile.yaml), else a simulated target's own profile.",
)
@click.option(
    "--results",
    "results_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
    help="Results root holding <pack name>/twin/.",
)
@click.option(
    "--allow-untrusted",
    is_flag=True,
    help="Predict with a twin whose validation error exceeds its tolerance (labelled so).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@_die_on_manifest_error
def whatif(
    config: Path,
    mix_items: tuple[str, ...],
    replicas: int | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    rates: tuple[float, ...],
    cache_states: tuple[str, ...],
    profile: str | None,
    results_root: Path,
    allow_untrusted: bool,
    as_json: bool,
) -> None:
    """Ask the twin what CONFIG's pack would show with one thing changed: a prediction in
    virtual time, printed next to the twin's validation error."""
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.twin.whatif import Changes, answer, answer_lines, find_twin, parse_mix

    pack = load_pack(config)
    changes = Changes(
        mix=parse_mix(mix_items),
        replicas=replicas,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    twin = find_twin(pack, results_root / pack.pack.name, profile)
    if twin.trusted is False and not allow_untrusted:
        raise _Fail(
            f"{twin.words()}: an untrusted twin's predictions are not used; "
            "--allow-untrusted prints them anyway, labelled"
        )
    doc = answer(pack, changes, twin, rates=list(rates), cache_states=list(cache_states))
    if as_json:
        _echo_json(doc)
        return
    for line in answer_lines(doc):
        click.echo(line)
