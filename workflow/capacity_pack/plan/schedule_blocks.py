"""The building blocks of a schedule: its seeded streams, block sizes and per-request columns.

Every random stream of a block is ``block_rng(entropy, block, stream)``: a
``numpy.random.SeedSequence`` of the point's entropy (:func:`capacity_pack.plan.schedule_inputs.
point_entropy`) with spawn key (block, stream), one stream per use below (classes, lengths,
arrivals, prefixes, prompt seeds, cancellations), so each draw is independent of the others and
of the other blocks. :func:`block_requests` gives a block's classes (exact quotas by the
largest-remainder method, then shuffled), lengths, prompt seeds and cancellations;
:func:`operational_gaps` its inter-arrival gaps in operational time; :func:`prefix_assignment` its
shared-prefix ids (Zipf or uniform, warm points only).
"""

from __future__ import annotations

import math

import numpy as np

from capacity_pack.plan.lengths import sample_lengths
from capacity_pack.plan.manifest import ManifestError, stratified_counts
from capacity_pack.plan.schedule_inputs import NS_PER_S, Point, ScheduleInputs
from capacity_pack.plan.schedule_rates import experiment_profile, warmup_rate
from capacity_pack.plan.sweep import Experiment

# Independent random streams within one block (spawn-key second component).
CLASS_STREAM, LENGTH_STREAM, ARRIVAL_STREAM, PREFIX_STREAM, PROMPT_STREAM, CANCEL_STREAM = range(6)


def block_rng(entropy: list[int], block: int, stream: int) -> np.random.Generator:
    """The generator of one random stream of one block of a point."""
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(block, stream)))


def operational_gaps(pattern: str, cv: float, rng: np.random.Generator, n: int) -> np.ndarray:
    """Inter-arrival gaps in operational time (mean 1)."""
    if pattern == "poisson":
        return rng.exponential(1.0, size=n)
    if pattern == "gamma":
        return rng.gamma(shape=1.0 / (cv * cv), scale=cv * cv, size=n)
    if pattern == "constant":
        return np.ones(n)
    raise ValueError(f"no gap generator for arrival pattern {pattern!r}")


def _class_sequence(inputs: ScheduleInputs, n: int, rng: np.random.Generator) -> np.ndarray:
    counts = stratified_counts(n, {c.name: c.mix for c in inputs.workload})
    labels = np.repeat(np.array(inputs.class_names, dtype=object), [counts[c] for c in counts])
    rng.shuffle(labels)
    return labels


def block_requests(
    inputs: ScheduleInputs,
    entropy: list[int],
    block: int,
    n: int,
    classes: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Classes, lengths, prompt seeds and cancellations for ``n`` requests of one block."""
    if classes is None:
        classes = _class_sequence(inputs, n, block_rng(entropy, block, CLASS_STREAM))
    inp = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    length_rng = block_rng(entropy, block, LENGTH_STREAM)
    for c in inputs.workload:
        mask = classes == c.name
        k = int(mask.sum())
        inp[mask] = sample_lengths(c.input_tokens, length_rng, k)
        out[mask] = sample_lengths(c.output_tokens, length_rng, k)
    prompt_seed = block_rng(entropy, block, PROMPT_STREAM).integers(
        0, 2**63 - 1, size=n, dtype=np.int64
    )
    cancel = np.full(n, -1, dtype=np.int64)
    client = inputs.client
    if client.cancellation_policy == "seeded_fraction" and client.cancel_fraction > 0:
        hit = block_rng(entropy, block, CANCEL_STREAM).random(n) < client.cancel_fraction
        cancel[hit] = round(client.cancel_after_seconds * NS_PER_S)
    return {
        "class": classes,
        "input_tokens": inp,
        "output_tokens": out,
        "prompt_seed": prompt_seed,
        "cancel_after_ns": cancel,
    }


def prefix_assignment(
    inputs: ScheduleInputs, point: Point, entropy: list[int], block: int, input_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    n = input_tokens.size
    spec = inputs.prompts.prefix
    if point.cache_state == "cold" or spec is None:
        return np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.int32)
    k = np.arange(spec.shared_prefixes)
    weights = (
        1.0 / np.power(k + 1.0, spec.zipf_exponent)
        if spec.distribution == "zipf"
        else (np.ones(spec.shared_prefixes))
    )
    # The cache state gets its own stream so cold and warm keep identical classes and arrivals.
    rng = block_rng(entropy + [1], block, PREFIX_STREAM)
    ids = rng.choice(spec.shared_prefixes, size=n, p=weights / weights.sum()).astype(np.int32)
    # A prompt shorter than the prefix keeps at least one token of its own.
    tokens = np.minimum(spec.prefix_tokens, input_tokens - 1).astype(np.int32)
    ids[tokens <= 0] = -1
    tokens[tokens <= 0] = 0
    return ids, tokens


def measure_size(inputs: ScheduleInputs, point: Point) -> int:
    """Requests in the measured block (block 1)."""
    client = inputs.client
    if point.mode == "open":
        assert point.rate_rps is not None
        return max(
            client.initial_scheduled_requests,
            math.ceil(point.rate_rps * client.minimum_duration_seconds),
        )
    if point.mode == "closed":
        assert point.concurrency is not None
        return max(
            inputs.closed_loop_min_requests,
            inputs.closed_loop_requests_per_worker * point.concurrency,
        )
    return max(1, round(experiment_profile(experiment_of(inputs, point)).total))


def extension_block_size(inputs: ScheduleInputs) -> int:
    """Requests per extension block: ``client.extension_block_requests``, else 10% of initial."""
    if inputs.client.extension_block_requests is not None:
        return inputs.client.extension_block_requests
    return max(1, math.ceil(inputs.client.initial_scheduled_requests / 10))


def warmup_size(inputs: ScheduleInputs, point: Point) -> int:
    """Requests in the warm-up block (block 0; none without warm-up seconds)."""
    w = inputs.client.warmup_seconds
    if w <= 0:
        return 0
    if point.mode == "closed":
        return int(point.concurrency or 1)  # one request per worker before measuring
    if point.mode == "open":
        return max(1, round((point.rate_rps or 0) * w))
    return max(1, round(warmup_rate(experiment_profile(experiment_of(inputs, point))) * w))


def experiment_of(inputs: ScheduleInputs, point: Point) -> Experiment:
    """The experiment of an ``exp`` point."""
    for e in inputs.experiments:
        if e.name == point.experiment:
            return e
    raise ManifestError(f"no experiment named {point.experiment!r} in the pack")


def arrival_pattern(inputs: ScheduleInputs, point: Point) -> tuple[str, float]:
    """The point's arrival process and CV (an experiment's own, else the client's)."""
    if point.mode == "exp":
        e = experiment_of(inputs, point)
        return (
            e.arrival_pattern or _base_pattern(inputs),
            e.arrival_cv if e.arrival_cv is not None else inputs.client.arrival_cv,
        )
    return inputs.client.arrival_pattern, inputs.client.arrival_cv


def _base_pattern(inputs: ScheduleInputs) -> str:
    # Experiments built on a trace-driven pack still need a synthetic process.
    p = inputs.client.arrival_pattern
    return "poisson" if p == "trace" else p
