"""Commands that run before, and without, the command-line framework: ``analyze``.

``python -m capacity_pack analyze REQUESTS_CSV DURATION_SECONDS QUEUE_TREND`` with plain
arguments (three positional, no option, a number, a CSV path that is not a folder) is answered
here, importing only what the analysis uses (not click, the pack's models, pandas or MLflow,
which would cost several times the analysis of a million-row file); any other command line goes
to :mod:`capacity_pack.cli`. Both run :func:`analyze_json` and refuse an input alike (``Error:``
and one redacted line on standard error, exit status 1). Why: docs/performance.md, "Start-up
without the CLI's imports".
"""

from __future__ import annotations

import sys
from pathlib import Path


def analyze_json(
    requests_csv: Path, duration_s: float, queue_trend: str, manifest: Path | None = None
) -> str:
    """The ``analyze`` command's output: the SLO report of ``requests_csv`` as indented JSON.

    Classes, cutoffs and gates come from ``manifest`` (a pack), else the built-in tutorial
    classes. Raises a :class:`~capacity_pack.errors.StatedError` on input it refuses.
    """
    import json

    from capacity_pack.evidence.requests_csv import analyze_csv
    from capacity_pack.evidence.slo_report import AnalysisError

    classes = gates = None
    if manifest is not None:
        from capacity_pack.evidence.gates import pack_gates
        from capacity_pack.evidence.slo_report import pack_classes
        from capacity_pack.plan.manifest import load_pack

        pack = load_pack(manifest)
        classes, gates = pack_classes(pack), pack_gates(pack)
    try:
        report = analyze_csv(requests_csv, duration_s, queue_trend, classes, gates)
    except AnalysisError as err:
        message = str(err)
        if manifest is None and "unknown workload class" in message:
            # A pack's own requests.csv has the pack's classes, not the built-in ones.
            beside = requests_csv.parent / "workload-manifest.yaml"
            named = beside if beside.is_file() else "PACK.yaml"
            message += f"; the pack's classes and cutoffs come with --manifest {named}"
        raise AnalysisError(message) from None
    return json.dumps(report, indent=2, sort_keys=True)


def run(argv: list[str]) -> int | None:
    """Run ``argv`` (the arguments after the program name) if it is a plain ``analyze``
    command line: its exit status. None for any other command line, left to the CLI."""
    if len(argv) != 4 or argv[0] != "analyze" or any(a.startswith("-") for a in argv[1:]):
        return None
    csv, duration, trend = argv[1:]
    try:
        duration_s = float(duration)
    except ValueError:
        return None
    if Path(csv).is_dir():
        return None

    from capacity_pack.errors import StatedError
    from capacity_pack.logs import redact_console
    from capacity_pack.redact import redact_text

    redact_console()
    try:
        text = analyze_json(Path(csv), duration_s, trend)
    except StatedError as err:
        print(f"Error: {redact_text(str(err))}", file=sys.stderr)
        return 1
    print(text)
    return 0
