"""The definitions of every metric the pack page shows, by anchor: a table header of the page
(:mod:`capacity_pack.decide.html`) links to ``#def-<key>``, and the page's definitions section
lists them all (a test holds every link to an entry here). The gates' own estimates are the gate
registry's words (:data:`capacity_pack.evidence.gates.GATES`), not restated here.
"""

from __future__ import annotations

from capacity_pack.evidence.gates import GATES


def _gate_estimate(name: str) -> str:
    gate = next(g for g in GATES if g.name == name)
    return f"{gate.statistic.estimate} ({gate.statistic.unit})"


#: Every metric the page shows, by anchor: its name and definition. A table header links to
#: ``#def-<key>``; a test holds every link to an entry here.
METRICS: dict[str, tuple[str, str]] = {
    "cache_state": (
        "cache state",
        "cold: the engine's prefix cache is cleared before the point (target.cache_reset) and "
        "every prompt starts with unique tokens, so nothing is reused; warm: prompts start with "
        "the pack's shared prefixes (prompts.prefix), warmed before the point is measured, so "
        "the hit rate shows what the cache buys.",
    ),
    "ttft": (
        "TTFT",
        "Time to first token: from the request's write to the first streamed content token "
        "(client clock, per request).",
    ),
    "tpot": (
        "TPOT",
        "Time per output token after the first: (E2E - TTFT) / (output tokens - 1), per "
        "request (0 for a one-token output).",
    ),
    "cutoff": (
        "cutoff",
        "A class's per-request TTFT and TPOT limits. A request meets its class SLO when it is "
        "ok and its TTFT and its TPOT are both within them.",
    ),
    "p95": (
        "P95 / P99",
        "Nearest-rank percentile of the class's successful requests (always an observed value, "
        "never interpolated); P99 is withheld below the pack's p99_min_samples successful "
        "requests per class.",
    ),
    "attempted": (
        "attempted",
        "Measured requests sent in the point's window (warm-up excluded), whatever their end.",
    ),
    "successful": ("successful", _gate_estimate("sample_size")),
    "attainment": (
        "attainment",
        "Among successful requests: " + _gate_estimate("class_attainment"),
    ),
    "attainment_bound": (
        "attainment bound",
        "The confidence sequence of the attainment at the pack's attainment_confidence, valid "
        "however often the point was looked at while it ran; a class passes only when the lower "
        "end is at or over the gate, and fails for certain when the upper end is below it.",
    ),
    "all_attempt_attainment": (
        "all-attempt attainment",
        "Over all attempts: " + _gate_estimate("all_attempt_attainment"),
    ),
    "class_error_rate": ("error rate (class)", _gate_estimate("class_error_rate")),
    "error_rate": ("error rate", _gate_estimate("error_rate")),
    "class_pass": (
        "class SLO",
        "Whether the class passes its attainment and sample gates in this point.",
    ),
    "measured_window": (
        "measured window T",
        "First measured send to the last measured terminal event, the drain included: the "
        "denominator of every rate of a point.",
    ),
    "nominal_rps": ("nominal RPS", "The rate the point's seeded schedule was drawn at."),
    "offered_rps": (
        "offered RPS",
        "The rate the schedule actually offered: (n - 1) / (last - first measured scheduled "
        "arrival).",
    ),
    "achieved_rps": (
        "achieved RPS",
        "Request throughput: successful requests / T (every completion, within SLO or not).",
    ),
    "goodput": (
        "goodput",
        "Requests that met their class SLO / T, all classes together (requests per second).",
    ),
    "queue_trend": ("queue trend", _gate_estimate("queue_trend")),
    "server_hit_rate": (
        "server hit rate",
        "The engine's own prefix-cache counters over the measured window, in prompt tokens: "
        "hits / queries (or its hit-rate gauge); n/a where the engine exposes none.",
    ),
    "client_cached_share": (
        "client cached share",
        "Sum of the responses' usage.prompt_tokens_details.cached_tokens / sum of their "
        "usage.prompt_tokens over the measured window's successful requests; n/a where the "
        "engine reports none.",
    ),
    "status": (
        "status",
        "A rate's verdict over its repeats (see the verdict words above).",
    ),
    "capacity": (
        "capacity",
        "The highest tested rate meeting every gate on its repeats' pooled estimate (pass or "
        "marginal), with every lower tested rate meeting them too: the lower end of the "
        "bracket, and the figure the plan sizes with.",
    ),
    "next_rate_up": (
        "next rate up",
        "The lowest tested rate above the capacity, whatever its status (not shown to pass): "
        "the upper end of the bracket; none when the highest rate tested passes, so the true "
        "capacity may be higher.",
    ),
    "width": ("width", "Next rate up - capacity: how precisely the boundary is known (RPS)."),
    "resolution": (
        "resolution",
        "The width the boundary search aims for (sweep.search); reached when width <= "
        "resolution. None without a search: then the tested grid decides the width.",
    ),
    "confidence": (
        "confidence",
        "The confidence of the per-point attainment bounds the verdicts were taken on.",
    ),
    "per_replica": (
        "capacity per replica",
        "Capacity / replicas under test: the figure the replica plan sizes with.",
    ),
    "goodput_per_unit": (
        "goodput per GPU (or host)",
        "The least measured goodput over the repeats at the capacity rate / the GPUs (hosts) "
        "under test (DistServe's per-GPU goodput, as measured).",
    ),
    "required_replicas": (
        "required replicas",
        "ceil(peak RPS / (capacity per replica x target utilization)), or the KV-memory bound "
        "if larger, plus redundancy and warm-pool replicas.",
    ),
    "operating_point": (
        "operating point (closed loop)",
        "The highest output throughput whose concurrency meets every class's attainment gate.",
    ),
    "output_throughput": (
        "output throughput",
        "Output tokens of successful requests / T (tokens per second).",
    ),
    "n_plus_one": (
        "N+1 verdict (PASS / FAIL / UNDECIDED)",
        "The plan drill's answer: PASS when the recommended fleet holds the planned peak "
        "before the failure, the survivors carry the peak with every class's SLO counted over "
        "all attempts, only the failed replica's in-flight requests are lost, and the fleet "
        "recovers; FAIL names the check that did not hold; UNDECIDED: none failed, but a "
        "class had no request before the failure or while one replica was short.",
    ),
}
