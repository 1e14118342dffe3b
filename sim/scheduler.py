"""Per-instance continuous-batching scheduler with vLLM V1 (v0.19) semantics.

Each step:
1. Running requests first, in order. Each asks for the rest of its prompt (chunked,
   capped by ``long_prefill_token_threshold`` and the remaining token budget) or one
   decode token. If KV blocks run out, the most recently admitted running request is
   preempted (its blocks freed, its progress dropped: recompute) and put at the front of
   the waiting queue; if the victim is the request being scheduled, the loop stops.
2. Only if nothing was preempted this step: waiting requests in FCFS order, while the
   budget lasts and fewer than ``max_num_seqs`` run. A request first reuses its longest
   cached prefix; with ``reserve_full_isl`` it is admitted only if its whole sequence
   fits in the free blocks. Without chunked prefill a prompt that exceeds the remaining
   budget waits. The first waiting request that cannot be admitted stops admission (FCFS).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sim.kv_cache import KVCacheManager
from sim.latency.base import BatchShape
from sim.options import SimOptions
from sim.request import FINISHED, RUNNING, WAITING, Request


@dataclass(slots=True)
class Batch:
    requests: list[Request]
    num_new: list[int]
    shape: BatchShape
    prefill_tokens: int
    decode_tokens: int
    #: bytes of KV loaded from the lower prefix tier this step (its hits)
    tier_load_bytes: int = 0


class Scheduler:
    def __init__(self, instance_id: int, opts: SimOptions, kv: KVCacheManager) -> None:
        self.instance_id = instance_id
        self.opts = opts
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.max_num_seqs = opts.max_num_seqs
        # 0 means no token budget (LLMServingSim's convention for decode instances).
        self.budget = opts.max_num_batched_tokens or (1 << 40)
        self.threshold = opts.long_prefill_token_threshold
        self.chunked = opts.enable_chunked_prefill
        self.reserve_full = opts.reserve_full_isl
        #: bytes of one KV block of the whole instance (what a lower-tier hit loads)
        self.tier_block_bytes = 0
        #: PD disaggregation role: None, "prefill" or "decode"
        self.role: str | None = None
        #: prefill role: requests whose prefill finished, to be handed to a decode instance
        self.handoffs: list[Request] = []
        #: decode role: requests admitted this step whose KV must now be transferred in
        self.admitted_transfers: list[Request] = []

    def add_request(self, req: Request) -> None:
        req.instance_id = self.instance_id
        req.status = WAITING
        self.waiting.append(req)

    @property
    def is_idle(self) -> bool:
        return not self.running and not self.waiting

    def load(self) -> int:
        """vLLM-style load score used by the LOAD router."""
        return len(self.waiting) * 4 + len(self.running)

    def _preempt(self, victim: Request) -> None:
        self.kv.free_request(victim)
        victim.num_computed = 0
        victim.remote_kv = False  # its transferred KV is gone: recompute locally
        victim.status = WAITING
        victim.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def schedule(self, now: int) -> Batch | None:
        budget = self.budget
        threshold = self.threshold
        kv = self.kv
        running = self.running
        reqs: list[Request] = []
        news: list[int] = []
        preempted = False
        tier_bytes = 0
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            if req.in_flight or req.ready_ns > now:
                # Its previous step is still in the pipeline, or its KV is still arriving.
                i += 1
                continue
            n = req.num_tokens - req.num_computed
            if threshold and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            if n <= 0:
                i += 1
                continue
            scheduled = True
            while not kv.allocate(req, n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            reqs.append(req)
            news.append(n)
            budget -= n
            i += 1

        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = waiting[0]
                if req.remote_kv:
                    # Decode side of PD disaggregation: the prompt's KV comes from the prefill
                    # instance. Admit only when blocks for the whole sequence are free; the
                    # request runs once the transfer has landed.
                    if not kv.allocate(req, req.num_tokens):
                        break
                    waiting.popleft()
                    req.num_computed = req.num_tokens - 1
                    req.status = RUNNING
                    running.append(req)
                    self.admitted_transfers.append(req)
                    continue
                hit = kv.lookup(req)
                lower = kv.lookup_lower(req, len(hit)) if kv.lower_tier is not None else 0
                hit_tokens = len(hit) * kv.block_size
                n = req.num_tokens - hit_tokens - lower * kv.block_size
                if threshold and n > threshold:
                    n = threshold
                if not self.chunked and n > budget:
                    break
                if n > budget:
                    n = budget
                if self.reserve_full and not kv.can_admit(req, hit, True, n):
                    break
                lower_tokens = lower * kv.block_size
                if not kv.allocate(req, n + lower_tokens, hit):
                    break
                waiting.popleft()
                req.num_computed = hit_tokens + lower_tokens
                if lower:
                    tier_bytes += lower * self.tier_block_bytes
                    kv.lower_hit_tokens += lower_tokens
                if req.first_scheduled_ns < 0:
                    # The per-request column: the prefix its first admission found cached.
                    req.first_scheduled_ns = now
                    req.prefix_hit = hit_tokens + lower_tokens
                    req.lower_hit = lower_tokens
                # The summary counts hits at every admission, re-admissions after preemption
                # included (as vLLM's prefix-cache hit rate does).
                kv.hit_tokens += hit_tokens + lower_tokens
                kv.queried_tokens += req.num_tokens
                req.status = RUNNING
                running.append(req)
                reqs.append(req)
                news.append(n)
                budget -= n

        if not reqs:
            return None
        for req in reqs:
            req.in_flight = True
        prefill_tokens = prefill_kv = n_dec = kv_sum = pwork = 0
        kv_max = 0
        kv_min = 1 << 62
        for req, n in zip(reqs, news):
            if req.num_computed >= req.input_len and n == 1 and req.num_output > 0:
                n_dec += 1
                k = req.num_computed
                kv_sum += k
                if k > kv_max:
                    kv_max = k
                if k < kv_min:
                    kv_min = k
            else:
                prefill_tokens += n
                prefill_kv += req.num_computed
                pwork += n * (2 * req.num_computed + n)  # varlen attention: per request
        total = prefill_tokens + n_dec
        shape = BatchShape(total, len(reqs), prefill_tokens, prefill_kv, n_dec, kv_sum, kv_max,
                           kv_min if n_dec else 0, pwork)
        return Batch(reqs, news, shape, prefill_tokens, n_dec, tier_bytes)

    def complete(self, batch: Batch, now: int, itl_sink: list[int]) -> list[Request]:
        """Apply a finished step: advance progress, emit tokens, retire finished requests."""
        finished: list[Request] = []
        kv = self.kv
        caching = kv.enable_prefix_caching
        bs = kv.block_size
        for req, n in zip(batch.requests, batch.num_new):
            req.in_flight = False
            if req.status != RUNNING:
                continue
            req.num_computed += n
            if req.num_computed >= req.num_tokens:
                # The step computed the whole sequence so far: it samples one token.
                if req.num_output == 0:
                    req.first_token_ns = now
                else:
                    gap = now - req.last_token_ns
                    itl_sink.append(gap)
                    if gap > req.itl_max_ns:
                        req.itl_max_ns = gap
                req.last_token_ns = now
                req.num_output += 1
                if req.num_output >= req.output_len:
                    req.status = FINISHED
                    req.finish_ns = now
                    finished.append(req)
                elif self.role == "prefill":
                    # Prefill done: the request moves to a decode instance.
                    req.status = WAITING
                    self.handoffs.append(req)
            if caching and req.num_computed // bs > (req.cached_hashes or 0):
                kv.cache_full_blocks(req)
        leaving = finished + self.handoffs if self.handoffs else finished
        if leaving:
            done = {id(r) for r in leaving}
            self.running = [r for r in self.running if id(r) not in done]
            for r in leaving:
                if caching:
                    kv.cache_full_blocks(r)
                kv.free_request(r)
        return finished
