"""What-if questions for the twin: the pack and engine model with one thing changed.

``capacity-pack whatif PACK --mix long_context=0.4 --replicas 8 --max-num-seqs 128``: each
answer is a prediction in virtual time, printed beside the twin's validation error. A given mix
rescales the other classes: ``m_j' = m_j (1 - S) / sum_{k not given} m_k``.

Changes: docs/twin.md, "What-if changes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capacity_pack.artifacts import ArtifactError, TwinValidation
from capacity_pack.errors import StatedError


class WhatIfError(StatedError):
    """A what-if change that cannot be applied; the message names the option and value."""


@dataclass(frozen=True)
class Changes:
    """The changes asked for (None / empty: unchanged)."""

    mix: dict[str, float] = field(default_factory=dict)
    replicas: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def words(self) -> str:
        parts = [f"mix {name}={share:g}" for name, share in self.mix.items()]
        if self.replicas is not None:
            parts.append(f"{self.replicas} replicas")
        if self.max_num_seqs is not None:
            parts.append(f"max_num_seqs {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None:
            parts.append(f"max_num_batched_tokens {self.max_num_batched_tokens}")
        return ", ".join(parts) or "nothing changed"


def parse_mix(items: list[str] | tuple[str, ...]) -> dict[str, float]:
    """``["long_context=0.4", ...]`` as ``{"long_context": 0.4}``."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not sep or not name or not (0.0 <= share <= 1.0):
            raise WhatIfError(f"--mix {item!r}: expected CLASS=SHARE with a share in [0, 1]")
        out[name] = share
    return out


def new_mix(current: dict[str, float], given: dict[str, float]) -> dict[str, float]:
    """The whole mix after ``given`` (see the module docstring)."""
    unknown = sorted(set(given) - set(current))
    if unknown:
        raise WhatIfError(
            f"--mix: unknown workload class {unknown[0]!r}; the pack's classes: "
            + ", ".join(current)
        )
    total = math.fsum(given.values())
    rest = {k: v for k, v in current.items() if k not in given}
    rest_total = math.fsum(rest.values())
    if not rest:
        if abs(total - 1.0) > 1e-9:
            raise WhatIfError(f"--mix: every class given, the shares must sum to 1, not {total:g}")
        return dict(given)
    if total > 1.0 + 1e-9 or (total >= 1.0 - 1e-9 and rest_total > 0):
        raise WhatIfError(
            f"--mix: the given shares sum to {total:g}, leaving nothing for "
            + ", ".join(rest)
            + " (give them 0 explicitly to drop them)"
        )
    scale = (1.0 - total) / rest_total if rest_total > 0 else 0.0
    return {k: given[k] if k in given else current[k] * scale for k in current}


def changed_pack(pack: Any, changes: Changes) -> Any:
    """A validated copy of ``pack`` (a :class:`~capacity_pack.plan.manifest.Pack`) with
    ``changes``' mix and replicas (the engine limits change the profile:
    :func:`changed_profile`)."""
    from capacity_pack.plan.manifest import validate_pack

    data = pack.model_dump(mode="json", exclude_none=True)
    if changes.mix:
        mix = new_mix({c["name"]: c["mix"] for c in data["workload"]}, changes.mix)
        # Shares rounded to 12 places so that they still sum to 1 within the pack's check.
        for c in data["workload"]:
            c["mix"] = round(mix[c["name"]], 12)
        drift = 1.0 - math.fsum(c["mix"] for c in data["workload"])
        data["workload"][-1]["mix"] = round(data["workload"][-1]["mix"] + drift, 12)
        data["workload"] = [c for c in data["workload"] if c["mix"] > 0]
        if data["client"].get("class_schedule_counts") is not None:
            data["client"].pop("class_schedule_counts")
    if changes.replicas is not None:
        if changes.replicas < 1:
            raise WhatIfError(f"--replicas {changes.replicas}: expected at least 1")
        placement = data["engine"]["placement"]
        per_replica = max(1, placement["gpus"] // max(1, placement["replicas"]))
        placement["replicas"] = changes.replicas
        placement["dp"] = changes.replicas
        placement["gpus"] = per_replica * changes.replicas
        if "replicas" in data["target"]:
            data["target"]["replicas"] = changes.replicas
        if data.get("plan", {}).get("replicas_under_test") is not None:
            data["plan"]["replicas_under_test"] = changes.replicas
    return validate_pack(data, "whatif")


def changed_profile(profile: Any, changes: Changes) -> Any:
    """A copy of ``profile`` (a :class:`~capacity_pack.sim.profile.Profile`) with the engine
    limits in ``changes``."""
    update: dict[str, Any] = {}
    if changes.max_num_seqs is not None:
        if changes.max_num_seqs < 1:
            raise WhatIfError(f"--max-num-seqs {changes.max_num_seqs}: expected at least 1")
        update["max_num_seqs"] = changes.max_num_seqs
    if changes.max_num_batched_tokens is not None:
        if changes.max_num_batched_tokens < 1:
            raise WhatIfError(
                f"--max-num-batched-tokens {changes.max_num_batched_tokens}: expected at least 1"
            )
        update["max_num_batched_tokens"] = changes.max_num_batched_tokens
    return profile.with_overrides(**update) if update else profile


@dataclass(frozen=True)
class Twin:
    """The engine model a what-if runs on, where it came from, and its validation."""

    profile: Any
    source: str
    validation: TwinValidation | None = None

    @property
    def trusted(self) -> bool | None:
        return None if self.validation is None else self.validation.trusted

    def words(self) -> str:
        v = self.validation
        if v is None:
            return f"twin: {self.source}; no validation against a measurement"
        errors = [
            f"{s.cache_state} {s.capacity_error_rel:.1%}"
            for s in v.states
            if s.capacity_error_rel is not None
        ]
        label = "trusted" if v.trusted else "UNTRUSTED"
        return (
            f"twin: {self.source}; {label} (tolerance {v.tolerance_rel:.0%}): "
            f"{v.why}; capacity error " + (", ".join(errors) if errors else "n/a")
        )


def find_twin(pack: Any, results: Path, profile: str | None = None) -> Twin:
    """The twin for ``pack``: ``profile`` when given; else the pack's calibrated profile
    (``results/twin/profile.yaml``) with its validation; else a simulated target's own engine
    model (exact: the model the live points run). A real target without a calibration is
    refused, saying what to run."""
    from capacity_pack.plan.manifest import SimTarget
    from capacity_pack.sim.profile import ProfileError, load_profile

    validation_path = results / "twin" / "validation.json"
    try:
        validation = TwinValidation.read(validation_path) if validation_path.is_file() else None
    except ArtifactError as err:
        raise WhatIfError(str(err)) from None
    try:
        if profile is not None:
            return Twin(load_profile(profile), f"profile {profile} (given)", None)
        calibrated = results / "twin" / "profile.yaml"
        if calibrated.is_file():
            return Twin(load_profile(calibrated), f"calibrated profile {calibrated}", validation)
    except ProfileError as err:
        raise WhatIfError(str(err)) from None
    if isinstance(pack.target, SimTarget):
        return Twin(
            load_profile(pack.target.profile),
            f"the simulated target's own engine model ({pack.target.profile}): exact, less the "
            "client and the network",
            None,
        )
    raise WhatIfError(
        f"{results / 'twin' / 'profile.yaml'}: no calibrated twin for this real target; run the "
        "pack's closed loop and its calibrate stage first (snakemake ... calibrate), or give "
        "--profile"
    )


def answer(
    pack: Any,
    changes: Changes,
    twin: Twin,
    *,
    rates: list[float] | None = None,
    cache_states: list[str] | None = None,
    max_requests: int | None = None,
) -> dict[str, Any]:
    """The what-if's answer: per cache state, the unchanged pack's and the changed pack's
    predicted bracket (or, with ``rates``, each rate's predicted status and per-class
    attainment), all predictions of ``twin``."""
    from capacity_pack.twin.preflight import preflight
    from capacity_pack.twin.virtual_point import DEFAULT_MAX_REQUESTS, predict_point

    cap = max_requests if max_requests is not None else DEFAULT_MAX_REQUESTS
    new_pack = changed_pack(pack, changes)
    new_profile = changed_profile(twin.profile, changes)
    states = cache_states or list(pack.sweep.cache_states)
    unknown = sorted(set(states) - set(pack.sweep.cache_states))
    if unknown:
        raise WhatIfError(
            f"--cache-state {unknown[0]}: the pack measures " + ", ".join(pack.sweep.cache_states)
        )
    out: dict[str, Any] = {
        "pack": pack.pack.name,
        "changes": changes.words(),
        "twin": twin.words(),
        "trusted": twin.trusted,
        "cache_states": {},
    }
    if rates:
        for state in states:
            rows = []
            for rate in rates:
                p = predict_point(new_pack, rate, state, new_profile, max_requests=cap)
                rows.append(
                    {
                        "rate_rps": rate,
                        "status": p.status,
                        "attainment": {c.name: c.attainment for c in p.classes},
                        "reasons": list(p.reasons),
                    }
                )
            out["cache_states"][state] = {"points": rows}
        return out
    before = preflight(pack, twin.profile, max_requests=cap)
    after = preflight(new_pack, new_profile, max_requests=cap)
    for state in states:
        b0, b1 = before.bracket_of(state), after.bracket_of(state)
        out["cache_states"][state] = {
            "unchanged": b0.text() if b0 else None,
            "changed": b1.text() if b1 else None,
            "changed_pass_rps": b1.pass_rps if b1 else None,
            "changed_fail_rps": b1.fail_rps if b1 else None,
        }
    return out


def answer_lines(doc: dict[str, Any]) -> list[str]:
    """The answer as the console prints it."""
    lines = [f"{doc['pack']}: what if {doc['changes']} (a prediction in virtual time)", doc["twin"]]
    for state, entry in doc["cache_states"].items():
        if "points" in entry:
            for row in entry["points"]:
                att = ", ".join(
                    f"{k} {v:.3f}" if v is not None else f"{k} n/a"
                    for k, v in row["attainment"].items()
                )
                lines.append(f"  {state} {row['rate_rps']:g} RPS: {row['status']} ({att})")
        else:
            lines.append(
                f"  {state}: predicted capacity {entry['changed']} "
                f"(unchanged pack: {entry['unchanged']})"
            )
    return lines
