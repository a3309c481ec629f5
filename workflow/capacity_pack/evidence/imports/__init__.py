"""Import per-request exports of other load generators as this project's point tables.

Two formats, each read as its tool documents it, each in its own module with its
metric-definition mapping onto ours:

- AIPerf ``profile_export.jsonl`` (:func:`import_aiperf`, :mod:`.aiperf`);
- ``vllm bench serve --save-result --save-detailed`` result JSON (:func:`import_vllm_bench`,
  :mod:`.vllm_bench`).

Both give an :class:`ImportedPoint`: the requests and chunks tables validated by the same
pandera schemas as a measured point (``RequestsTable`` with the pack's classes, ``ChunksTable``),
a :class:`Provenance` (tool, version, file sha256, the definitions applied, what was estimated
and what could not be mapped) and the minimal sweep summary :func:`analysis.analyze_point` reads
(:mod:`.point` builds them from a tool-neutral frame; :mod:`.common` holds the shared types).

Our definitions (``capacity_pack.measure.records``): s = request sent, f = first non-empty content
chunk, e = last content chunk, O = output tokens (``usage.completion_tokens`` when given):
TTFT = f - s, E2E = e - s, TPOT = (E2E - TTFT) / (O - 1) for O > 1 (0 otherwise),
ITL = gaps between consecutive chunks (the chunks table). Failed rows carry zero latencies.

Class assignment, per request: a ``class`` field in the export (AIPerf ``metadata.class``,
vLLM top-level ``class`` from ``--metadata class=NAME``) when present, else by the pack classes'
length specs, else ``class_name`` (the rule in :mod:`.point`).
"""

from __future__ import annotations

from capacity_pack.evidence.imports.aiperf import AIPERF_DEFINITIONS, import_aiperf
from capacity_pack.evidence.imports.common import (
    IMPORTER_VERSION,
    ExportFormatError,
    ImportedPoint,
    Provenance,
    Tool,
)
from capacity_pack.evidence.imports.point import write_imported
from capacity_pack.evidence.imports.vllm_bench import VLLM_DEFINITIONS, import_vllm_bench

IMPORTERS = {"aiperf": import_aiperf, "vllm-bench": import_vllm_bench}

__all__ = [
    "AIPERF_DEFINITIONS",
    "IMPORTERS",
    "IMPORTER_VERSION",
    "VLLM_DEFINITIONS",
    "ExportFormatError",
    "ImportedPoint",
    "Provenance",
    "Tool",
    "import_aiperf",
    "import_vllm_bench",
    "write_imported",
]
