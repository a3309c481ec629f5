"""Stage ``sweep``: measure one point against the target, recording every attempted request.

The point holds its target's lock (:mod:`capacity_pack.measure.lock`) from before the target
starts until its last request ends: no other measurement of this user on this host, in this
invocation or another, loads the same target meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from capacity_pack.io import write_json_atomic
from capacity_pack.measure.inputs import AttainmentGate, SweepInputs
from capacity_pack.measure.interrupt import Interrupted
from capacity_pack.measure.lock import LockSettings, hold_target
from capacity_pack.measure.sweep import measure_point
from capacity_pack.plan.manifest import Acceptance
from capacity_pack.plan.prepared import PromptInputs, read_prepared
from capacity_pack.plan.schedule import Point


def _reporter(log: logging.Logger):
    """Progress lines to the job's log and to the console (the terminal running Snakemake)."""

    def report(line: str) -> None:
        log.info("%s", line)
        print(line, flush=True)

    return report


def run(
    *,
    inputs: str | SweepInputs,
    point: str,
    cache_state: str,
    repeat: int,
    schedule: str | Path | pd.DataFrame,
    records: str | Path,
    summary: str | Path,
    log: logging.Logger,
    progress: bool = False,
    lock: LockSettings | Mapping[str, Any] | None = None,
    gate: Mapping[str, Any] | None = None,
    prompts: str | Path | None = None,
) -> dict[str, Any]:
    """Measure ``point`` on ``schedule`` (a parquet path or the frame); the records and metrics
    go beside ``records``, the summary to ``summary``, which is returned. Interrupted (SIGINT,
    SIGTERM), it writes them all the same and raises
    :class:`~capacity_pack.measure.interrupt.Interrupted` (exit status 130 or 143). ``lock``:
    whether to wait for a busy target (:class:`~capacity_pack.measure.lock.LockSettings`, or a
    Snakemake config holding its keys); ``gate``: the pack's ``acceptance`` section, whose
    attainment gate and confidence the in-run decision judges by instead of the inputs' (a
    searching pack's rule params hold none: ``SweepInputs.without_gate``); ``prompts``: the
    point's prepared prompts (stage ``prompts``), checked against this schedule and these
    inputs, or None to fit every prompt here."""
    pt = Point.parse(point, cache_state, int(repeat))
    if isinstance(inputs, str):
        inputs = SweepInputs.model_validate_json(inputs)
    if gate is not None:
        inputs = inputs.with_gate(AttainmentGate.of_acceptance(Acceptance.model_validate(gate)))
    frame = schedule if isinstance(schedule, pd.DataFrame) else pd.read_parquet(schedule)
    prepared = None
    if prompts is not None:
        # Refused (one line) when prepared for another schedule, tokenizer or corpus.
        expected = PromptInputs.of_parts(inputs.target, inputs.prompts, inputs.client.trace)
        prepared = read_prepared(prompts, frame, expected)
    pack = inputs.schedule.pack.name
    try:
        with hold_target(inputs.target, pack=pack, stage="sweep", what=pt.key, settings=lock):
            doc = measure_point(
                inputs, pt, frame, Path(records).parent, progress=progress, report=_reporter(log),
                prompts=prepared,
            )  # fmt: skip
    except Interrupted as stop:
        # The partial measurement's summary says so (normalization refuses it); the job fails.
        if stop.summary:
            write_json_atomic(summary, stop.summary)
        log.warning("%s: %s", pt.key, stop)
        raise
    write_json_atomic(summary, doc)
    log.info(
        "%s: %d recorded, %d failed, lateness p99 %.3f ms%s",
        pt.key,
        doc["requests_recorded"],
        doc["failed"],
        doc["dispatch_lateness_ms"]["p99"] or 0.0,
        " (CLIENT-BOUND)" if doc["client_bound"] else "",
    )
    for why in doc.get("disturbance_reasons", []):
        log.warning("%s: DISTURBED: %s", pt.key, why)
    return doc
