"""Commands of the failure drills: run one drill of a pack, and write its alert rules and
dashboard."""

from __future__ import annotations

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


def _check_twin(profile: Path, validation: Path) -> None:
    """Refuse, in one line, a --twin pair that is not a calibrated profile and its validation."""
    from capacity_pack.artifacts import ArtifactError, TwinValidation
    from capacity_pack.sim.profile import ProfileError, load_profile

    try:
        load_profile(profile)
    except ProfileError as err:
        first, *problems = str(err).splitlines()
        listed = "; ".join(p.strip().removeprefix("- ") for p in problems)
        raise Fail(f"--twin PROFILE: {first} {listed}".strip()) from None
    try:
        TwinValidation.read(validation)
    except ArtifactError as err:
        raise Fail(
            f"--twin VALIDATION {err} (expected results/<pack>/twin/validation.json)"
        ) from None


# Over 80 lines only with its options: a click command's options are its signature.
@click.command()
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
@lock_options
@die_on_manifest_error
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
    from capacity_pack.drills.render import alerts_fired_text, expected_alert_text
    from capacity_pack.measure.lock import LockError, TargetBusy
    from capacity_pack.plan.manifest import load_pack
    from capacity_pack.stages import STAGES

    pack = load_pack(config)
    log = quiet_log()
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
        stage_entry("failure_drill")(
            inputs=inputs,
            numbers=DrillNumbers.from_files(inputs, capacity_path, report_paths, plan_path),
            drill=drill_json,
            log=log,
            lock=lock_settings(no_wait, lock_timeout),
            twin_profile=profile,
            twin_validation=validation,
        )
        rules = output / "alert-rules.yaml"
        stage_entry("dashboard")(inputs=pack, rules=rules, log=log)
        report = stage_entry("failure_analyze")(
            spec=DrillAnalysisSpec.of(pack),
            drill=drill_json,
            rules=rules,
            report=output / STAGES["failure_analyze"].outputs["report"],
            timeline=output / STAGES["failure_analyze"].outputs["timeline"],
            log=log,
        )
    except (DrillError, DashboardError, TargetBusy, LockError) as err:
        raise Fail(str(err)) from None
    if report.get("skipped"):
        click.echo(f"{name}: skipped: {report['skipped']}")
        return
    if report.get("n_plus_one"):
        click.echo(f"{name} ({report['execution']}): {report['n_plus_one']['sentence']}")
    click.echo(
        f"{name}: injected at {report['injection_time_s']:.2f} s, alerts fired "
        f"{alerts_fired_text(report)}; expected alert fired: "
        f"{expected_alert_text(report)}; recovery at {report['recovery_time_s']} s"
    )


@click.command()
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
@die_on_manifest_error
def alerts(config: Path, rules_path: Path, dashboard_path: Path | None) -> None:
    """Alert rules (and a Grafana dashboard) for CONFIG's engine, workload and gates."""
    from capacity_pack.drills.queries import DashboardError
    from capacity_pack.plan.manifest import load_pack

    pack = load_pack(config)
    try:
        omitted = stage_entry("dashboard")(
            inputs=pack, rules=rules_path, dashboard_path=dashboard_path, log=quiet_log()
        )
    except DashboardError as err:
        raise Fail(str(err)) from None
    for o in omitted:
        click.echo(f"left out: {o['alert']} ({o['scope']}): {o['reason']}", err=True)
    click.echo(f"{rules_path}" + (f", {dashboard_path}" if dashboard_path else ""))
