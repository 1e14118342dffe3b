"""Private KV blocks (sim.kv_cache.private_depths): counted, not entered in the prefix
table until their request is preempted, dropped when it finishes.

A private block's hash is one no other request of the workload can have, so deferring it
must change nothing anyone observes. These tests drive a manager that defers and one that
enters every block at once through the same operations (admissions with prefix hits,
decode steps, preemptions under a tiny pool, finishes, a lower tier) and compare every
lookup, block id, free-queue order and tier content; and they run whole simulations both
ways, with event leaping (whose stretches only count a private request's fills).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_testkit import cluster_dict, opts_for

import sim
import sim.engine
from sim.kv_cache import KVCacheManager, PrefixTier, private_depths
from sim.request import FINISHED, PREEMPTED, RUNNING, Request

BS = 4


def _requests(spec) -> list[Request]:
    out = []
    for rid, (n_in, n_out, ids, out_ids) in enumerate(spec):
        out.append(Request(rid, 0, n_in, n_out, input_ids=None if ids is None else list(ids),
                           output_ids=None if out_ids is None else list(out_ids)))
    return out


@st.composite
def request_specs(draw):
    """Prompts from a few shared token runs (some identical, some without ids), outputs
    with ids given in full, in part or not at all."""
    runs = [[100 * p + t for t in range(24)] for p in range(2)]
    spec = []
    for i in range(draw(st.integers(2, 8))):
        n_in = draw(st.integers(1, 20))
        n_out = draw(st.integers(1, 12))
        kind = draw(st.sampled_from(["none", "shared", "shared", "copy"]))
        if kind == "copy" and spec:
            spec.append(spec[draw(st.integers(0, len(spec) - 1))])  # an identical request
            continue
        ids = None
        if kind != "none":
            pre = runs[draw(st.integers(0, 1))][:draw(st.integers(0, n_in))]
            ids = pre + [10_000 + 100 * i + k for k in range(n_in - len(pre))]
        out_ids = draw(st.sampled_from([None, "all", "part"]))
        if out_ids is not None:
            m = n_out if out_ids == "all" else draw(st.integers(0, n_out))
            out_ids = [7 + k for k in range(m)]  # the same for every request: shareable
        spec.append((n_in, n_out, ids, out_ids))
    return spec


class _Driver:
    """A minimal scheduler over one manager: FCFS admission (prefix hit, lower-tier hit),
    one-token decode steps, preemption of the last running request when a block is
    missing, and the free when a request finishes. Records what it observes."""

    def __init__(self, kv: KVCacheManager, reqs: list[Request]) -> None:
        self.kv = kv
        self.waiting = list(reqs)
        self.running: list[Request] = []
        self.seen: list = []

    def admit(self) -> None:
        if not self.waiting:
            return
        kv, r = self.kv, self.waiting[0]
        hit = kv.lookup(r)
        lower = kv.lookup_lower(r, len(hit)) if kv.lower_tier is not None else 0
        self.seen.append(("hit", r.rid, tuple(hit), lower))
        computed = (len(hit) + lower) * BS
        n = r.num_tokens - computed
        if not kv.allocate(r, n + lower * BS, hit):
            self.seen.append(("full", r.rid))
            return
        self.waiting.pop(0)
        r.num_computed = computed + n
        r.status = RUNNING
        self.running.append(r)

    def step(self, k: int) -> None:
        if not self.running:
            return
        kv = self.kv
        r = self.running[k % len(self.running)]
        r.num_output += 1  # its last computed token sampled one
        if r.num_output >= r.output_len:
            r.status = FINISHED
            kv.free_request(r)
            self.running.remove(r)
            self.seen.append(("done", r.rid))
            return
        while not (kv.grow_one(r) if k % 2 else kv.allocate(r, 1)):
            victim = self.running.pop()
            kv.free_request(victim)
            victim.num_computed = 0
            victim.status = PREEMPTED
            victim.preemptions += 1
            self.waiting.insert(0, victim)
            self.seen.append(("preempt", victim.rid))
            if victim is r:
                return
        r.num_computed += 1

    def observe(self) -> None:
        kv = self.kv
        self.seen.append((tuple(tuple(r.block_ids) for r in self.running), tuple(kv.free),
                          tuple(tuple(kv.lookup(r)) for r in self.waiting)))
        tier = kv.lower_tier
        if tier is not None:
            self.seen.append(tuple(n.key for n in tier.lru))


def _run(spec, ops, num_blocks: int, tier: bool, deferring: bool) -> list:
    reqs = _requests(spec)
    private = private_depths(reqs, BS) if deferring else None
    kv = KVCacheManager(num_blocks, BS, True, private=private)
    if tier:
        kv.lower_tier = PrefixTier("CPU", 6, 10.0, 0)
    d = _Driver(kv, reqs)
    for op in ops:
        if op < 0:
            d.admit()
        else:
            d.step(op)
        d.observe()
    return d.seen


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(spec=request_specs(), ops=st.lists(st.integers(-12, 20), min_size=10, max_size=160),
       num_blocks=st.integers(5, 10), tier=st.sampled_from([False, False, True]))
def test_deferring_private_blocks_changes_no_lookup_eviction_or_block(spec, ops, num_blocks,
                                                                      tier):
    # (about a quarter of the cases preempt, most of those hit a preempted request's blocks)
    assert _run(spec, ops, num_blocks, tier, True) == _run(spec, ops, num_blocks, tier, False)


def test_deferring_case_preempts_and_hits_its_own_private_blocks():
    """A case the property covers: a request without token ids is preempted and finds its
    own blocks again (entered at the preemption), while another request's stay out."""
    spec = [(8, 6, None, None), (8, 6, None, None)]
    ops = [-1, -1] + [0, 1] * 6 + [-1] * 2
    for deferring in (True, False):
        seen = _run(spec, ops, 7, False, deferring)
        hits = [s for s in seen if s[0] == "hit"]
        assert ("preempt", 1) in seen
        assert any(rid == 1 and hit for _, rid, hit, _ in hits[2:])  # its own 2 blocks
    reqs = _requests(spec)
    kv = KVCacheManager(7, BS, True, private=private_depths(reqs, BS))
    d = _Driver(kv, reqs)
    d.admit()
    assert reqs[0].cached_hashes == 2 and not kv.first  # counted, not entered
    d.step(0)
    kv.free_request(reqs[0])  # (preempted: still RUNNING)
    assert len(kv.first) == 2


def test_private_depths():
    shared = list(range(12))
    reqs = _requests([
        (10, 4, None, None),                        # no ids: private from block 0
        (12, 4, shared, None),                      # shares 2 blocks with the next
        (12, 4, shared[:8] + [50, 51, 52, 53], None),
        (12, 4, [9] * 12, [1, 2, 3, 4]),            # identical to the next, outputs too
        (12, 4, [9] * 12, [1, 2, 3, 4]),
        (12, 6, [9] * 12, [1, 2, 3, 4, 5, 6]),      # one more known block than those
        (6, 2, [8] * 6, [8] * 2),                   # 2 known blocks, unique from block 0
    ])
    assert private_depths(reqs, BS) == {0: 0, 1: 2, 2: 2, 3: 4, 4: 4, 5: 4, 6: 0}
    assert all(r.num_output == 0 for r in reqs)


def _outputs(cluster, workload, opts) -> str:
    res = sim.simulate(cluster, workload, opts)
    rows = [(r.rid, r.first_token_ns, r.finish_ns, r.preemptions, r.prefix_hit, r.itl_max_ns)
            for r in res.requests]
    summary = {k: v for k, v in res.summary.items()
               if k not in ("wall_s", "speedup_vs_real_time")}
    return json.dumps([rows, summary, res.timeseries.columns()], sort_keys=True, default=repr)


def _workload(n: int) -> sim.Workload:
    reqs = []
    for i in range(n):
        n_in = 60 + 37 * i % 150
        n_out = 40 + 53 * i % 200
        ids = None
        if i % 3:
            pre = list(range(1000 * (i % 2), 1000 * (i % 2) + 40))[:n_in]
            ids = pre + [7 + 100_000 * i + k for k in range(n_in - len(pre))]
        out_ids = [5] * (n_out // 2) if i % 4 == 1 else None
        reqs.append(Request(i, 2_000_000 * (i // 3), n_in, n_out, input_ids=ids,
                            output_ids=out_ids))
    reqs.append(Request(n, 9_000_000, 100, 80, input_ids=reqs[1].input_ids))  # a repeat
    return sim.Workload(reqs, source="<test>")


def test_simulations_with_and_without_deferring_agree(bundle_root, monkeypatch):
    """Whole runs, stepped and leapt, sync and async, under preemption pressure: the same
    output whether private blocks are deferred or entered at once."""
    wl = _workload(14)
    cluster = sim.parse_cluster(cluster_dict(90, 1, 16))
    entered: list = []
    real = sim.engine.private_depths

    def depths(reqs, bs):
        entered.append(bs)
        return real(reqs, bs)

    for async_ in (False, True):
        for leaping in (False, True):
            opts = opts_for(bundle_root, async_scheduling=async_, enable_prefix_caching=True,
                            event_leaping=leaping, block_size=16)
            monkeypatch.setattr(sim.engine, "private_depths", depths)
            deferred = _outputs(cluster, wl, opts)
            monkeypatch.setattr(sim.engine, "private_depths", lambda reqs, bs: None)
            at_once = _outputs(cluster, wl, opts)
            assert deferred == at_once
            assert json.loads(deferred)[1]["preemptions"] > 0
    assert entered


def test_duplicate_request_ids_enter_every_block(bundle_root, monkeypatch):
    """Keys without token ids hold the request id: with two requests sharing one, their
    blocks are not private, and the run enters every block at once."""
    made: list = []
    real = sim.engine.KVCacheManager

    def manager(*args, **kw):
        kv = real(*args, **kw)
        made.append(kv.private)
        return kv

    monkeypatch.setattr(sim.engine, "KVCacheManager", manager)
    cluster = sim.parse_cluster(cluster_dict(200, 1, 16))
    opts = opts_for(bundle_root, enable_prefix_caching=True)
    sim.simulate(cluster, sim.Workload([Request(0, 0, 40, 5), Request(0, 1, 40, 5)]), opts)
    assert made[-1] is None  # (the run's manager: the last one made)
    sim.simulate(cluster, sim.Workload([Request(0, 0, 40, 5), Request(1, 1, 40, 5)]), opts)
    assert made[-1] == {0: 0, 1: 0}


def _states(cluster, workload, opts, monkeypatch) -> dict:
    """Each instance's requests, free queue, prefix table and tier whenever it schedules
    a step."""
    seen: dict = {}
    real = sim.engine.Scheduler.schedule

    def schedule(sch, now):
        reqs = sorted(sch.running + list(sch.waiting), key=lambda r: r.rid)
        kv = sch.kv
        tier = () if kv.lower_tier is None else tuple(n.key for n in kv.lower_tier.lru)
        state = (tuple((r.rid, r.num_computed, r.num_output, r.cached_hashes,
                        tuple(r.block_ids)) for r in reqs), tuple(kv.free),
                 tuple(kv.block_hash), sorted(kv.first.items()),
                 sorted((h, tuple(d)) for h, d in kv.dups.items()), tier)
        seen.setdefault((sch.instance_id, now), []).append(state)
        return real(sch, now)

    monkeypatch.setattr(sim.engine.Scheduler, "schedule", schedule)
    sim.simulate(cluster, workload, opts)
    monkeypatch.undo()
    return seen


def test_a_leap_counts_private_fills_as_steps_do(bundle_root, monkeypatch):
    """Where a leapt run schedules a step, its requests (cached block counts included:
    a leap sets a private request's once, at its end) and free queue are the stepped
    run's at that time; also with a lower tier (where nothing is deferred)."""
    wl = _workload(14)
    for async_, tier, blocks in ((False, None, 90), (True, None, 90), (True, "CPU", 90),
                                 (False, "CPU", 400)):
        cluster = sim.parse_cluster(cluster_dict(blocks, 1, 16))
        opts = opts_for(bundle_root, async_scheduling=async_, enable_prefix_caching=True,
                        block_size=16, prefix_storage=tier)
        stepped = _states(cluster, wl, opts.replace(event_leaping=False), monkeypatch)
        leapt = _states(cluster, wl, opts.replace(event_leaping=True), monkeypatch)
        assert len(leapt) < 0.75 * len(stepped)  # (many steps leapt over)
        for key, states in leapt.items():
            assert stepped[key][:len(states)] == states, key


def _block_pops_reference(bs, num_free, firsts, max_steps, drops, freed_at):
    """``sim.leap._block_pops`` step by step: each request's block steps, then the
    free blocks step by step."""
    pops = [0] * max_steps
    for i, f in enumerate(firsts):
        end = max_steps if drops is None else min(max_steps, drops[i])
        for j in range(f, end, bs):
            pops[j] += 1
    through, total = [], 0
    for p in pops:
        total += p
        through.append(total)
    cap = num_free
    for j in range(max_steps):
        cap += freed_at[j] if j < len(freed_at) else 0
        if through[j] > cap:
            return pops, through, j
    return pops, through, max_steps


@settings(max_examples=400, deadline=None, derandomize=True)
@given(bs=st.sampled_from([1, 2, 4, 16]), max_steps=st.integers(1, 70),
       firsts=st.lists(st.one_of(st.integers(0, 40), st.just(1 << 60)), min_size=1, max_size=8),
       drops=st.one_of(st.none(), st.lists(st.integers(0, 80), min_size=8, max_size=8)),
       freed_at=st.lists(st.sampled_from([0, 0, 0, 1, 3]), max_size=72),
       num_free=st.integers(0, 30))
def test_block_pops_periodic_and_bisected_paths(bs, max_steps, firsts, drops, freed_at,
                                                num_free):
    class _Kv:
        block_size = bs

    class _Sch:
        kv = _Kv()

    _Sch.kv.num_free = num_free
    from sim.leap import _block_pops
    pops, through, steps = _block_pops(_Sch, firsts, max_steps, drops, freed_at)
    ref_pops, ref_through, ref_steps = _block_pops_reference(bs, num_free, firsts, max_steps,
                                                             drops, freed_at)
    assert (pops, through) == (ref_pops, ref_through)
    # (past max_steps the plan's bound may be any that the blocks allow)
    assert min(steps, max_steps) == ref_steps
