# mypy: disable-error-code="union-attr,index,arg-type,attr-defined"
# (compiled by mypyc where a C compiler is at hand: sim/native.py. Those checks stay off
# because an Optional read after a guard compiles to a generic, checked operation.)
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
A request whose blocks to fill are private (``sim.kv_cache``: no other request can hit
them) only counts them: no event, its count set at the end of the stretch; where no
event enters a block in the prefix table, the blocks are handed out in one pass.
Block allocations in a stretch cannot fail (the plan counts them against the free
blocks), and the head of the waiting queue provably stays unadmittable (its prefix hit
cannot change and free blocks only shrink).

The step-by-step path stays the reference: ``SimOptions.event_leaping=False`` turns
leaping off, and ``tests/sim/test_sim_leap.py`` checks both give byte-identical output.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate, chain, compress, islice
from operator import eq
from typing import Final

from sim.kv_cache import NONE_PRIVATE, KVCacheManager, block_hashes
from sim.latency.base import BatchShape
from sim.metrics import GapRuns
from sim.request import FINISHED, RUNNING, Request
from sim.scheduler import Batch, Scheduler, decode_kv_stats

#: a first block step for requests that allocate none
NEVER: Final = 1 << 60


@dataclass(slots=True)
class LeapPlan:
    """What a stretch of steps may do, before timing decides how far it goes."""

    #: most steps that may be scheduled in the stretch
    max_steps: int
    #: most step completions that may be applied (one request at least stays)
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
    #: per scheduled step, the waiting head's prefix-cache lookup to account (hit blocks,
    #: queried tokens), or None when the head is not looked up
    head_lookup: tuple[int, int] | None
    #: (async) indices of the requests whose step in flight is their last: not scheduled
    #: again, they finish at the first completion
    leaving: list[int]
    #: blocks freed at each completion (index k: the k-th, 1-based; index 0: none), which
    #: steps from the k-th on may take
    freed_at: list[int]
    #: (async) per request, the first step it is not in: it finishes at completion
    #: ``drop + 1`` (None: sync, every request is in every step)
    drops: list[int] | None
    #: the steps at which the batch shrinks (sorted), and per batch between them (lazily)
    #: its decode KV at step 0: count, sum, max, min, sum of squares (and, under key -1 -
    #: k, ``finishing(plan, k)``)
    bounds: list[int]
    segs: dict
    #: (async) the stretch is step 0 and the first completion, at which the requests in
    #: ``leaving`` finish and their blocks may admit the waiting head: step 1's decodes
    #: are planned (their blocks counted) for the engine to take with the waiting queue
    #: scheduled after them (``Scheduler.schedule_after_decodes``), and step 0's lookup
    #: of the head is the only one the stretch accounts
    admits_next: bool = False


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


def plan_leap(sch: Scheduler, in_flight: Batch | None, may_finish: bool = False,
              step_cap: int = NEVER) -> LeapPlan | None:
    """Bound a stretch of steady decode steps, or None where there is none
    (``steady_decode`` must hold). One pass over the running requests checks that each
    is in steady decode (its next step computes one token and samples one; async: its
    one step in flight is ``in_flight``'s, in the same order) and gathers their counters,
    the completions the stretch may apply and the step at which each starts its next
    block. (Async) a request whose step in flight is its last leaves at the first
    completion. With ``may_finish`` (async, no request releasing another) requests may
    finish at any completion of the stretch where nothing waits, the batch shrinking,
    while one stays; with a waiting queue, through the first finish past step 0 (the head
    checked at the steps whose budget or free blocks change), the step after it left to
    the engine (``LeapPlan.admits_next``). The plan covers ``step_cap`` completions at
    most, the steps that timing will likely allow (any bound is exact: a shorter stretch
    is followed by another; a plan's block and finish tables are as long as it is)."""
    head_hit = _head_hit(sch)
    if head_hit is False or _short_of_blocks(sch):
        return None
    running = sch.running
    waiting = sch.waiting
    general = may_finish and sch.async_scheduling and not waiting
    # (async, a queue whose head a step looks at) through the first finish past step 0
    to_first_finish = bool(may_finish and sch.async_scheduling and waiting
                           and sch.budget > len(running) and len(running) < sch.max_num_seqs)
    counters = _steady_counters(sch, in_flight, general, step_cap, to_first_finish)
    if counters is None:
        return None
    computed0, output0, firsts, drops, max_completions, first_drop = counters
    leaving = [i for i, d in enumerate(drops) if d == 0] if drops is not None else []
    finishes = general or to_first_finish  # (requests may finish past the first completion)
    freed = [] if general else _freed_blocks(sch, [running[i] for i in leaving])
    freed_at = (_freed_at(sch, firsts, drops, max_completions) if finishes
                else [0, len(freed)])
    # (only where requests may finish past the first completion do their blocks stop)
    pops, pops_through, max_steps = _block_pops(sch, firsts, max_completions + 1,
                                                drops if finishes else None, freed_at)
    if max_steps < 2:
        return None  # (see below)
    # (the batch shrinks only where requests may finish past the first completion)
    bounds = sorted({d for d in drops if 0 < d < max_completions}) if finishes else []
    head_lookup = None
    stay = len(running) - len(leaving)
    budget_left = sch.budget - stay
    free0 = sch.kv.num_free
    if waiting and budget_left > 0 and stay < sch.max_num_seqs:
        head = waiting[0]
        if head.remote_kv or len(running) >= sch.max_num_seqs:
            return None  # (the leaving requests' seats free up for step 1)
        max_steps, head_lookup = _bound_by_waiting_head(sch, head, budget_left, max_steps,
                                                        pops_through, free0, computed0, output0,
                                                        freed, head_hit)
        if to_first_finish and bounds and max_steps > first_drop and _head_admissible(
                sch, head, head_hit, free0 + len(freed) - pops_through[first_drop],
                sch.budget - sum(d > first_drop for d in drops)):
            # the requests finishing next are not in step first_drop: its budget is larger
            max_steps = first_drop
    admits_next = False
    if max_steps == 1 and leaving and first_drop >= 2 and not general:
        # The head may get in at step 1, once the leaving requests free their blocks (or
        # its hit may change there): step 0 and the first completion, then step 1's
        # decodes (the blocks counted allow two steps), the queue scheduled after them.
        # (Two steps stepped cost more than this stretch.)
        max_steps, max_completions, admits_next, bounds = 2, 1, True, []
    elif max_steps < 2:
        # (a stretch of one step costs more to plan and apply than to step)
        return None
    elif (to_first_finish and bounds and max_completions == first_drop + 1
          and max_steps == first_drop + 2 and drops is not None
          and first_drop + 1 not in drops):
        # The requests finishing at the last completion may let the head in at the step
        # after it: where the stretch gets there, that step's decodes are taken (all the
        # requests left, their blocks counted), the queue scheduled after them.
        admits_next = True
    return LeapPlan(max_steps, max_completions, computed0, output0, firsts, pops, pops_through,
                    free0, head_lookup, leaving, freed_at, drops, bounds, {}, admits_next)


def _steady_counters(sch: Scheduler, in_flight: Batch | None, general: bool,
                     step_cap: int = NEVER, to_first_finish: bool = False
                     ) -> tuple[list[int], list[int], list[int], list[int] | None, int, int] | None:
    """``plan_leap``'s pass over the running requests: None unless each is in steady
    decode; else their computed and output counters, the step at which each starts its
    next block, (async) the step each is dropped from, and the completions the stretch
    may apply: before the first finish of a request in step 0 (``general``: before the
    last request finishes; ``to_first_finish``: through that finish), and (async) the
    first step from which a request in step 0 is dropped (else NEVER)."""
    running = sch.running
    ph = 1 if sch.async_scheduling else 0
    if ph and in_flight.requests != running:  # (Requests compare by identity)
        return None
    room = sch.max_model_len
    bs = sch.kv.block_size
    # (async) a prompt finishing in flight has no output yet; with one token to compute
    # (input + output + ph - computed == 1) and o0 + ph >= 1, c0 >= input_len follows
    k = 1 - ph
    computed0: list[int] = []
    output0: list[int] = []
    # completions left to each (to its output length or max_model_len), less one
    lasts: list[int] = []
    firsts: list[int] = []
    # their extremes, found in the same loop: the fewest outputs; the fewest and most
    # completions left, and the fewest that is not 0; the first block step of the requests
    # with a completion left (async; sync: of all)
    low_output = low_last = low_nonzero_last = low_first = NEVER
    high_last = -NEVER
    any_zero_last = False
    for r in running:  # (one loop: cheaper than a comprehension per list)
        c = r.num_computed
        o = r.num_output
        n_in = r.input_len
        if r.status != RUNNING or r.num_placeholders != ph or n_in + o - c != k:
            return None
        computed0.append(c)
        output0.append(o)
        out = r.output_len
        last = (out if out < room - n_in else room - n_in) - o - 1
        first = len(r.block_ids) * bs - c
        lasts.append(last)
        firsts.append(first)
        if o < low_output:
            low_output = o
        if last < low_last:
            low_last = last
        if last > high_last:
            high_last = last
        if last == 0 and ph:
            any_zero_last = True
        else:
            if last < low_nonzero_last:
                low_nonzero_last = last
            if first < low_first:
                low_first = first
    if low_output < k:
        return None
    drops = None
    if ph:
        # (async) a request with L completions left is in steps 0 .. L - 2 and finishes
        # at the L-th completion: dropped from step L - 1
        drops = lasts
        if any_zero_last:
            if high_last == 0:
                return None
            for i, d in enumerate(drops):
                if d == 0:
                    firsts[i] = NEVER  # (not in any step: no block to start)
        first_drop = low_nonzero_last if any_zero_last else low_last
        max_completions = _async_completions(first_drop, high_last, general, to_first_finish,
                                             step_cap)
    else:
        max_completions = first_drop = low_last
    if max_completions > step_cap:
        max_completions = step_cap
    if max_completions < 1 or low_first < 0:
        return None
    return computed0, output0, firsts, drops, max_completions, first_drop


def _async_completions(first_drop: int, last_drop: int, general: bool, to_first_finish: bool,
                       step_cap: int) -> int:
    """(Async) the completions a stretch may apply, the first request to finish leaving
    at completion ``first_drop`` and the last at ``last_drop``: up to the first finish;
    ``general``: up to the last; ``to_first_finish``: through the first."""
    if general and step_cap > first_drop:
        return last_drop
    if to_first_finish and first_drop < min(step_cap, last_drop):
        return first_drop + 1  # (a request stays in the step after)
    return first_drop


def _short_of_blocks(sch: Scheduler) -> bool:
    """Whether the requests that start a block at step 0 (a full last block, and a step
    0 to be in) are more than the free blocks: no stretch (``_block_pops`` would allow
    no step). Looked at only where the free blocks are few (about the requests that
    start a block each step), with an early out: cheaper than the plan's pass."""
    running = sch.running
    kv = sch.kv
    free = kv.num_free
    bs = kv.block_size
    if free * bs >= len(running):
        return False
    room = sch.max_model_len
    need = 0
    for r in running:
        if len(r.block_ids) * bs == r.num_computed:
            n_in = r.input_len
            out = r.output_len
            if (out if out < room - n_in else room - n_in) - r.num_output >= 2:
                need += 1
                if need > free:
                    return True
    return False


def _head_hit(sch: Scheduler) -> list[int] | bool | None:
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
    free = kv.num_free - n
    if -(-head.num_tokens // kv.block_size) <= free:
        # Admissible whatever its prefix hit (no lookup needed): a hit of h blocks, f of
        # them free, needs at most blocks_for(num_tokens) - h + f of the free blocks, and
        # only shortens the chunk that must fit an unchunked budget.
        m = head.num_tokens - head.num_computed
        if sch.threshold and m > sch.threshold:
            m = sch.threshold
        if sch.chunked or m <= budget:
            return False
    hit = kv.lookup(head) if looked_up else []
    if _head_admissible(sch, head, hit, free, budget):
        return False
    return hit


def _freed_blocks(sch: Scheduler, leaving: list) -> list[int]:
    """Blocks that freeing these requests (in order, each one's last block first)
    appends to the free queue: those no other request holds."""
    if not leaving:
        return []
    ref = sch.kv.ref
    out = []
    for r in leaving:
        out += reversed(r.block_ids)
    if not out or max(map(ref.__getitem__, out)) == 1:
        return out  # (no block shared: each is freed)
    left: dict[int, int] = {}
    out = []
    for r in leaving:
        for b in reversed(r.block_ids):
            k = left.get(b, ref[b]) - 1
            left[b] = k
            if k == 0:
                out.append(b)
    return out


def _freed_at(sch: Scheduler, firsts: list[int], drops: list[int], max_completions: int
              ) -> list[int]:
    """Blocks freed at each completion up to ``max_completions`` (index k: the k-th)
    by the requests finishing there (in running order, as ``Scheduler.complete``): those
    of its blocks no other request holds, and every block it takes in the stretch."""
    kv = sch.kv
    bs = kv.block_size
    ref = kv.ref
    # (no block is shared without prefix caching, nor a private one: sim.kv_cache)
    private = kv.private.get if kv.private is not None else None
    caching = kv.enable_prefix_caching
    running = sch.running
    freed_at = [0] * (max_completions + 1)
    order = sorted([(d, i) for i, d in enumerate(drops) if d < max_completions])
    left: dict[int, int] = {}
    for d, i in order:
        r = running[i]
        bids = r.block_ids
        if not left and (not caching or (private is not None and not private(r.rid, 1))
                         or sum(map(ref.__getitem__, bids)) == len(bids)):
            k = len(bids)  # (no block shared: each is freed)
        else:
            k = 0
            for b in bids:
                n = left.get(b, ref[b]) - 1
                left[b] = n
                k += n == 0
        f = firsts[i]
        if f < d:
            k += (d - 1 - f) // bs + 1
        freed_at[d + 1] += k
    return freed_at


def _block_pops(sch: Scheduler, firsts: list[int], max_steps: int, drops: list[int] | None,
                freed_at: list[int]) -> tuple[list[int], list[int], int]:
    """(blocks each step allocates, their running total, the steps the free blocks
    allow): request i takes one at step firsts[i] and every block_size steps after,
    while it is in the batch (before step drops[i]); ``freed_at[k]`` blocks join the
    free ones after the k-th completion, for step k on."""
    bs = sch.kv.block_size
    pops = _step_pops(bs, firsts, max_steps, drops)
    pops_through = list(accumulate(pops))  # (non-decreasing)
    # The free blocks change only where freed_at is not 0: between two such steps, the
    # first step short of blocks is found by bisection.
    cap = sch.kv.num_free
    j = 0
    for k in compress(range(min(len(freed_at), max_steps)), freed_at):
        if k > j:
            short = bisect_right(pops_through, cap, j, k)
            if short < k:
                return pops, pops_through, short
            j = k
        cap += freed_at[k]
    return pops, pops_through, bisect_right(pops_through, cap, j)


def _step_pops(bs: int, firsts: list[int], max_steps: int, drops: list[int] | None
               ) -> list[int]:
    """``_block_pops``'s blocks taken at each step."""
    pops = [0] * max_steps
    periodic = True  # every request's first block step is in the first block_size steps
    leave = []  # (periodic) the first block step past each leaving request's last
    if drops is None:
        for f in firsts:
            if f < max_steps:
                pops[f] += 1
                if f >= bs:
                    periodic = False
    else:
        for f, d in zip(firsts, drops):
            if f < d and f < max_steps:
                pops[f] += 1
                e = f + (d - f + bs - 1) // bs * bs  # its first block step not in the batch
                if f >= bs:
                    periodic = False
                if e < max_steps:
                    pops[e] -= 1
                    leave.append(e)
    if not periodic:
        for j in range(bs, max_steps):
            pops[j] += pops[j - bs]
        return pops
    if max_steps > bs:  # (the same blocks every block_size steps, less those left)
        pops = (pops[:bs] * (max_steps // bs + 1))[:max_steps]
        for e in leave:  # (e >= block_size: past its mark)
            pops[e::bs] = [x - 1 for x in pops[e::bs]]
    return pops


def _bound_by_waiting_head(sch: Scheduler, head: Request, budget: int, max_steps: int,
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
    which only makes it look more admissible); where it may get in then, the bound is
    one step (``LeapPlan.admits_next``)."""
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
        max_steps = 1  # (its lookup at step 0 still bounded and accounted below)
    if not looked_up:
        return max_steps, None
    accounted = not head.preemptions
    max_blocks = kv.lookup_span(head)  # (no block holds the hash of one past it)
    watched = set(block_hashes(head, bs, max_blocks)[:max_blocks]) if max_blocks else ()
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
        start = r.cached_hashes
        full = (r.input_len + o0 + steps) // bs
        hashes = r.block_hashes
        if full <= start or (start and (hashes is None or len(hashes) < start
                                        or hashes[start - 1] not in watched)):
            # Hashes chain on their parent: blocks after one the head does not share
            # cannot match the head's either. (Unhashed cached blocks are private
            # blocks: r's own, not the head's.)
            continue
        r.num_output = o0 + steps  # hashes of the tokens known by then (a pure cache)
        try:
            hashes = block_hashes(r, bs, full)
        finally:
            r.num_output = o0
        if not watched.isdisjoint(hashes[start:full]):
            return True
    return False


def _head_admissible(sch: Scheduler, head: Request, hit: list[int], free: int, budget: int) -> bool:
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
    hit_free = [ref[b] for b in hit].count(0) if hit else 0
    if sch.reserve_full and kv.blocks_for(head.num_tokens) - len(hit) > free - hit_free:
        return False
    if hit:
        need = max(0, -(-(computed + n) // bs) - len(head.block_ids) - len(hit))
        return need + hit_free <= free
    return -(-(head.num_computed + n) // bs) - len(head.block_ids) <= free


def step_shape(plan: LeapPlan, j: int) -> BatchShape:
    """Step ``j``'s shape: every request in it decodes one token over its KV, one longer
    a step."""
    s = bisect_right(plan.bounds, j) if plan.bounds else 0
    seg = plan.segs.get(s)
    if seg is None:
        seg = plan.segs[s] = _segment(plan, s)
    n, kv_sum0, kv_max0, kv_min0, kv_sq0 = seg
    return BatchShape(n, n, 0, 0, n, kv_sum0 + n * j, kv_max0 + j, kv_min0 + j, 0,
                      kv_sq0 + 2 * j * kv_sum0 + n * j * j)


def segment_end(plan: LeapPlan, j: int) -> int:
    """The first step after ``j`` whose batch differs from step ``j``'s."""
    s = bisect_right(plan.bounds, j)
    return plan.bounds[s] if s < len(plan.bounds) else NEVER


def _segment(plan: LeapPlan, s: int) -> tuple[int, int, int, int, int]:
    """The step-0 decode KVs of the batch of the steps from ``plan.bounds[s - 1]`` on:
    count, sum, max, min, sum of squares."""
    c = plan.computed0
    if plan.drops is not None and (s or plan.leaving):
        lo = plan.bounds[s - 1] if s else 0
        c = [k for k, d in zip(c, plan.drops) if d > lo]
    total, hi, lo, squares = decode_kv_stats(c)
    return len(c), total, hi, lo, squares


def apply_leap(sch: Scheduler, plan: LeapPlan, steps: int, start_ns: int,
               completion_ns: list[int], itl_sink: GapRuns, lookups: int) -> list[Batch]:
    """Advance the scheduler by ``steps`` steps, the first scheduled at ``start_ns``, and
    ``len(completion_ns)`` completions (at those times), as step-by-step simulation would;
    return the batches of the steps still in flight, in step order. Sync: completion k is
    step k-1's (a step is in flight if one more was scheduled than completed). Async: the
    first completion is the step already in flight at the start, completion k step k-2's,
    so the last step is always in flight; with one step more than completions the last
    two are (the last one scheduled at the last completion: every request in it has two
    tokens in flight). The waiting head's lookup is accounted for ``lookups`` steps (the
    timed ones: the caller schedules the waiting queue of a further step it takes)."""
    running = sch.running
    done = len(completion_ns)
    sch.read_input(start_ns)  # (the first step's schedule)
    _apply_block_events(sch, plan, steps, done)
    sch.preempted_last = []
    if plan.head_lookup is not None:
        hit_blocks, tokens = plan.head_lookup
        sch.kv.hit_tokens += lookups * hit_blocks * sch.kv.block_size
        sch.kv.queried_tokens += lookups * tokens
    if done:
        _emit_tokens(running, plan, steps, completion_ns, itl_sink)
    else:
        for r, c0 in zip(running, plan.computed0):
            r.num_computed = c0 + steps
    if plan.drops is not None and finishing(plan, done):
        drops = plan.drops
        sch.running = running = [r for r, d in zip(running, drops) if d >= done]
    if steps == done and not sch.async_scheduling:
        return []
    n = len(running)
    ones, yes = [1] * n, [True] * n
    last = Batch(list(running), ones, step_shape(plan, steps - 1), 0, n, 0, yes)
    if not sch.async_scheduling or steps == done:
        return [last]
    # (no request leaves the batch at step steps - 1: both steps hold the same ones)
    for r in running:
        r.num_placeholders = 2
    return [Batch(list(running), ones, step_shape(plan, steps - 2), 0, n, 0, yes), last]


def finishing(plan: LeapPlan, done: int) -> list[int]:
    """The requests (indices, in running order) that finish within the first ``done``
    completions."""
    if plan.bounds and plan.bounds[0] < done:
        key = -1 - done  # (kept with the segments, under negative keys; not to be changed)
        out = plan.segs.get(key)
        if out is None:
            out = plan.segs[key] = [i for i, d in enumerate(plan.drops) if d < done]
        return out
    return plan.leaving


def finished_in(plan: LeapPlan, done: int) -> int:
    """How many requests finish within the first ``done`` completions."""
    return len(finishing(plan, done))


def _emit_tokens(running: list[Request], plan: LeapPlan, steps: int, completion_ns: list[int],
                 itl_sink: GapRuns) -> None:
    """Set each request's counters after ``steps`` steps and the completions; each
    completion gives every request in its step one token: its inter-token gaps in the
    order ``Scheduler.complete`` appends them (a request without output gets its first
    token at the first completion: no gap). (Async) a request dropped from step d
    finishes at completion d + 1."""
    done = len(completion_ns)
    first = completion_ns[0]
    last = completion_ns[-1]
    gaps = [completion_ns[k + 1] - completion_ns[k] for k in range(done - 1)]
    common_max = max(gaps) if gaps else 0
    ending = finishing(plan, done)
    if ending:
        before = [(i, running[i].itl_max_ns, running[i].last_token_ns) for i in ending]
    values, counts = itl_sink.values, itl_sink.counts  # (GapRuns.add, inline)
    have_run = bool(values)
    run = values[-1] if have_run else 0  # the last run's gap
    pending = 0  # gaps equal to it not yet added to its count
    for r, c0, o0 in zip(running, plan.computed0, plan.output0):
        r.num_computed = c0 + steps
        r.num_output = o0 + done
        if o0:
            g = first - r.last_token_ns
            if have_run and g == run:
                pending += 1
            else:
                if pending:
                    counts[-1] += pending
                values.append(g)
                counts.append(0)
                run, have_run, pending = g, True, 1
            m = g if g > common_max else common_max
        else:
            r.first_token_ns = first
            m = common_max
        if m > r.itl_max_ns:
            r.itl_max_ns = m
        r.last_token_ns = last
    if pending:
        counts[-1] += pending
    if not ending:
        _add_gaps(itl_sink, gaps, len(running))
        return
    drops = plan.drops
    gap_max = list(accumulate(gaps, max))  # gap_max[m - 1]: the largest of the first m
    for i, itl_max, last_token in before:
        r = running[i]
        d = drops[i]  # finishes at completion d + 1, its last step d - 1
        r.num_computed = plan.computed0[i] + d
        r.num_output = plan.output0[i] + d + 1
        r.num_placeholders = 0
        r.status = FINISHED
        r.finish_ns = r.last_token_ns = completion_ns[d]
        m = first - last_token if plan.output0[i] else 0
        if d and gap_max[d - 1] > m:
            m = gap_max[d - 1]
        r.itl_max_ns = m if m > itl_max else itl_max
    # completion k + 2 (gaps[k]) gives a token to each request in step k: drop > k (the
    # gaps between two drops to as many requests)
    ends = sorted([drops[i] for i in ending])
    e = k = 0
    while k < len(gaps):
        while e < len(ends) and ends[e] <= k:
            e += 1
        nxt = ends[e] if e < len(ends) and ends[e] < len(gaps) else len(gaps)
        _add_gaps(itl_sink, gaps[k:nxt], len(running) - e)
        k = nxt


def _add_gaps(itl_sink: GapRuns, gaps: list[int], n: int) -> None:
    """``itl_sink.add(g, n)`` for each of ``gaps`` in order (runs extended at once where
    no two neighbours are equal)."""
    if not gaps:
        return
    values, counts = itl_sink.values, itl_sink.counts
    k = 0
    if values and values[-1] == gaps[0]:
        counts[-1] += n
        k = 1
    if any(map(eq, gaps, islice(gaps, 1, None))):
        add = itl_sink.add
        for g in islice(gaps, k, None):
            add(g, n)
        return
    values += gaps[k:] if k else gaps
    counts += [n] * (len(gaps) - k)


def _apply_block_events(sch: Scheduler, plan: LeapPlan, steps: int, done: int) -> None:
    """Run the KV-cache code where step-by-step simulation would leave its fast path:
    a step that starts a block or fills one (allocate), and (async) a completion that
    fills one (cache_blocks). Events go in the order step-by-step simulation meets them:
    phase 2j is step j's scheduling, phase 2k-1 the k-th completion; running order
    within a phase, and (async) the blocks of the requests finishing at a completion
    freed after it. Each candidate phase (``_candidates``) re-checks the exact condition.
    A request whose blocks to fill are private (``KVCacheManager.defers_private``) only
    counts them: its count is set once, at the end. Where no event enters a block in the
    table, the allocations between two frees take their blocks at once."""
    kv = sch.kv
    n = len(sch.running) + 1  # index len(running): the finishing requests' blocks freed
    keys, frees, deferred, exact = _candidates(sch, plan, steps, done, n)
    free_before = kv.num_free
    if exact or kv.lower_tier is not None:
        keys += [(2 * d + 1) * n + n - 1 for d in frees]
        _replay_events(sch, plan, sorted(set(keys)), n, frees)
    else:
        keys.sort()
        _replay_allocations(sch, keys, n, frees)
    if deferred:
        _count_private(sch, plan, deferred, steps, done)
    freed = sum(plan.freed_at[:done + 1])
    if free_before - kv.num_free != plan.pops_through[steps - 1] - freed:
        raise RuntimeError("event leap: block allocations differ from the plan")


def _replay_events(sch: Scheduler, plan: LeapPlan, keys: list[int], n: int,
                   frees: dict[int, list[int]]) -> None:
    """Every event, one at a time, in order."""
    kv = sch.kv
    bs = kv.block_size
    caching = kv.enable_prefix_caching
    ph = 1 if sch.async_scheduling else 0
    running = sch.running
    drops = plan.drops
    computed0, output0 = plan.computed0, plan.output0
    free, ref, block_hash = kv.free, kv.ref, kv.block_hash
    cache_blocks = kv.cache_blocks
    for key in keys:
        phase, i = divmod(key, n)
        if i == n - 1:
            for i in frees[phase >> 1]:
                kv.free_request(running[i], finished=True)
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
                elif free.count:
                    bid = free.pop_freed()
                    if block_hash[bid] is not None:
                        kv._evict(bid)
                else:
                    raise RuntimeError("event leap: a planned block allocation failed")
                ref[bid] = 1
                bids.append(bid)
            if caching:
                known = r.input_len + o
                m = c + 1 if c < known else known
                if m // bs > r.cached_hashes:
                    cache_blocks(r, m)
        else:
            k = (phase + 1) // 2
            c = r.num_computed = computed0[i] + k
            r.num_output = output0[i] + k
            if drops is not None and drops[i] + 1 == k:
                # its last completion: nothing in flight after this one
                r.num_computed = computed0[i] + k - 1
                c = computed0[i] + k - 1 + ph
            if (c - ph) // bs > r.cached_hashes:
                cache_blocks(r, c - ph)


def _replay_allocations(sch: Scheduler, keys: list[int], n: int,
                        frees: dict[int, list[int]]) -> None:
    """The events when all are allocations (each candidate is one: they are exact) and
    frees, and no block enters the table (no lower tier): the blocks taken before a
    free are the free queue's next ones, evicted from the table in any order (no entry
    is made in between), handed out in event order."""
    kv = sch.kv
    running = sch.running
    block_lists = [r.block_ids for r in running]
    if len(keys) <= kv.num_free:
        # The blocks taken are the free queue's first ones, which the frees (at its tail)
        # do not reach: taken at once, then the frees, in order (a request's blocks are
        # all taken before it finishes).
        for key, bid in zip(keys, kv.take_blocks(len(keys))):
            block_lists[key % n].append(bid)
        for d in sorted(frees):
            for i in frees[d]:
                kv.free_request(running[i], finished=True)
        return
    lo = 0
    for d in sorted(frees):  # freed at completion d + 1: phase 2d + 1
        hi = bisect_right(keys, (2 * d + 1) * n + n - 1, lo)
        if hi > lo:
            for key, bid in zip(keys[lo:hi], _take_blocks(kv, hi - lo)):
                block_lists[key % n].append(bid)
            lo = hi
        for i in frees[d]:
            kv.free_request(running[i], finished=True)
    if lo < len(keys):
        for key, bid in zip(keys[lo:] if lo else keys, _take_blocks(kv, len(keys) - lo)):
            block_lists[key % n].append(bid)


def _take_blocks(kv: KVCacheManager, count: int) -> list[int]:
    """``KVCacheManager.take_blocks``, which the plan has counted against the free
    blocks."""
    if kv.num_free < count:
        raise RuntimeError("event leap: a planned block allocation failed")
    return kv.take_blocks(count)


def _count_private(sch: Scheduler, plan: LeapPlan, deferred: list[int], steps: int,
                   done: int) -> None:
    """Set the cached block count of requests whose blocks to fill are private to what
    the stretch's last fill gives: step j caches min(c0 + j + 1, known) tokens (known:
    input + o0 + j), the most at its last step (a completion caches no more than the
    step before it: ``_candidates``). Requests finishing in it are freed already."""
    bs = sch.kv.block_size
    running = sch.running
    drops = plan.drops
    computed0, output0 = plan.computed0, plan.output0
    for i in deferred:
        if drops is not None and drops[i] < done:
            continue
        r = running[i]
        m = computed0[i] + steps
        known = r.input_len + output0[i] + steps - 1
        full = (m if m < known else known) // bs
        if full > r.cached_hashes:
            r.cached_hashes = full


def _candidates(sch: Scheduler, plan: LeapPlan, steps: int, done: int, n: int
                ) -> tuple[list[int], dict[int, list[int]], list[int], bool]:
    """Phases (as ``phase * n + index``) at which a request may leave the fast path: a
    superset of where it does. Its allocations are exact (one block every ``block_size``
    steps from ``plan.firsts``, while it is in the batch); a block fills when the tokens
    to cache cross a multiple of the block size, or at once when its cache lags at the
    start. (Async) a request dropped from step d has its last completion d + 1, after
    which its blocks are freed (phase 2d + 1, index n - 1); a completion k before that
    caches what its step k - 1, scheduled before it, has cached already (c0 + k - 1
    tokens, c0 = input + output): only its scheduling phases and its last completion are
    candidates. A request whose blocks to fill are all private gets no fill phase: it is
    among the deferred ones. Returns the phases (frees left out), the requests freed
    after each completion (by d: at completion d + 1, in running order), the deferred
    requests, and whether any fill phase is among the phases."""
    kv = sch.kv
    bs = kv.block_size
    period = 2 * bs * n
    sched_end = 2 * (steps - 1) * n + n  # keys of phases up to 2 (steps - 1)
    drops = plan.drops
    running = sch.running
    fills: list[int] = []
    deferred: list[int] = []
    if kv.enable_prefix_caching:
        if kv.defers_private():
            private = kv.private
            fills = [i for i, r in enumerate(running)
                     if r.cached_hashes < private.get(r.rid, NONE_PRIVATE)]
            if fills:
                fill_set = set(fills)
                deferred = [i for i in range(n - 1) if i not in fill_set]
            else:
                deferred = list(range(n - 1))
        else:
            fills = list(range(n - 1))
        if drops is not None and plan.leaving:  # (in no step)
            fills = [i for i in fills if drops[i]]
            deferred = [i for i in deferred if drops[i]]
    keys: list[int] = []
    frees: dict[int, list[int]] = {}
    firsts = plan.firsts
    exact = False
    if drops is not None and (plan.leaving or (plan.bounds and plan.bounds[0] < done)):
        ends = [sched_end] * (n - 1)  # per request: the keys past its last scheduling phase
        fill_set = set(fills)
        for i in finishing(plan, done):  # finishes at completion d + 1 <= done
            d = drops[i]
            ends[i] = min(sched_end, 2 * (d - 1) * n + n)
            frees.setdefault(d, []).append(i)
            if i in fill_set:
                keys.append((2 * d + 1) * n + i)
                exact = True
        for i, f in enumerate(firsts):
            _every(keys, 2 * f * n + i, ends[i], period)
    else:
        ends = None
        for i, f in enumerate(firsts):
            _every(keys, 2 * f * n + i, sched_end, period)
    computed0, output0 = plan.computed0, plan.output0
    for i in fills:
        r = running[i]
        # step j caches min(c0 + j + 1, known) tokens; both grow by one a step
        base = min(computed0[i] + 1, r.input_len + output0[i])
        j = (r.cached_hashes + 1) * bs - base
        if j < steps:
            if j <= 0:
                keys.append(i)
                j = (-base) % bs or bs
            _every(keys, 2 * j * n + i, ends[i] if ends else sched_end, period)
            exact = True
    return keys, frees, deferred, exact


def _every(keys: list[int], start: int, end: int, period: int) -> None:
    """Append ``range(start, end, period)`` to ``keys`` (a loop: a request takes a block
    or two in a stretch, fewer than a range object costs)."""
    k = start
    while k < end:
        keys.append(k)
        k += period
