"""Stages ``search_round`` (:func:`run_round`: round k's file from the SLO reports of rounds
1..k) and ``search`` (:func:`run`: the finished search's summary) of one cache state
(:mod:`capacity_pack.decide.search`; docs/search.md, "Rounds as checkpoints").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capacity_pack.artifacts import SloReport
from capacity_pack.decide.search import (
    SearchInputs,
    decide_round,
    predicted_rates,
    resolution_of,
    summarize,
)
from capacity_pack.io import write_json_atomic


def run_round(
    *,
    inputs: str | SearchInputs,
    cache_state: str,
    round_index: int,
    reports: Sequence[str | Path],
    round_file: str | Path,
    log: logging.Logger,
    preflight: str | Path | None = None,
) -> dict[str, Any]:
    """Write round ``round_index``'s file of ``cache_state`` from ``reports``; return it.
    ``preflight``: the preflight file a search with ``initial: predicted`` starts from."""
    if isinstance(inputs, str):
        inputs = SearchInputs.model_validate_json(inputs)
    docs = [SloReport.read(p) for p in reports]
    predicted = None
    if preflight is not None:
        doc = json.loads(Path(preflight).read_text())
        entry = next((b for b in doc.get("brackets") or [] if b["cache_state"] == cache_state), {})
        res = resolution_of(inputs, entry.get("pass_rps"))
        predicted = predicted_rates(doc, cache_state, res)
    doc = decide_round(docs, inputs, cache_state, int(round_index), predicted_rps=predicted)
    write_json_atomic(round_file, doc)
    for loop, unit in (("open", "rates"), ("closed", "levels")):
        step = doc[loop].get("search")
        if step is not None:
            o = doc[loop]
            log.info(
                "%s round %s, %s loop: bracket %s; next %s %s (%s); confirm %s",
                *(cache_state, round_index, loop, o.get("bracket"), unit, step[unit], step["why"]),
                o.get("confirm"),
            )
    return doc


def run(
    *,
    inputs: str | SearchInputs,
    cache_state: str,
    max_rounds: int,
    rounds: Sequence[str | Path],
    summary: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write the summary of ``cache_state``'s finished search from its round files (in round
    order); return it."""
    if isinstance(inputs, str):
        inputs = SearchInputs.model_validate_json(inputs)
    docs = [json.loads(Path(p).read_text()) for p in rounds]
    doc = summarize(docs, inputs, int(max_rounds), cache_state)
    write_json_atomic(summary, doc)
    for loop in ("open", "closed"):
        o = doc[loop]
        if "stopped" in o:
            log.info(
                "%s %s loop: %d rounds, bracket %s; stopped: %s",
                *(cache_state, loop, o["search_rounds"], o["bracket"], o["stopped"]),
            )
    return doc
