"""The validated twin as a consumer reads it: whether it is trusted, and the words every answer it
gives is labelled with.

A pack has a validated twin when it plans ``calibrate`` and ``twin_validate``
(:func:`capacity_pack.twin.calibrate.twin_absent_reason`, kept there so a drill job's code does
not hold the fit's); its quoted error is the largest capacity error over the compared cache
states, with its cache state. Docs: docs/twin.md, "The plan drill of a real target".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capacity_pack.artifacts import TwinValidation


@dataclass(frozen=True)
class ValidatedTwin:
    """A calibrated profile (its path) and its validation (``validation.json``)."""

    profile: str
    validation: TwinValidation

    @classmethod
    def from_files(cls, profile: str | Path, validation: str | Path) -> ValidatedTwin:
        return cls(str(profile), TwinValidation.read(validation))

    @property
    def trusted(self) -> bool:
        return self.validation.trusted

    @property
    def tolerance_rel(self) -> float:
        return float(self.validation.tolerance_rel)

    def error_words(self) -> str:
        """``its open-loop capacity prediction was 2.8 % from the measured bracket (cold),
        tolerance 15 %``, or why nothing was compared."""
        w = self.validation.worst
        tol = f"tolerance {self.tolerance_rel:.0%}"
        if w is None:
            why = self.validation.why
            return f"its prediction was compared with no measured bracket ({why}; {tol})"
        return (
            f"its open-loop capacity prediction was {w.capacity_error_rel:.1%} from the "
            f"measured bracket ({w.cache_state}), {tol}"
        )

    def label(self) -> str:
        """The words a prediction of this twin carries."""
        return (
            "predicted by the calibrated twin, the engine model fitted to this pack's closed "
            f"loop: {self.error_words()}"
        )

    def summary(self) -> dict[str, Any]:
        """What a drill file records of the twin it ran on."""
        w = self.validation.worst
        return {
            "profile": self.profile,
            "trusted": self.trusted,
            "tolerance_rel": self.tolerance_rel,
            "capacity_error_rel": w.capacity_error_rel if w else None,
            "cache_state": w.cache_state if w else None,
            "why": self.validation.why,
            "label": self.label(),
        }
