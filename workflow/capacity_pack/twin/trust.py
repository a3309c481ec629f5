"""The validated twin as a consumer reads it: whether it is trusted, and the words every answer it
gives is labelled with.

A pack has a validated twin when it plans ``calibrate`` and ``twin_validate``
(:func:`capacity_pack.twin.calibrate.twin_absent_reason`, kept there so a drill job's code does
not hold the fit's); its quoted error is the largest capacity error over the compared cache
states, with its cache state. Docs: docs/twin.md, "The plan drill of a real target".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ValidatedTwin:
    """A calibrated profile (its path) and its validation document (``validation.json``)."""

    profile: str
    validation: dict[str, Any]

    @classmethod
    def from_files(cls, profile: str | Path, validation: str | Path) -> ValidatedTwin:
        doc = json.loads(Path(validation).read_text(encoding="utf-8"))
        return cls(str(profile), doc)

    @property
    def trusted(self) -> bool:
        return bool(self.validation.get("trusted"))

    @property
    def tolerance_rel(self) -> float:
        return float(self.validation.get("tolerance_rel") or 0.0)

    @property
    def worst(self) -> dict[str, Any] | None:
        """The compared cache state with the largest capacity error (None: none compared)."""
        compared = [
            s for s in self.validation.get("states", []) if s.get("capacity_error_rel") is not None
        ]
        return max(compared, key=lambda s: s["capacity_error_rel"]) if compared else None

    def error_words(self) -> str:
        """``its open-loop capacity prediction was 2.8 % from the measured bracket (cold),
        tolerance 15 %``, or why nothing was compared."""
        w = self.worst
        tol = f"tolerance {self.tolerance_rel:.0%}"
        if w is None:
            why = self.validation.get("why")
            return f"its prediction was compared with no measured bracket ({why}; {tol})"
        return (
            f"its open-loop capacity prediction was {w['capacity_error_rel']:.1%} from the "
            f"measured bracket ({w['cache_state']}), {tol}"
        )

    def label(self) -> str:
        """The words a prediction of this twin carries."""
        return (
            "predicted by the calibrated twin, the engine model fitted to this pack's closed "
            f"loop: {self.error_words()}"
        )

    def summary(self) -> dict[str, Any]:
        """What a drill file records of the twin it ran on."""
        w = self.worst
        return {
            "profile": self.profile,
            "trusted": self.trusted,
            "tolerance_rel": self.tolerance_rel,
            "capacity_error_rel": w["capacity_error_rel"] if w else None,
            "cache_state": w["cache_state"] if w else None,
            "why": self.validation.get("why"),
            "label": self.label(),
        }
