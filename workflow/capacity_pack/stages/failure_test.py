"""Stage ``failure_test``: failure-test.md and failure-test.json, every drill side by side."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from capacity_pack.artifacts import FailureTest
from capacity_pack.drills.render import failure_test, failure_test_markdown
from capacity_pack.io import atomic_path, write_text_atomic


def run(
    *,
    pack: str,
    reports: Sequence[str | Path],
    markdown: str | Path,
    json_path: str | Path,
    log: logging.Logger,
    timelines: Sequence[tuple[str | Path, str | Path]] = (),
) -> FailureTest:
    """``pack`` is the pack section (with its label) as JSON; ``reports`` the drill reports;
    ``timelines`` (drill picture, its copy in the pack) pairs."""
    docs = [json.loads(Path(p).read_text()) for p in reports]
    doc = FailureTest.parse(failure_test(docs, json.loads(pack)), json_path)
    doc.write(json_path)
    write_text_atomic(markdown, failure_test_markdown(doc.dump()))
    for src, dst in timelines:
        with atomic_path(Path(dst)) as tmp:
            shutil.copyfile(src, tmp)
    log.info("failure test: %s", doc.summary.model_dump())
    return doc
