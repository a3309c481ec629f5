"""Stage ``prompts``: every scheduled request's exact prompt text, prepared before the target is
reserved (:mod:`capacity_pack.plan.prepared`, fitted by :mod:`capacity_pack.plan.prompt_fit`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.plan.prepared import PromptInputs, write_prepared
from capacity_pack.plan.prompt_fit import prepare


def run(
    *,
    inputs: str | PromptInputs,
    schedule: str | Path | pd.DataFrame,
    prompts: str | Path,
    log: logging.Logger,
) -> dict[str, Any]:
    """Write the prompts of ``schedule``'s rows to ``prompts``; return what was done."""
    if isinstance(inputs, str):
        inputs = PromptInputs.model_validate_json(inputs)
    frame = schedule if isinstance(schedule, pd.DataFrame) else pd.read_parquet(schedule)
    start = time.perf_counter()
    if inputs.tokenizer == "endpoint":
        # The server's /tokenize is not up before its measurement: it fits the prompts then.
        write_prepared(prompts, frame, None, inputs)
        log.info("prompts: none prepared (counted by the target's /tokenize at measurement)")
        return {"requests": len(frame), "prepared": 0}
    counter = inputs.counter()
    rows = [inputs.row(r) for r in frame.to_dict("records")]
    ids = frame["request_id"].astype(str).tolist()
    texts = prepare(rows, counter, log=log.warning, ids=ids)
    write_prepared(prompts, frame, texts, inputs)
    elapsed = time.perf_counter() - start
    name = counter.name if counter is not None else "the project tokenizer"
    log.info("prompts: %d prepared under %s in %.1f s", len(texts), name, elapsed)
    return {"requests": len(frame), "prepared": len(texts), "seconds": elapsed}
