"""A continuous-batching scheduler after vLLM V1's, driven one step at a time.

Every request has ``num_tokens = prompt + generated`` tokens, of which ``num_computed`` have KV
entries. Each step (:meth:`Scheduler.schedule`) fills a token budget of
``max_num_batched_tokens``:

1. running requests first, in admission order, each asking for ``num_tokens - num_computed``
   tokens (1 for a decode, the rest of the prompt for an unfinished chunked prefill), capped by
   the budget left. KV blocks are allocated for ``ceil((num_computed + q) / block_size)``; when
   the pool cannot supply them the newest running request is preempted (its blocks freed, its
   progress dropped, put back at the head of the waiting queue to be recomputed later), until the
   request fits or is itself the newest;
2. then, only if nothing was preempted, waiting requests in arrival order while budget remains
   and fewer than ``max_num_seqs`` run: the prefix cache supplies the longest run of cached full
   blocks (at most ``num_tokens - 1`` tokens, so at least one token is computed), the rest is
   prefilled in chunks of what the budget leaves; the queue stops at the first request that
   cannot get its blocks (first come, first served).

When a step completes (:meth:`Scheduler.complete`) every request whose ``num_computed`` reached
``num_tokens`` emits one token. A request finishes at ``stop_at`` tokens (``max_tokens``, or an
earlier seeded EOS when ``ignore_eos`` is off, never before ``min_tokens``) or on a stop string.

Prefix-cache counters are in tokens (queries += num_tokens, hits += cached tokens) for every
admission, including re-admissions after preemption, as vLLM counts them.
"""

from __future__ import annotations

from collections import deque

from capacity_pack.sim.kv import ROOT_HASH, BlockPool
from capacity_pack.sim.perf import PerfModel
from capacity_pack.sim.profile import Profile
from capacity_pack.sim.tokenizer import token_id

WAITING, RUNNING, FINISHED = 0, 1, 2

# Generated text: one of these words per token, chosen by a per-request seeded sequence.
OUTPUT_WORDS = tuple(
    dict.fromkeys(
        """the of and to in is was for on that with as by at from his her an are be this which
    or had not but were have one their all there been has they who its two new more would after
    first other into time some only also over many these can such may most out about than when
    up then made him between three through during under where years state world city before both
    each same well while part long being high used those group she any life work number because
    since great year around water small house large old another system still end water point
    place light line order school area early law power human public form family night name early
    open river given sound field rock heart music paper story north south east west green blue
    red white black gold silver stone wood glass fire earth wind cloud rain snow summer winter
    spring autumn morning evening garden forest mountain valley island ocean harbor bridge road
    market village castle tower window door table chair letter number signal engine token model
    batch queue cache block layer vector matrix kernel tensor stream packet socket server client
    request answer question reason result method theory measure sample signal record report
    figure value balance energy motion force weight pressure current circuit voltage carbon
    silicon copper iron nickel zinc lead tin iodine helium neon argon oxygen hydrogen nitrogen
    sodium calcium planet comet star moon orbit galaxy nebula photon proton neutron electron
    atom molecule crystal fiber thread fabric cotton linen wool silk leather canvas""".split()
    )
)
OUTPUT_IDS = tuple(token_id(w) for w in OUTPUT_WORDS)
OUTPUT_TEXT = tuple(" " + w for w in OUTPUT_WORDS)
_N_WORDS = len(OUTPUT_WORDS)


def output_index(out_seed: int, k: int) -> int:
    """Vocabulary index of generated token ``k`` of a request (a splitmix64-style mix, so
    neighbouring seeds do not give shifted copies of one sequence)."""
    x = (out_seed * 0x9E3779B97F4A7C15 + k * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return (((x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF) >> 40) % _N_WORDS


class SimRequest:
    """One request's engine state; the server hangs its own fields on the same object."""

    __slots__ = (
        "request_id",
        "prompt_ids",
        "num_prompt",
        "max_tokens",
        "min_tokens",
        "stop_at",
        "stop_at_reason",
        "stop_strings",
        "text",
        "text_limit",
        "stop_reason",
        "out_seed",
        "arrival_ns",
        "scheduled_ns",
        "first_token_ns",
        "prev_token_ns",
        "last_token_ns",
        "finished_ns",
        "num_computed",
        "num_output",
        "blocks",
        "hashes",
        "num_hashed",
        "num_cached_tokens",
        "num_preemptions",
        "status",
        "finish_reason",
        "waiter",
        "listener",
        "ctx",
    )

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        arrival_ns: int = 0,
        min_tokens: int = 0,
        eos_at: int | None = None,
        stop_strings: tuple[str, ...] = (),
        out_seed: int = 0,
    ) -> None:
        if not prompt_ids:
            raise ValueError("a request needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.num_prompt = len(prompt_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min(min_tokens, max_tokens)
        stop = max_tokens if eos_at is None else max(self.min_tokens, min(eos_at, max_tokens))
        self.stop_at = stop
        self.stop_at_reason = "stop" if eos_at is not None and stop < max_tokens else "length"
        self.stop_strings = stop_strings
        self.text = "" if stop_strings else None
        self.text_limit: int | None = None
        self.stop_reason: str | None = None
        self.out_seed = out_seed
        self.arrival_ns = arrival_ns
        self.scheduled_ns: int | None = None
        self.first_token_ns: int | None = None
        self.prev_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.finished_ns: int | None = None
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []
        self.num_hashed = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.status = WAITING
        self.finish_reason: str | None = None
        self.waiter = None
        # Called (in the live engine's loop) instead of resolving ``waiter``: a stream's writer.
        self.listener = None
        self.ctx = None

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_output

    def token_at(self, pos: int) -> int:
        if pos < self.num_prompt:
            return self.prompt_ids[pos]
        return OUTPUT_IDS[output_index(self.out_seed, pos - self.num_prompt)]

    def output_text(self, start: int, stop: int) -> str:
        """Text of generated tokens ``start..stop-1``, cut at a matched stop string."""
        seed = self.out_seed
        text = "".join([OUTPUT_TEXT[output_index(seed, k)] for k in range(start, stop)])
        if self.text_limit is not None:
            begin = sum(len(OUTPUT_TEXT[output_index(seed, k)]) for k in range(start))
            text = text[: max(0, self.text_limit - begin)]
        return text

    def block_hashes(self, n: int, block_size: int) -> list[int]:
        """Chained hashes of the first ``n`` full blocks (memoised: tokens never change)."""
        hashes = self.hashes
        while len(hashes) < n:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            start = i * block_size
            if start + block_size <= self.num_prompt:
                toks = self.prompt_ids[start : start + block_size]
            else:
                # token_at inlined: the blocks past the prompt are most of a long run's calls.
                n_prompt, seed, ids = self.num_prompt, self.out_seed, self.prompt_ids
                toks = [
                    ids[p] if p < n_prompt else OUTPUT_IDS[output_index(seed, p - n_prompt)]
                    for p in range(start, start + block_size)
                ]
            hashes.append(hash((parent, *toks)))
        return hashes


class Step:
    """What one engine step computes: per request its new tokens, and the step's cost."""

    __slots__ = ("reqs", "nums", "num_tokens", "duration_s", "num_preempted", "failed")

    def __init__(self) -> None:
        self.reqs: list[SimRequest] = []
        self.nums: list[int] = []
        self.num_tokens = 0
        self.duration_s = 0.0
        self.num_preempted = 0
        self.failed: list[SimRequest] = []


class Scheduler:
    """Waiting queue, running batch, block pool and the counters vLLM exposes."""

    def __init__(self, profile: Profile, perf: PerfModel | None = None) -> None:
        eng = profile.engine
        self.profile = profile
        self.perf = perf or PerfModel(profile)
        self.block_size = eng.block_size
        self.max_num_batched_tokens = eng.max_num_batched_tokens
        self.max_num_seqs = eng.max_num_seqs
        self.pool = BlockPool(profile.num_gpu_blocks, eng.block_size, eng.enable_prefix_caching)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0

    # -- queue ------------------------------------------------------------------------------

    def add(self, req: SimRequest) -> None:
        req.status = WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def abort(self, req: SimRequest, now_ns: int, reason: str = "abort") -> bool:
        """Remove a request wherever it is; False when it had already finished."""
        if req.status == FINISHED:
            return False
        if req.status == RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, reason, now_ns)
        return True

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- one step ---------------------------------------------------------------------------

    def schedule(self, now_ns: int) -> Step:
        """Choose this step's work (see the module docstring) and its modelled duration."""
        step = Step()
        budget = self._continue_running(step, self.max_num_batched_tokens)
        if not step.num_preempted:
            self._admit_waiting(step, budget, now_ns)
            if not step.reqs and not self.running and self.waiting:
                # Nothing runs and the head still does not fit: it never will (the KV capacity
                # was reduced below its size), so fail it rather than stall the queue forever.
                req = self.waiting.popleft()
                self._finish(req, "error", now_ns)
                step.failed.append(req)
        num_tokens = 0
        attn = 0.0
        kv = 0
        for req, q in zip(step.reqs, step.nums, strict=True):
            c = req.num_computed
            num_tokens += q
            attn += q * c + q * (q + 1) * 0.5
            kv += c + q
        step.num_tokens = num_tokens
        step.duration_s = self.perf.step_s(len(step.reqs), num_tokens, attn, kv)
        return step

    def _continue_running(self, step: Step, budget: int) -> int:
        """Give each running request its next tokens in order, preempting from the back when
        the KV pool runs short; returns the token budget left."""
        bs = self.block_size
        pool = self.pool
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            q = min(req.num_prompt + req.num_output - req.num_computed, budget)
            need = -(-(req.num_computed + q) // bs) - len(req.blocks)
            while need > 0 and not pool.can_allocate(need):
                victim = running.pop()
                self._preempt(victim)
                step.num_preempted += 1
                if victim is req:
                    break
            if req.status != RUNNING:
                break
            if need > 0:
                req.blocks.extend(pool.allocate(need))
            step.reqs.append(req)
            step.nums.append(q)
            budget -= q
            i += 1
        return budget

    def _admit_waiting(self, step: Step, budget: int, now_ns: int) -> None:
        """Admit waiting requests first come first served while the budget, the sequence limit
        and the KV pool (after prefix-cache hits) allow."""
        bs = self.block_size
        pool = self.pool
        waiting, running = self.waiting, self.running
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            total = req.num_prompt + req.num_output
            hits: list[int] = []
            if pool.enable_caching:
                hits = pool.lookup(req.block_hashes((total - 1) // bs, bs))
            c = len(hits) * bs
            q = min(total - c, budget)
            need = -(-(c + q) // bs) - len(hits)
            if not pool.can_allocate(need + pool.count_free_among(hits)):
                break
            waiting.popleft()
            pool.touch(hits)
            req.blocks = hits + pool.allocate(need)
            req.num_hashed = len(hits)
            req.num_computed = c
            req.status = RUNNING
            if req.scheduled_ns is None:
                req.scheduled_ns = now_ns
                req.num_cached_tokens = c
            self.prefix_queries_tokens += total
            self.prefix_hits_tokens += c
            running.append(req)
            step.reqs.append(req)
            step.nums.append(q)
            budget -= q

    def complete(self, step: Step, now_ns: int) -> tuple[list[SimRequest], list[SimRequest]]:
        """Apply a finished step: returns (requests that emitted a token, requests finished)."""
        bs = self.block_size
        pool = self.pool
        caching = pool.enable_caching
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        for req, q in zip(step.reqs, step.nums, strict=True):
            if req.status != RUNNING:
                continue  # aborted or preempted while the step ran
            req.num_computed += q
            if caching:
                full = req.num_computed // bs
                if full > req.num_hashed:
                    hashes = req.block_hashes(full, bs)
                    blocks = req.blocks
                    for j in range(req.num_hashed, full):
                        pool.cache_block(blocks[j], hashes[j])
                    req.num_hashed = full
            if req.num_computed < req.num_prompt + req.num_output:
                continue  # a prefill chunk that did not reach the end of the prompt
            req.num_output += 1
            self.generation_tokens += 1
            if req.num_output == 1:
                self.prompt_tokens += req.num_prompt
                req.first_token_ns = now_ns
            req.prev_token_ns = req.last_token_ns
            req.last_token_ns = now_ns
            emitted.append(req)
            if req.num_output >= req.stop_at:
                self._finish(req, req.stop_at_reason, now_ns)
                finished.append(req)
            elif req.text is not None and self._hits_stop_string(req):
                self._finish(req, "stop", now_ns)
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.status == RUNNING]
        return emitted, finished

    # -- internals --------------------------------------------------------------------------

    def _hits_stop_string(self, req: SimRequest) -> bool:
        word = OUTPUT_TEXT[output_index(req.out_seed, req.num_output - 1)]
        before = len(req.text)
        req.text += word
        if req.num_output <= req.min_tokens:
            return False
        for s in req.stop_strings:
            pos = req.text.find(s, max(0, before - len(s) + 1))
            if pos >= 0:
                req.text_limit = pos
                req.stop_reason = s
                return True
        return False

    def _preempt(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_hashed = 0
        req.status = WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: SimRequest, reason: str, now_ns: int) -> None:
        if req.blocks:
            self.pool.release(req.blocks)
            req.blocks = []
        req.status = FINISHED
        req.finish_reason = reason
        req.finished_ns = now_ns
