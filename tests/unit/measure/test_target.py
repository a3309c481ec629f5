"""Real-target paths, exercised against the simulated engine started as a separate server."""

from __future__ import annotations

import logging

import httpx
import pytest

from capacity_pack.measure.sweep import measure_point
from capacity_pack.measure.target import SimProcess, reset_prefix_cache, verify_cold
from capacity_pack.plan import schedule as S
from capacity_pack.plan.manifest import validate_pack
from capacity_pack.plan.system import OpenAITarget, SimTarget
from tests.conftest import pack_data


@pytest.mark.slow
def test_openai_target_cold_point_resets_and_verifies(tmp_path, monkeypatch):
    with SimProcess(SimTarget(kind="sim", profile="small-fast"), "sim-small") as sim:
        # Warm the engine's prefix cache first, as a previous point would.
        for _ in range(3):
            httpx.post(f"{sim.base_url}/v1/completions",
                       json={"model": "sim-small", "prompt": "same words " * 40, "max_tokens": 2},
                       timeout=30)  # fmt: skip
        data = pack_data()
        data["target"] = {"kind": "openai", "base_url": sim.base_url, "cache_reset": "vllm",
                          "api_key_env": "CAPACITY_PACK_TEST_KEY"}  # fmt: skip
        data["client"].update(initial_scheduled_requests=30, minimum_duration_seconds=1,
                              maximum_duration_seconds=3, warmup_seconds=0.2)  # fmt: skip
        data["client"].pop("class_schedule_counts")
        data["acceptance"]["min_successful_samples_per_class"] = 5
        monkeypatch.setenv("CAPACITY_PACK_TEST_KEY", "sk-test-secret-value")
        pack = validate_pack(data)
        point = S.Point(mode="open", rate_rps=30, cache_state="cold", repeat=0)
        summary = measure_point(pack, point, S.build_schedule(pack, point), tmp_path)
    assert summary["cache_preparation"] == "/reset_prefix_cache"
    assert summary["cache_empty_verified"] is True
    assert summary["target_kind"] == "openai" and summary["failed"] == 0
    assert summary["server_prefix_hit_rate"] < 0.01
    # The key was sent but is never written anywhere.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"sk-test-secret-value" not in path.read_bytes()


def test_reset_waits_while_the_engine_refuses(tmp_path):
    with SimProcess(SimTarget(kind="sim", profile="small-fast"), "sim-small") as sim:
        target = OpenAITarget(kind="openai", base_url=sim.base_url, cache_reset="vllm")
        assert reset_prefix_cache(target, sim.base_url, timeout_s=30) == "/reset_prefix_cache"
        facts = verify_cold(sim.base_url)
        assert facts["cache_empty_verified"] is True and facts["kv_usage_at_start"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("prepared", [False, True])
def test_openai_target_with_a_tokenizer_json_sends_exact_prompts(tmp_path, prepared):
    """A word-level tokenizer.json counts like the simulated engine, so the server's usage
    proves every fitted prompt had exactly its scheduled input tokens: fitted in the
    measurement, or prepared beforehand by the prompts stage."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "the": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with SimProcess(SimTarget(kind="sim", profile="small-fast"), "sim-small") as sim:
        data = pack_data()
        data["target"] = {"kind": "openai", "base_url": sim.base_url, "cache_reset": "none",
                          "tokenizer_path": str(path)}  # fmt: skip
        data["sweep"]["cache_states"] = ["warm"]
        data["experiments"] = []
        data["client"].update(initial_scheduled_requests=20, minimum_duration_seconds=1,
                              maximum_duration_seconds=3, warmup_seconds=0.2)  # fmt: skip
        data["client"].pop("class_schedule_counts")
        data["acceptance"]["min_successful_samples_per_class"] = 2
        pack = validate_pack(data)
        point = S.Point(mode="open", rate_rps=30, cache_state="warm", repeat=0)
        frame = S.build_schedule(pack, point)
        prompts = None
        if prepared:
            from capacity_pack.plan.prepared import PromptInputs, read_prepared
            from capacity_pack.stages.prompts import run as prepare

            spec, file = PromptInputs.of_pack(pack), tmp_path / "prompts.parquet"
            prepare(inputs=spec, schedule=frame, prompts=file, log=logging.getLogger("t"))
            prompts = read_prepared(file, frame, spec)
            assert len(prompts) == len(frame)
        summary = measure_point(pack, point, frame, tmp_path / "out", prompts=prompts)
    assert summary["failed"] == 0 and summary["prompt_tokens_mismatches"] == 0
    assert summary["server_prefix_hit_rate"] > 0.1  # the shared prefixes survived the fitting
