"""Capacity selection across repeats, the closed-loop operating point, and the plan."""

from __future__ import annotations

import pytest
import yaml

from capacity_pack.artifacts import Plan, SloReport
from capacity_pack.decide import capacity as decide
from capacity_pack.decide import pooled
from capacity_pack.decide.capacity import mix_p95_context
from capacity_pack.decide.faults import measurement_faults, measurement_notes
from capacity_pack.decide.repeats import t_interval
from capacity_pack.plan.manifest import load_pack, validate_pack
from tests.conftest import with_fixed_lengths
from tests.paths import DEFAULT, TUTORIAL

CLASSES = ["interactive", "long_context", "generation_heavy"]


def models(reports):
    """The tests' report dicts as the SloReport models the decision reads."""
    return [SloReport.model_validate(r) for r in reports]


def select_open_loop(reports, *args, **kwargs):
    return decide.select_open_loop(models(reports), *args, **kwargs)


def closed_loop_curve(reports, *args):
    return decide.closed_loop_curve(models(reports), *args)


def build_capacity(reports, pack):
    return decide.build_capacity(models(reports), pack)


def build_plan(capacity, reports, pack):
    return decide.build_plan(capacity, models(reports), pack)


def decision_metrics(capacity, plan):
    return decide.decision_metrics(capacity, Plan.model_validate(plan))


def rate_status(reports):
    return pooled.rate_status(models(reports))


def pooled_attainment(reports):
    return pooled.pooled_attainment(models(reports))


def report(rate, repeat, verdict, *, state="cold", attainment=0.99, mode="open", conc=None,
           reasons=(), goodput=None):  # fmt: skip
    point = f"open-r{rate:g}" if mode == "open" else f"closed-c{conc}"
    per_class = 200
    return {
        "attempted": per_class * len(CLASSES), "successful": per_class * len(CLASSES),
        "measured_window_s": per_class * len(CLASSES) / (rate or conc),
        "mode": mode, "offered_rps": rate, "concurrency": conc, "cache_state": state,
        "repeat": repeat, "point": point, "key": f"{point}/{state}/rep{repeat}",
        "verdict": verdict, "verdict_reasons": list(reasons),
        "observed_goodput_rps": goodput if goodput is not None else (rate or conc) * attainment,
        "output_throughput_tps": (rate or conc) * 100.0,
        "request_throughput_rps": float(rate or conc),
        "error_rate": 0.0, "all_class_slos_pass": verdict == "pass",
        "classes": {c: {"attainment": attainment, "p95_ttft_ms": 100.0 + (rate or conc),
                        "p95_tpot_ms": 20.0, "p95_e2e_ms": 900.0,
                        "successful_count": per_class,
                        "passing_count": round(per_class * attainment)} for c in CLASSES},
    }  # fmt: skip


def test_seed_worked_example_selects_24_not_28():
    # 16/20/24 pass in every repeat; 28 fails (78% attainment, errors, growing queue).
    reports = [report(r, k, "pass") for r in (16, 20, 24) for k in range(3)]
    reports += [report(28, k, "fail", attainment=0.78,
                       reasons=["interactive: attainment 0.7800 < 0.95", "queue trend growing"])
                for k in range(3)]  # fmt: skip
    sel = select_open_loop(reports, CLASSES, replicas=4, gpus=8)["cold"]
    assert sel["capacity_rps"] == 24
    assert sel["capacity_per_replica_rps"] == 6  # the seed's 24 RPS / 4 replicas
    assert sel["capacity_per_gpu_nominal_rps"] == 3  # 24 RPS / 8 GPUs
    # Goodput per GPU is the measured goodput at 24 RPS (24 x 0.99 in every repeat) / 8 GPUs.
    assert sel["goodput_per_gpu_rps"] == pytest.approx(24 * 0.99 / 8)
    b = sel["bracket"]
    assert (b["pass_rps"], b["fail_rps"], b["width_rps"]) == (24, 28, 4)
    assert b["fail_status"] == "fail" and b["resolution_rps"] is None and b["reached"] is None
    assert sel["next_rate_up"]["offered_rps"] == 28
    assert "queue trend growing" in sel["next_rate_up"]["limited_by"]
    assert "28 RPS" in sel["decision"] and "24 RPS" in sel["decision"]


def pooled_report(rate, repeat, attainment, *, blocks=6, per_block=100, others="pass",
                  state="cold", sample_gate=80, **per_class):  # fmt: skip
    """A report that pools: each class ``blocks`` blocks of ``per_block`` successful requests,
    at ``attainment`` (or its own, by name in ``per_class``), evenly spread over the blocks
    unless a class gives its per-block attainments as a list."""
    r = report(rate, repeat, "marginal", state=state)
    for c in CLASSES:
        a = per_class.get(c, attainment)
        shares = a if isinstance(a, list) else [a] * blocks
        n_j = [per_block] * len(shares)
        k_j = [round(per_block * x) for x in shares]
        r["classes"][c] |= {
            "successful_count": sum(n_j), "passing_count": sum(k_j),
            "attainment": sum(k_j) / sum(n_j), "attainment_ci_confidence": 0.95,
            "attainment_blocks": {"block_s": 5.0, "successful": n_j, "passing": k_j},
        }  # fmt: skip
    r["attainment_gate"] = {"min": 0.95, "min_successful": sample_gate}
    reasons = {"pass": [], "fail": ["error rate 0.0300 > 0.01"],
               "inconclusive": ["queue trend inconclusive"]}[others]  # fmt: skip
    r["besides_attainment"] = {"outcome": others, "reasons": reasons}
    return r


def test_a_rates_repeats_are_pooled_into_one_interval():
    """The issue's 35 RPS: one repeat met every SLO, the other 0.90 of the interactive class.
    Neither decides the rate alone: their requests pooled meet the gate (0.95) and the blocks
    of both give the design effect, so the interval is wide (cannot decide at this size)."""
    reps = [pooled_report(35, 0, 1.0), pooled_report(35, 1, 1.0, interactive=0.9)]
    assert rate_status(reps) == "marginal"
    pooled = pooled_attainment(reps)["interactive"]
    assert pooled["attainment"] == pytest.approx(0.95) and pooled["meets"]
    assert pooled["evidence"] == "cannot decide at this sample size"
    assert pooled["design_effect"] > 5 and pooled["blocks"] == 12
    assert pooled["between_repeats"] == pytest.approx(0.1) and pooled["per_repeat"] == [1.0, 0.9]
    low, high = pooled["ci"]
    assert low < 0.95 < high
    # Consistent repeats: the design effect is that of either (evenly spread: 1).
    assert pooled_attainment([pooled_report(35, 0, 0.95)] * 2)["interactive"]["design_effect"] == 1
    # Under the gate on the pooled estimate, not shown to fail: misses.
    assert rate_status([pooled_report(36, 0, 0.99, interactive=0.94)]) == "misses"


def test_a_rate_is_shown_to_pass_or_fail_on_the_pooled_evidence():
    assert rate_status([pooled_report(30, k, 0.99, blocks=12) for k in range(2)]) == "pass"
    assert rate_status([pooled_report(50, 0, 0.99, interactive=0.8)]) == "fail"
    # 0.925 over 300 requests: undecided alone; three such repeats pooled are shown to fail.
    one = pooled_report(40, 0, 0.99, interactive=0.925, per_block=50)
    assert (
        pooled_attainment([one])["interactive"]["evidence"] == "cannot decide at this sample size"
    )
    three = [pooled_report(40, k, 0.99, interactive=0.925, per_block=50) for k in range(3)]
    assert pooled_attainment(three)["interactive"]["evidence"] == "shown to fail"
    assert rate_status(three) == "fail"
    # Another gate failed in a repeat (the error rate), or undecided (the queue trend); a class
    # under its sample gate even pooled.
    assert (
        rate_status([pooled_report(30, 0, 0.99), pooled_report(30, 1, 0.99, others="fail")])
        == "fail"
    )
    assert rate_status([pooled_report(30, 0, 0.99, others="inconclusive")]) == "inconclusive"
    assert rate_status([pooled_report(30, 0, 1.0, blocks=1, per_block=40)]) == "inconclusive"
    assert (
        rate_status([pooled_report(30, k, 1.0, blocks=1, per_block=40) for k in range(2)])
        != "inconclusive"
    )


def test_a_rate_with_no_server_result_or_under_the_gate_says_so_first():
    """A client-bound repeat measured the client: no side of the gate, whatever its data; a
    class under the gate on its estimate reads `misses` even when it is also under-sampled."""
    bound = pooled_report(50, 0, 0.99, interactive=0.5, others="inconclusive")
    bound["client_bound"] = True
    assert rate_status([bound]) == "inconclusive"
    few = pooled_report(50, 0, 0.99, interactive=0.9, blocks=1, per_block=40)
    assert rate_status([few]) == "misses"
    undecided_queue = pooled_report(50, 0, 0.99, interactive=0.94, others="inconclusive")
    assert rate_status([undecided_queue]) == "misses"


def test_the_capacity_is_the_pooled_estimates_and_says_what_is_shown():
    reports = [pooled_report(30, k, 0.99, blocks=12) for k in range(2)]
    reports += [pooled_report(35, 0, 1.0), pooled_report(35, 1, 1.0, interactive=0.9)]
    reports += [pooled_report(37, k, 0.99, interactive=0.94) for k in range(2)]
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    assert sel["capacity_rps"] == 35 and sel["shown_to_pass_rps"] == 30
    assert (sel["bracket"]["pass_rps"], sel["bracket"]["fail_rps"]) == (35, 37)
    rows = {r["offered_rps"]: r for r in sel["rates"]}
    assert [rows[r]["status"] for r in (30, 35, 37)] == ["pass", "marginal", "misses"]
    words = sel["decision"]
    assert words.startswith(
        "cold: SLO-compliant capacity [35, 37) RPS, taken as 35 RPS; 35 RPS is the highest "
        "tested rate meeting every gate on the pooled evidence of its repeats ("
    )
    assert "; above it, 37 RPS misses the attainment gate on the pooled estimate: " in words
    assert "interactive 0.9400" in words and "cannot decide at this sample size" in words
    assert "fails" not in words


def test_reports_that_cannot_be_pooled_must_pass_in_every_repeat():
    def verdicts(*vs):
        return [report(16, k, v) for k, v in enumerate(vs)]

    assert rate_status(verdicts("pass", "fail")) == "inconsistent"
    assert rate_status(verdicts("pass", "marginal")) == "inconsistent"
    assert rate_status(verdicts("marginal", "marginal")) == "marginal"
    assert rate_status(verdicts("pass", "inconclusive")) == "inconclusive"
    reports = [report(16, 0, "pass"), report(16, 1, "pass"),
               report(20, 0, "pass"), report(20, 1, "fail")]  # fmt: skip
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    assert sel["capacity_rps"] == 16
    assert sel["next_rate_up"]["status"] == "inconsistent"


def test_a_client_bound_repeat_is_set_aside_when_another_is_a_server_result():
    bound = ["client-bound: dispatch lateness above its bound, not a server result"]
    reports = [
        report(16, 0, "pass"),
        report(20, 0, "inconclusive", reasons=bound) | {"client_bound": True},
        report(20, 1, "pass", goodput=19.5),
        report(24, 0, "inconclusive", reasons=bound) | {"client_bound": True},
    ]
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    # 20 RPS is decided on its server result (repeat 1); 24 RPS has none: inconclusive.
    assert sel["capacity_rps"] == 20 and sel["goodput_at_capacity_rps"] == 19.5
    rows = {r["offered_rps"]: r for r in sel["rates"]}
    assert rows[20]["set_aside_repeats"] == [0] and rows[20]["repeats"] == 1
    assert rows[24]["status"] == "inconclusive" and rows[24]["set_aside_repeats"] == []
    assert "client-bound" in rows[24]["failure_summary"]
    assert rows[20]["set_aside_why"] == {"0": "client-bound"}


def test_a_superseded_repeat_is_set_aside_when_another_decides():
    """Decided in run under another gate and undecided at this one: no evidence either way."""
    stale = ["stopped in run under another gate (0.95 at 95%): undecided at this one"]
    reports = [
        report(16, 0, "marginal", reasons=stale) | {"superseded": True},
        report(16, 1, "pass"),
        report(20, 0, "inconclusive", reasons=stale) | {"superseded": True},
    ]
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    rows = {r["offered_rps"]: r for r in sel["rates"]}
    assert sel["capacity_rps"] == 16 and rows[16]["set_aside_why"] == {"0": "superseded"}
    assert rows[20]["status"] == "inconclusive"


def test_a_pass_above_a_failure_is_not_selected():
    reports = [report(16, 0, "pass"), report(20, 0, "fail"), report(24, 0, "pass")]
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    assert sel["capacity_rps"] == 16 and sel["non_monotonic_passes_rps"] == [24]


def test_variation_is_disclosed_not_the_best_run():
    reports = [report(16, k, "pass", goodput=g) for k, g in enumerate([15.0, 15.5, 16.0])]
    row = select_open_loop(reports, CLASSES, 1, 1)["cold"]["rates"][0]
    g = row["variation"]["observed_goodput_rps"]
    assert (g["mean"], g["min"], g["max"]) == pytest.approx((15.5, 15.0, 16.0))
    assert g["interval"] is None and "range of 3 repeats" in g["interval_note"]
    values = [15.0, 15.5, 16.0, 15.25, 15.75]
    reports = [report(16, k, "pass", goodput=v) for k, v in enumerate(values)]
    g = select_open_loop(reports, CLASSES, 1, 1)["cold"]["rates"][0]["variation"]
    g = g["observed_goodput_rps"]
    # t(0.975, 4) = 2.7764; s = 0.3953; half = 2.7764 x 0.3953 / sqrt(5) = 0.4909
    assert g["interval"][0] == pytest.approx(15.5 - 0.4909, abs=1e-3)
    assert t_interval([1.0])["interval"] is None


def test_cold_and_warm_are_selected_separately():
    reports = [
        report(16, 0, "pass"),
        report(20, 0, "fail"),
        report(16, 0, "pass", state="warm"),
        report(20, 0, "pass", state="warm"),
    ]
    sel = select_open_loop(reports, CLASSES, 1, 1)
    assert sel["cold"]["capacity_rps"] == 16 and sel["warm"]["capacity_rps"] == 20
    assert "highest rate tested" in sel["warm"]["decision"]


def test_closed_loop_operating_point_and_single_user():
    reports = [report(None, 0, "pass", mode="closed", conc=c, attainment=a)
               for c, a in ((1, 1.0), (8, 0.99), (32, 0.97), (64, 0.6))]  # fmt: skip
    for r, tps in zip(reports, (100.0, 700.0, 2000.0, 2600.0), strict=True):
        r["output_throughput_tps"] = tps
    cur = closed_loop_curve(reports, CLASSES, 0.95)["cold"]
    assert cur["operating_point"]["concurrency"] == 32
    assert cur["single_user"]["concurrency"] == 1
    assert cur["saturation_tps"] == 2600.0


def test_plan_from_the_tutorial_pack_gives_the_seeds_8_replicas():
    pack = load_pack(TUTORIAL)
    reports = [report(r, k, "pass") for r in (16, 20, 24) for k in range(3)]
    reports += [report(28, k, "fail") for k in range(3)]
    capacity = build_capacity(reports, pack)
    assert capacity.primary_cache_state == "cold"
    plan = build_plan(capacity, reports, pack)
    assert plan["throughput"]["replicas_for_load"] == 8
    assert plan["required_replicas"] >= 8 and plan["required_gpus"] == 2 * plan["required_replicas"]
    metrics = decision_metrics(capacity, plan)
    assert metrics["cold.capacity_rps"] == 24 and metrics["cold.capacity_per_replica_rps"] == 6


def test_no_capacity_means_no_plan():
    pack = load_pack(DEFAULT)
    reports = [report(20, 0, "fail", reasons=["error rate 0.5 > 0.01"])]
    capacity = build_capacity(reports, pack)
    plan = build_plan(capacity, reports, pack)
    assert plan["required_replicas"] is None and "no SLO-compliant capacity" in plan["reason"]
    assert "error rate 0.5" in capacity.open_loop["cold"].decision


def test_mix_p95_context():
    assert mix_p95_context(load_pack(TUTORIAL)) == 8192 + 256  # 70% + 20% reach the long class
    data = with_fixed_lengths(yaml.safe_load(DEFAULT.read_text()))
    data["workload"][1]["mix"], data["workload"][2]["mix"] = 0.46, 0.04
    data["client"].pop("class_schedule_counts")
    assert mix_p95_context(validate_pack(data)) == 1024 + 48


@pytest.mark.parametrize(("kv_gb", "verdict"), [(4, "fits"), (8, "zero-headroom"),
                                                (12, "does-not-fit")])  # fmt: skip
def test_preflight_fit_probe_with_the_seed_numbers(kv_gb, verdict):
    from capacity_pack.decide.capacity import max_context_tokens, preflight_fit

    data = with_fixed_lengths(yaml.safe_load(DEFAULT.read_text()))
    pack = validate_pack(data)
    context = max_context_tokens(pack)
    assert context == 1024 + 48
    data["plan"]["memory"] = {
        "accelerator_memory_gb": 24, "margin_gb": 2, "weights_gb": 12, "overhead_gb": 2,
        "memory_utilization": 1.0, "kv_bytes_per_token": kv_gb * 1e9 / context,
    }  # fmt: skip
    fit = preflight_fit(validate_pack(data))
    assert fit["checked"] and fit["verdict"] == verdict
    assert fit["headroom_gb"] == pytest.approx(8 - kv_gb)


def test_preflight_refuses_a_context_beyond_the_model_limit():
    from capacity_pack.decide.capacity import preflight_fit

    data = yaml.safe_load(DEFAULT.read_text())
    data["workload"][1]["input_tokens"] = 9000  # small-fast's max_model_len is 8192
    fit = preflight_fit(validate_pack(data))
    assert fit["verdict"] == "does-not-fit" and "max_model_len 8192" in fit["reason"]


def test_effective_bandwidth_from_the_single_user_tpot():
    from capacity_pack.decide.capacity import effective_bandwidth, memory_inputs

    pack = load_pack(DEFAULT)
    closed = [report(None, 0, "pass", mode="closed", conc=1)]
    for c in closed[0]["classes"].values():
        c["p95_tpot_ms"] = 10.0  # 100 tokens/s
    capacity = build_capacity(closed, pack)
    bw = effective_bandwidth(capacity, pack)
    weights = memory_inputs(pack)["weights_gb"]
    assert bw["tokens_per_second"] == pytest.approx(100.0)
    assert bw["effective_bandwidth_gbps"] == pytest.approx(100.0 * weights)
    # small-fast: 0.4 TB/s spec; 2.47 GB x 100/s = 247 GB/s -> MBU ~0.62
    assert bw["mbu"] == pytest.approx(100.0 * weights / 400.0)


def test_attainment_plot_draws_a_zero_attainment_whose_interval_rounds_above_it(tmp_path):
    """A Wilson bound a hair above a 0.0 attainment (floating point) must not crash the plot."""
    from capacity_pack.decide.plots import plot_attainment

    report = {
        "cache_state": "cold",
        "mode": "open",
        "offered_rps": 10.0,
        "repeat": 0,
        "classes": {"chat": {"attainment": 0.0, "attainment_ci": [6.9e-18, 0.12]}},
    }
    path = tmp_path / "attainment.png"
    plot_attainment([report], ["chat"], 0.95, path)
    assert path.stat().st_size > 0


class _Search:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("search", "resolution", "reached"),
    [
        (None, None, None),
        (_Search(resolution_rps=2.0, resolution_rel=None), 2.0, True),
        (_Search(resolution_rps=1.0), 1.0, False),
        (_Search(resolution_rps=None, resolution_rel=0.05), 0.05 * 34, False),
        ({"resolution_rel": 0.1}, 3.4, True),
    ],
)
def test_the_capacity_is_a_bracket_with_the_search_resolution(search, resolution, reached):
    reports = [report(r, 0, "pass") for r in (20, 30, 34)]
    reports += [report(36, 0, "fail", reasons=["interactive: attainment 0.9100 < 0.95"])]
    reports += [report(40, 0, "fail")]
    sel = select_open_loop(reports, CLASSES, 1, 1, search=search)["cold"]
    b = sel["bracket"]
    assert sel["capacity_rps"] == b["pass_rps"] == 34
    assert b["fail_rps"] == 36 and b["width_rps"] == 2 and b["confidence"] == 0.95
    if resolution is None:
        assert b["resolution_rps"] is None
    else:
        assert b["resolution_rps"] == pytest.approx(resolution)
    assert b["reached"] is reached
    assert b["note"] == "cold: SLO-compliant capacity [34, 36) RPS, taken as 34 RPS" + (
        "; the bracket is wider than the search's resolution" if reached is False else ""
    )


def test_the_bracket_without_an_upper_or_a_lower_end():
    top = select_open_loop([report(20, 0, "pass")], CLASSES, 1, 1)["cold"]["bracket"]
    assert top["fail_rps"] is None and top["width_rps"] is None
    assert top["note"] == (
        "cold: SLO-compliant capacity at least 20 RPS, taken as 20 RPS; the highest rate tested "
        "meets every gate, so the true capacity may be higher"
    )
    low = select_open_loop([report(20, 0, "fail")], CLASSES, 1, 1)["cold"]["bracket"]
    assert low["pass_rps"] is None and low["fail_rps"] == 20
    assert low["note"] == (
        "cold: no SLO-compliant capacity, below 20 RPS (the lowest rate tested does not meet "
        "every gate)"
    )


def test_each_repeat_lists_its_offered_and_achieved_rate():
    r = report(30, 0, "pass", goodput=28.3)
    r.update(attempted=480, successful=470, measured_window_s=16.0, request_throughput_rps=29.375)
    row = select_open_loop([r], CLASSES, 1, 2)["cold"]["rates"][0]
    (rep,) = row["per_repeat"]
    assert rep["nominal_rps"] == 30.0
    assert rep["offered_measured_rps"] == pytest.approx(480 / 16.0)  # attempted / T
    assert rep["achieved_rps"] == pytest.approx(470 / 16.0)  # successful / T
    assert rep["goodput_rps"] == 28.3


def test_goodput_per_gpu_is_the_least_measured_goodput_at_the_capacity_rate():
    reports = [report(30, k, "pass", goodput=g) for k, g in enumerate([29.4, 28.8])]
    sel = select_open_loop(reports, CLASSES, replicas=1, gpus=2)["cold"]
    assert sel["goodput_at_capacity_rps"] == 28.8
    assert sel["goodput_per_gpu_rps"] == pytest.approx(14.4)
    assert sel["capacity_per_gpu_nominal_rps"] == 15.0
    assert sel["capacity_per_replica_rps"] == 30.0  # the plan still sizes on the capacity


def test_a_failing_rate_names_the_class_the_repeat_and_the_binding_metric():
    bad = report(36, 1, "fail", reasons=["interactive: attainment 0.9100 < 0.95",
                                         "error rate 0.0200 > 0.01"])  # fmt: skip
    bad["classes"]["interactive"].update(
        attainment=0.91,
        class_slo_pass=False,
        p99_ttft_early_stopping={"over_cutoff": 40},
        p99_tpot_early_stopping={"over_cutoff": 3},
    )
    marginal = report(36, 2, "marginal", reasons=["long_context: attainment CI lower bound "
                                                  "0.9400 < 0.95"])  # fmt: skip
    marginal["classes"]["long_context"].update(
        request_ttft_cutoff_ms=600.0, request_tpot_cutoff_ms=30.0, p95_ttft_ms=300.0,
        p95_tpot_ms=31.0,
    )  # fmt: skip
    reports = [report(34, k, "pass") for k in range(3)] + [report(36, 0, "pass"), bad, marginal]
    sel = select_open_loop(reports, CLASSES, 1, 1)["cold"]
    row = sel["rates"][1]
    assert [f["repeat"] for f in row["failures"]] == [1, 2]  # repeat 0 passed
    first, second = row["failures"]
    (cls,) = first["classes"]
    assert cls["class"] == "interactive" and cls["binding_metric"] == "ttft"
    assert cls["binding_evidence"] == {"basis": "requests over each cutoff",
                                       "over_ttft_cutoff": 40, "over_tpot_cutoff": 3}  # fmt: skip
    assert cls["attribution"] is None
    assert first["point_reasons"] == ["error rate 0.0200 > 0.01"]
    (cls,) = second["classes"]
    # No per-cutoff counts: P95 / cutoff, 300/600 for TTFT against 31/30 for TPOT.
    assert cls["binding_metric"] == "tpot" and cls["binding_evidence"]["basis"].startswith("P95")
    assert row["failure_summary"] == (
        "interactive TTFT (repeat 1); error rate 0.0200 > 0.01 (repeat 1); "
        "long_context TPOT (repeat 2)"
    )
    assert sel["bracket"]["fail_summary"] == row["failure_summary"]
    assert "interactive TTFT (repeat 1)" in sel["decision"]
    # With the analysis's attribution of the misses, the summary names their main cause.
    bad["classes"]["interactive"]["attribution"] = {
        "primary_cause": "queueing", "cause_share": {"queueing": 0.8, "prefill": 0.2},
    }  # fmt: skip
    row = select_open_loop(reports, CLASSES, 1, 1)["cold"]["rates"][1]
    assert row["failure_summary"].startswith("interactive TTFT (queueing 80% of misses) (repeat 1)")


def test_an_under_sampled_class_is_named_without_a_binding_metric():
    r = report(36, 0, "inconclusive", reasons=["under-sampled: ['interactive']",
                                               "interactive: 5 successful < 80"])  # fmt: skip
    r["under_sampled_classes"] = ["interactive"]
    r["classes"]["interactive"]["p99_ttft_early_stopping"] = {"over_cutoff": 1}
    r["classes"]["interactive"]["p99_tpot_early_stopping"] = {"over_cutoff": 0}
    r["verdict_reasons"] += ["queue trend inconclusive"] * 2  # a label and a failed gate
    row = select_open_loop([r], CLASSES, 1, 1)["cold"]["rates"][0]
    (f,) = row["failures"]
    (cls,) = f["classes"]
    assert cls["reasons"] == ["interactive: 5 successful < 80"] and cls["binding_metric"] is None
    assert f["point_reasons"] == ["queue trend inconclusive"]
    assert row["failure_summary"] == (
        "interactive: 5 successful < 80 (repeat 0); queue trend inconclusive (repeat 0)"
    )


def test_the_closed_loop_operating_point_states_its_status():
    reports = [report(None, 0, "inconclusive", mode="closed", conc=c, attainment=1.0,
                      reasons=["under-sampled: ['interactive']"]) for c in (1, 8, 32)]  # fmt: skip
    for r, tps in zip(reports, (100.0, 700.0, 2000.0), strict=True):
        r["output_throughput_tps"] = tps
    cur = closed_loop_curve(reports, CLASSES, 0.95)["cold"]
    assert cur["operating_point"]["concurrency"] == 32
    assert cur["operating_point_status"] == "inconclusive"
    assert cur["operating_point_is_largest_tested"] is True
    assert "status is inconclusive" in cur["operating_point_note"]
    assert "largest concurrency tested" in cur["operating_point_note"]


def test_decision_metrics_carry_the_bracket_in_rps():
    pack = load_pack(TUTORIAL)
    reports = [report(r, 0, "pass") for r in (16, 20, 24)] + [report(28, 0, "fail")]
    capacity = build_capacity(reports, pack)
    metrics = decision_metrics(capacity, build_plan(capacity, reports, pack))
    assert metrics["cold.bracket_pass_rps"] == 24 and metrics["cold.bracket_fail_rps"] == 28
    assert metrics["cold.bracket_width_rps"] == 4
    assert metrics["cold.capacity_per_gpu_nominal_rps"] == 3  # 24 RPS / 8 GPUs under test


def test_results_that_contradict_how_a_server_works_are_measurement_faults():
    curve = [
        {"concurrency": 8, "request_throughput_rps": 20.0, "meets_latency_gates": True},
        {"concurrency": 32, "request_throughput_rps": 30.0, "meets_latency_gates": False},
    ]
    open_loop = {
        "cold": {"capacity_rps": 36.0, "non_monotonic_passes_rps": [],
                 "bracket": {"pass_rps": 36.0, "fail_rps": 38.0}},
        "warm": {
            "capacity_rps": 24.0,
            "bracket": {"pass_rps": 24.0, "fail_rps": 26.0},
            "non_monotonic_passes_rps": [30.0],
            "next_rate_up": {"offered_rps": 26.0},
        },
    }  # fmt: skip
    faults = measurement_faults(open_loop, {"cold": {"curve": curve}})
    assert [(f["kind"], f["cache_state"]) for f in faults] == [
        ("warm-below-cold", "warm"),
        ("above-saturation", "cold"),
        ("pass-above-failure", "warm"),
    ]
    assert "warm did not meet the gates at 26 RPS, at most 0.8 x the 36 RPS" in faults[0]["message"]
    assert "highest request throughput 30 RPS" in faults[1]["message"]
    assert faults[2]["message"].startswith("warm: 30 RPS met the gates above 26 RPS")
    assert measurement_notes(open_loop) == []
    # A closed loop still inside its gates at its largest level is no saturation figure; a warm
    # capacity at 0.8 x cold or more is no fault.
    curve[-1]["meets_latency_gates"] = True
    open_loop["warm"] = {"capacity_rps": 30.0, "non_monotonic_passes_rps": [],
                         "bracket": {"pass_rps": 30.0, "fail_rps": 32.0}}  # fmt: skip
    assert measurement_faults(open_loop, {"cold": {"curve": curve}}) == []
    assert measurement_notes(open_loop) == []


def test_warm_under_cold_only_on_its_passing_end_is_a_note_not_a_fault():
    """The real-engine pack at --cores 2 decided cold [4, 5.3) and warm [3.1, 4.6): 3.1 is
    0.78 x 4, but warm's bracket reaches past 0.8 x 4 = 3.2 and overlaps cold's, so the
    evidence does not show warm under the floor: the search's resolution cannot tell."""
    open_loop = {
        "cold": {"capacity_rps": 4.0, "bracket": {"pass_rps": 4.0, "fail_rps": 5.3}},
        "warm": {"capacity_rps": 3.1, "bracket": {"pass_rps": 3.1, "fail_rps": 4.6}},
    }
    assert measurement_faults(open_loop, {}) == []
    [note] = measurement_notes(open_loop)
    assert note["kind"] == "warm-below-cold-unresolved"
    assert "brackets (warm [3.1, 4.6) RPS, cold [4, 5.3) RPS)" in note["message"]
    assert "cannot tell warm from cold" in note["message"]
    # Warm failing at 3.2 RPS (= 0.8 x 4), or no warm rate meeting the gates below it, is
    # shown under the floor.
    open_loop["warm"]["bracket"]["fail_rps"] = 3.2
    assert [f["kind"] for f in measurement_faults(open_loop, {})] == ["warm-below-cold"]
    open_loop["warm"] = {"capacity_rps": None, "bracket": {"pass_rps": None, "fail_rps": 2.0}}
    assert [f["kind"] for f in measurement_faults(open_loop, {})] == ["warm-below-cold"]
    assert measurement_notes(open_loop) == []
