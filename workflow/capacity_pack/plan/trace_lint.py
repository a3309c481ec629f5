"""What lint says of a verbatim trace pack (``client.trace.replay: verbatim``).

A verbatim trace point sends the trace's rows and no more, at its own rate: the sample-size
quota ``client.initial_scheduled_requests`` and the extension blocks do not apply, so the
``too-few-requests`` and ``undecidable-gate`` findings, computed from them, are not made for
it (:mod:`capacity_pack.plan.lint`). Instead, per declared time scale s, the requests of each
class in its measured window, n_c(s) = #{rows of class c: s x t_i >= client.warmup_seconds},
are compared with max(acceptance.min_successful_samples_per_class, N), N the fewest successful
requests that can pass the attainment gate (:func:`capacity_pack.binomial.min_samples_to_pass`).
A class below it is a note, which refuses nothing: the trace is what it is, and its points are
labelled ``inconclusive`` (under-sampled, with why) rather than extended. The notes also say that
no boundary search bisects these points: their rates are the trace's own.
"""

from __future__ import annotations

from capacity_pack.binomial import min_samples_to_pass
from capacity_pack.plan.manifest import Pack
from capacity_pack.plan.traces import verbatim_rates


def measured_class_rows(pack: Pack) -> dict[float, dict[str, int]]:
    """n_c(s): each time scale's measured requests per class."""
    spec = pack.client.trace
    assert spec is not None
    trace = spec.arrivals(default_class=pack.class_names[0])
    out = {}
    for s in spec.time_scales:
        measured = trace[trace["offset_s"] * s >= pack.client.warmup_seconds]
        out[s] = {c: int((measured["class"] == c).sum()) for c in pack.class_names}
    return out


def verbatim_trace_notes(pack: Pack) -> list[str]:
    if not pack.client.replays_verbatim:
        return []
    spec, a = pack.client.trace, pack.acceptance
    assert spec is not None
    need = min_samples_to_pass(a.class_slo_attainment_min, a.attainment_confidence) or 0
    floor = max(a.min_successful_samples_per_class, need)
    trace = spec.arrivals(default_class=pack.class_names[0])
    rates = dict(zip(spec.time_scales, verbatim_rates(trace, spec.time_scales), strict=True))
    notes = [
        f"client.trace {spec.path}: replayed verbatim at time scales {spec.time_scales} "
        f"(open-loop rates {list(rates.values())} RPS, the trace's own): never extended, never "
        "stopped early, never bisected by a search"
    ]
    for s, counts in measured_class_rows(pack).items():
        short = {c: n for c, n in counts.items() if n < floor}
        if short:
            notes.append(
                f"client.trace at time scale {s:g} ({rates[s]:g} RPS): the measured window "
                f"holds {short} requests, below {floor} (the sample gate "
                f"{a.min_successful_samples_per_class}, or the {need} successes that can pass "
                f"attainment {a.class_slo_attainment_min:g}): those classes will be "
                "inconclusive (under-sampled; a verbatim trace is never extended)"
            )
    return notes
