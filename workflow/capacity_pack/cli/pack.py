"""Commands on a pack's configuration before anything is measured: its JSON schema, a skeleton
from a running server, the lint, the frozen manifest, a point's schedule and sample traces."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from capacity_pack.cli.common import Fail, die_on_manifest_error, quiet_log, stage_entry


@click.command()
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the schema here instead of standard output.",
)
@click.option(
    "--artifact",
    # capacity_pack.artifacts.ARTIFACTS' names, written out so that --help imports no pydantic
    # model (test_artifacts exports every one of them through this option).
    type=click.Choice(
        ["slo-report", "capacity", "plan", "failure-test", "twin-prediction", "twin-validation"]
    ),
    default=None,
    help="The schema of this artifact file (capacity_pack.artifacts) instead of the pack's.",
)
def schema(output: Path | None, artifact: str | None) -> None:
    """Write the JSON schema of the pack configuration (for editors), or of an artifact."""
    import json

    from capacity_pack.engines import cache_reset_names
    from capacity_pack.io import write_text_atomic
    from capacity_pack.plan.manifest import json_schema

    if artifact is not None:
        from capacity_pack.artifacts import ARTIFACTS

        schema = ARTIFACTS[artifact].model_json_schema()
    else:
        schema = json_schema(cache_resets=cache_reset_names())
    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output, text)


@click.command("trace-sample")
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


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Frozen manifest JSON to write.",
)
@die_on_manifest_error
def freeze(config: Path, output: Path) -> None:
    """Validate CONFIG, refuse mutable revisions, and write its canonical frozen manifest."""
    from capacity_pack.engines import check_cache_reset
    from capacity_pack.io import write_json_atomic
    from capacity_pack.plan.manifest import freeze as do_freeze
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    if problem := check_cache_reset(pack.target):
        raise Fail(f"{config}: invalid pack configuration: {problem}")
    doc = do_freeze(pack, str(config))
    write_json_atomic(output, doc)
    click.echo(f"{output}: sha256 {doc['sha256']}")


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option(
    "--no-predict",
    is_flag=True,
    help="Skip the preflight prediction (the planned rates run in virtual time).",
)
@die_on_manifest_error
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
        raise Fail(f"{config}: invalid pack configuration: {problem}")
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


@click.command()
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
@die_on_manifest_error
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
        raise Fail("give --point and --output (or --list to see the points)")
    matches = sched.match_points(pack, point_id, cache_state, repeat)
    if not matches:
        raise Fail(
            f"{config}: no point {point_id!r} (cache {cache_state}, repeat {repeat}); "
            f"known: {', '.join(sorted({p.point_id for p in points}))}"
        )
    point = matches[0]
    summary = stage_entry("schedule")(
        inputs=sched.ScheduleInputs.for_point(pack, point),
        point=point.point_id,
        cache_state=point.cache_state,
        repeat=point.repeat,
        schedule=output,
        summary=output.with_suffix(".json"),
        log=quiet_log(),
        extension_blocks=extension_blocks,
    )
    click.echo(f"{output}: {summary['requests']} requests, {summary['duration_s']:.1f} s")


@click.command()
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
        raise Fail(f"{output} exists: choose another --output, or --force to overwrite it")
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise Fail(f"--api-key-env {api_key_env}: no such variable in this environment")
        watch_env(api_key_env)
    found = survey(url, auth_headers(key))
    write_text_atomic(output, skeleton(found, api_key_env=api_key_env, name=name))
    click.echo(f"wrote {output}: {found.engine_name or 'unknown engine'} serving {found.model}")
    for line in (found.metrics_note, found.tokenize_note, found.reset_note, *found.notes):
        click.echo(f"  {line}")
    click.echo("still yours to decide: " + ", ".join(found.todo))
    click.echo(f"then: capacity-pack lint {output}")
