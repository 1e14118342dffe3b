"""Event leaping: a stretch of pure-decode steps of one instance in one computation.

Between two events (an arrival, a completion, a prefill chunk, a block the pool cannot
give, a preemption, a PD hand-off) the batch of a decoding instance is fixed: every
running request computes one token per step, its KV length grows by one, and its step
time follows from the KV lengths. ``plan_leap`` checks that the scheduler is in such a
steady state and bounds how many steps may pass before anything can change;
``apply_leap`` then advances every request at once.

Per request, work happens only at its block boundaries (every ``block_size`` steps):
there the real KV-cache code runs (``KVCacheManager.allocate`` / ``cache_blocks``) with
the request's counters set to the values they have at that point of the stretch, in the
same global order as step-by-step simulation (step by step, running order within a
step), so the block pool, its free queue and the prefix-cache tables end identical.
Block allocations in a stretch cannot fail (the plan counts them against the free
blocks), and the head of the waiting queue provably stays unadmittable (its prefix hit
cannot change and free blocks only shrink).

The step-by-step path stays the reference: ``SimOptions.event_leaping=False`` turns
leaping off, and ``tests/sim/test_sim_leap.py`` checks both give byte-identical output.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, chain, islice
from operator import mul

from sim.kv_cache import block_hashes
from sim.latency.base import BatchShape
from sim.metrics import GapRuns
from sim.request import FINISHED, RUNNING
from sim.scheduler import Batch, Scheduler


@dataclass(slots=True)
class LeapPlan:
    """What a stretch of steps may do, before timing decides how far it goes."""

    #: most steps that may be scheduled in the stretch
    max_steps: int
    #: most step completions that may be applied (none may finish a request)
    max_completions: int
    #: per request: tokens computed and generated when the stretch starts
    computed0: list[int]
    output0: list[int]
    #: per request: the step whose token starts its next block
    firsts: list[int]
    #: blocks each step allocates, and their running total
    pops: list[int]
    pops_through: list[int]
    #: free blocks when the stretch starts
    free0: int
    #: step 0's decode KV: sum, max, min (each step adds len(running), 1, 1)
    kv_sum0: int
    kv_max0: int
    kv_min0: int
    #: step 0's sum of squared decode KVs (step j adds 2 j kv_sum0 + len(running) j^2)
    kv_sq0: int
    #: per scheduled step, the waiting head's prefix-cache lookup to account (hit blocks,
    #: queried tokens), or None when the head is not looked up
    head_lookup: tuple[int, int] | None
    #: (async) indices of the requests whose step in flight is their last: not scheduled
    #: again, they finish at the first completion, which frees ``freed`` blocks
    leaving: list[int]
    freed: int
    #: the requests each step of the stretch decodes
    num_stay: int


def steady_decode(sch: Scheduler, in_flight: Batch | None) -> bool:
    """Whether the scheduler may be in steady decode (the checks that do not look at each
    request; ``plan_leap`` checks the requests): a plain instance, nothing to hand off or
    receive, a budget for one token each, and (async) one step in flight, in which every
    request samples a token (a decode, or the last chunk of its prompt: the stretch starts
    while that step finishes prompts)."""
    running = sch.running
    if (not running or sch.role is not None or sch.receiving or sch.handoffs
            or sch.admitted_transfers or sch.budget < len(running)):
        return False
    if sch.async_scheduling:
        return (in_flight is not None and len(in_flight.requests) == len(running)
                and all(in_flight.samples))
    return in_flight is None


def plan_leap(sch: Scheduler, in_flight: Batch | None) -> LeapPlan | None:
    """Bound a stretch of steady decode steps, or None where there is none
    (``steady_decode`` must hold). One pass over the running requests checks that each
    is in steady decode (its next step computes one token and samples one; async: its
    one step in flight is ``in_flight``'s, in the same order) and gathers their counters,
    the completions before the first finish and the step at which each starts its next
    block. (Async) a request whose step in flight is its last leaves at the first
    completion (where nothing waits: its blocks freed could admit a request)."""
    head_hit = _head_hit(sch)
    if head_hit is False:
        return None
    running = sch.running
    counters = _steady_counters(sch, in_flight)
    if counters is None:
        return None
    computed0, output0, firsts, leaving, max_completions, kv_sum, kv_max, kv_min, kv_sq = counters
    freed = _freed_blocks(sch, [running[i] for i in leaving])
    pops, pops_through, max_steps = _block_pops(sch, firsts, max_completions + 1, len(freed))
    head_lookup = None
    waiting = sch.waiting
    stay = len(running) - len(leaving)
    budget_left = sch.budget - stay
    free0 = sch.kv.num_free
    if max_steps and waiting and budget_left > 0 and stay < sch.max_num_seqs:
        head = waiting[0]
        if head.remote_kv or len(running) >= sch.max_num_seqs:
            return None  # (the leaving requests' seats free up for step 1)
        max_steps, head_lookup = _bound_by_waiting_head(sch, head, budget_left, max_steps,
                                                        pops_through, free0, computed0, output0,
                                                        freed, head_hit)
    if max_steps < 1:
        return None
    return LeapPlan(max_steps, max_completions, computed0, output0, firsts, pops, pops_through,
                    free0, kv_sum, kv_max, kv_min, kv_sq, head_lookup, leaving, len(freed),
                    stay)


def _steady_counters(sch: Scheduler, in_flight: Batch | None):
    """``plan_leap``'s pass over the running requests (a few passes, each in C where it
    can be): None unless each is in steady decode; else their computed and output
    counters, the step at which each starts its next block, the leaving ones, the
    completions before the first finish, and the staying ones' decode-KV sum, max, min
    and sum of squares."""
    running = sch.running
    ph = 1 if sch.async_scheduling else 0
    if ph and in_flight.requests != running:  # (Requests compare by identity)
        return None
    if any(r.status != RUNNING or r.num_placeholders != ph for r in running):
        return None
    computed0 = [r.num_computed for r in running]
    output0 = [r.num_output for r in running]
    # (async) a prompt finishing in flight has no output yet; with one token to compute
    # and o0 + ph >= 1, c0 >= input_len follows
    if min(output0) < 1 - ph or any(r.input_len + o + ph - c != 1
                                    for r, c, o in zip(running, computed0, output0)):
        return None
    room = sch.max_model_len
    # No completion in the stretch may finish a request (its output length or max_model_len).
    lefts = [(r.output_len if r.output_len < room - r.input_len else room - r.input_len) - o
             for r, o in zip(running, output0)]
    bs = sch.kv.block_size
    firsts = [len(r.block_ids) * bs - c for r, c in zip(running, computed0)]
    leaving = [i for i, left in enumerate(lefts) if left == 1] if ph else []
    if leaving:
        stay = [i for i, left in enumerate(lefts) if left != 1]
        if not stay:
            return None
        for i in leaving:
            firsts[i] = NEVER
        stay_computed = [computed0[i] for i in stay]
        max_completions = min(lefts[i] for i in stay) - 1
    else:
        stay_computed = computed0
        max_completions = min(lefts) - 1
    if max_completions < 1 or min(firsts) < 0:
        return None
    return (computed0, output0, firsts, leaving, max_completions, sum(stay_computed),
            max(stay_computed), min(stay_computed), sum(map(mul, stay_computed, stay_computed)))


def _head_hit(sch: Scheduler):
    """The waiting head's prefix hit where a step would look it up (None where it is not
    looked up), or False where no stretch can start: it would be admitted even if every
    running request took a block at step 0 (so the plan's pass is not needed)."""
    waiting = sch.waiting
    n = len(sch.running)
    budget = sch.budget - n
    if not waiting or budget <= 0 or n >= sch.max_num_seqs:
        return None
    head = waiting[0]
    kv = sch.kv
    looked_up = head.num_computed == 0 and kv.enable_prefix_caching
    if head.remote_kv or (looked_up and kv.lower_tier is not None):
        return False
    hit = kv.lookup(head) if looked_up else []
    if _head_admissible(sch, head, hit, kv.num_free - n, budget):
        return False
    return hit


#: a first block step for requests that allocate none
NEVER = 1 << 60


def _freed_blocks(sch: Scheduler, leaving: list) -> list[int]:
    """Blocks that freeing these requests (in order, each one's last block first)
    appends to the free queue: those no other request holds."""
    if not leaving:
        return []
    ref = sch.kv.ref
    left: dict[int, int] = {}
    out = []
    for r in leaving:
        for b in reversed(r.block_ids):
            k = left.get(b, ref[b]) - 1
            left[b] = k
            if k == 0:
                out.append(b)
    return out


def _block_pops(sch: Scheduler, firsts: list[int], max_steps: int, freed: int):
    """(blocks each step allocates, their running total, the steps the free blocks
    allow): request i takes one at step firsts[i] and every block_size steps after;
    ``freed`` blocks join the free ones after step 0."""
    bs = sch.kv.block_size
    pops = [0] * max_steps
    for f in firsts:
        if f < max_steps:
            pops[f] += 1
    for j in range(bs, max_steps):
        pops[j] += pops[j - bs]
    pops_through = list(accumulate(pops))
    free = sch.kv.num_free
    if pops_through[0] > free:
        return pops, pops_through, 0
    return pops, pops_through, min(max_steps, bisect_right(pops_through, free + freed))


def _bound_by_waiting_head(sch: Scheduler, head, budget: int, max_steps: int,
                           pops_through: list[int], free0: int, computed0: list[int],
                           output0: list[int], freed: list[int], hit: list[int] | None
                           ) -> tuple[int, tuple[int, int] | None]:
    """Steps before the waiting head could be admitted, and what its lookup accounts.

    With no block holding one of its hashes cached anew, its prefix hit can only shrink
    as blocks are evicted, and free blocks only shrink: under ``reserve_full_isl`` an
    unadmittable head stays so (evicting a free hit block costs the hit one block and
    the free pool one block; truncating the hit frees at most the blocks dropped). So:
    admissible at step 0 -> no stretch. Without ``reserve_full_isl`` (a chunk needs
    fewer blocks once the hit is gone), or when the lookup's hit is accounted (a request
    never preempted), the stretch ends before the first step that evicts one of the
    head's cached blocks. Blocks ``freed`` at the first completion join the free ones
    once: the head is checked at step 1 too (its hit blocks among them counted as held,
    which only makes it look more admissible)."""
    kv = sch.kv
    bs = kv.block_size
    looked_up = head.num_computed == 0 and kv.enable_prefix_caching
    if looked_up and kv.lower_tier is not None:
        return 0, None  # a lower-tier lookup reorders the tier's LRU: step it
    if hit is None:
        hit = kv.lookup(head) if looked_up else []
    if _head_admissible(sch, head, hit, free0 - pops_through[0], budget):
        return 0, None
    if freed and max_steps > 1 and _head_admissible(
            sch, head, hit, free0 + len(freed) - pops_through[1], budget):
        max_steps = 1
    if not looked_up:
        return max_steps, None
    accounted = not head.preemptions
    max_blocks = (head.num_tokens - 1) // bs
    watched = set(block_hashes(head, bs, max_blocks)[:max_blocks])
    if watched:
        if accounted or not sch.reserve_full:
            block_hash = kv.block_hash
            popped = islice(chain(kv.free, freed), pops_through[max_steps - 1])
            for k, bid in enumerate(popped):
                if block_hash[bid] in watched:
                    max_steps = min(max_steps, bisect_right(pops_through, k))
                    break
        if max_steps and _caches_watched(sch, watched, max_steps, computed0, output0):
            max_steps = 0
    return max_steps, (len(hit), head.num_tokens) if accounted else None


def _caches_watched(sch: Scheduler, watched: set, steps: int, computed0: list[int],
                    output0: list[int]) -> bool:
    """Whether a running request would cache, within ``steps`` steps, a block whose hash
    the waiting head's lookup reads (same tokens from the start: rare, but it would
    lengthen the head's hit)."""
    bs = sch.kv.block_size
    for r, o0 in zip(sch.running, output0):
        start = r.cached_hashes or 0
        full = (r.input_len + o0 + steps) // bs
        if full <= start or (start and r.block_hashes[start - 1] not in watched):
            # Hashes chain on their parent: blocks after one the head does not share
            # cannot match the head's either.
            continue
        r.num_output = o0 + steps  # hashes of the tokens known by then (a pure cache)
        try:
            hashes = block_hashes(r, bs, full)
        finally:
            r.num_output = o0
        if not watched.isdisjoint(hashes[start:full]):
            return True
    return False


def _head_admissible(sch: Scheduler, head, hit: list[int], free: int, budget: int) -> bool:
    """``Scheduler._schedule_waiting``'s admission test for its head, without its effects."""
    kv = sch.kv
    bs = kv.block_size
    computed = head.num_computed + len(hit) * bs
    n = head.num_tokens - computed
    if sch.threshold and n > sch.threshold:
        n = sch.threshold
    if not sch.chunked and n > budget:
        return False
    if n > budget:
        n = budget
    ref = kv.ref
    hit_free = sum(1 for b in hit if ref[b] == 0)
    if sch.reserve_full and kv.blocks_for(head.num_tokens) - len(hit) > free - hit_free:
        return False
    if hit:
        need = max(0, -(-(computed + n) // bs) - len(head.block_ids) - len(hit))
        return need + hit_free <= free
    return -(-(head.num_computed + n) // bs) - len(head.block_ids) <= free


def step_shape(plan: LeapPlan, num_running: int, j: int) -> BatchShape:
    """Step ``j``'s shape: every request decodes one token over its KV, one longer a step."""
    return BatchShape(num_running, num_running, 0, 0, num_running,
                      plan.kv_sum0 + num_running * j, plan.kv_max0 + j, plan.kv_min0 + j, 0,
                      plan.kv_sq0 + 2 * j * plan.kv_sum0 + num_running * j * j)


def apply_leap(sch: Scheduler, plan: LeapPlan, steps: int, start_ns: int,
               completion_ns: list[int], itl_sink: GapRuns) -> Batch | None:
    """Advance the scheduler by ``steps`` steps, the first scheduled at ``start_ns``, and
    ``len(completion_ns)`` completions (at those times), as step-by-step simulation would;
    return the batch of the last step when it is still in flight. Sync: completion k is
    step k-1's (a step is in flight if one more was scheduled than completed). Async: the
    first completion is the step already in flight at the start, completion k step k-2's,
    so the last step is always in flight."""
    running = sch.running
    done = len(completion_ns)
    if sch.unread:  # the first step's schedule reads the engine's input queue
        for r in sch.unread:
            r.queued_ns = start_ns
        sch.unread.clear()
    _apply_block_events(sch, plan, steps, done)
    sch.preempted_last = []
    if plan.head_lookup is not None:
        hit_blocks, tokens = plan.head_lookup
        sch.kv.hit_tokens += steps * hit_blocks * sch.kv.block_size
        sch.kv.queried_tokens += steps * tokens
    if done:
        _emit_tokens(running, plan, steps, completion_ns, itl_sink)
    else:
        for r, c0 in zip(running, plan.computed0):
            r.num_computed = c0 + steps
    if plan.leaving:
        gone = set(plan.leaving)
        sch.running = running = [r for i, r in enumerate(running) if i not in gone]
    if steps == done and not sch.async_scheduling:
        return None
    n = len(running)
    return Batch(list(running), [1] * n, step_shape(plan, n, steps - 1), 0, n, 0, [True] * n)


def _emit_tokens(running, plan: LeapPlan, steps: int, completion_ns: list[int],
                 itl_sink: GapRuns) -> None:
    """Set each request's counters after ``steps`` steps and the completions; each
    completion gives every request one token: its inter-token gaps in the order
    ``Scheduler.complete`` appends them (a request without output gets its first token
    at the first completion: no gap). The leaving ones finish at the first completion."""
    done = len(completion_ns)
    first = completion_ns[0]
    last = completion_ns[-1]
    gaps = [b - a for a, b in zip(completion_ns, completion_ns[1:])]
    common_max = max(gaps, default=0)
    before = [(i, running[i].itl_max_ns, running[i].last_token_ns) for i in plan.leaving]
    values, counts = itl_sink.values, itl_sink.counts  # (GapRuns.add, inline)
    for r, c0, o0 in zip(running, plan.computed0, plan.output0):
        r.num_computed = c0 + steps
        r.num_output = o0 + done
        if o0:
            g = first - r.last_token_ns
            if values and values[-1] == g:
                counts[-1] += 1
            else:
                values.append(g)
                counts.append(1)
            m = g if g > common_max else common_max
        else:
            r.first_token_ns = first
            m = common_max
        if m > r.itl_max_ns:
            r.itl_max_ns = m
        r.last_token_ns = last
    for i, itl_max, last_token in before:
        r = running[i]
        r.num_computed = plan.computed0[i]
        r.num_output = plan.output0[i] + 1
        r.num_placeholders = 0
        r.status = FINISHED
        r.finish_ns = r.last_token_ns = first
        g = first - last_token if plan.output0[i] else 0
        r.itl_max_ns = g if g > itl_max else itl_max
    add = itl_sink.add
    n = plan.num_stay
    for g in gaps:
        add(g, n)


def _apply_block_events(sch: Scheduler, plan: LeapPlan, steps: int, done: int) -> None:
    """Run the KV-cache code where step-by-step simulation would leave its fast path:
    a step that starts a block or fills one (allocate), and (async) a completion that
    fills one (cache_blocks). Events go in the order step-by-step simulation meets them:
    phase 2j is step j's scheduling, phase 2k-1 the k-th completion; running order
    within a phase, and (async) the leaving requests' blocks freed after the first
    completion. Each candidate phase (``_candidates``) re-checks the exact condition."""
    kv = sch.kv
    bs = kv.block_size
    caching = kv.enable_prefix_caching
    ph = 1 if sch.async_scheduling else 0
    running = sch.running
    n = len(running) + 1  # index len(running): the leaving requests' blocks freed
    leaving = set(plan.leaving)
    keys = sorted(set(_candidates(sch, plan, steps, n)))
    computed0, output0 = plan.computed0, plan.output0
    free_before = kv.num_free
    free, ref, block_hash = kv.free, kv.ref, kv.block_hash
    recycled = free.recycled
    cache_blocks = kv.cache_blocks
    for key in keys:
        phase, i = divmod(key, n)
        if i == n - 1:
            for i in plan.leaving:
                kv.free_request(running[i])
            continue
        r = running[i]
        if not phase & 1:
            # KVCacheManager.grow_one, inline: a block when the step's token starts one,
            # and the full blocks among the tokens known cached
            j = phase >> 1
            c = r.num_computed = computed0[i] + j
            o = r.num_output = output0[i] + j
            bids = r.block_ids
            if c >= len(bids) * bs:
                bid = free.next_fresh
                if bid < free.end:
                    free.next_fresh = bid + 1
                elif recycled:
                    bid = recycled.popitem(last=False)[0]
                    if block_hash[bid] is not None:
                        kv._evict(bid)
                else:
                    raise RuntimeError("event leap: a planned block allocation failed")
                ref[bid] = 1
                bids.append(bid)
            if caching:
                known = r.input_len + o
                m = c + 1 if c < known else known
                if m // bs > (r.cached_hashes or 0):
                    cache_blocks(r, m)
        else:
            k = (phase + 1) // 2
            c = r.num_computed = computed0[i] + k
            r.num_output = output0[i] + k
            if i in leaving:  # not scheduled again: nothing in flight after this one
                r.num_computed = computed0[i]
                c = computed0[i] + ph
            if (c - ph) // bs > (r.cached_hashes or 0):
                cache_blocks(r, c - ph)
    if free_before - kv.num_free != plan.pops_through[steps - 1] - plan.freed:
        raise RuntimeError("event leap: block allocations differ from the plan")


def _candidates(sch: Scheduler, plan: LeapPlan, steps: int, n: int) -> list[int]:
    """Phases (as ``phase * n + index``) at which a request may leave the fast path: a
    superset of where it does. Its allocations are exact (one block every ``block_size``
    steps from ``plan.firsts``); a block fills when the tokens to cache cross a multiple
    of the block size, or at once when its cache lags at the start. A leaving request
    has only the first completion, after which its blocks are freed (index n - 1).
    (Async) a staying request's completion k caches what its step k - 1, scheduled
    before it, has cached already (c0 + k - 1 tokens, c0 = input + output): only its
    scheduling phases are candidates."""
    bs = sch.kv.block_size
    period = 2 * bs * n
    sched_end = 2 * (steps - 1) * n + n  # keys of phases up to 2 (steps - 1)
    keys: list[int] = []
    extend = keys.extend
    for i, f in enumerate(plan.firsts):
        if f < steps:
            extend(range(2 * f * n + i, sched_end, period))
    if plan.leaving:
        keys.append(2 * n - 1)
    if not sch.kv.enable_prefix_caching:
        return keys
    leaving = set(plan.leaving)
    for i, r in enumerate(sch.running):
        if i in leaving:
            keys.append(n + i)
            continue
        c0 = plan.computed0[i]
        cached = r.cached_hashes or 0
        # step j caches min(c0 + j + 1, known) tokens; both grow by one a step
        base = min(c0 + 1, r.input_len + plan.output0[i])
        j = (cached + 1) * bs - base
        if j < steps:
            if j <= 0:
                keys.append(i)
                j = (-base) % bs or bs
            extend(range(2 * j * n + i, sched_end, period))
    return keys
