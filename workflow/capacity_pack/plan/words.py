"""The words a pack's reports use for its target, in one place.

What a plan counts and what a counterfactual speeds up follow what the engine computes on
(``engine.device``), and "simulated" is said only of the simulator:

- ``gpu`` (the default; the simulator models one): the plan counts **GPUs**, goodput is per
  GPU (DistServe's per-GPU goodput, Zhong et al., OSDI 2024), the autopsy prices "a 2x faster
  accelerator";
- ``cpu`` (a CPU server, e.g. llama.cpp's ``llama-server``): the plan counts **hosts** (the
  manifest's ``placement.gpus`` and ``plan.gpus_per_replica`` then count hosts; the JSON keys
  keep their names), goodput is per host, the autopsy prices "a 2x faster CPU".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TargetWords:
    """Nouns for one pack's target."""

    simulated: bool
    processor: str  # what a faster one would be: "accelerator" or "CPU"
    unit: str  # what the plan counts: "GPU" or "host"

    @property
    def units(self) -> str:
        return f"{self.unit}s"

    @property
    def target(self) -> str:
        """ "the simulated target" or "the target"."""
        return "the simulated target" if self.simulated else "the target"


def target_words(pack: Any) -> TargetWords:
    """The words of a :class:`~capacity_pack.plan.manifest.Pack` or of its JSON dump."""
    if isinstance(pack, dict):
        kind, device = pack["target"]["kind"], pack["engine"].get("device", "gpu")
    else:
        kind, device = pack.target.kind, pack.engine.device
    cpu = device == "cpu"
    return TargetWords(
        simulated=kind == "sim",
        processor="CPU" if cpu else "accelerator",
        unit="host" if cpu else "GPU",
    )
