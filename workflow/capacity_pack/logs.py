"""Job logging: send a pipeline job's logging and stderr to its log file.

Rule scripts call :func:`job_logging` with their ``log`` path so that everything a job says,
including a traceback on failure, lands in the file Snakemake names for it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def job_logging(path: str | Path, name: str = "capacity_pack") -> Iterator[logging.Logger]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        old_stderr = sys.stderr
        sys.stderr = fh
        try:
            yield logging.getLogger(name)
        except BaseException:
            fh.write(traceback.format_exc())
            fh.flush()
            # Also show the reason on the console, where the person running the pipeline looks.
            print(traceback.format_exc(limit=0).strip(), file=old_stderr)
            raise
        finally:
            sys.stderr = old_stderr
            root.removeHandler(handler)
