"""capacity-pack: defensible inference capacity packs for OpenAI-compatible serving endpoints.

The library holds all logic (manifest, schedule, sim, loadgen, normalize, analysis, capacity,
failure, autopsy, tracking, report); the Snakemake rules and the ``capacity-pack`` CLI are thin
callers of it.
"""

__version__ = "0.1.0"
