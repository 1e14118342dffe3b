"""The vLLM V1 scheduling rules, driven step by step on a bare Scheduler."""

from __future__ import annotations

import pytest
from sim_testkit import flat_workload, make_cluster, opts_for

import sim
from sim.kv_cache import KVCacheManager
from sim.metrics import GapRuns
from sim.options import SimOptions
from sim.request import FINISHED, PREEMPTED, RUNNING, WAITING, Request
from sim.scheduler import Scheduler


def make_sched(num_blocks: int = 101, block_size: int = 16, caching: bool = False,
               **opts) -> Scheduler:
    o = SimOptions(block_size=block_size, enable_prefix_caching=caching, **opts)
    return Scheduler(0, o, KVCacheManager(num_blocks, block_size, caching))


def step(s: Scheduler, now: int = 0):
    """One schedule + complete; returns ({rid: num_new}, finished rids)."""
    b = s.schedule(now)
    if b is None:
        return None, []
    got = {r.rid: n for r, n in zip(b.requests, b.num_new)}
    fin = s.complete(b, now + 1, GapRuns())
    return got, [r.rid for r in fin]


def req(rid: int, n_in: int, n_out: int, ids=None) -> Request:
    return Request(rid, 0, n_in, n_out, input_ids=ids)


# ----------------------------------------------------------------- budget, order, limits
def test_running_requests_are_scheduled_before_waiting_ones():
    s = make_sched(max_num_batched_tokens=10)
    a = req(0, 8, 5)
    s.add_request(a)
    assert step(s)[0] == {0: 8}  # a prefills, now decoding
    b = req(1, 50, 5)
    s.add_request(b)
    got, _ = step(s)
    # a's decode token first, then b gets the 9 tokens left of the budget
    assert list(got) == [0, 1]
    assert got == {0: 1, 1: 9}


def test_token_budget_is_respected_every_step():
    s = make_sched(max_num_batched_tokens=64, max_num_seqs=100)
    for i in range(10):
        s.add_request(req(i, 30 + 7 * i, 4))
    steps = 0
    while s.running or s.waiting:
        b = s.schedule(steps)
        assert b is not None
        assert sum(b.num_new) <= 64
        assert b.shape.num_tokens == sum(b.num_new)
        s.complete(b, steps + 1, GapRuns())
        steps += 1
        assert steps < 200
    assert s.is_idle


def test_max_num_seqs_is_respected():
    s = make_sched(max_num_seqs=3, max_num_batched_tokens=10_000)
    rs = [req(i, 10, 3) for i in range(7)]
    for r in rs:
        s.add_request(r)
    got, _ = step(s)
    assert sorted(got) == [0, 1, 2]
    assert len(s.running) == 3 and len(s.waiting) == 4
    for t in range(1, 30):
        b = s.schedule(t)
        if b is None:
            break
        assert len(s.running) <= 3
        assert len(b.requests) <= 3
        s.complete(b, t, GapRuns())
    assert all(r.status == FINISHED for r in rs)


def test_fcfs_admission_stops_at_first_request_that_does_not_fit():
    """Without chunking a big head-of-line prompt blocks smaller ones behind it (FCFS)."""
    s = make_sched(max_num_batched_tokens=100, enable_chunked_prefill=False)
    s.add_request(req(0, 60, 2))
    s.add_request(req(1, 60, 2))
    s.add_request(req(2, 10, 2))
    got, _ = step(s)
    assert got == {0: 60}  # 1 does not fit the 40 left, so 2 is not tried


# ----------------------------------------------------------------- chunked prefill
def test_chunked_prefill_splits_long_prompt_over_steps():
    s = make_sched(max_num_batched_tokens=32)
    r = req(0, 100, 2)
    s.add_request(r)
    chunks = []
    for t in range(4):
        got, _ = step(s, t)
        chunks.append(got[0])
        if t < 3:
            assert r.num_output == 0 and r.first_token_ns < 0
    assert chunks == [32, 32, 32, 4]
    assert r.num_computed == 100 and r.num_output == 1
    got, fin = step(s, 10)
    assert got == {0: 1} and fin == [0]


def test_long_prefill_threshold_caps_chunks():
    s = make_sched(max_num_batched_tokens=1000, long_prefill_token_threshold=40)
    s.add_request(req(0, 100, 2))
    s.add_request(req(1, 30, 2))
    got, _ = step(s)
    assert got == {0: 40, 1: 30}
    got, _ = step(s, 1)
    assert got == {0: 40, 1: 1}
    got, _ = step(s, 2)
    assert got == {0: 20}  # request 1 finished (2 outputs) after its decode step


def test_threshold_does_not_cap_decode_batch_tokens():
    s = make_sched(max_num_batched_tokens=1000, long_prefill_token_threshold=1)
    s.add_request(req(0, 3, 3))
    chunks = [step(s, t)[0][0] for t in range(5)]
    assert chunks == [1, 1, 1, 1, 1]


def test_without_chunking_prompt_larger_than_budget_waits():
    s = make_sched(max_num_batched_tokens=32, enable_chunked_prefill=False)
    big = req(0, 50, 2)
    s.add_request(big)
    assert s.schedule(0) is None
    assert big.status == WAITING and big.num_computed == 0


def test_prompt_that_fits_the_budget_left_is_admitted_whole_or_chunked():
    s = make_sched(max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(req(0, 30, 5))
    assert step(s)[0] == {0: 30}
    s.add_request(req(1, 31, 2))  # exactly the 31 tokens left after req 0's decode token
    got, _ = step(s, 1)
    assert got == {0: 1, 1: 31}
    # now with chunking the same prompt would be split instead of waiting
    s2 = make_sched(max_num_batched_tokens=32, enable_chunked_prefill=True)
    s2.add_request(req(0, 30, 5))
    step(s2)
    s2.add_request(req(1, 40, 2))
    got, _ = step(s2, 1)
    assert got == {0: 1, 1: 31}


def test_without_chunking_big_prompt_behind_decode_waits():
    s = make_sched(max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add_request(req(0, 30, 5))
    step(s)
    s.add_request(req(1, 32, 2))  # needs 32, only 31 left after req 0's decode token
    got, _ = step(s, 1)
    assert got == {0: 1}
    assert s.waiting[0].rid == 1


# ----------------------------------------------------------------- reserve_full_isl
@pytest.mark.parametrize("reserve", [True, False])
def test_reserve_full_isl_blocks_admission_when_whole_sequence_does_not_fit(reserve):
    # 10 usable blocks of 16 tokens; a running request holds 6, leaving 4 (64 tokens).
    s = make_sched(num_blocks=11, max_num_batched_tokens=32, reserve_full_isl=reserve)
    s.add_request(req(0, 96, 50))
    for t in range(3):
        step(s, t)
    assert s.kv.num_free == 4
    s.add_request(req(1, 100, 2))  # 7 blocks for the whole prompt, 2 for a 32-token chunk
    got, _ = step(s, 5)
    if reserve:
        assert got == {0: 1}
        assert s.waiting[0].rid == 1
    else:
        assert got == {0: 1, 1: 31}


def test_reserve_full_isl_admits_when_whole_sequence_fits():
    s = make_sched(num_blocks=11, max_num_batched_tokens=32, reserve_full_isl=True)
    s.add_request(req(0, 64, 2))  # exactly 4 blocks
    got, _ = step(s)
    assert got == {0: 32}


# ----------------------------------------------------------------- preemption
def test_preemption_picks_most_recently_admitted_and_recomputes():
    # 4 usable blocks of 4 tokens. A and B each take 2 blocks for an 8-token prompt.
    s = make_sched(num_blocks=5, block_size=4, max_num_batched_tokens=100)
    a, b = req(0, 8, 2), req(1, 8, 4)
    s.add_request(a)
    s.add_request(b)
    assert step(s)[0] == {0: 8, 1: 8}
    assert s.kv.num_free == 0
    # A's decode needs a 3rd block: B (admitted last) is preempted so A can go on.
    got, fin = step(s, 1)
    assert got == {0: 1}
    assert fin == [0]
    assert b.status == PREEMPTED and b.num_computed == 0 and b.block_ids == []
    assert b.preemptions == 1 and s.num_preemptions == 1
    assert b.num_output == 1  # generated tokens are kept: it recomputes them
    assert list(s.waiting) == [b]
    # B comes back and recomputes its prompt plus its generated token in one chunk.
    got, _ = step(s, 2)
    assert got == {1: 9}
    assert b.num_output == 2
    for t in range(3, 10):
        if step(s, t)[0] is None:
            break
    assert b.status == FINISHED and b.num_output == 4
    assert s.kv.num_free == 4


def test_preemption_victims_go_to_front_of_waiting_in_order():
    # 3 usable blocks of 4 tokens; A, B, C take one block each with a 4-token prompt.
    s = make_sched(num_blocks=4, block_size=4, max_num_batched_tokens=100)
    a, b, c = req(0, 4, 5), req(1, 4, 5), req(2, 4, 5)
    late = req(3, 2, 2)
    for r in (a, b, c):
        s.add_request(r)
    assert step(s)[0] == {0: 4, 1: 4, 2: 4}
    s.add_request(late)
    got, _ = step(s, 1)
    # A needs a 2nd block: C is evicted; B then needs one: none left, B is itself the victim.
    assert got == {0: 1}
    assert [r.rid for r in s.waiting] == [1, 2, 3]
    assert (b.preemptions, c.preemptions, a.preemptions) == (1, 1, 0)
    assert s.num_preemptions == 2
    assert s.running == [a]


def test_no_admission_in_a_step_that_preempted():
    s = make_sched(num_blocks=5, block_size=4, max_num_batched_tokens=100,
                   reserve_full_isl=False)
    a, b = req(0, 8, 3), req(1, 8, 3)
    s.add_request(a)
    s.add_request(b)
    step(s)
    tiny = req(2, 1, 1)
    s.add_request(tiny)
    got, _ = step(s, 1)
    assert 2 not in got
    assert s.waiting[0] is b and s.waiting[1] is tiny


def test_preemptions_recorded_end_to_end(bundle_root):
    """A KV cache too small for the batch preempts; every request still finishes and the
    per-request preemption counts add up to the summary's."""
    w = flat_workload([(0, 200, 120) for _ in range(12)])
    r = sim.simulate(make_cluster(60), w,
                     opts_for(bundle_root, max_num_seqs=12, reserve_full_isl=False))
    t = r.requests_table()
    assert r.summary["preemptions"] > 0
    assert t.preemptions.sum() == r.summary["preemptions"]
    assert (t.output_tokens == 120).all()
    assert r.summary["num_finished"] == 12


def test_request_larger_than_kv_capacity_is_an_input_error(bundle_root):
    w = flat_workload([(0, 20 * 16, 10)])
    with pytest.raises(sim.InputError, match="request 0 needs .* tokens of KV"):
        sim.simulate(make_cluster(10), w, opts_for(bundle_root))


def test_batch_shape_separates_prefill_and_decode():
    s = make_sched(max_num_batched_tokens=100)
    s.add_request(req(0, 20, 5))
    step(s)
    step(s, 1)  # 0 now has 21 computed, 22 tokens
    s.add_request(req(1, 30, 5))
    b = s.schedule(2)
    sh = b.shape
    assert (sh.num_tokens, sh.num_seqs) == (31, 2)
    assert (sh.prefill_tokens, sh.prefill_kv) == (30, 0)
    assert (sh.num_decode, sh.decode_kv_sum, sh.decode_kv_max) == (1, 21, 21)
    assert b.prefill_tokens == 30 and b.decode_tokens == 1
    assert all(r.status == RUNNING for r in b.requests)
    # Progress advances when the step is scheduled (vLLM's num_computed_tokens).
    assert [r.num_computed for r in b.requests] == [22, 30]


def test_prompt_over_budget_without_chunking_names_the_budget(bundle_root):
    w = flat_workload([(0, 40, 2)])
    with pytest.raises(sim.InputError, match="max_num_batched_tokens|chunked"):
        sim.simulate(make_cluster(100), w,
                     opts_for(bundle_root, max_num_batched_tokens=32, enable_chunked_prefill=False))


# ----------------------------------------------------------------- the step being built
def _joined(step, reqs_news):
    for r, n in reqs_news:
        step.add(r, n)
    return step


def _progress(reqs):
    return [(r.num_computed, r.num_placeholders) for r in reqs]


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("dropped", [0, 1, 2, 3])
def test_a_request_dropped_from_a_step_leaves_it_as_if_it_never_joined(async_, dropped):
    """A priority victim taken back out of the step being built (Step.drop) has its
    progress undone and leaves the step's shape and samples as they would be without it:
    a decode, a prefill chunk, the prompt's last chunk, or a repeated KV length."""
    from sim.scheduler import Step

    def fresh():
        dec = req(0, 40, 9)
        dec.num_output, dec.num_computed = 3, 42 + async_
        dec.num_placeholders = int(async_)
        chunk = req(1, 300, 5)
        chunk.num_computed = 64
        last = req(2, 100, 5)
        last.num_computed = 96
        twin = req(3, 40, 9)
        twin.num_output, twin.num_computed = 3, 42 + async_
        twin.num_placeholders = int(async_)
        return [(dec, 1), (chunk, 128), (last, 4), (twin, 1)]

    everyone = fresh()
    before = _progress([r for r, _ in everyone])
    step = _joined(Step(async_), everyone)
    assert step.drop(dropped) == everyone[dropped][1]
    assert _progress([everyone[dropped][0]]) == [before[dropped]]
    others = fresh()
    del others[dropped]
    want = _joined(Step(async_), others).batch(7)
    got = step.batch(7)
    assert got.shape == want.shape and got.samples == want.samples
    assert [r.rid for r in got.requests] == [r.rid for r in want.requests]
    assert got.num_new == want.num_new and got.tier_load_bytes == 7


def test_step_batch_adds_a_given_decode_shape_as_if_its_decodes_were_listed():
    """Scheduler.schedule_after_decodes hands Step.batch the leap's decode shape instead of
    listing each decode's KV: the batch's shape must be the one the listed KVs give."""
    from sim.latency.base import BatchShape
    from sim.scheduler import Step

    leap_kv, joined_kv = [700, 31, 4096], [12, 5000]

    def listed(kvs):
        step = Step(False)
        step.decode_kv = list(kvs)
        step.add_prefill(100, 300)
        return step.batch(0).shape

    s = sorted(leap_kv)
    decoded = BatchShape(len(s), len(s), 0, 0, len(s), sum(s), s[-1], s[0], 0,
                         sum(k * k for k in s))
    for extra in ([], joined_kv):
        step = Step(False)
        step.decode_kv = list(extra)
        step.add_prefill(100, 300)
        got = step.batch(0, decoded).shape
        want = listed(leap_kv + extra)
        assert (got.num_tokens, got.num_decode, got.decode_kv_sum, got.decode_kv_max,
                got.decode_kv_min, got.decode_kv_sq_sum) == (
            want.num_tokens, want.num_decode, want.decode_kv_sum, want.decode_kv_max,
            want.decode_kv_min, want.decode_kv_sq_sum)
