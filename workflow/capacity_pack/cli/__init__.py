"""The ``capacity-pack`` command line: the library's functions for use outside Snakemake.

Heavy modules are imported inside each command so that ``capacity-pack --help`` starts fast.
Every command exits non-zero with a message naming the file and field when its input is bad,
writes its outputs atomically, and its console output passes through
:func:`capacity_pack.logs.redact_console`. The group is defined here; its commands live beside it
by what they work on (``pack``, ``measure``, ``failure``, ``results``, ``sizing``; shared:
``common``).
"""

from __future__ import annotations

import click

from capacity_pack.cli.common import Fail
from capacity_pack.cli.failure import alerts, drill
from capacity_pack.cli.measure import import_export, load, shard
from capacity_pack.cli.pack import freeze, init, lint, schedule, schema, trace_sample
from capacity_pack.cli.results import COMPARE_DIFFERS_STATUS, analyze, autopsy, compare, whatif
from capacity_pack.cli.sizing import bandwidth, fit, little, plan


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
            raise Fail(str(err)) from None

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


COMMANDS = (
    schema,
    trace_sample,
    freeze,
    lint,
    schedule,
    load,
    shard,
    init,
    analyze,
    import_export,
    drill,
    alerts,
    autopsy,
    compare,
    plan,
    fit,
    bandwidth,
    little,
    whatif,
)
for command in COMMANDS:
    main.add_command(command)

__all__ = ["COMMANDS", "COMPARE_DIFFERS_STATUS", "LazyGroup", "main"]
