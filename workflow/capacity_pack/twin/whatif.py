"""What-if questions for the twin: the pack and engine model with one thing changed.

``capacity-pack whatif PACK --mix long_context=0.4 --replicas 8 --max-num-seqs 128`` asks the
twin what the pack would show with the changes below; every answer is a prediction in virtual
time and is printed beside the twin's validation error (how far its capacity prediction was from
the pack's own measurement), so a reader can weigh it.

Changes, each applied to a copy of the validated pack (the result is validated again, so a
change the pack cannot hold is refused with the manifest's own message):

- ``mix``: ``{class: share}`` for some classes; the other classes keep their relative shares and
  are scaled to fill ``1 - sum(given)``: new share ``m_j' = m_j (1 - S) / sum_{k not given} m_k``
  with ``S`` the sum of the given shares (which must lie in (0, 1], or be exactly 1 when every
  class is given); a pack with stratified ``client.class_schedule_counts`` gets them recounted
  for the new mix;
- ``replicas``: the fleet the model runs (``target.replicas``, the placement's replicas and
  GPUs at the same GPUs per replica, and the plan's replicas under test);
- ``max_num_seqs`` and ``max_num_batched_tokens``: the engine model's batching limits (the
  profile's ``engine`` section: running sequences per step and the token budget per step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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
