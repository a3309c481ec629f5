"""The SLO analyzer: the seed's smoke test, its validation rules, and property tests."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capacity_pack.binomial import wilson_interval
from capacity_pack.evidence.requests_csv import analyze_csv
from capacity_pack.evidence.slo_report import AnalysisError
from capacity_pack.evidence.statistics import (
    early_stopping_min_samples,
    little_in_flight,
    littles_law,
    mann_kendall,
    trend_of,
)
from capacity_pack.vocab.percentile import nearest_rank
from tests.paths import ROOT

HEADER = "request_id,class,ttft_ms,tpot_ms,e2e_ms,output_tokens,status"
SMOKE = f"""{HEADER}
r-0001,interactive,182.0,25.1,3369.7,128,ok
r-0002,long_context,1940.0,44.2,13211.0,256,ok
r-0003,generation_heavy,910.0,47.0,48991.0,1024,ok
r-0004,interactive,0,0,0,0,error
"""
CUTOFFS = {
    "interactive": (500, 40, 128),
    "long_context": (2500, 50, 256),
    "generation_heavy": (800, 45, 1024),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "requests.csv"
    path.write_text(text)
    return path


def test_seed_smoke_test(tmp_path):
    report = analyze_csv(write(tmp_path, SMOKE), 300, "flat")
    assert report["attempted"] == 4
    assert report["successful"] == 3
    assert report["failed"] == 1
    assert report["error_rate"] == 0.25
    assert sum(c["passing_count"] for c in report["classes"].values()) == 2
    assert report["observed_goodput_rps"] == 2 / 300
    assert report["capacity_gate_pass"] is False
    assert report["classes"]["interactive"]["attainment"] == 1.0
    assert report["classes"]["generation_heavy"]["attainment"] == 0.0
    assert report["classes"]["long_context"]["p99_ttft_ms"] is None


def test_cli_prints_the_seed_report(tmp_path):
    path = write(tmp_path, SMOKE)
    for extra in ([], ["--manifest", str(ROOT / "config/packs/tutorial-70b.yaml")]):
        res = subprocess.run(
            [sys.executable, "-m", "capacity_pack", "analyze", str(path), "300", "flat", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        assert (report["attempted"], report["successful"], report["failed"]) == (4, 3, 1)
        assert report["capacity_gate_pass"] is False


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["r-1,interactive,1,1,128,128,ok", ",interactive,1,1,128,128,ok"],
         "line 3: request IDs must be nonempty and unique"),
        (["r-1,interactive,1,1,128,128,ok", "r-1,interactive,1,1,128,128,ok"],
         "line 3: request IDs must be nonempty and unique"),
        (["r-1,chatbot,1,1,128,128,ok"],
         "line 2: unknown workload class 'chatbot' (known: interactive, long_context, "
         "generation_heavy)"),
        (["r-1,interactive,1,1,128,128,done"],
         "line 2: every scheduled request needs a recognized terminal status"),
        (["r-1,interactive,-1,1,126,128,ok"], "line 2: latencies must be finite and nonnegative"),
        (["r-1,interactive,nan,1,128,128,ok"], "line 2: latencies must be finite and nonnegative"),
        (["r-1,interactive,inf,1,128,128,ok"], "line 2: latencies must be finite and nonnegative"),
        (["r-1,interactive,1,1,127,127,ok"],
         "line 2: successful output length differs from the fixed workload"),
        (["r-1,interactive,1,1,129,128,ok"],
         "line 2: TTFT/TPOT/E2E disagree under this fixture's metric convention"),
        (["r-1,interactive,fast,1,128,128,ok"],
         "line 2, column ttft_ms: 'fast' is not a number"),
    ],
)  # fmt: skip
def test_every_validation_rule_names_file_line_and_rule(tmp_path, rows, message):
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 300, "flat")
    assert str(err.value) == f"{path}: {message}"


def test_first_failing_row_wins_and_failed_rows_are_not_checked(tmp_path):
    rows = [
        "r-1,interactive,0,0,0,0,error",  # a failed row needs no latencies
        "r-2,interactive,1,1,127,127,ok",  # wrong length (line 3)
        "r-3,chatbot,1,1,128,128,ok",  # unknown class (line 4), checked in the first pass
    ]
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(AnalysisError, match="line 4: unknown workload class"):
        analyze_csv(path, 300, "flat")


@pytest.mark.parametrize(
    ("duration", "trend", "message"),
    [(0, "flat", "duration must be positive"), (float("nan"), "flat", "duration must be positive"),
     (300, "rising", "queue trend must be flat or growing")],
)  # fmt: skip
def test_argument_errors(tmp_path, duration, trend, message):
    with pytest.raises(AnalysisError, match=message):
        analyze_csv(write(tmp_path, SMOKE), duration, trend)


def test_missing_column_and_missing_file(tmp_path):
    path = write(tmp_path, "request_id,class\nr-1,interactive\n")
    with pytest.raises(AnalysisError, match=r"missing column\(s\)"):
        analyze_csv(path, 300, "flat")
    with pytest.raises(AnalysisError, match="no such file"):
        analyze_csv(tmp_path / "nope.csv", 300, "flat")


# -- an independent, straightforward implementation to check against -----------------------


def reference(rows: list[dict], duration: float, trend: str) -> dict:
    def pct(values, p):
        if not values:
            return None
        v = sorted(values)
        k = max(0, math.ceil(p * len(v)) - 1)
        return v[k]

    out = {"classes": {}}
    ok = [r for r in rows if r["status"] == "ok"]
    total_pass = 0
    tokens = 0
    for name in sorted(CUTOFFS):
        ttft_cut, tpot_cut, _ = CUTOFFS[name]
        mine = [r for r in ok if r["class"] == name]
        passing = 0
        for r in mine:
            if r["ttft"] <= ttft_cut and r["tpot"] <= tpot_cut:
                passing += 1
        total_pass += passing
        tokens += sum(r["out"] for r in mine)
        n = len(mine)
        att = passing / n if n else None
        out["classes"][name] = {
            "successful_count": n,
            "passing_count": passing,
            "attainment": att,
            "class_slo_pass": n >= 2000 and att >= 0.95,
            "p50_ttft_ms": pct([r["ttft"] for r in mine], 0.5),
            "p95_ttft_ms": pct([r["ttft"] for r in mine], 0.95),
            "p99_ttft_ms": pct([r["ttft"] for r in mine], 0.99) if n >= 10000 else None,
            "p95_tpot_ms": pct([r["tpot"] for r in mine], 0.95),
            "p95_e2e_ms": pct([r["e2e"] for r in mine], 0.95),
            "output_tokens": sum(r["out"] for r in mine),
        }
    out["attempted"] = len(rows)
    out["successful"] = len(ok)
    out["failed"] = len(rows) - len(ok)
    out["error_rate"] = out["failed"] / len(rows) if rows else None
    out["overall_attainment"] = total_pass / len(ok) if ok else None
    # Over all attempts: every failed, rejected or cancelled request is a miss.
    out["overall_all_attempt_attainment"] = total_pass / len(rows) if rows else None
    out["observed_goodput_rps"] = total_pass / duration
    out["request_throughput_rps"] = len(ok) / duration
    out["output_throughput_tps"] = tokens / duration
    everyone = all(c["class_slo_pass"] for c in out["classes"].values())
    out["all_class_slos_pass"] = everyone
    out["capacity_gate_pass"] = everyone and out["error_rate"] <= 0.01 and trend == "flat"
    return out


def random_rows(rng: np.random.Generator, n: int, ok_share: float) -> list[dict]:
    rows = []
    names = list(CUTOFFS)
    for i in range(n):
        name = names[rng.choice(3, p=[0.7, 0.2, 0.1])]
        status = "ok" if rng.random() < ok_share else rng.choice(
            ["error", "timeout", "rejected", "cancelled"])  # fmt: skip
        if status != "ok":
            rows.append({"id": f"r{i}", "class": name, "status": status, "ttft": 0.0, "tpot": 0.0,
                         "e2e": 0.0, "out": 0})  # fmt: skip
            continue
        cut_ttft, cut_tpot, out = CUTOFFS[name]
        # Many values exactly at the cutoffs: the comparison must be <=.
        ttft = float(rng.choice([cut_ttft, round(rng.gamma(2, cut_ttft / 3), 1)]))
        tpot = float(rng.choice([cut_tpot, round(rng.gamma(4, cut_tpot / 5), 2)]))
        e2e = ttft + tpot * (out - 1)
        rows.append({"id": f"r{i}", "class": name, "status": status, "ttft": ttft, "tpot": tpot,
                     "e2e": e2e, "out": out})  # fmt: skip
    return rows


@pytest.mark.parametrize("seed", range(12))
def test_matches_an_independent_implementation(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 7, 500, 3000, 12_000]))
    rows = random_rows(rng, n, ok_share=float(rng.choice([1.0, 0.995, 0.9])))
    lines = [HEADER] + [
        f"{r['id']},{r['class']},{r['ttft']!r},{r['tpot']!r},{r['e2e']!r},{r['out']},{r['status']}"
        for r in rows
    ]
    path = write(tmp_path, "\n".join(lines) + "\n")
    duration = float(rng.uniform(1, 1000))
    trend = str(rng.choice(["flat", "growing"]))
    got = analyze_csv(path, duration, trend)
    want = reference(rows, duration, trend)
    for key in ("attempted", "successful", "failed", "error_rate", "overall_attainment",
                "overall_all_attempt_attainment", "observed_goodput_rps", "request_throughput_rps",
                "output_throughput_tps", "all_class_slos_pass", "capacity_gate_pass"):  # fmt: skip
        assert got[key] == pytest.approx(want[key]) if want[key] is not None else got[key] is None
    for name, c in want["classes"].items():
        for key, value in c.items():
            if value is None:
                assert got["classes"][name][key] is None, (name, key)
            else:
                assert got["classes"][name][key] == pytest.approx(value), (name, key)


# -- statistics -------------------------------------------------------------------------------


def test_nearest_rank():
    v = np.arange(1, 101, dtype=float)
    assert nearest_rank(v, 0.95) == 95 and nearest_rank(v, 0.5) == 50
    assert nearest_rank(np.array([7.0]), 0.99) == 7 and nearest_rank(np.array([]), 0.5) is None


def test_wilson_interval_hand_computed():
    lo, hi = wilson_interval(95, 100, 0.95)
    # p = .95, z = 1.959964: centre = (0.95 + 0.019208) / 1.038415, half = 0.043581 / 1.038415
    assert lo == pytest.approx(0.88825, abs=1e-4) and hi == pytest.approx(0.97847, abs=1e-4)
    assert wilson_interval(0, 0) is None
    lo, hi = wilson_interval(10, 10, 0.95)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-4)
    # The bounds of a bounded quantity are exact at its ends (no 2.8e-17 for "none passed").
    for n in (1, 10, 1000, 10_007):
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0


def test_mlperf_early_stopping_bound():
    # No over-cutoff request: 0.99^n <= 0.01 first holds at n = 459.
    assert early_stopping_min_samples(0) == 459
    assert 0.99**459 <= 0.01 < 0.99**458
    # More failures need more samples, monotonically.
    bounds = [early_stopping_min_samples(h) for h in range(0, 60, 10)]
    assert bounds == sorted(bounds) and bounds[-1] > 4000


def test_mann_kendall_and_trend():
    flat = np.zeros(30)
    assert mann_kendall(flat)["s"] == 0
    up = np.arange(30, dtype=float)
    mk = mann_kendall(up)
    assert mk["s"] == 30 * 29 / 2 and mk["z"] > 5 and mk["sen_slope"] == 1.0
    import pandas as pd

    series = pd.DataFrame({"t_offset_ns": np.arange(30) * 10**9, "value": up})
    assert trend_of(series, 0, 30 * 10**9)["trend"] == "growing"
    noisy = pd.DataFrame(
        {"t_offset_ns": np.arange(30) * 10**9, "value": np.random.default_rng(1).integers(0, 3, 30)}
    )
    assert trend_of(noisy, 0, 30 * 10**9)["trend"] == "flat"
    assert trend_of(series, 0, 5 * 10**9)["trend"] == "inconclusive"


def test_littles_law():
    assert little_in_flight(23.9, 1.8) == pytest.approx(43.02)
    # A steady stream: one request a second, each lasting 2.5 s -> 2.5 in flight on average.
    sent = np.arange(0, 100) * 10**9
    end = sent + int(2.5e9)
    check = littles_law(sent, end, 10 * 10**9, 90 * 10**9)
    assert check["average_in_flight"] == pytest.approx(2.5)
    assert check["little_estimate"] == pytest.approx(2.5, rel=0.02)
    assert not check["flagged"]
    # An ever-growing backlog breaks the stable-system assumption: flagged.
    end_growing = sent + (np.arange(100) * 0.5e9).astype(np.int64)
    assert littles_law(sent, end_growing, 10 * 10**9, 90 * 10**9)["flagged"]


# -- the fast (typed) path and the exact (text) path -------------------------------------------


def both_paths(path: Path, classes=None) -> tuple[dict | None, dict]:
    """The report of the fast path (None if it declined) and of the exact path, same file."""
    from capacity_pack.evidence import requests_csv as a
    from capacity_pack.evidence import slo_report as r
    from capacity_pack.evidence.gates import Gates

    classes = classes or r.tutorial_classes()
    summary = a._fast_summary(path, classes)
    fast = None if summary is None else r.summary_report(summary, 300, "flat", classes, Gates())
    cols = a.validate_requests_table(a.read_requests_csv(path), classes, str(path))
    return fast, r.class_report(cols, 300, "flat", classes, Gates())


def csv_text(rows: list[dict]) -> str:
    lines = [
        f"{r['id']},{r['class']},{r['ttft']!r},{r['tpot']!r},{r['e2e']!r},{r['out']},{r['status']}"
        for r in rows
    ]
    return "\n".join([HEADER, *lines]) + "\n"


@pytest.mark.parametrize("seed", range(6))
def test_fast_and_exact_paths_agree_exactly(tmp_path, monkeypatch, seed):
    from capacity_pack.evidence import requests_csv as a

    # Tiny parse blocks and tasks: many record batches, ID chunks and tasks, as in a large file.
    monkeypatch.setattr(a, "_BLOCK_BYTES", int(np.random.default_rng(seed).choice([4096, 1 << 20])))
    monkeypatch.setattr(a, "_TASK_ROWS", 700)
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, int(rng.choice([0, 1, 2500, 12_000])), ok_share=0.97)
    for i, r in enumerate(rows):  # IDs of several lengths
        r["id"] = f"req-{i}" if i % 3 else f"a-much-longer-request-identifier-{i:x}"
    text = csv_text(rows)
    # Failed rows may carry blanks or NA instead of numbers: the seed never parses them.
    text = text.replace(",0.0,0.0,0.0,0,error", ",,NA,,,error")
    path = write(tmp_path, text)
    fast, exact = both_paths(path)
    assert fast is not None and fast == exact
    assert analyze_csv(path, 300, "flat") == exact | {"percentile_method": "nearest_rank"}


def test_variable_length_classes_and_header_only(tmp_path):
    from capacity_pack.evidence.slo_report import ClassSpec

    classes = [ClassSpec("interactive", 500, 40, None), ClassSpec("long_context", 2500, 50, 256)]
    rows = ["r-1,interactive,10,2,30,11,ok", "r-2,long_context,1,1,256,256,ok", "r-3,x,1,1,1,1,ok"]
    fast, exact = both_paths(write(tmp_path, HEADER + "\n" + "\n".join(rows[:2]) + "\n"), classes)
    assert fast == exact and exact["classes"]["interactive"]["output_tokens"] == 11
    fast, exact = both_paths(write(tmp_path, HEADER + "\n"), classes)
    assert fast == exact and exact["attempted"] == 0 and exact["error_rate"] is None


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # Across columns and rules, the first failing ok row wins, with its first failing rule.
        (["r-1,interactive,1,x,128,128,ok", "r-2,interactive,fast,1,128,128,ok"],
         "line 2, column tpot_ms: 'x' is not a number"),
        (["r-1,interactive,-1,1,126,128,ok", "r-2,interactive,fast,1,128,128,ok"],
         "line 2: latencies must be finite and nonnegative"),
        (["r-1,interactive,1,1,128,128,ok", "r-2,interactive,1,1,127,127,ok",
          "r-3,interactive,1,1,x,128,ok"],
         "line 3: successful output length differs from the fixed workload"),
        (["r-1,interactive,1,1,129,128,ok", "r-2,interactive,1,1,128,,ok"],
         "line 2: TTFT/TPOT/E2E disagree under this fixture's metric convention"),
        (["r-1,interactive,0,0,0,0,error", "r-2,interactive,,1,128,128,ok"],
         "line 3, column ttft_ms: '' is not a number"),
        (["r-1,interactive,NA,1,128,128,ok"], "line 2, column ttft_ms: 'NA' is not a number"),
        # int() takes no decimal point and no hexadecimal (pyarrow's integers do), as in the seed.
        (["r-1,interactive,1,1,128,128.0,ok"],
         "line 2, column output_tokens: '128.0' is not a whole number"),
        (["r-1,interactive,1,1,128,0x80,ok"],
         "line 2, column output_tokens: '0x80' is not a whole number"),
        # Python's float() rejects the NaN payload pyarrow accepts.
        (["r-1,interactive,nan(1),1,128,128,ok"],
         "line 2, column ttft_ms: 'nan(1)' is not a number"),
        (["r-1,interactive,1,1,128,128,ok", "r-9,interactive,1,1,128,128,ok",
          "r-1,interactive,1,1,128,128,ok", "r-9,interactive,1,1,128,128,ok"],
         "line 4: request IDs must be nonempty and unique"),
    ],
)  # fmt: skip
def test_first_failing_row_over_every_rule(tmp_path, rows, message):
    path = write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n")
    with pytest.raises(AnalysisError) as err:
        analyze_csv(path, 300, "flat")
    assert str(err.value) == f"{path}: {message}"


def test_python_number_syntax_is_accepted_as_python_does(tmp_path):
    # Spellings outside pyarrow's grammar leave the fast path, and Python's rules decide.
    rows = ["r-1,interactive, 1_0 ,+.5,73.5,+1_28,ok", "r-2,interactive,1.e1,-0,10.0, 128 ,ok",
            "r-3,interactive,١٠,0,10,١٢٨,ok", "r-4,interactive,0,0,0,x,error"]  # fmt: skip
    report = analyze_csv(write(tmp_path, HEADER + "\n" + "\n".join(rows) + "\n"), 300, "flat")
    c = report["classes"]["interactive"]
    assert (c["successful_count"], c["output_tokens"], c["p50_ttft_ms"]) == (3, 384, 10.0)


def test_numbers_parse_exactly_as_python_float_and_int():
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    from capacity_pack.evidence.requests_csv import numeric_column

    rng = np.random.default_rng(7)
    alphabet = list("0123456789_.eE+- ") + ["inf", "nan", "Infinity", "\t", "x", "١", "\xa0"]
    texts = ["", " ", "1", "1_000", "1__0", "_1", "1_", "+.5", "1.e5", ".", "e5", "-iNF", "nan(1)",
             "0x10", "1e400", "4.9e-324", "128.0", "+128", " 12 ", "1_2", "٣", "\xa07"]  # fmt: skip
    texts += ["".join(rng.choice(alphabet, rng.integers(1, 7))) for _ in range(3000)]

    def arrow_reads(text: str) -> bool:
        try:
            pc.cast(pa.array([text]), pa.float64())
            return True
        except pa.ArrowInvalid:
            return False

    # A column pyarrow converts whole takes another route: check that one too.
    easy = [t for t in texts if arrow_reads(t)]
    cases = [(False, float, texts), (True, int, texts), (False, float, easy)]
    for integer, convert, batch in cases:
        values, bad = numeric_column(
            pd.Series(batch, dtype="str"), np.ones(len(batch), bool), integer
        )
        for text, value, failed in zip(batch, values, bad, strict=True):
            try:
                want = float(convert(text))
            except ValueError:
                assert failed, (text, integer)
                continue
            assert not failed and (value == want or (math.isnan(value) and math.isnan(want))), (
                text,
                integer,
            )


@pytest.mark.parametrize("seed", range(8))
def test_id_hash_check_never_misses_a_duplicate(seed):
    import pyarrow as pa

    from capacity_pack.evidence.requests_csv import ids_valid

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    width = int(rng.choice([0, 3, 8, 12, 16, 23]))  # 0: every ID its own length
    ids = [
        (f"{i:0{width}d}" if width else "x" * int(rng.integers(1, 40)) + str(i)).encode()
        for i in range(n)
    ]
    if seed % 2:  # a duplicate, anywhere, possibly in another chunk
        ids[int(rng.integers(0, n))] = ids[int(rng.integers(0, n))]
    cuts = sorted(set(rng.integers(0, n, 5).tolist()) | {0, n})
    whole = pa.array(ids, pa.binary())
    # Sliced chunks: offsets into a shared buffer, as pyarrow may hand them over.
    chunks = pa.chunked_array([whole.slice(a, b - a) for a, b in zip(cuts, cuts[1:], strict=False)])
    assert ids_valid(chunks) == (len(set(ids)) == n)


def test_seed_report_takes_text_columns(tmp_path):
    from capacity_pack.evidence import requests_csv as a
    from capacity_pack.evidence import slo_report as r
    from capacity_pack.evidence.gates import Gates

    rows = random_rows(np.random.default_rng(3), 3000, ok_share=0.95)
    path = write(tmp_path, csv_text(rows))
    cols = a.validate_requests_table(a.read_requests_csv(path), r.tutorial_classes(), str(path))
    names = np.array([c.name for c in r.tutorial_classes()] + ["?"], dtype=object)
    text_cols = {k: cols[k] for k in ("ttft", "tpot", "e2e", "out")}
    text_cols["class"] = names[cols["code"]]
    text_cols["status"] = np.where(cols["ok"], "ok", "error").astype(object)
    args = (300, "flat", r.tutorial_classes(), Gates())
    assert r.class_report(text_cols, *args) == r.class_report(cols, *args)


def test_hash_collisions_are_settled_by_comparing_strings(tmp_path, monkeypatch):
    import pandas as pd
    import pyarrow.compute as pc

    from capacity_pack.evidence import requests_csv as a

    def colliding(ids, longest):  # equal lengths, equal hashes
        return pc.binary_length(ids).to_numpy(zero_copy_only=False).astype(np.uint64)

    monkeypatch.setattr(a, "_row_hashes", colliding)
    ids = pd.Series(["ab", "cd", "ab", "xyz", "cd", "q", "xyz", "ab"], dtype="str")
    assert a._repeats(ids).tolist() == ids.duplicated(keep="first").tolist()
    path = write(tmp_path, csv_text(random_rows(np.random.default_rng(5), 2500, ok_share=0.99)))
    fast, exact = both_paths(path)
    assert fast is None  # every ID "collides": the exact path decides, and finds no duplicate
    assert analyze_csv(path, 300, "flat") == exact | {"percentile_method": "nearest_rank"}


def test_the_in_run_gate_is_current_only_at_the_same_gate_and_confidence():
    from capacity_pack.evidence.analysis import in_run_gate

    decided = {"decision": "fail", "gate": 0.95, "confidence": 0.95}
    assert in_run_gate(decided, 0.95, 0.95) == {
        "attainment_min": 0.95, "confidence": 0.95, "current": True,
    }  # fmt: skip
    assert in_run_gate(decided, 0.9, 0.95)["current"] is False
    assert in_run_gate(decided, 0.95, 0.9)["current"] is False
    # No in-run decision (closed loop, a sharded point): nothing to be stale.
    assert in_run_gate({}, 0.95, 0.95) is None


def test_a_point_stopped_on_a_proven_pass_keeps_the_looks_lower_bound():
    """The running intersection: the final interval cut by the deciding look's, so requests
    still in flight at the stop (and the design effect re-estimated over them) cannot turn the
    pass that ended the point into a marginal verdict; the upper end and the lower end each
    come from whichever interval is tighter."""
    from capacity_pack.evidence.analysis import in_run_bounds, intersect_with_look

    decided = {
        "decision": "pass",
        "gate": 0.95,
        "confidence": 0.95,
        "per_class": {
            "interactive": {"low": 0.9512, "high": 0.999, "n": 330, "passed": 329},
            "long_context": {"low": None, "high": None, "n": 0, "passed": 0},
        },
    }
    looks = in_run_bounds(decided, 0.95, 0.95)
    assert looks == {"interactive": (0.9512, 0.999)}
    # Another gate or confidence: the look's bounds were for another question.
    assert in_run_bounds(decided, 0.9, 0.95) == {} and in_run_bounds({}, 0.95, 0.95) == {}

    entry = {"attainment_ci": [0.9465, 0.9981], "attainment_ci_method": "confidence sequence"}
    intersect_with_look(entry, looks["interactive"])
    assert entry["attainment_ci"] == [0.9512, 0.9981]
    assert "deciding in-run look" in entry["attainment_ci_method"]
    # Disjoint intervals (the two design-effect estimates disagree): the final one stands.
    entry = {"attainment_ci": [0.80, 0.90], "attainment_ci_method": "confidence sequence"}
    intersect_with_look(entry, (0.95, 0.99))
    assert entry["attainment_ci"] == [0.80, 0.90]
    # No look, or no interval: unchanged.
    entry = {"attainment_ci": None, "attainment_ci_method": "x"}
    intersect_with_look(entry, (0.95, 0.99))
    assert entry["attainment_ci"] is None
