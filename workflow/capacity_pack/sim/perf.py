"""The performance model: how long one engine step takes on the profile's hardware.

A step computes ``q_i`` new tokens for each scheduled sequence ``i`` whose KV cache already holds
``c_i`` tokens (a decode has ``q_i = 1``; a prefill chunk has ``q_i`` up to the token budget;
prefix-cache hits raise ``c_i`` instead of ``q_i``, so they cost no compute). With ``L`` layers,
``H_q`` query heads of width ``d``, ``H_kv`` KV heads, ``P`` parameters of ``b_w`` bytes and KV
elements of ``b_kv`` bytes, on ``tp`` GPUs of peak ``F`` FLOP/s and bandwidth ``B`` bytes/s:

- tokens                 ``T = sum_i q_i``
- dense FLOPs            ``2 P T``    (one multiply-add per parameter per token)
- attention FLOPs        ``4 L H_q d sum_i (q_i c_i + q_i (q_i + 1) / 2)``  (QK^T and AV, each
  ``2 d`` FLOPs per query-key pair; token ``j`` of a chunk sees ``c_i + j + 1`` keys, causal)
- KV bytes per token     ``k = 2 L H_kv d b_kv``
- bytes read             ``W + k sum_i (c_i + q_i)``  with weight bytes ``W = P b_w``
- compute time           ``t_c = FLOPs / (tp F MFU)``
- memory time            ``t_m = bytes / (tp B MBU)``
- tensor-parallel time   ``t_ar = 2 L T h b_w 2 (tp - 1) / tp / B_link``  (two ring all-reduces
  of the ``T x h`` activations per layer; zero at ``tp = 1``)
- step time              ``max(t_c, t_m) + t_ar + overhead + n_seqs x per_sequence_overhead``

so a batch-1 decode at short context takes ``W / (tp B MBU) + overhead`` (the memory-bound
floor), and large prefill chunks become compute-bound at ``T`` of roughly
``(W / (tp B MBU)) / (2 P / (tp F MFU))`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity_pack.sim.profile import Profile


@dataclass(frozen=True)
class StepCost:
    """The terms of one step's modelled duration, in seconds."""

    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


class PerfModel:
    """Step times of one profile; constants are folded once so a step costs a few flops."""

    def __init__(self, profile: Profile) -> None:
        m, hw, eff, eng = profile.model, profile.hardware, profile.efficiency, profile.engine
        tp = eng.tensor_parallel
        self.profile = profile
        self.weight_bytes = m.weight_bytes
        self.kv_bytes_per_token = m.kv_bytes_per_token
        self.dense_flops_per_token = 2.0 * m.params
        self.attn_flops_per_pair = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim
        self.flops_per_s = tp * hw.dense_tflops * 1e12 * eff.mfu
        self.bytes_per_s = tp * hw.bandwidth_tb_s * 1e12 * eff.mbu
        self.allreduce_s_per_token = (
            2.0 * m.num_layers * m.hidden_size * m.bytes_per_param * 2.0 * (tp - 1) / tp
        ) / (hw.interconnect_gb_s * 1e9)
        self.overhead_s = eff.step_overhead_ms / 1e3
        self.per_seq_s = eff.per_sequence_overhead_us / 1e6

    def cost(self, num_seqs: int, num_tokens: int, attn_pairs: float, kv_tokens: int) -> StepCost:
        """Terms of a step with ``num_tokens = sum q_i``, ``attn_pairs = sum q_i (c_i + (q_i+1)/2)``
        and ``kv_tokens = sum (c_i + q_i)``."""
        flops = self.dense_flops_per_token * num_tokens + self.attn_flops_per_pair * attn_pairs
        return StepCost(
            compute_s=flops / self.flops_per_s,
            memory_s=(self.weight_bytes + self.kv_bytes_per_token * kv_tokens) / self.bytes_per_s,
            allreduce_s=self.allreduce_s_per_token * num_tokens,
            overhead_s=self.overhead_s + self.per_seq_s * num_seqs,
        )

    def step_s(self, num_seqs: int, num_tokens: int, attn_pairs: float, kv_tokens: int) -> float:
        """Modelled duration of one step in seconds (the hot path of the engine loop)."""
        if num_tokens == 0:
            return 0.0
        compute = (
            self.dense_flops_per_token * num_tokens + self.attn_flops_per_pair * attn_pairs
        ) / self.flops_per_s
        memory = (self.weight_bytes + self.kv_bytes_per_token * kv_tokens) / self.bytes_per_s
        return (
            (compute if compute > memory else memory)
            + self.allreduce_s_per_token * num_tokens
            + self.overhead_s
            + self.per_seq_s * num_seqs
        )

    def batch_step_s(self, seqs: list[tuple[int, int]]) -> float:
        """Step time of explicit ``(q_i, c_i)`` pairs (for tests, docs and planning)."""
        num_tokens = sum(q for q, _ in seqs)
        attn = sum(q * c + q * (q + 1) / 2 for q, c in seqs)
        kv = sum(c + q for q, c in seqs)
        return self.step_s(len(seqs), num_tokens, attn, kv)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """A step of ``batch`` decodes, each over ``context_tokens`` cached tokens."""
        return self.batch_step_s([(1, context_tokens)] * batch)

    def prefill_s(self, prompt_tokens: int, chunk_tokens: int | None = None) -> float:
        """Time to prefill one prompt alone, in chunks of the step token budget."""
        chunk = chunk_tokens or self.profile.engine.max_num_batched_tokens
        total, done = 0.0, 0
        while done < prompt_tokens:
            q = min(chunk, prompt_tokens - done)
            total += self.batch_step_s([(q, done)])
            done += q
        return total
