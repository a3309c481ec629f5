"""The simulator's model without a server: profiles, step-time formulas, KV pool, scheduler,
and virtual-time sanity (saturation, calibration of the default pack's profile)."""

from __future__ import annotations

import pytest
import yaml

from capacity_pack.sim.kv import ROOT_HASH, BlockPool, chain_hash
from capacity_pack.sim.perf import PerfModel
from capacity_pack.sim.profile import GIB, Profile, ProfileError, load_profile, shipped_profiles
from capacity_pack.sim.scheduler import FINISHED, RUNNING, WAITING, Scheduler, SimRequest
from capacity_pack.sim.virtual import poisson_arrivals, simulate

# The default pack's workload classes: (mix, input, output, name) and (TTFT s, TPOT s) cutoffs.
PACK_CLASSES = [
    (0.5, 256, 32, "interactive"),
    (0.3, 1024, 48, "long_context"),
    (0.2, 128, 128, "generation_heavy"),
]
PACK_CUTOFFS = {
    "interactive": (0.250, 0.025),
    "long_context": (0.600, 0.030),
    "generation_heavy": (0.300, 0.028),
}

# ---------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------


def test_shipped_profiles_load():
    names = shipped_profiles()
    assert {"llama-3.1-8b-h100", "llama-3.1-70b-tp2-h100", "small-fast"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name
        assert p.num_gpu_blocks * p.engine.block_size >= p.model.max_model_len


def test_unknown_profile_lists_shipped_ones():
    with pytest.raises(ProfileError) as err:
        load_profile("no-such-profile")
    message = str(err.value)
    assert "no-such-profile" in message
    for name in shipped_profiles():
        assert name in message


def test_profile_from_path_and_validation(tmp_path):
    data = load_profile("small-fast").model_dump()
    data["name"] = "custom"
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path).name == "custom"
    assert load_profile(str(path)).name == "custom"

    data["model"]["num_params"] = 9e9  # disagrees with the shape
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="model.num_params|disagrees"):
        load_profile(path)
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "missing.yaml")
    path.write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(path)


def test_params_and_kv_sizing_match_hand_computation():
    p = load_profile("llama-3.1-8b-h100")
    # 32 x (4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 14336 + 2 x 4096)
    #   + 2 x 128256 x 4096 + 4096
    assert p.model.shape_params() == 8_030_261_248
    assert p.model.weight_bytes == 16.06e9
    assert p.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert p.kv_bytes_per_block == 16 * 131_072
    # (80 GiB x 0.9 - 16.06 GB - 3 GiB) / 2 MiB = 27,669.99
    assert p.num_gpu_blocks == int((80 * GIB * 0.9 - 16.06e9 - 3 * GIB) / (16 * 131_072))
    assert p.num_gpu_blocks == 27_669
    p70 = load_profile("llama-3.1-70b-tp2-h100")
    # Two GPUs: (2 x 80 GiB x 0.9 - 141.2 GB - 2 x 2 GiB) / (16 x 327,680 B)
    assert p70.num_gpu_blocks == int((2 * 80 * GIB * 0.9 - 141.2e9 - 4 * GIB) / (16 * 327_680))


def test_profile_without_kv_memory_is_refused():
    data = load_profile("llama-3.1-70b-tp2-h100").model_dump()
    data["engine"]["tensor_parallel"] = 1
    with pytest.raises(ValueError, match="no KV-cache memory"):
        Profile.model_validate(data)


# ---------------------------------------------------------------------------------------------
# Step-time formulas
# ---------------------------------------------------------------------------------------------


def test_step_time_matches_hand_computed_values():
    perf = PerfModel(load_profile("llama-3.1-8b-h100"))
    peak = 989e12 * 0.45
    bandwidth = 3.35e12 * 0.8
    overhead = 1.5e-3
    # One decode over 1000 cached tokens: memory-bound.
    compute = (2 * 8.03e9 * 1 + 4 * 32 * 32 * 128 * (1 * 1000 + 1)) / peak
    memory = (16.06e9 + 131_072 * 1001) / bandwidth
    assert memory == pytest.approx(6.041494e-3, rel=1e-6)
    assert perf.batch_step_s([(1, 1000)]) == pytest.approx(memory + overhead + 4e-6, rel=1e-9)
    assert compute < memory
    # A 2048-token prefill chunk from scratch: compute-bound, causal attention q (q + 1) / 2.
    compute = (2 * 8.03e9 * 2048 + 4 * 32 * 32 * 128 * (2048 * 2049 / 2)) / peak
    memory = (16.06e9 + 131_072 * 2048) / bandwidth
    assert compute == pytest.approx(76.376e-3, rel=1e-4)
    assert perf.batch_step_s([(2048, 0)]) == pytest.approx(compute + overhead + 4e-6, rel=1e-9)
    cost = perf.cost(1, 2048, 2048 * 2049 / 2, 2048)
    assert cost.bound == "compute" and cost.memory_s == pytest.approx(memory)
    # Mixed batch: sums over sequences.
    seqs = [(1, 500), (1, 700), (256, 100)]
    compute = (
        2 * 8.03e9 * 258 + 4 * 32 * 32 * 128 * (500 + 1 + 700 + 1 + 256 * 100 + 256 * 257 / 2)
    ) / peak
    memory = (16.06e9 + 131_072 * (501 + 701 + 356)) / bandwidth
    expected = max(compute, memory) + overhead + 3 * 4e-6
    assert perf.batch_step_s(seqs) == pytest.approx(expected, rel=1e-9)


def test_tensor_parallel_all_reduce_term():
    perf = PerfModel(load_profile("llama-3.1-70b-tp2-h100"))
    # 2 all-reduces x 80 layers x 8192 x 2 bytes x 2 (tp - 1) / tp, over 450 GB/s.
    assert perf.allreduce_s_per_token == pytest.approx(2 * 80 * 8192 * 2 * 1.0 / 450e9)
    assert PerfModel(load_profile("llama-3.1-8b-h100")).allreduce_s_per_token == 0.0


def test_decode_batch_1_is_weights_over_bandwidth_plus_overhead():
    p = load_profile("llama-3.1-8b-h100")
    floor = p.model.weight_bytes / (p.hardware.bandwidth_tb_s * 1e12 * p.efficiency.mbu)
    expected = floor + p.efficiency.step_overhead_ms / 1e3
    measured = PerfModel(p).decode_step_s(1, 512)
    assert abs(measured - expected) / expected < 0.10


def test_step_time_grows_with_batch_and_context():
    perf = PerfModel(load_profile("small-fast"))
    assert perf.decode_step_s(1, 100) < perf.decode_step_s(64, 100) < perf.decode_step_s(64, 2000)
    assert perf.prefill_s(1024) < perf.prefill_s(4096) < perf.prefill_s(16384)


# ---------------------------------------------------------------------------------------------
# KV pool and prefix cache
# ---------------------------------------------------------------------------------------------


def test_block_pool_lru_eviction_and_touch():
    pool = BlockPool(4, 16)
    a = pool.allocate(2)
    assert a == [0, 1] and pool.num_used == 2
    h0 = chain_hash(ROOT_HASH, range(16))
    h1 = chain_hash(h0, range(16, 32))
    pool.cache_block(0, h0)
    pool.cache_block(1, h1)
    pool.release(a)  # the tail block joins the free queue first, so it is evicted first
    assert pool.num_used == 0 and pool.lookup([h0, h1]) == [0, 1]
    b = pool.allocate(3)  # never-used blocks 2 and 3, then block 1 (evicting h1)
    assert b == [2, 3, 1]
    assert pool.lookup([h0, h1]) == [0] and pool.evictions == 1
    assert pool.count_free_among([0]) == 1
    pool.touch([0])
    assert pool.num_used == 4 and not pool.can_allocate(1)
    assert pool.reset_prefix_cache() is False  # refused while blocks are in use
    pool.release(b)
    pool.release([0])
    assert pool.reset_prefix_cache() is True
    assert pool.lookup([h0]) == []


def test_chained_hashes_name_the_whole_prefix():
    h_a = chain_hash(ROOT_HASH, range(16))
    h_b = chain_hash(ROOT_HASH, range(1, 17))
    # The same second block after a different first block is a different block.
    assert chain_hash(h_a, range(16, 32)) != chain_hash(h_b, range(16, 32))


def _sched(**engine) -> Scheduler:
    return Scheduler(load_profile("small-fast").with_overrides(**engine))


def _drain(sched: Scheduler, max_steps: int = 10_000) -> int:
    for t in range(max_steps):
        if not sched.has_work():
            return t
        sched.complete(sched.schedule(t), t + 1)
    raise AssertionError("scheduler did not drain")


def test_chunked_prefill_under_the_token_budget():
    sched = _sched(max_num_batched_tokens=64)
    req = SimRequest("a", list(range(100)), 3)
    sched.add(req)
    step = sched.schedule(0)
    assert step.nums == [64]
    emitted, _ = sched.complete(step, 1)
    assert emitted == [] and req.num_computed == 64 and req.num_output == 0
    step = sched.schedule(1)
    assert step.nums == [36]
    emitted, _ = sched.complete(step, 2)
    assert emitted == [req] and req.num_output == 1 and req.first_token_ns == 2
    step = sched.schedule(2)
    assert step.nums == [1]


def test_running_first_then_waiting_and_max_num_seqs():
    sched = _sched(max_num_seqs=2, max_num_batched_tokens=100)
    reqs = [SimRequest(str(i), [1000 * i + j for j in range(40)], 2) for i in range(3)]
    for r in reqs:
        sched.add(r)
    step = sched.schedule(0)
    # Budget 100: the first prompt (40) and the second (40), then max_num_seqs stops the third.
    assert step.reqs == reqs[:2] and step.nums == [40, 40]
    assert reqs[2].status == WAITING
    sched.complete(step, 1)
    step = sched.schedule(1)
    assert step.reqs == reqs[:2] and step.nums == [1, 1]
    _, finished = sched.complete(step, 2)
    assert finished == reqs[:2]
    step = sched.schedule(2)
    assert step.reqs == [reqs[2]] and reqs[2].scheduled_ns == 2


def test_preemption_takes_the_newest_request():
    sched = _sched()
    sched.pool.capacity = 4  # blocks
    a = SimRequest("a", list(range(31)), 4)  # 2 blocks
    b = SimRequest("b", list(range(100, 116)), 4)  # 1 block, needs a 2nd at token 17
    c = SimRequest("c", list(range(200, 216)), 4)  # 1 block
    for r in (a, b, c):
        sched.add(r)
    sched.complete(sched.schedule(0), 1)
    assert sched.pool.num_used == 4
    step = sched.schedule(1)
    # b needs a block; the newest running request (c) is preempted, not b.
    assert c.status == WAITING and c.num_preemptions == 1 and c.num_computed == 0
    assert sched.num_preemptions == 1 and step.num_preempted == 1
    assert step.reqs == [a, b] and sched.waiting[0] is c
    sched.complete(step, 2)
    _drain(sched)
    assert [r.num_output for r in (a, b, c)] == [4, 4, 4]
    assert all(r.status == FINISHED for r in (a, b, c))


def test_a_request_preempts_itself_when_it_is_the_newest():
    sched = _sched()
    sched.pool.capacity = 4
    a = SimRequest("a", list(range(32)), 30)  # 62 tokens: 4 blocks, the whole pool
    b = SimRequest("b", list(range(100, 132)), 30)
    sched.add(a)
    sched.add(b)
    sched.complete(sched.schedule(0), 1)
    sched.schedule(1)  # both need a 3rd block; only a gets one, b (the newest) yields
    assert a.status == RUNNING and b.status == WAITING and b.num_preemptions == 1
    _drain(sched)
    assert a.num_output == b.num_output == 30 and b.num_preemptions >= 1


def test_prefix_cache_hits_full_blocks_in_tokens():
    sched = _sched()
    prompt = list(range(40))
    first = SimRequest("1", prompt, 1)
    sched.add(first)
    _drain(sched)
    assert sched.prefix_queries_tokens == 40 and sched.prefix_hits_tokens == 0
    second = SimRequest("2", prompt, 1)
    sched.add(second)
    step = sched.schedule(10)
    assert second.num_cached_tokens == 32 and step.nums == [8]  # hits skip prefill compute
    sched.complete(step, 11)
    assert sched.prefix_queries_tokens == 80 and sched.prefix_hits_tokens == 32
    # At most num_tokens - 1 tokens come from the cache: one block of an exact 32-token repeat.
    exact = SimRequest("3", list(range(32)), 1)
    sched.add(exact)
    step = sched.schedule(12)
    assert exact.num_cached_tokens == 16 and step.nums == [16]
    sched.complete(step, 13)
    # A different first block invalidates every later block.
    other = SimRequest("4", [999] + list(range(1, 40)), 1)
    sched.add(other)
    sched.schedule(14)
    assert other.num_cached_tokens == 0


def test_prefix_caching_can_be_disabled():
    sched = _sched(enable_prefix_caching=False)
    for i in range(2):
        sched.add(SimRequest(str(i), list(range(64)), 1))
        _drain(sched)
    assert sched.prefix_hits_tokens == 0


def test_eos_min_tokens_and_stop_strings():
    assert SimRequest("a", [1], 10, eos_at=5).stop_at == 5
    assert SimRequest("a", [1], 10, eos_at=5).stop_at_reason == "stop"
    assert SimRequest("a", [1], 10, eos_at=5, min_tokens=8).stop_at == 8
    assert SimRequest("a", [1], 10, eos_at=50).stop_at_reason == "length"
    assert SimRequest("a", [1], 10).stop_at == 10
    probe = SimRequest("p", [1], 20, out_seed=7)
    words = probe.output_text(0, 20).split()
    target = words[5]
    sched = _sched()
    req = SimRequest("s", [1, 2, 3], 20, out_seed=7, stop_strings=(target,))
    sched.add(req)
    _drain(sched)
    assert req.finish_reason == "stop" and req.stop_reason == target
    assert req.num_output == words.index(target) + 1
    text = req.output_text(0, req.num_output)
    assert target not in text and text == " " + " ".join(words[: words.index(target)]) + " "


def test_request_that_can_never_fit_fails_instead_of_stalling():
    sched = _sched()
    sched.pool.capacity = 2
    req = SimRequest("big", list(range(100)), 1)
    sched.add(req)
    step = sched.schedule(0)
    assert step.failed == [req] and req.finish_reason == "error" and not sched.has_work()


# ---------------------------------------------------------------------------------------------
# Virtual-time sanity
# ---------------------------------------------------------------------------------------------


def test_throughput_saturates_and_ttft_climbs_past_capacity():
    prof = load_profile("small-fast")
    served, ttft_p50 = [], []
    for rate in (10, 40, 70, 100, 150):
        run = simulate(prof, poisson_arrivals(rate, 20, PACK_CLASSES, seed=3))
        served.append(run.output_tokens_per_s)
        ttfts = sorted(r.ttft_s for r in run.results)
        ttft_p50.append(ttfts[len(ttfts) // 2])
    offered = [rate * 56 for rate in (10, 40, 70, 100, 150)]  # mean output 56 tokens
    # Below capacity everything offered is served; above it the served rate flattens.
    assert served[0] == pytest.approx(offered[0], rel=0.1)
    assert served[1] == pytest.approx(offered[1], rel=0.1)
    assert served[4] < 1.15 * served[2] and served[4] < 0.5 * offered[4]
    assert ttft_p50 == sorted(ttft_p50)
    assert ttft_p50[4] > 100 * ttft_p50[0]


def _attainment(run) -> dict[str, float]:
    out = {}
    for name, (ttft_s, tpot_s) in PACK_CUTOFFS.items():
        rows = [r for r in run.results if r.label == name]
        ok = sum(1 for r in rows if r.ttft_s <= ttft_s and r.tpot_s <= tpot_s)
        out[name] = ok / len(rows)
    return out


def test_small_fast_passes_the_default_pack_at_20_rps_and_fails_by_50():
    prof = load_profile("small-fast")
    low = _attainment(simulate(prof, poisson_arrivals(20, 60, PACK_CLASSES, seed=11)))
    high = _attainment(simulate(prof, poisson_arrivals(50, 60, PACK_CLASSES, seed=11)))
    assert min(low.values()) >= 0.99
    assert min(high.values()) < 0.95


def test_the_models_own_slo_boundary_is_a_bracket_that_moves_with_the_cutoff():
    from capacity_pack.sim.virtual import VirtualClass, attainment_at, slo_boundary

    profile = load_profile("small-fast")

    def classes(ttft_cutoff_s: float) -> list[VirtualClass]:
        # The default pack's classes, with the interactive TTFT cutoff given.
        out = []
        for mix, inp, outp, name in PACK_CLASSES:
            ttft, tpot = PACK_CUTOFFS[name]
            ttft = ttft_cutoff_s if name == "interactive" else ttft
            out.append(VirtualClass(name, mix, inp, outp, ttft, tpot))
        return out

    low, high = slo_boundary(profile, classes(0.25), 0.95, 20, 60, 4, duration_s=30, seeds=(0,))
    assert high - low <= 4
    at_low = attainment_at(profile, classes(0.25), low, 30, seeds=(0,))
    at_high = attainment_at(profile, classes(0.25), high, 30, seeds=(0,))
    assert min(at_low.values()) >= 0.95 > min(at_high.values())
    # A looser TTFT cutoff can only move the boundary up.
    looser = slo_boundary(profile, classes(0.5), 0.95, low, 80, 4, duration_s=30, seeds=(0,))
    assert looser[0] >= low
    with pytest.raises(ValueError, match="not inside"):
        slo_boundary(profile, classes(0.25), 0.95, high + 20, high + 30, 4, 30, seeds=(0,))


def test_shared_prefixes_raise_the_models_boundary():
    # A warm cache (the default pack's 8 shared 96-token prefixes, Zipf 1.1) saves prefill:
    # where unique prompts miss the gate, shared ones still meet it.
    from capacity_pack.sim.virtual import (
        SharedPrefixes,
        VirtualClass,
        attainment_at,
        poisson_arrivals,
        with_shared_prefixes,
    )

    classes = [
        VirtualClass(name, mix, inp, outp, *PACK_CUTOFFS[name])
        for mix, inp, outp, name in PACK_CLASSES
    ]
    warm = SharedPrefixes(8, 96, 1.1)
    reqs = with_shared_prefixes(poisson_arrivals(10, 5, PACK_CLASSES, seed=1), warm, seed=1)
    heads = {r.prompt[:96] for r in reqs if len(r.prompt) > 96}
    assert 1 < len(heads) <= 8 and all(len(r.prompt) in (256, 1024, 128) for r in reqs)
    profile = load_profile("small-fast")
    cold = attainment_at(profile, classes, 40, 20, seeds=(0,))
    hot = attainment_at(profile, classes, 40, 20, seeds=(0,), prefixes=warm)
    assert min(hot.values()) > min(cold.values())
