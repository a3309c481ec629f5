"""Preflight prediction: a pack's planned open-loop points, and its capacity bracket, in virtual
time before anything is measured.

A simulated target is predicted on its own profile, a real one only on a profile given to
:func:`preflight` (else ``unavailable``). Every planned rate and cache state is judged by
:func:`capacity_pack.twin.virtual_point.predict_point`; the bracket is the open-loop search
(:func:`capacity_pack.decide.search.rate_step`) on predicted statuses down to the resolution
(:func:`capacity_pack.decide.bracket.resolution_of`, :data:`DEFAULT_RESOLUTION_REL` without a
search), reaching from :data:`capacity_pack.plan.limits.MIN_OPEN_LOOP_RPS` to :data:`UP_FACTOR`
x the highest planned rate. Findings: no planned rate predicted to pass, or every one.

Method: docs/twin.md, "Preflight prediction".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from capacity_pack.decide.bracket import bracket, meets_gates, resolution_of
from capacity_pack.decide.search import SearchInputs, rate_step
from capacity_pack.io import sha256_of_obj
from capacity_pack.plan.limits import MIN_OPEN_LOOP_RPS
from capacity_pack.plan.manifest import Pack, SimTarget
from capacity_pack.twin.control import long_run_bracket
from capacity_pack.twin.virtual_point import (
    DEFAULT_MAX_REQUESTS,
    PointPrediction,
    VirtualPointError,
    predict_point,
)
from capacity_pack.vocab.words import bracket_text

#: The bracket's relative resolution for a pack without ``sweep.search``.
DEFAULT_RESOLUTION_REL = 0.1
#: The predicted search goes up to this many times the highest planned rate.
UP_FACTOR = 64
#: At most this many rates beyond the planned ones are predicted per cache state.
MAX_PROBES = 16
FORMAT = "capacity-pack/preflight/v1"


@dataclass(frozen=True)
class PredictedBracket:
    """A cache state's predicted capacity bracket [pass_rps, fail_rps) and how it was found."""

    cache_state: str
    pass_rps: float | None
    fail_rps: float | None
    resolution_rps: float | None
    why: str
    probes: tuple[PointPrediction, ...] = ()
    #: Where the bracket is centred on the model's long-run boundary (``long_run``): that
    #: boundary and the (rate, worst-class long-run attainment) pairs it was found from.
    boundary_rps: float | None = None
    long_run: tuple[tuple[float, float], ...] = ()

    def text(self) -> str:
        """The bracket in words (:func:`capacity_pack.vocab.words.bracket_text`), with why an
        end is missing: ``[0.5, 0.56) RPS``, ``below 0.001 RPS (no predicted rate passes)``,
        ``at least 64 RPS (every predicted rate passes)``."""
        text = bracket_text(self.pass_rps, self.fail_rps)
        if self.pass_rps is None and self.fail_rps is not None:
            return f"{text} (no predicted rate passes)"
        if self.fail_rps is None and self.pass_rps is not None:
            return f"{text} (every predicted rate passes)"
        return text

    def inside(self, low: float, high: float) -> bool:
        """Whether both ends of the bracket lie within [low, high]."""
        return (
            self.pass_rps is not None
            and self.fail_rps is not None
            and low <= self.pass_rps
            and self.fail_rps <= high
        )


@dataclass(frozen=True)
class Preflight:
    """The preflight prediction of a pack (see the module docstring)."""

    pack: str
    profile: str | None
    profile_sha256: str | None
    max_requests: int | None
    points: tuple[PointPrediction, ...] = ()
    brackets: tuple[PredictedBracket, ...] = ()
    findings: tuple[str, ...] = ()
    unavailable: str | None = None
    cpu_s: float = 0.0
    method: str = field(
        default=(
            "each planned open-loop point's seeded schedule run in virtual time on the engine "
            "model's fleet (capacity_pack.sim.fleet) and judged by the per-point analysis; "
            "the bracket by the open-loop search on the predicted statuses; no client "
            "lateness, no network, no extension blocks"
        )
    )

    def bracket_of(self, cache_state: str) -> PredictedBracket | None:
        return next((b for b in self.brackets if b.cache_state == cache_state), None)

    def to_dict(self) -> dict[str, Any]:
        doc = {"format": FORMAT, **asdict(self)}
        doc["points"] = [p.to_dict() for p in self.points]
        for b, entry in zip(self.brackets, doc["brackets"], strict=True):
            entry["probes"] = [p.to_dict() for p in b.probes]
            entry["text"] = b.text()
        return doc


def planned_rates(pack: Pack) -> list[float]:
    """The pack's planned open-loop rates: ``sweep.open_loop_rps``, or round 1 of its search
    (none for ``initial: auto``, which comes from the closed loop)."""
    return sorted(pack.sweep.search_initial_rps or pack.sweep.open_loop_rps or [])


def target_profile(pack: Pack, profile: Any = None) -> tuple[Any, str] | None:
    """(profile, its name or path) to predict on: ``profile`` (a Profile, a shipped name or a
    YAML path) when given, else a simulated target's own; None for a real target without one."""
    from capacity_pack.sim.profile import Profile, load_profile

    if isinstance(profile, Profile):
        return profile, profile.model.name
    if profile is not None:
        return load_profile(profile), str(profile)
    if isinstance(pack.target, SimTarget):
        return load_profile(pack.target.profile), pack.target.profile
    return None


def preflight(
    pack: Pack,
    profile: Any = None,
    *,
    max_requests: int | None = DEFAULT_MAX_REQUESTS,
    search: Literal["always", "findings"] = "always",
    long_run: bool = False,
) -> Preflight:
    """Predict every planned open-loop point of ``pack`` and its bracket per cache state
    (module docstring); ``profile`` as :func:`target_profile` takes it. ``search="findings"``
    searches beyond the planned rates only for a cache state whose planned rates do not
    straddle the boundary (a finding names its bracket); elsewhere the bracket is the planned
    rates' own (a lint's cheaper prediction). ``long_run``: where the pack's points are judged
    by the engine model as control variate (:func:`capacity_pack.twin.control.applies`), each
    bracket is then re-centred on the model's long-run boundary
    (:func:`capacity_pack.twin.control.long_run_bracket`), where the live search will find it."""
    cpu0 = time.process_time()
    found = target_profile(pack, profile)
    name = pack.pack.name
    if found is None:
        return Preflight(
            pack=name,
            profile=None,
            profile_sha256=None,
            max_requests=max_requests,
            unavailable=(
                f"target kind {pack.target.kind!r} has no engine model of its own: no "
                "prediction is possible before the closed loop is measured and a profile is "
                "calibrated from it"
            ),
        )
    model, label = found
    sha = sha256_of_obj(model.model_dump(mode="json"))
    try:
        points = tuple(
            predict_point(pack, rate, cache, model, max_requests=max_requests)
            for cache in pack.sweep.cache_states
            for rate in planned_rates(pack)
        )
        brackets: list[PredictedBracket] = []
        for cache in pack.sweep.cache_states:
            mine = [p for p in points if p.cache_state == cache]
            straddles = any(meets_gates(p.status) for p in mine) and any(
                not meets_gates(p.status) for p in mine
            )
            # The other cache state's bracket ends are probed first: cold and warm send the
            # same arrivals and lengths, so their boundaries are usually close.
            hint = next(
                (b for b in brackets if b.pass_rps is not None and b.fail_rps is not None), None
            )
            brackets.append(
                predicted_bracket(
                    pack,
                    model,
                    cache,
                    mine,
                    max_requests,
                    search=search == "always" or not straddles,
                    hint=(hint.pass_rps, hint.fail_rps) if hint else (),
                    long_run=long_run,
                )
            )
    except VirtualPointError as err:
        return Preflight(
            pack=name,
            profile=label,
            profile_sha256=sha,
            max_requests=max_requests,
            unavailable=str(err),
        )
    return Preflight(
        pack=name,
        profile=label,
        profile_sha256=sha,
        max_requests=max_requests,
        points=points,
        brackets=tuple(brackets),
        findings=tuple(findings(points, tuple(brackets))),
        cpu_s=time.process_time() - cpu0,
    )


def search_inputs(pack: Pack, first: list[float]) -> SearchInputs:
    """The open-loop search's settings for the prediction: the pack's resolution (or the
    default relative one) between the prediction's own wider bounds."""
    s = pack.sweep.search
    res_rps = s.resolution_rps if s is not None else None
    res_rel = s.resolution_rel if s is not None else None
    if res_rps is None and res_rel is None:
        res_rel = DEFAULT_RESOLUTION_REL
    return SearchInputs(
        initial_rps=first,
        resolution_rps=res_rps,
        resolution_rel=res_rel,
        min_rps=MIN_OPEN_LOOP_RPS,
        max_rps=UP_FACTOR * max(first),
        closed_levels=[],
        concurrency=None,
        max_concurrency=None,
        repeats=1,
        attainment_min=pack.acceptance.class_slo_attainment_min,
    )


def predicted_bracket(
    pack: Pack,
    profile: Any,
    cache_state: str,
    known: list[PointPrediction],
    max_requests: int | None = DEFAULT_MAX_REQUESTS,
    *,
    search: bool = True,
    hint: tuple[float | None, ...] = (),
    long_run: bool = False,
) -> PredictedBracket:
    """The bracket of ``cache_state`` by the open-loop search on predicted statuses, from the
    predictions ``known`` (a start at 1 RPS per replica when there are none) and the rates of
    ``hint`` (predicted first); without ``search``, the bracket of ``known`` alone; with
    ``long_run``, re-centred on the model's long-run boundary where that applies."""
    preds = {p.rate_rps: p for p in known}
    if not preds:
        replicas = (
            pack.target.replicas
            if isinstance(pack.target, SimTarget)
            else pack.engine.placement.replicas
        )
        preds[float(replicas)] = predict_point(
            pack, float(replicas), cache_state, profile, max_requests=max_requests
        )
    first = sorted(preds)
    inputs = search_inputs(pack, first)
    probes: list[PointPrediction] = []
    why = "the probe limit was reached"
    if not search:
        why = "the planned rates' own bracket (not searched further)"
    for rate in hint if search else ():
        if rate is not None and rate not in preds:
            preds[rate] = predict_point(pack, rate, cache_state, profile, max_requests=max_requests)
            probes.append(preds[rate])
    for _ in range(MAX_PROBES + 1 if search else 0):
        rows = [{"offered_rps": r, "status": preds[r].status} for r in sorted(preds)]
        step, direction, why = rate_step(rows, inputs, first)
        if direction == "none" or not step or len(probes) == MAX_PROBES:
            break
        for rate in step:
            preds[rate] = predict_point(pack, rate, cache_state, profile, max_requests=max_requests)
            probes.append(preds[rate])
    rows = [{"offered_rps": r, "status": preds[r].status} for r in sorted(preds)]
    low, high = bracket(rows, "offered_rps")
    res = resolution_of(inputs, low)
    if long_run and low is not None and high is not None:
        centred = long_run_bracket(
            pack, profile, cache_state, low, high, inputs.resolution_rps, inputs.resolution_rel
        )
        if centred is not None:
            return PredictedBracket(
                cache_state,
                centred.pass_rps,
                centred.fail_rps,
                resolution_of(inputs, centred.pass_rps),
                f"{centred.why}; the schedule's own windows predicted [{low:g}, {high:g}) ({why})",
                tuple(probes),
                centred.boundary_rps,
                centred.attainment,
            )
    return PredictedBracket(cache_state, low, high, res, why, tuple(probes))


def findings(
    points: tuple[PointPrediction, ...], brackets: tuple[PredictedBracket, ...]
) -> list[str]:
    """What the author should know before the sweep runs (module docstring)."""
    out = []
    for b in brackets:
        mine = sorted(
            (p for p in points if p.cache_state == b.cache_state), key=lambda p: p.rate_rps
        )
        if not mine:
            continue
        rates = "/".join(f"{p.rate_rps:g}" for p in mine)
        statuses = ", ".join(f"{p.rate_rps:g} {p.status}" for p in mine)
        where = f"the engine model's predicted bracket is {b.text()}"
        if not any(meets_gates(p.status) for p in mine):
            out.append(
                f"{b.cache_state}: no planned rate is predicted to pass ({statuses}; "
                f"{worst_words(mine[0])}); {where}"
            )
        elif all(meets_gates(p.status) for p in mine):
            out.append(
                f"{b.cache_state}: every planned rate ({rates} RPS) is predicted to pass: the "
                f"sweep cannot bracket the boundary; {where}"
            )
    return out


def worst_words(p: PointPrediction) -> str:
    """The worst class of a point in words: its attainment, or its error rate."""
    w = p.worst_class()
    if w.attainment is None:
        return (
            f"at {p.rate_rps:g} RPS no {w.name} request succeeds "
            f"({w.error_rate or 0:.0%} time out or fail)"
        )
    return f"at {p.rate_rps:g} RPS {w.name} meets its SLO on {w.attainment:.0%} of requests"


def write(doc: Preflight, path: str | Path) -> None:
    """``doc`` as JSON at ``path`` (atomically)."""
    from capacity_pack.io import write_json_atomic

    write_json_atomic(path, doc.to_dict())


def lint_warnings(pack: Pack, profile: Any = None) -> list[str]:
    """The lint's lines of the preflight prediction: a ``warning:`` per finding, or a
    ``note:`` saying what was predicted (or why nothing could be)."""
    doc = preflight(pack, profile, search="findings")
    if doc.unavailable:
        return [f"note: preflight: {doc.unavailable}"]
    if not doc.points:
        return []
    cap = f"the first {doc.max_requests} measured requests" if doc.max_requests else "all"
    how = (
        f"predicted in virtual time on profile {doc.profile!r} ({cap} of each point, "
        f"{doc.cpu_s:.0f} s of CPU)"
    )
    if not doc.findings:
        brackets = "; ".join(f"{b.cache_state} {b.text()}" for b in doc.brackets)
        return [f"note: preflight: the planned rates bracket the boundary ({brackets}), {how}"]
    return [f"warning: preflight: {f}" for f in doc.findings] + [f"note: preflight: {how}"]
