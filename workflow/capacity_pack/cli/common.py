"""What the commands of ``capacity-pack`` share: the user-facing error, the manifest-error
guard, a stage's entry point, the target lock's options and the console JSON."""

from __future__ import annotations

import click


class Fail(click.ClickException):
    """A user-facing error: printed without a traceback, exit status 1, secrets redacted."""

    def format_message(self) -> str:
        from capacity_pack.redact import redact_text

        return redact_text(self.message)


def die_on_manifest_error(func):
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from capacity_pack.plan.manifest import ManifestError

        try:
            return func(*args, **kwargs)
        except ManifestError as err:
            raise Fail(str(err)) from None

    return wrapper


def stage_entry(name: str):
    """The entry point of pipeline stage ``name`` (capacity_pack.stages), as its rule runs it."""
    from capacity_pack.stages import entry

    return entry(name)


def lock_options(func):
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


def lock_settings(no_wait: bool, lock_timeout: float):
    from capacity_pack.measure.lock import LockSettings

    try:
        return LockSettings(wait=not no_wait, timeout_s=lock_timeout)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--lock-timeout") from None


def quiet_log():
    """The logger a stage entry point gets here: the command prints its own lines."""
    import logging

    log = logging.getLogger("capacity_pack.cli.stage")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    log.propagate = False
    return log


def echo_json(obj) -> None:
    import json

    click.echo(json.dumps(obj, indent=2, sort_keys=True))
