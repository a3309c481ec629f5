"""The sizing calculators: replicas for a peak, the memory fit probe, decode bandwidth and
Little's Law, each printing JSON (:mod:`capacity_pack.decide.sizing`)."""

from __future__ import annotations

import click

from capacity_pack.cli.common import Fail, echo_json


def _sizing_call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ValueError as err:
        raise Fail(str(err)) from None


@click.command()
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
    echo_json(result.model_dump())


@click.command()
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

    echo_json(
        _sizing_call(fit_probe, memory_gb, margin_gb, weights_gb, kv_gb, overhead_gb).model_dump()
    )


@click.command()
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

    echo_json(
        _sizing_call(
            compute, bytes_per_token_gb, effective_bandwidth_gbps, spec_bandwidth_gbps
        ).model_dump()
    )


@click.command()
@click.option("--rate", type=float, required=True, help="Arrival/completion rate (per s).")
@click.option("--mean-seconds", type=float, required=True, help="Mean time in system (s).")
def little(rate: float, mean_seconds: float) -> None:
    """Little's Law: average in flight = rate x mean time (prints JSON)."""
    from capacity_pack.evidence.statistics import little_in_flight

    echo_json(
        {
            "rate": rate,
            "mean_seconds": mean_seconds,
            "average_in_flight": _sizing_call(little_in_flight, rate, mean_seconds),
        }
    )
