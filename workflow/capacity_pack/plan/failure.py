"""The failure section: the drills run against N replicas behind a router at the selected
capacity point, one mechanism each, and the plan drill (N+1) on the recommended fleet."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from capacity_pack.plan.section import COMMAND_TIMEOUT_MAX_S, NAME_PATTERN, Section

# The drill kinds a manifest may name, each a module of capacity_pack.drills.kinds that says what
# it injects; that layer sits above this one, so the names are written here too, and
# tests/unit/drills/test_kinds.py keeps them equal to the registry's. The default drills run
# one of each.
DRILL_KINDS = ("replica_kill", "cold_replica", "kv_pressure", "cancellation", "degraded_link")
DrillKind = Literal[DRILL_KINDS]  # the schema enum of failure.drills[].kind


class DrillCommands(Section):
    """What a drill runs against a real target: argv lists, run as given (no shell)."""

    inject: list[str] = Field(
        min_length=1, description="argv run at the injection time, e.g. a kubectl delete pod line."
    )
    restore: list[str] | None = Field(
        default=None, description="argv run when the fault ends (none: the system heals itself)."
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=COMMAND_TIMEOUT_MAX_S,
        allow_inf_nan=False,
        description="Most seconds inject or restore may run (then it is killed, and the drill "
        "records the action as timed out).",
    )


class Drill(Section):
    """One failure drill: one mechanism, its own named experiment (never a combined score)."""

    name: str = Field(
        pattern=NAME_PATTERN, description="Drill name (results/<pack>/failure/<name>)."
    )
    kind: DrillKind = Field(description="The failure mechanism the drill injects.")
    replica: int = Field(default=0, ge=0, description="Replica the fault hits (simulated cluster).")
    inject_at_s: float | None = Field(
        default=None, gt=0, description="Injection time after the load starts (default baseline_s)."
    )
    fault_s: float = Field(
        default=8.0,
        gt=0,
        description="How long a reversible fault (KV, link, cancellations) lasts before the "
        "drill lifts it; a killed replica is restarted by the supervisor instead.",
    )
    kv_capacity_fraction: float = Field(
        default=0.01, gt=0, le=1, description="kv_pressure: share of KV blocks left usable."
    )
    latency_ms: float = Field(
        default=150.0, ge=0, description="degraded_link: one-way latency added to the link."
    )
    bandwidth_bytes_per_s: float = Field(
        default=0.0, ge=0, description="degraded_link: bandwidth cap of the link (0: none)."
    )
    cancel_fraction: float = Field(
        default=0.3, gt=0, le=1, description="cancellation: share of requests the client cancels."
    )
    cancel_after_s: float = Field(
        default=0.3,
        gt=0,
        description="cancellation: seconds after sending that they are cancelled.",
    )
    rate_multiplier: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="Offered rate from the injection on, relative to the drill rate (a "
        "cold_replica drill defaults to (replicas + 1) / replicas: the load that made the "
        "autoscaler add a replica).",
    )
    commands: DrillCommands | None = Field(
        default=None, description="Real targets: the commands that inject (and lift) the fault."
    )


def default_drills() -> list[Drill]:
    return [Drill(name=kind, kind=kind) for kind in DRILL_KINDS]


# The plan drill's name (results/<pack>/failure/<name>); no configured drill may take it.
PLAN_DRILL = "plan_replica_kill"


class PlanDrill(Section):
    """The N+1 check: the replica-kill drill on the planned topology at the planned peak."""

    enabled: bool = Field(
        default=True,
        description="Run it: plan.required_replicas behind the router at plan.peak_rps, one "
        "replica killed at baseline_s, the supervisor's restart as in the other drills.",
    )
    mode: Literal["auto", "live", "virtual"] = Field(
        default="auto",
        description="live: real processes on this host; virtual: the engine model in virtual "
        "time (simulated targets only); auto: live when the plan fits live_max_replicas and "
        "live_max_rps, else virtual (a real target that does not fit is skipped, saying why).",
    )
    # Measured on a 2-core host: the project's router (one Python process relaying every
    # streamed chunk) used 75 % of a core at a steady 60 RPS of ~50-token streams and 100 %
    # after a replica's restart, and then fell behind; at 40 RPS live and virtual drills agree.
    live_max_replicas: int = Field(
        default=2, ge=1, description="auto: the most replicas this host runs live."
    )
    live_max_rps: float = Field(
        default=40.0, gt=0, description="auto: the highest offered rate this host runs live."
    )
    replica: int = Field(default=0, ge=0, description="The replica killed.")
    commands: DrillCommands | None = Field(
        default=None,
        description="A real target the pack does not start: the commands that kill (and bring "
        "back) one replica of the planned fleet, which must be deployed at the plan's size.",
    )

    def drill(self) -> Drill:
        return Drill(
            name=PLAN_DRILL, kind="replica_kill", replica=self.replica, commands=self.commands
        )


class Failure(Section):
    """Failure drills against N replicas behind a router at the selected capacity point (the
    mechanism tests), and the plan drill on the recommended fleet at its peak."""

    replicas: int | None = Field(
        default=None,
        ge=1,
        description="Replicas behind the router in the drill (default: follows the target: "
        "max(2, replicas under test) simulated ones; for a real target the replicas under "
        "test). The drill starts this many simulated replicas, or copies of a managed target's "
        "command.",
    )
    rate_rps: float | None = Field(
        default=None,
        gt=0,
        description="Offered rate of the drill (default: the selected capacity per replica x "
        "replicas, i.e. every replica at its capacity point).",
    )
    fallback_rate_per_replica_rps: float | None = Field(
        default=None,
        gt=0,
        description="Per-replica rate when the sweep selected no capacity point (default: the "
        "lowest tested open-loop rate, labelled so in the report).",
    )
    duration_s: float = Field(default=30.0, gt=0, description="Length of each drill's schedule.")
    baseline_s: float = Field(default=10.0, gt=0, description="Healthy window before injection.")
    warmup_s: float = Field(
        default=2.0, ge=0, description="Start of the baseline window (caches warm up before)."
    )
    window_s: float = Field(default=2.0, gt=0, description="Width of the windowed metrics.")
    scrape_interval_s: float = Field(default=0.5, gt=0, description="Metrics scrape period.")
    health_interval_s: float = Field(
        default=0.25, gt=0, description="Simulated router's health-check period."
    )
    restart_after_s: float | None = Field(
        default=3.0,
        gt=0,
        description="Simulated supervisor: restart a dead replica this long after it is noticed "
        "(none: no restarts, capacity does not return by itself).",
    )
    cold_start_s: float = Field(
        default=4.0,
        ge=0,
        description="Simulated target: seconds a restarted or added replica loads before it "
        "serves (weights and warm-up); the drill's initial replicas are already running.",
    )
    admission_max_outstanding: int | None = Field(
        default=None,
        ge=1,
        description="Router admission limit per healthy replica (default: admission_headroom x "
        "the in-flight requests per replica measured at the capacity point).",
    )
    admission_headroom: float = Field(
        default=2.0,
        ge=1.0,
        description="See above; Poisson bursts at the capacity point reach about 1.5x the mean.",
    )
    drain_timeout_s: float = Field(
        default=60.0, gt=0, description="Most seconds to wait for the last requests to end."
    )
    alert_thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Overrides of the alert thresholds (drills.alerts.AlertThresholds).",
    )
    drills: list[Drill] = Field(default_factory=default_drills, min_length=1)
    plan_drill: PlanDrill = Field(
        default_factory=PlanDrill,
        description="The plan drill: one replica of the recommended fleet killed at its peak.",
    )

    @model_validator(mode="after")
    def _check(self) -> Failure:
        names = [d.name for d in self.drills]
        if len(set(names)) != len(names):
            raise ValueError(f"drill names must be unique: {names}")
        # Only the plan drill itself may carry its name (a drill's inputs hold just that drill).
        if any(d.name == PLAN_DRILL and d != self.plan_drill.drill() for d in self.drills):
            raise ValueError(f"the drill name {PLAN_DRILL!r} is the plan drill's (plan_drill)")
        if not self.warmup_s < self.baseline_s < self.duration_s:
            raise ValueError("need warmup_s < baseline_s < duration_s")
        for d in self.drills:
            if d.inject_at_s is not None and not self.warmup_s < d.inject_at_s < self.duration_s:
                raise ValueError(f"drill {d.name!r}: inject_at_s must lie in the schedule")
        return self

    @property
    def all_drills(self) -> list[Drill]:
        """The capacity-point drills, then the plan drill when it is enabled."""
        return [*self.drills, *([self.plan_drill.drill()] if self.plan_drill.enabled else [])]
