"""capacity-pack compare: the statistics (evidence brackets, Newcombe's interval, the pooled
log-scale variation of P95s), the verdict line, the sources and the command's errors."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from capacity_pack.cli import COMPARE_DIFFERS_STATUS, main
from capacity_pack.decide.bracket import evidence_bracket, evidence_disjoint
from capacity_pack.decide.compare import BEYOND, NO_DIFFERENCE, run_compare
from capacity_pack.decide.compare_render import to_html
from capacity_pack.decide.compare_sources import CompareError, load_folder
from capacity_pack.decide.compare_stats import (
    LogSample,
    d2,
    excludes_zero,
    log_ratio_test,
    log_sample,
    newcombe_interval,
    pooled_log_variance,
)

CLASSES = ("interactive", "batch")

# ---------------------------------------------------------------------------------------------
# A pack folder as the pipeline writes it (the fields compare reads)
# ---------------------------------------------------------------------------------------------


def spread(vals, **extra):
    """A quantity over the repeats, as capacity.json holds it (no interval: two repeats)."""
    return {"n": len(vals), "mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals),
            "interval": None, "interval_method": None, "interval_note": None,
            "confidence": 0.95, **extra}  # fmt: skip


def rate_row(rate, status, *, met=(200, 200), ok=(200, 200), p95=(100.0, 104.0)):
    """One open-loop rate with two repeats: per class `met` of `ok` requests met the SLO in
    each repeat, P95 TTFT `p95` ms in each repeat (TPOT a tenth, E2E ten times)."""
    classes = {}
    for c in CLASSES:
        lat = {}
        for key, scale in (("p95_ttft_ms", 1.0), ("p95_tpot_ms", 0.1), ("p95_e2e_ms", 10.0)):
            lat[key] = spread([v * scale for v in p95])
        k, n = sum(met), sum(ok)
        attainment = spread([m / o for m, o in zip(met, ok, strict=True)],
                            pooled={"count": k, "trials": n, "value": k / n})  # fmt: skip
        classes[c] = {"attainment": attainment, **lat}
    rates = [float(rate)] * 2
    return {
        "offered_rps": float(rate),
        "status": status,
        "repeats": 2,
        "per_repeat": [{"repeat": 0}, {"repeat": 1}],
        "variation": {
            "observed_goodput_rps": spread(rates),
            "request_throughput_rps": spread(rates),
            "output_throughput_tps": spread([r * 50 for r in rates]),
            "error_rate": spread([0.0, 0.0]),
            "classes": classes,
        },  # fmt: skip
    }


def capacity_doc(name, rates, capacity):
    rows = [rate_row(r, s, **kw) for r, s, kw in rates]
    above = [r for r in rows if capacity is None or r["offered_rps"] > capacity]
    return {
        "pack": name,
        "primary_cache_state": "cold",
        "holds_for": {
            "engine": {"name": "sim", "version": "1"},
            "model": {"id": "m", "revision": "r1"},
        },  # fmt: skip
        "open_loop": {
            "cold": {
                "capacity_rps": capacity,
                "capacity_per_replica_rps": capacity,
                "goodput_per_gpu_rps": capacity,
                "decision": f"cold: {capacity}",
                "bracket": {
                    "pass_rps": capacity,
                    "fail_rps": above[0]["offered_rps"] if above else None,
                },  # fmt: skip
                "rates": rows,
            }
        },
        "closed_loop": {},
    }


def write_pack(root: Path, name="p", *, rates=None, capacity=20.0, profile="small-fast",
               replicas=2, reports=None, drill_verdict="PASS") -> Path:  # fmt: skip
    """results/<name>/ with pack/capacity.json, plan.json, failure-test.json and
    workload-manifest.yaml; `reports` adds per-point reports (design effects)."""
    rates = rates or [(10, "pass", {}), (20, "pass", {}), (30, "fail", {})]
    results = root / "results" / name
    pack = results / "pack"
    pack.mkdir(parents=True)
    (pack / "capacity.json").write_text(json.dumps(capacity_doc(name, rates, capacity)))
    (pack / "plan.json").write_text(json.dumps({
        "required_replicas": replicas, "required_gpus": replicas, "bound_by": "throughput",
        "capacity_cache_state": "cold", "throughput": {"capacity_per_replica_rps": capacity},
    }))  # fmt: skip
    (pack / "failure-test.json").write_text(json.dumps({
        "pack": {"name": name}, "clock": "CLOCK_MONOTONIC",
        "clocks": {"replica_kill": "CLOCK_MONOTONIC"},
        "plan_drill": {"verdict": drill_verdict, "sentence": f"Losing 1: {drill_verdict}"},
        "drills": [{"drill": "replica_kill", "expected_alert_fired": True,
                    "injection_time_s": 4.0, "detection_time_s": 5.0, "recovery_time_s": 9.0,
                    "requests_rejected": 3, "requests_lost": 1}],
        "summary": {"drills_run": ["replica_kill"], "drills_skipped": {}, "any_alert_fired": True,
                    "expected_alerts_fired": {"replica_kill": True}, "alerts_not_evaluated": {},
                    "unexpected_mechanisms": {"replica_kill": []}, "mechanism_lines": []},
    }))  # fmt: skip
    manifest = {
        "pack": {"name": name},
        "target": {"kind": "sim", "profile": profile},
        "engine": {"name": "sim", "version": "1"},
        "model": {"id": "m", "revision": "r1"},
    }
    (pack / "workload-manifest.yaml").write_text(
        yaml.safe_dump({"frozen_sha256": "abc", **manifest})
    )
    for (state, rate, rep), classes in (reports or {}).items():
        where = results / "reports" / f"open-r{rate:g}" / state / f"rep{rep}"
        where.mkdir(parents=True)
        point = f"open-r{rate:g}"
        counted = {c: {"successful_count": 200, "passing_count": 190, **v}
                   for c, v in classes.items()}  # fmt: skip
        (where / "slo-report.json").write_text(json.dumps({
            "point": point, "key": f"{point}/{state}/rep{rep}", "mode": "open",
            "cache_state": state, "offered_rps": rate, "repeat": rep, "verdict": "pass",
            "attempted": 400, "successful": 400, "classes": counted,
        }))  # fmt: skip
    return results


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        # Newcombe (Statist. Med. 1998), Table II, method 10: B - A.
        ((48, 80), (56, 70), (0.0524, 0.3339)),
        ((3, 10), (9, 10), (0.1705, 0.8090)),
        ((0, 29), (5, 56), (-0.0381, 0.1926)),
        # Worked by hand from the two Wilson intervals (0.4869, 0.9742) and (0.0822, 0.6410).
        ((2, 7), (6, 7), (0.0582, 0.8062)),
    ],
)
def test_newcombe_hybrid_score_interval_matches_the_published_values(a, b, expected):
    low, high = newcombe_interval(*a, *b, 0.95)
    assert low == pytest.approx(expected[0], abs=1e-4)
    assert high == pytest.approx(expected[1], abs=1e-4)


def test_newcombe_interval_stays_in_range_and_needs_trials():
    low, high = newcombe_interval(0, 5, 5, 5, 0.999)
    assert -1 <= low < high <= 1
    assert newcombe_interval(0, 0, 5, 5, 0.95) is None
    assert excludes_zero((0.01, 0.2)) and excludes_zero((-0.2, -0.01))
    assert not excludes_zero((-0.01, 0.2)) and not excludes_zero(None)


def test_d2_is_the_expected_range_of_normal_samples():
    # Tippett's table: 1.128, 1.693, 2.059, 2.326, 3.078.
    for n, value in ((2, 1.128), (3, 1.693), (4, 2.059), (5, 2.326), (10, 3.078)):
        assert d2(n) == pytest.approx(value, abs=1e-3)
    assert d2(2) == pytest.approx(2 / math.sqrt(math.pi))  # E|X1 - X2| exactly
    with pytest.raises(ValueError):
        d2(1)


def test_log_sample_from_repeats_and_from_the_range():
    exact = log_sample([100.0, 121.0], None)
    assert exact.basis == "repeats" and exact.n == 2
    assert exact.mean_log == pytest.approx(math.log(110.0))
    assert exact.var_log == pytest.approx(math.log(1.21) ** 2 / 2)
    ranged = log_sample(None, {"n": 2, "mean": 110.5, "min": 100.0, "max": 121.0})
    # For two repeats the range estimate is the sample variance exactly: (r / d2(2))^2 = r^2 / 2
    # only up to d2(2)^2 = 4 / pi vs 2; it is the unbiased range estimator, not s^2.
    assert ranged.var_log == pytest.approx((math.log(1.21) / d2(2)) ** 2)
    assert log_sample(None, {"n": 1, "mean": 5.0, "min": 5.0, "max": 5.0}).var_log is None
    assert log_sample(None, {"n": 0, "mean": None, "min": None, "max": None}) is None
    assert log_sample([None], {"n": 0}) is None


def test_pooled_log_variance_weights_by_degrees_of_freedom():
    a = LogSample(2, 0.0, 0.04, 1.0, 1.0, 1.0, "repeats")
    b = LogSample(4, 0.0, 0.01, 1.0, 1.0, 1.0, "repeats")
    single = LogSample(1, 0.0, None, 1.0, 1.0, 1.0, "repeats")
    var, df = pooled_log_variance([a, b, single])
    assert df == 4 and var == pytest.approx((1 * 0.04 + 3 * 0.01) / 4)
    assert pooled_log_variance([single]) == (None, 0)


def test_log_ratio_test_calls_a_difference_only_beyond_the_pooled_spread():
    a = LogSample(2, math.log(100), None, 100, 95, 105, "repeats")
    same = LogSample(2, math.log(104), None, 104, 99, 109, "repeats")
    slower = LogSample(2, math.log(200), None, 200, 190, 210, "repeats")
    var = 0.05**2  # 5 % between-repeat spread
    assert not log_ratio_test(a, same, var, 10, 0.95)["beyond"]
    hit = log_ratio_test(a, slower, var, 10, 0.95)
    assert hit["beyond"] and hit["ratio"] == pytest.approx(2.0)
    assert hit["interval"][0] > 1 and hit["interval"][0] < 2 < hit["interval"][1]
    blind = log_ratio_test(a, slower, None, 0, 0.95)
    assert not blind["beyond"] and "no estimate" in blind["why"]


def test_evidence_bracket_ignores_rates_that_were_not_shown_to_fail():
    rates = [(25, "pass", {}), (30, "inconclusive", {}), (35, "marginal", {}), (40, "fail", {})]
    sel = capacity_doc("x", rates, 25.0)["open_loop"]["cold"]
    assert evidence_bracket(sel) == {"low": 25.0, "high": 40.0, "capacity_rps": 25.0}
    none = capacity_doc("x", [(10, "inconclusive", {})], None)["open_loop"]["cold"]
    assert evidence_bracket(none) == {"low": 0.0, "high": math.inf, "capacity_rps": None}


def test_search_brackets_apart_but_evidence_overlapping_is_within_variation():
    # Two runs of the default pack: [30, 32) and [25, 30) as searched, but 30 is only
    # inconclusive in the second run and nothing fails below 40 in either.
    a = {"low": 30.0, "high": 40.0}
    b = {"low": 25.0, "high": 40.0}
    assert not evidence_disjoint(a, b)
    assert evidence_disjoint(a, {"low": 10.0, "high": 20.0})
    assert evidence_disjoint({"low": 0.0, "high": 10.0}, {"low": 10.0, "high": math.inf})
    assert not evidence_disjoint(a, None)


# ---------------------------------------------------------------------------------------------
# Whole comparisons
# ---------------------------------------------------------------------------------------------


def test_two_runs_of_one_pack_show_no_difference(tmp_path):
    a = write_pack(tmp_path / "a")
    b = write_pack(tmp_path / "b", rates=[
        (10, "pass", {"p95": (102.0, 98.0)}),
        (20, "pass", {"met": (199, 200), "p95": (101.0, 106.0)}),
        (30, "fail", {"met": (196, 199)}),
    ])  # fmt: skip
    text, doc = run_compare(str(a), str(b))
    assert doc["summary"].startswith(NO_DIFFERENCE[0].upper() + NO_DIFFERENCE[1:])
    assert "B carries as much as A (cold: 20 RPS each)" in doc["summary"]
    assert not doc["beyond"] and doc["beyond_what"] == []
    assert text.splitlines()[2] == f"**{doc['summary']}**"  # the verdict on top
    # Under it, each pack's decision in the console's and README's sentence.
    assert doc["decisions"] == [
        "A, cold: SLO-compliant capacity [20, 30) RPS, taken as 20 RPS",
        "B, cold: SLO-compliant capacity [20, 30) RPS, taken as 20 RPS",
    ]
    assert text.splitlines()[4:6] == [f"- {line}" for line in doc["decisions"]]
    # Both brackets of each pack in the bracket's words.
    row = next(line for line in text.splitlines() if line.startswith("| cold | 20 | 20 |"))
    assert "| [20, 30) RPS / [20, 30) RPS | [20, 30) RPS / [20, 30) RPS |" in row
    assert "manifests are identical" in text
    # Latency at the failing rate is shown, not tested.
    at30 = [r for r in doc["latency"] if r["offered_rps"] == 30.0]
    assert at30 and all(not m["tested"] for r in at30 for m in r["metrics"].values())


def test_a_slower_engine_differs_beyond_variation(tmp_path):
    a = write_pack(tmp_path / "a")
    b = write_pack(
        tmp_path / "b",
        rates=[(10, "pass", {"p95": (200.0, 210.0)}), (14, "pass", {}),
               (20, "fail", {"met": (40, 44), "ok": (200, 200)})],
        capacity=14.0,
        profile="slow-profile",
        replicas=3,
        drill_verdict="FAIL",
    )  # fmt: skip
    text, doc = run_compare(str(a), str(b))
    assert doc["summary"] == f"B carries 30 % less than A (cold: 14 vs 20 RPS): {BEYOND}"
    cold = doc["capacity"][0]
    assert cold["beyond"] and "B fails 20 RPS" in cold["note"]
    att = [r for r in doc["attainment"] if r["offered_rps"] == 20.0]
    assert all(r["beyond"] and r["difference"] < 0 for r in att)
    lat = [r for r in doc["latency"] if r["offered_rps"] == 10.0]
    assert all(r["metrics"]["p95_ttft_ms"]["beyond"] for r in lat)
    assert doc["plan"]["differs"] and "differs beyond variation" in doc["plan"]["note"]
    assert doc["drills"]["differs"]
    fields = {f["field"]: f["values"] for f in doc["manifest"]["fields"]}
    assert fields["target.profile"] == ["small-fast", "slow-profile"]
    assert "`target.profile`" in text and "slow-profile" in text


def test_design_effect_widens_the_attainment_interval(tmp_path):
    """A burst of misses (deff 8) is within variation where independent misses would not be;
    the larger design effect applies to both sides."""
    rates = [(10, "pass", {"met": (200, 200)}), (20, "pass", {}), (30, "fail", {})]
    burst = [(10, "pass", {"met": (185, 185), "ok": (200, 200)}), (20, "pass", {}),
             (30, "fail", {})]  # fmt: skip
    deffs = {("cold", 10.0, k): {c: {"attainment_design_effect": 8.0} for c in CLASSES}
             for k in (0, 1)}  # fmt: skip
    a = write_pack(tmp_path / "a", rates=rates)
    plain = write_pack(tmp_path / "plain", rates=burst)
    bursty = write_pack(tmp_path / "bursty", rates=burst, reports=deffs)
    _, independent = run_compare(str(a), str(plain))
    _, correlated = run_compare(str(a), str(bursty))
    pick = [r for r in independent["attainment"] if r["offered_rps"] == 10.0]
    assert all(r["beyond"] for r in pick)
    pick = [r for r in correlated["attainment"] if r["offered_rps"] == 10.0]
    assert all(not r["beyond"] and r["design_effect"] == 8.0 for r in pick)
    assert all(r["sides"][0]["design_effect"] == 1.0 for r in pick)


def test_sources_are_found_from_the_folders_around_a_pack(tmp_path):
    results = write_pack(tmp_path / "w", "mine")
    for path in (results, results / "pack", results.parent, tmp_path / "w"):
        assert load_folder(str(path), "A").name == "mine"
    assert load_folder(str(results), "A").manifest["target"]["profile"] == "small-fast"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "missing", "no such folder; expected a results folder"),
        (lambda t: (t / "empty").mkdir() or t / "empty", "not a capacity pack: no capacity.json"),
        (lambda t: (t / "f.txt").write_text("x") and t / "f.txt", "a file, not a folder"),
    ],
)
def test_bad_sources_are_one_line_errors(tmp_path, make, message):
    with pytest.raises(CompareError, match=message):
        load_folder(str(make(tmp_path)), "A")


def test_a_capacity_json_without_open_loop_names_the_field(tmp_path):
    results = write_pack(tmp_path / "w")
    (results / "pack" / "capacity.json").write_text('{"pack": "p"}')
    with pytest.raises(CompareError, match=r"capacity.json: not a Capacity file: open_loop: Field"):
        load_folder(str(results), "A")
    (results / "pack" / "capacity.json").write_text("{not json")
    with pytest.raises(CompareError, match=r"capacity.json: cannot read Capacity: Expecting"):
        load_folder(str(results), "A")


def test_two_packs_in_one_folder_must_be_named(tmp_path):
    write_pack(tmp_path, "one")
    write_pack(tmp_path, "two")
    with pytest.raises(CompareError, match=r"holds 2 packs \(one, two\); name one"):
        load_folder(str(tmp_path / "results"), "A")


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.verdict, self.tables, self._in = "", 0, False
        self.external = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._in = attrs.get("id") == "verdict" or self._in
        self.tables += tag == "table"
        self.external += [v for k, v in attrs.items() if k in ("src", "href") and v]

    def handle_endtag(self, tag):
        if tag == "p":
            self._in = False

    def handle_data(self, data):
        if self._in:
            self.verdict += data


def test_cli_writes_markdown_html_and_json(tmp_path):
    a = write_pack(tmp_path / "a")
    b = write_pack(tmp_path / "b", rates=[(10, "pass", {}), (14, "pass", {}),
                                          (20, "fail", {})], capacity=14.0)  # fmt: skip
    md, page, js = tmp_path / "c.md", tmp_path / "c.html", tmp_path / "c.json"
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(md), "--html",
                                    str(page), "--json", str(js)])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(js.read_text())
    assert res.output.splitlines()[0] == doc["summary"]
    assert doc["summary"] in md.read_text()
    parser = _Text()
    parser.feed(page.read_text())
    assert parser.verdict == doc["summary"] and BEYOND in parser.verdict
    assert parser.tables >= 5 and parser.external == []  # self-contained
    # The pack page's shell: a viewport for narrow screens and the body in one <main>.
    html = page.read_text()
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert html.count("<main>") == 1 and html.rstrip().endswith("</main>\n</body>\n</html>")
    # --exit-code: a difference beyond variation is its own status, not an error.
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--exit-code"])
    assert res.exit_code == COMPARE_DIFFERS_STATUS
    assert res.output.startswith("# Capacity pack comparison")
    res = CliRunner().invoke(main, ["compare", str(a), str(a), "--exit-code"])
    assert res.exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/nope", "{a}"], "Error: {tmp}/nope: no such folder"),
        (["mlflow:", "{a}"], "Error: mlflow:: no run id"),
        (["mlflow:abc", "{a}", "--tracking-uri", "sqlite:///{tmp}/none.db"],
         "Error: sqlite:///{tmp}/none.db: no such MLflow store"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_without_traceback(tmp_path, args, message):
    a = write_pack(tmp_path / "a")
    fill = {"tmp": str(tmp_path), "a": str(a)}
    res = CliRunner().invoke(main, ["compare", *(x.format(**fill) for x in args)])
    assert res.exit_code == 1
    assert res.output.strip().splitlines() == [res.output.strip()]
    assert res.output.startswith(message.format(**fill)), res.output
    assert "Traceback" not in res.output


def test_html_escapes_what_the_packs_say(tmp_path):
    a = write_pack(tmp_path / "a")
    cap = json.loads((a / "pack" / "capacity.json").read_text())
    cap["pack"] = "<script>x</script>"
    (a / "pack" / "capacity.json").write_text(json.dumps(cap))
    _, doc = run_compare(str(a), str(a))
    page = to_html(doc)
    assert "<script>" not in page and "&lt;script&gt;" in page
