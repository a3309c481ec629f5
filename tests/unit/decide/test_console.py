"""The console's closing lines read the pack's own files: the decision, its faults and notes."""

from __future__ import annotations

import json

from capacity_pack.decide.console import console_lines
from capacity_pack.decide.faults import measurement_faults, measurement_notes


def _sel(pass_rps: float, fail_rps: float) -> dict:
    bracket = {"pass_rps": pass_rps, "fail_rps": fail_rps, "reached": True}
    return {"capacity_rps": pass_rps, "bracket": bracket, "non_monotonic_passes_rps": []}


def test_the_console_lists_faults_and_the_checks_the_brackets_cannot_settle(tmp_path):
    open_loop = {"cold": _sel(4.0, 5.3), "warm": _sel(3.1, 4.6)}
    capacity = {
        "pack": "p",
        "primary_cache_state": "cold",
        "open_loop": open_loop,
        "measurement_faults": measurement_faults(open_loop, {}),
        "measurement_notes": measurement_notes(open_loop),
    }
    (tmp_path / "capacity.json").write_text(json.dumps(capacity))
    lines = console_lines(tmp_path)
    assert lines[1] == "  decision, cold: SLO-compliant capacity [4, 5.3) RPS, taken as 4 RPS"
    assert lines[2] == "  decision, warm: SLO-compliant capacity [3.1, 4.6) RPS, taken as 3.1 RPS"
    assert not any("MEASUREMENT FAULT" in line for line in lines)
    [note] = [line for line in lines if line.startswith("  note (warm-below-cold-unresolved)")]
    assert "cannot tell warm from cold" in note

    # Warm failing at 3 RPS while cold passes 4: shown under 0.8 x cold, a fault.
    open_loop["warm"] = _sel(2.5, 3.0)
    capacity["measurement_faults"] = measurement_faults(open_loop, {})
    capacity["measurement_notes"] = measurement_notes(open_loop)
    (tmp_path / "capacity.json").write_text(json.dumps(capacity))
    lines = console_lines(tmp_path)
    assert [line.split(":")[0] for line in lines if "MEASUREMENT FAULT" in line] == [
        "  MEASUREMENT FAULT (warm-below-cold)"
    ]
    assert not any(line.startswith("  note") for line in lines)
