"""Seeded schedules: determinism, exact stratification, arrival statistics, trace replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from capacity_pack.plan import schedule as S
from capacity_pack.plan import schedule_table as T
from capacity_pack.plan.manifest import ManifestError, load_pack, validate_pack
from capacity_pack.tables import TableValidationError
from tests.conftest import pack_data
from tests.paths import DEFAULT, ROOT, TUTORIAL


def data(path: Path = DEFAULT) -> dict:
    return pack_data() if path == DEFAULT else yaml.safe_load(path.read_text())


def open_point(rate: float, cache: str = "cold", repeat: int = 0) -> S.Point:
    return S.Point(mode="open", rate_rps=rate, cache_state=cache, repeat=repeat)


def measured(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["phase"] == "measure"]


def test_points_cover_sweep_and_experiments():
    fixed = data()
    fixed["sweep"].pop("search")  # the declared rates only: every one a point
    pack = validate_pack(fixed)
    keys = [p.key for p in S.points(pack)]
    assert len(keys) == len(set(keys)) == (3 + 3) * 2 * 2 + 1
    assert "open-r30/warm/rep1" in keys and "closed-c1/cold/rep0" in keys
    assert "exp-spike_smoke/warm/rep0" in keys
    assert S.Point.parse("open-r2.5", "cold", 0).rate_rps == 2.5
    # The default pack searches its sweep: only the experiment is fixed; the rest is found.
    default = load_pack(DEFAULT)
    assert [p.key for p in S.points(default)] == ["exp-spike_smoke/warm/rep0"]
    assert S.find_point(default, "open-r20", "warm", 1).key == "open-r20/warm/rep1"


def test_tutorial_schedule_has_exact_class_counts():
    pack = load_pack(TUTORIAL)
    frame = S.build_schedule(pack, open_point(24))
    counts = measured(frame)["class"].value_counts().to_dict()
    assert counts == {"interactive": 15_400, "long_context": 4_400, "generation_heavy": 2_200}
    # Shuffled, not blocked: the first 1,000 measured requests already mix all classes.
    assert measured(frame)["class"].iloc[:1000].nunique() == 3
    assert (
        measured(frame)["input_tokens"][measured(frame)["class"] == "long_context"] == 8192
    ).all()


def test_same_manifest_and_point_give_byte_identical_files(tmp_path):
    pack = load_pack(DEFAULT)
    point = open_point(20, "warm")
    digests = []
    for k in range(2):
        out = tmp_path / f"s{k}.parquet"
        T.write_schedule(S.build_schedule(pack, point), pack, point, out, out.with_suffix(".json"))
        digests.append(out.read_bytes())
    assert digests[0] == digests[1]
    # A fresh process (no shared RNG state) gives the same bytes too.
    out = tmp_path / "cli.parquet"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "capacity_pack",
            "schedule",
            str(DEFAULT),
            "--point",
            "open-r20",
            "--cache-state",
            "warm",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert out.read_bytes() == digests[0]
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["phase_counts"]["measure"] == 480 and "REHEARSAL" in summary["pack_label"]


def test_adding_a_rate_leaves_other_schedules_unchanged():
    base = data()
    more = data()
    more["sweep"]["open_loop_rps"] = [5, 10, 20, 30, 40]
    a, b = validate_pack(base), validate_pack(more)
    for rate in (10, 20, 30):
        pd.testing.assert_frame_equal(
            S.build_schedule(a, open_point(rate)), S.build_schedule(b, open_point(rate))
        )
    # ... while different points and repeats get different streams.
    assert not S.build_schedule(a, open_point(10))["class"].equals(
        S.build_schedule(a, open_point(10, repeat=1))["class"]
    )


def test_a_schedule_reads_the_packs_name_and_size_never_its_words():
    """A retitled or re-described pack is a new manifest, but its schedules (and so every
    measurement after them) are the same: their rule params must not change."""
    base, reworded = data(), data()
    reworded["pack"].update(title="Another title", description="Another description.")
    a, b = validate_pack(base), validate_pack(reworded)
    for point in S.points(a):
        assert S.ScheduleInputs.for_point(a, point) == S.ScheduleInputs.for_point(b, point)
    resized = data()
    resized["pack"]["size"] = "full" if base["pack"]["size"] == "rehearsal" else "rehearsal"
    point = open_point(10)
    assert S.ScheduleInputs.for_point(validate_pack(resized), point).pack.label != (
        S.ScheduleInputs.for_point(a, point).pack.label
    )


def test_cold_and_warm_are_paired():
    pack = load_pack(DEFAULT)
    cold = S.build_schedule(pack, open_point(20, "cold"))
    warm = S.build_schedule(pack, open_point(20, "warm"))
    for col in ("class", "input_tokens", "output_tokens", "scheduled_offset_ns", "prompt_seed"):
        assert cold[col].equals(warm[col])
    assert (cold["prefix_id"] == -1).all() and (cold["prefix_tokens"] == 0).all()
    # The shared prefix is 96 tokens, or all but one token of a shorter prompt.
    assert (warm["prefix_id"] >= 0).all()
    assert (warm["prefix_tokens"] == np.minimum(96, warm["input_tokens"] - 1)).all()
    # Zipf: prefix 0 is the most frequent.
    assert warm["prefix_id"].value_counts().idxmax() == 0


def test_poisson_mean_gap_and_warmup():
    d = data()
    d["client"]["initial_scheduled_requests"] = 20_000
    d["client"].pop("class_schedule_counts")
    pack = validate_pack(d)
    frame = S.build_schedule(pack, open_point(40))
    offsets = frame["scheduled_offset_ns"].to_numpy() / 1e9
    gaps = np.diff(offsets[frame["phase"].to_numpy() == "measure"])
    # Mean gap 1/40 s; the standard error with 20,000 exponential gaps is 0.7%; allow 4 SE.
    assert gaps.mean() == pytest.approx(1 / 40, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)
    warm = frame[frame["phase"] == "warmup"]
    assert len(warm) == 40  # 1 s of warm-up at 40 RPS, before every measured request
    assert warm["scheduled_offset_ns"].max() <= measured(frame)["scheduled_offset_ns"].min()


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_cv(cv):
    d = data()
    d["client"].update(arrival_pattern="gamma", arrival_cv=cv, initial_scheduled_requests=20_000)
    d["client"].pop("class_schedule_counts")
    frame = S.build_schedule(validate_pack(d), open_point(25))
    gaps = np.diff(measured(frame)["scheduled_offset_ns"].to_numpy() / 1e9)
    assert gaps.mean() == pytest.approx(1 / 25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_constant_arrivals_are_evenly_spaced():
    d = data()
    d["client"]["arrival_pattern"] = "constant"
    frame = S.build_schedule(validate_pack(d), open_point(8))
    gaps = np.diff(frame["scheduled_offset_ns"].to_numpy())
    assert np.all(np.abs(gaps - 125_000_000) <= 1)


def test_closed_loop_sizes():
    pack = load_pack(DEFAULT)
    frame = S.build_schedule(
        pack, S.Point(mode="closed", concurrency=32, cache_state="cold", repeat=0)
    )
    assert len(measured(frame)) == 3 * 32 and (frame["phase"] == "warmup").sum() == 32
    assert (frame["scheduled_offset_ns"] == 0).all()
    one = S.build_schedule(
        pack, S.Point(mode="closed", concurrency=1, cache_state="cold", repeat=0)
    )
    assert len(measured(one)) == 16  # closed_loop_min_requests


def test_extension_blocks_continue_the_same_stream():
    pack = load_pack(DEFAULT)
    point = open_point(30)
    base = S.build_schedule(pack, point)
    extended = S.build_schedule(pack, point, extension_blocks=2)
    pd.testing.assert_frame_equal(extended.iloc[: len(base)], base)
    ext = extended.iloc[len(base) :]
    assert set(ext["phase"]) == {"extension"} and set(ext["block"]) == {2, 3}
    assert len(ext) == 2 * 48  # 10% of the initial 480 per block
    assert ext["scheduled_offset_ns"].min() >= base["scheduled_offset_ns"].max()
    # 48 x 0.5/0.3/0.2 = 24/14.4/9.6 -> largest remainder 24/14/10 per block
    assert ext["class"].value_counts().to_dict() == {
        "interactive": 48,
        "long_context": 28,
        "generation_heavy": 20,
    }


def test_extension_blocks_stop_at_maximum_duration():
    d = data()
    d["client"]["maximum_duration_seconds"] = 17  # measured block alone is ~16 s at 30 RPS
    frame = S.build_schedule(validate_pack(d), open_point(30), extension_blocks=5)
    limit = (1 + 17) * 1e9
    assert frame.loc[frame["phase"] == "extension", "scheduled_offset_ns"].max() <= limit
    assert (frame["phase"] == "extension").sum() < 5 * 48


def test_spike_experiment_follows_its_profile():
    d = data()
    d["experiments"] = [
        {
            "name": "spiky",
            "test_type": "spike",
            "arrival_pattern": "poisson",
            "segments": [{"duration_s": 200, "rate_rps": 10}],
            "spike": {"at_s": 80, "duration_s": 40, "rate_rps": 40},
        }
    ]
    pack = validate_pack(d)
    frame = S.build_schedule(
        pack, S.Point(mode="exp", experiment="spiky", cache_state="warm", repeat=0)
    )
    m = measured(frame)
    assert len(m) == 200 * 10 + 40 * 40
    t = (m["scheduled_offset_ns"].to_numpy() - m["scheduled_offset_ns"].min()) / 1e9
    inside = ((t >= 82) & (t < 118)).sum() / 36
    outside = ((t >= 10) & (t < 70)).sum() / 60
    assert inside == pytest.approx(50, rel=0.15) and outside == pytest.approx(10, rel=0.2)


def test_ramp_profile_integral_and_inverse():
    d = data()
    d["experiments"] = [
        {
            "name": "bp",
            "test_type": "breakpoint",
            "segments": [
                {"duration_s": 10, "rate_rps": 5},
                {"duration_s": 20, "from_rps": 5, "to_rps": 45},
            ],
        }
    ]
    prof = S.experiment_profile(validate_pack(d).experiments[0])
    assert prof.total == pytest.approx(50 + 20 * 25)
    t = np.array([0, 5, 10, 20, 30.0])
    cum = np.array([0, 25, 50, 50 + 10 * 15, 550.0])
    np.testing.assert_allclose(prof.inverse(cum), t, atol=1e-9)


def test_trace_replay(tmp_path):
    trace = tmp_path / "trace.csv"
    rows = ["offset_s,class,input_tokens,output_tokens"]
    rows += [
        f"{i * 0.5 + 100},{['interactive', 'long_context'][i % 2]},{100 + i},{10 + i}"
        for i in range(40)
    ]
    trace.write_text("\n".join(rows) + "\n")
    d = data()
    d["client"].update(arrival_pattern="trace", trace={"path": str(trace)}, warmup_seconds=1)
    pack = validate_pack(d)
    frame = S.build_schedule(pack, open_point(4))  # the trace runs at 2 RPS: stretched x0.5
    assert len(frame) == 40
    assert frame["input_tokens"].tolist() == [100 + i for i in range(40)]
    assert frame["class"].tolist()[:2] == ["interactive", "long_context"]
    assert np.allclose(np.diff(frame["scheduled_offset_ns"]) / 1e9, 0.25)
    assert (frame["phase"] == "warmup").sum() == 4  # offsets 0, .25, .5, .75 < 1 s


def test_trace_with_unknown_class_names_file_and_row(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("offset_s,class\n0,interactive\n1,chatty\n")
    d = data()
    d["client"].update(arrival_pattern="trace", trace={"path": str(trace)})
    with pytest.raises(ManifestError) as err:
        S.build_schedule(validate_pack(d), open_point(4))
    assert "trace.csv: row 2" in str(err.value) and "chatty" in str(err.value)


def test_schedule_validation_reports_every_failure():
    pack = load_pack(DEFAULT)
    frame = S.build_schedule(pack, open_point(10))
    frame.loc[3, "class"] = "mystery"
    frame.loc[5, "input_tokens"] = 0
    frame.loc[7, "request_id"] = frame.loc[8, "request_id"]
    with pytest.raises(TableValidationError) as err:
        T.validate_schedule(frame, pack.class_names, "sched.parquet")
    text = str(err.value)
    assert text.startswith("sched.parquet:")
    assert "mystery" in text and "input_tokens" in text and "request_id" in text


def test_every_k6_test_type_builds_a_valid_schedule(tmp_path):
    pack = load_pack(ROOT / "config" / "packs" / "k6-load-shapes.yaml")
    types = {e.test_type for e in pack.experiments}
    assert types == {"smoke", "average-load", "stress", "spike", "soak", "breakpoint"}
    for point in S.points(pack):
        if point.mode != "exp":
            continue
        frame = S.build_schedule(pack, point)
        out = tmp_path / f"{point.point_id}.parquet"
        summary = T.write_schedule(frame, pack, point, out, out.with_suffix(".json"))
        expected = summary["experiment"]["expected_requests"]
        assert summary["phase_counts"]["measure"] == max(1, round(expected))
    # The breakpoint ramp really ramps: the last fifth is much denser than the first.
    bp = S.build_schedule(
        pack, S.Point(mode="exp", experiment="breakpoint", cache_state="warm", repeat=0)
    )
    t = measured(bp)["scheduled_offset_ns"].to_numpy() / 1e9
    t = t - t.min()
    assert (t > 0.8 * t.max()).sum() > 4 * (t < 0.2 * t.max()).sum()
