"""The ``capacity-pack`` command line: the library's functions for use outside Snakemake.

Imports of heavy modules (pandas, mlflow, numpy, starlette) happen inside each command so that
``capacity-pack --help`` starts fast. Every command exits non-zero with a message that names the
file and field when its input is bad, and writes its outputs atomically.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


class _Fail(click.ClickException):
    """A user-facing error: printed without a traceback, exit status 1."""


def _die_on_manifest_error(func):
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from capacity_pack.manifest import ManifestError

        try:
            return func(*args, **kwargs)
        except ManifestError as err:
            raise _Fail(str(err)) from None

    return wrapper


class LazyGroup(click.Group):
    """A group whose larger subcommand groups are imported only when invoked."""

    # name -> "module:attribute"; keeps `capacity-pack --help` free of server/engine imports.
    lazy_subcommands = {
        "sim": "capacity_pack.sim.cli:sim",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_subcommands])

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

    from capacity_pack.io import write_text_atomic
    from capacity_pack.manifest import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if output is None:
        click.echo(text, nl=False)
    else:
        write_text_atomic(output, text)


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
    from capacity_pack.io import write_json_atomic
    from capacity_pack.manifest import freeze as do_freeze
    from capacity_pack.manifest import load_pack

    doc = do_freeze(load_pack(config), str(config))
    write_json_atomic(output, doc)
    click.echo(f"{output}: sha256 {doc['sha256']}")


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@_die_on_manifest_error
def lint(config: Path, as_json: bool) -> None:
    """Report benchmark anti-patterns in CONFIG (a pack or a plain benchmark description).

    Exit status 1 when any finding is reported.
    """
    import json

    from capacity_pack.lint import lint_file

    findings = lint_file(config)
    if as_json:
        click.echo(json.dumps([f.model_dump() for f in findings], indent=2))
    elif not findings:
        click.echo(f"{config}: no findings")
    else:
        for f in findings:
            click.echo(f"{config}: {f.code}: {f.message}\n    why: {f.reason}")
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
    from capacity_pack import schedule as sched
    from capacity_pack.manifest import load_pack

    pack = load_pack(config)
    points = sched.points(pack)
    if list_points:
        for p in points:
            click.echo(p.key)
        return
    if point_id is None or output is None:
        raise _Fail("give --point and --output (or --list to see the points)")
    matches = [
        p
        for p in points
        if p.point_id == point_id
        and (cache_state is None or p.cache_state == cache_state)
        and p.repeat == repeat
    ]
    if not matches:
        raise _Fail(
            f"{config}: no point {point_id!r} (cache {cache_state}, repeat {repeat}); "
            f"known: {', '.join(sorted({p.point_id for p in points}))}"
        )
    point = matches[0]
    frame = sched.build_schedule(pack, point, extension_blocks=extension_blocks)
    summary = sched.write_schedule(frame, pack, point, output, output.with_suffix(".json"))
    click.echo(f"{output}: {summary['requests']} requests, {summary['duration_s']:.1f} s")
