# mypy: disable-error-code="union-attr,index,arg-type,attr-defined"
# (compiled by mypyc where a C compiler is at hand: sim/native.py. Those checks stay off
# because an Optional read after a guard compiles to a generic, checked operation.)
"""Per-instance continuous-batching scheduler with vLLM V1 (v0.19) semantics.

The rules are those of vLLM's ``vllm/v1/core/sched/scheduler.py`` (and
``async_scheduler.py``), checked step by step against vLLM's own scheduler by
``tests/sim/test_sim_vllm_scheduler_parity.py``. Each ``schedule``:

1. Running requests first, in order. Each asks for the rest of its sequence, counting
   tokens still being sampled by steps in flight (chunked, capped by
   ``long_prefill_token_threshold``, the remaining token budget and ``max_model_len``).
   A request whose previous step is still in flight and has nothing new to compute is
   skipped (pipeline parallelism without async scheduling); with async scheduling a
   request already certain to finish with its step in flight gets no extra step. If KV
   blocks run out, a running request is preempted (its blocks freed, its progress
   dropped: recompute) and put back at the front of the waiting queue: the most recently
   admitted one (``fcfs``) or the one of lowest priority, latest arrival (``priority``);
   if the victim is the request being scheduled, the loop stops.
2. Only if nothing was preempted this step: waiting requests in queue order (FCFS, or
   priority then arrival), while the budget lasts and fewer than ``max_num_seqs`` run.
   A request first reuses its longest cached prefix; with ``reserve_full_isl`` it is
   admitted only if its whole sequence fits in the free blocks. Without chunked prefill
   a prompt that exceeds the remaining budget waits. The first waiting request that
   cannot be admitted stops admission.
3. Every scheduled request's ``num_computed`` advances now, not when the step ends (so
   chunks of one prompt overlap across pipeline stages). A step that reaches the end of
   the sequence samples a token; with async scheduling it counts as a placeholder until
   the step completes.

``complete`` applies a finished step: it appends the sampled tokens (also to a request
preempted meanwhile), finishes requests at their output length or ``max_model_len``,
and frees their blocks.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from itertools import compress
from dataclasses import dataclass
from operator import mul
from typing import TYPE_CHECKING

from sim.kv_cache import KVCacheManager
from sim.latency.base import BatchShape
from sim.options import SimOptions
from sim.request import COMPILED, FINISHED, PREEMPTED, RUNNING, WAITING, Request

if TYPE_CHECKING:
    from sim.metrics import GapRuns


def decode_kv_stats(kvs: list[int]) -> tuple[int, int, int, int]:
    """Sum, largest, smallest and sum of squares of decode KV lengths (at least one):
    compiled, one loop over them; as Python, the builtins' passes (``COMPILED``)."""
    if not COMPILED:
        return sum(kvs), max(kvs), min(kvs), sum(map(mul, kvs, kvs))
    total = squares = 0
    hi = lo = kvs[0]
    for k in kvs:
        total += k
        squares += k * k
        if k > hi:
            hi = k
        elif k < lo:
            lo = k
    return total, hi, lo, squares


@dataclass(slots=True)
class Batch:
    requests: list[Request]
    num_new: list[int]
    shape: BatchShape
    prefill_tokens: int
    decode_tokens: int
    #: bytes of KV loaded from the lower prefix tier this step (its hits)
    tier_load_bytes: int = 0
    #: per request: this step reaches the end of its sequence and samples a token
    samples: list[bool] | None = None


class Step:
    """The step being scheduled. Each request's progress is applied as it joins (vLLM's
    ``_update_after_schedule``: ``num_computed`` advances now; a step that reaches the end
    of the sequence samples a token, with async scheduling a placeholder until it
    completes), and the step's shape is summed up as it goes."""

    __slots__ = ("async_", "decode_kv", "news", "prefill_kv", "prefill_tokens", "prefill_work",
                 "reqs", "samples")

    def __init__(self, async_: bool) -> None:
        self.async_ = async_
        self.reqs: list[Request] = []
        self.news: list[int] = []
        #: per request: this step reaches the end of its sequence and samples a token
        self.samples: list[bool] = []
        #: the KV length each decode reads (in cache when the step runs)
        self.decode_kv: list[int] = []
        self.prefill_tokens = self.prefill_kv = self.prefill_work = 0

    def add(self, req: Request, n: int) -> None:
        """``req`` computes ``n`` new tokens in this step (``Scheduler._schedule_running``
        has this inline)."""
        k = req.num_computed  # tokens already in cache when the step runs
        n_in = req.input_len
        req.num_computed = k + n
        sample = k + n >= n_in + req.num_output + req.num_placeholders
        if sample and self.async_:
            req.num_placeholders += 1
        self.reqs.append(req)
        self.news.append(n)
        self.samples.append(sample)
        if n == 1 and k >= n_in:
            self.decode_kv.append(k)
        else:
            self.add_prefill(k, n)

    def add_prefill(self, k: int, n: int) -> None:
        """A prefill chunk of ``n`` tokens over ``k`` cached ones joins the shape."""
        self.prefill_tokens += n
        self.prefill_kv += k
        self.prefill_work += n * (2 * k + n)  # varlen attention: per request

    def drop(self, j: int) -> int:
        """Take the ``j``-th request back out of the step, its progress undone (a victim of
        a preemption after it joined); returns its new tokens."""
        req = self.reqs.pop(j)
        n = self.news.pop(j)
        k = req.num_computed - n
        req.num_computed = k
        if self.samples.pop(j) and self.async_:
            req.num_placeholders -= 1
        if n == 1 and k >= req.input_len:
            self.decode_kv.remove(k)
        else:
            self.prefill_tokens -= n
            self.prefill_kv -= k
            self.prefill_work -= n * (2 * k + n)
        return n

    def batch(self, tier_bytes: int, decoded: BatchShape | None = None) -> Batch:
        """The scheduled step, with ``tier_bytes`` of prefix hits to load first.
        ``decoded``: the shape of decodes that joined the step without being listed in
        ``decode_kv`` (``Scheduler.schedule_after_decodes``), whose KV sums are added."""
        decode_kv = self.decode_kv
        n_dec = len(decode_kv)
        prefill_tokens = self.prefill_tokens
        if n_dec:
            kv_sum, kv_max, kv_min, kv_sq = decode_kv_stats(decode_kv)
        else:
            kv_sum = kv_max = kv_min = kv_sq = 0
        if decoded is not None and decoded.num_decode:
            if n_dec:
                kv_max = max(kv_max, decoded.decode_kv_max)
                kv_min = min(kv_min, decoded.decode_kv_min)
            else:
                kv_max, kv_min = decoded.decode_kv_max, decoded.decode_kv_min
            n_dec += decoded.num_decode
            kv_sum += decoded.decode_kv_sum
            kv_sq += decoded.decode_kv_sq_sum
        shape = BatchShape(prefill_tokens + n_dec, len(self.reqs), prefill_tokens,
                           self.prefill_kv, n_dec, kv_sum, kv_max, kv_min, self.prefill_work,
                           kv_sq)
        return Batch(self.reqs, self.news, shape, prefill_tokens, n_dec, tier_bytes,
                     self.samples)


class PriorityQueue:
    """vLLM's priority waiting queue: a heap ordered by (priority, arrival, request id)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, int, Request]] = []
        self._count = itertools.count()

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_ns, req.rid, next(self._count), req))

    def appendleft(self, req: Request) -> None:
        # A preempted request goes back by its priority. (A method, not an alias of
        # append: compiled, the alias crashed.)
        self.append(req)

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[4]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[4] is not req]
        heapq.heapify(self._heap)

    def __getitem__(self, i: int) -> Request:
        if i != 0:
            raise IndexError("only the head of a priority queue can be read")
        return self._heap[0][4]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (e[4] for e in sorted(self._heap, key=lambda e: e[:4]))


class Scheduler:
    def __init__(self, instance_id: int, opts: SimOptions, kv: KVCacheManager) -> None:
        self.instance_id = instance_id
        self.opts = opts
        self.kv = kv
        self.priority = opts.scheduling_policy == "priority"
        self.waiting: deque[Request] | PriorityQueue = (
            PriorityQueue() if self.priority else deque())
        self.running: list[Request] = []
        self.num_preemptions = 0
        #: requests preempted by the last schedule call
        self.preempted_last: list[Request] = []
        self.max_num_seqs = opts.max_num_seqs
        # 0 means no token budget (LLMServingSim's convention for decode instances).
        self.budget = opts.max_num_batched_tokens or (1 << 40)
        self.threshold = opts.long_prefill_token_threshold
        self.chunked = opts.enable_chunked_prefill
        self.reserve_full = opts.reserve_full_isl
        self.async_scheduling = opts.async_enabled
        self.max_model_len = opts.max_model_len or (1 << 40)
        #: bytes of one KV block of the whole instance (what a lower-tier hit loads)
        self.tier_block_bytes = 0
        #: PD disaggregation role: None, "prefill" or "decode"
        self.role: str | None = None
        #: prefill role: requests whose prefill finished, to be handed to a decode instance
        self.handoffs: list[Request] = []
        #: prefill role: handed-off requests whose blocks are kept until their KV is read
        self.held_handoffs = 0
        #: decode role: requests admitted this step whose KV must now be transferred in
        self.admitted_transfers: list[Request] = []
        #: decode role: requests holding blocks while their KV is transferred in
        self.receiving: list[Request] = []
        #: requests added since the engine last read its input (stamped QUEUED then)
        self.unread: list[Request] = []

    def add_request(self, req: Request) -> None:
        req.instance_id = self.instance_id
        req.status = WAITING
        self.waiting.append(req)
        if req.queued_ns < 0:
            self.unread.append(req)

    @property
    def is_idle(self) -> bool:
        return not self.running and not self.waiting and not self.receiving

    def load(self) -> int:
        """vLLM-style load score used by the LOAD router."""
        return len(self.waiting) * 4 + len(self.running) + len(self.receiving)

    def _preempt(self, victim: Request) -> None:
        self.kv.free_request(victim)
        victim.num_computed = 0
        victim.remote_kv = False  # its transferred KV is gone: recompute locally
        victim.status = PREEMPTED
        victim.preemptions += 1
        self.num_preemptions += 1
        self.preempted_last.append(victim)
        self.waiting.appendleft(victim)

    def _pick_victim(self) -> Request:
        running = self.running
        if not self.priority:
            return running.pop()
        victim = max(running, key=lambda r: (r.priority, r.arrival_ns))
        running.remove(victim)
        return victim

    def _schedule_running(self, step: Step, budget: int) -> tuple[int, bool]:
        """Step 1 (running requests); returns (budget left, whether anything was preempted)."""
        threshold = self.threshold
        kv = self.kv
        running = self.running
        cap = self.max_model_len - 1
        bs = kv.block_size
        caching = kv.enable_prefix_caching
        async_ = self.async_scheduling
        # A PD prefill instance serves each request with max_tokens=1 (vLLM's proxy).
        one_token = self.role == "prefill"
        add_req, add_new = step.reqs.append, step.news.append
        add_sample, add_decode_kv = step.samples.append, step.decode_kv.append
        preempted = False
        i = 0  # the index in ``running`` of the request after the one being scheduled
        n_running = len(running)
        while i < n_running and budget > 0:
            req = running[i]
            i += 1
            k = req.num_computed
            ph = req.num_placeholders
            n_in = req.input_len
            if ph and k + 2 - ph >= n_in + (1 if one_token else req.output_len):
                continue  # (async) Its step in flight is its last.
            known = n_in + req.num_output
            n = rest = known + ph - k  # (rest: the tokens it has left to compute)
            if n > 1:
                if threshold and n > threshold:
                    n = threshold
                if n > budget:
                    n = budget
                if n > cap - k:
                    n = cap - k
                if n <= 0:
                    continue
            elif n < 1 or k >= cap:
                continue  # (one token: within the threshold and the budget left)
            nc = k + n
            if nc <= len(req.block_ids) * bs and (not caching or (
                    nc if nc < known else known) // bs <= req.cached_hashes):
                pass  # Fast path (most decodes): its blocks have room and nothing to cache.
            elif not (kv.grow_one(req) if n == 1 else kv.allocate(req, n)):
                allocated, refund, undone = self._preempt_for(req, n, step)
                preempted = True
                budget += refund
                i -= undone
                n_running = len(running)
                if not allocated:
                    break
            # step.add(req, n), inline
            req.num_computed = nc
            if n == rest:
                add_sample(True)
                if async_:
                    req.num_placeholders = ph + 1
            else:
                add_sample(False)
            if n == 1 and k >= n_in:
                add_decode_kv(k)
            else:
                step.add_prefill(k, n)
            add_req(req)
            add_new(n)
            budget -= n
        return budget, preempted

    def _preempt_for(self, req: Request, n: int, step: Step) -> tuple[bool, int, int]:
        """Preempt running requests (the scheduling policy's victims) until ``req`` gets
        blocks for ``n`` more tokens, or is the victim itself. Returns whether it got them,
        the budget given back by victims scheduled earlier in this step (priority policy:
        their step is undone), and how many of those there were."""
        refund = undone = 0
        while True:
            victim = self._pick_victim()
            if victim in step.reqs:
                refund += step.drop(step.reqs.index(victim))
                undone += 1
            self._preempt(victim)
            if victim is req:
                return False, refund, undone
            if self.kv.allocate(req, n):
                return True, refund, undone

    def _schedule_waiting(self, now: int, step: Step, budget: int) -> int:
        """Step 2 (admission); returns the tier bytes loaded."""
        threshold = self.threshold
        kv = self.kv
        running = self.running
        waiting = self.waiting
        tier_bytes = 0
        bs = kv.block_size
        if self.receiving:
            budget = self._promote_received(now, step, budget)
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting[0]
            if req.remote_kv:
                # Decode side of PD disaggregation: the prompt's KV comes from the prefill
                # instance; only the part this instance has not cached is transferred.
                if not self._admit_remote(req):
                    break
                continue
            if req.num_computed == 0 and kv.enable_prefix_caching:
                hit = kv.lookup(req)
                lower = kv.lookup_lower(req, len(hit)) if kv.lower_tier is not None else 0
                if not req.preemptions:
                    # vLLM's prefix-cache hit rate: every lookup of a request never
                    # preempted, also one whose admission then fails.
                    kv.hit_tokens += len(hit) * bs + lower * bs
                    kv.queried_tokens += req.input_len + req.num_output
            else:
                hit, lower = [], 0
            hit_tokens = len(hit) * bs
            lower_tokens = lower * bs
            computed = req.num_computed + hit_tokens + lower_tokens
            n = req.input_len + req.num_output - computed  # (num_tokens - computed)
            if threshold and n > threshold:
                n = threshold
            if not self.chunked and n > budget:
                break
            if n > budget:
                n = budget
            if self.reserve_full and not kv.can_admit(req, hit, True, n):
                break
            if not kv.allocate(req, n + lower_tokens, hit):
                break
            waiting.popleft()
            req.num_computed = computed
            if lower:
                tier_bytes += lower * self.tier_block_bytes
                kv.lower_hit_tokens += lower_tokens
            if req.first_scheduled_ns < 0:
                # The per-request column: the prefix its first admission found cached.
                req.first_scheduled_ns = now
                req.prefix_hit = hit_tokens + lower_tokens
                req.lower_hit = lower_tokens
            self._start_running(req, n, step)
            budget -= n
        return tier_bytes

    def _promote_received(self, now: int, step: Step, budget: int) -> int:
        """PD decode side: requests whose KV has landed run their first step (vLLM's
        WAITING_FOR_REMOTE_KVS requests, taken before the waiting queue)."""
        running = self.running
        for req in list(self.receiving):
            if budget <= 0 or len(running) >= self.max_num_seqs:
                break
            if req.ready_ns > now:
                continue
            n = req.num_tokens - req.num_computed
            if not self.kv.allocate(req, n):
                break
            self.receiving.remove(req)
            self._start_running(req, n, step)
            budget -= n
        return budget

    def _start_running(self, req: Request, n: int, step: Step) -> None:
        """``req`` joins the running set and this step's batch with ``n`` new tokens."""
        req.status = RUNNING
        self.running.append(req)
        step.add(req, n)

    def _admit_remote(self, req: Request) -> bool:
        """Admit a request whose prompt KV arrives from a prefill instance: blocks for the
        prompt are allocated once (its local prefix hit reused); the request waits, outside
        the running set, until the transfer has landed."""
        kv = self.kv
        hit = kv.lookup(req)
        hit_tokens = len(hit) * kv.block_size
        if not kv.allocate(req, req.num_tokens - hit_tokens, hit):
            return False
        self.waiting.popleft()
        req.kv_transfer_tokens = req.input_len - hit_tokens
        # As vLLM's connector does: the loaded prompt counts as computed but the last
        # token, which the first decode step recomputes to sample the first token.
        req.num_computed = req.num_tokens - 1
        self.receiving.append(req)
        self.admitted_transfers.append(req)
        return True

    def read_input(self, now: int) -> None:
        """vLLM's engine core reads its input queue right before it schedules (between
        steps, or at once when idle): that is when a request is QUEUED."""
        if self.unread:
            for r in self.unread:
                r.queued_ns = now
            self.unread.clear()

    def schedule(self, now: int) -> Batch | None:
        self.read_input(now)
        step = Step(self.async_scheduling)
        if self.preempted_last:
            self.preempted_last = []
        budget, preempted = self._schedule_running(step, self.budget)
        tier_bytes = 0
        if not preempted and (self.waiting or self.receiving):
            tier_bytes = self._schedule_waiting(now, step, budget)
        if not step.reqs:
            return None
        return step.batch(tier_bytes)

    def schedule_after_decodes(self, decodes: Batch, now: int) -> Batch:
        """``schedule`` at ``now`` where the running requests' part of the step, one
        decode each, is ``decodes``, taken already with its effects (an event leap's
        step, ``sim.leap``; nothing preempted): the waiting queue is scheduled after it."""
        self.read_input(now)
        step = Step(self.async_scheduling)
        # (the leap's batch of that step is its own: it is not kept elsewhere)
        reqs = step.reqs = decodes.requests
        n = len(reqs)
        step.news = [1] * n
        step.samples = [True] * n
        tier_bytes = 0
        if self.waiting or self.receiving:
            tier_bytes = self._schedule_waiting(now, step, self.budget - n)
        # the decodes' KV lengths are the leap's step shape (each r.num_computed - 1);
        # decode_kv lists only requests the waiting queue adds as decodes
        return step.batch(tier_bytes, decodes.shape)

    def complete(self, batch: Batch, now: int, itl_sink: GapRuns) -> list[Request]:
        """Apply a finished step: emit sampled tokens, retire finished requests."""
        if self.role == "prefill":
            return self._complete_prefills(batch, now, itl_sink)
        samples = batch.samples
        sampled = batch.requests if all(samples) else list(compress(batch.requests, samples))
        return self._emit_tokens(sampled, now, itl_sink)

    def _emit_tokens(self, sampled: list[Request], now: int, itl_sink: GapRuns) -> list[Request]:
        """Each request of ``sampled`` (those whose step sampled a token) that is not
        finished gets its token; requests that reach their length retire."""
        gap_values, gap_counts = itl_sink.values, itl_sink.counts
        last_gap = gap_values[-1] if gap_values else None
        run = 0  # gaps equal to last_gap not yet added to gap_counts[-1]
        finished: list[Request] = []
        stopped_waiting: list[Request] = []
        kv = self.kv
        async_ = self.async_scheduling
        # (async) a running request's blocks are cached as its sampled tokens land
        caching = async_ and kv.enable_prefix_caching
        bs = kv.block_size
        max_len = self.max_model_len
        for req in sampled:
            status = req.status
            if status == FINISHED:
                continue
            out = req.num_output
            if out:
                gap = now - req.last_token_ns
                if gap == last_gap:
                    run += 1
                else:
                    if run:
                        gap_counts[-1] += run
                        run = 0
                    gap_values.append(gap)
                    gap_counts.append(1)
                    last_gap = gap
                if gap > req.itl_max_ns:
                    req.itl_max_ns = gap
            else:
                req.first_token_ns = now
            req.last_token_ns = now
            out += 1
            req.num_output = out
            if async_:
                ph = req.num_placeholders - 1
                req.num_placeholders = ph
                if caching and status == RUNNING:
                    n = req.num_computed - ph
                    if n // bs > req.cached_hashes:
                        kv.cache_blocks(req, n)
            if out >= req.output_len or req.input_len + out >= max_len:
                req.status = FINISHED
                req.finish_ns = now
                finished.append(req)
                if status != RUNNING:
                    stopped_waiting.append(req)
        if run:
            gap_counts[-1] += run
        if finished or self.handoffs:
            self._retire(finished, stopped_waiting)
        return finished

    def _complete_prefills(self, batch: Batch, now: int, itl_sink: GapRuns) -> list[Request]:
        """``complete`` on a PD prefill instance: a running request's prefill is done (its
        sampled token is not the client's: the request moves to a decode instance, whose
        first step samples the first token, as in vLLM's disaggregated serving); one
        preempted meanwhile still gets its token."""
        async_ = self.async_scheduling
        rest = []
        for req, s in zip(batch.requests, batch.samples):
            if s and req.status == RUNNING:
                if async_:
                    req.num_placeholders -= 1
                req.status = WAITING
                self.handoffs.append(req)
            elif s:
                rest.append(req)
        return self._emit_tokens(rest, now, itl_sink)

    def _retire(self, finished: list[Request], stopped_waiting: list[Request]) -> None:
        """Finished requests leave (their blocks freed), and so do handed-off prefills
        (their blocks held until the decode side has read them)."""
        kv = self.kv
        leaving = finished + self.handoffs if self.handoffs else finished
        done = {id(r) for r in leaving}
        self.running = [r for r in self.running if id(r) not in done]
        for r in stopped_waiting:
            self.waiting.remove(r)
        for r in finished:
            kv.free_request(r)
        for r in self.handoffs:
            # The prefill side keeps the blocks until the decode side has read them
            # (vLLM's connector delays the free): the engine calls release_handoff.
            self.held_handoffs += 1
            r.handoff_blocks = r.block_ids
            r.block_ids = []
            r.cached_hashes = 0
            r.num_computed = 0  # the decode side starts from its own cache

    def release_handoff(self, blocks: list[int]) -> None:
        """Free a handed-off request's prefill-side blocks once its KV has been read."""
        self.held_handoffs -= 1
        self.kv.free_blocks(blocks)
