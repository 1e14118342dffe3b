"""Paged KV blocks and the radix prefix cache (vLLM V1 block-pool rules)."""

from __future__ import annotations

import pytest
from sim_testkit import flat_workload, make_cluster, opts_for

import sim
from sim.kv_cache import KVCacheManager
from sim.metrics import GapRuns
from sim.options import SimOptions
from sim.request import Request
from sim.scheduler import Scheduler


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run_prefill(kv: KVCacheManager, r: Request, hit=None) -> None:
    """Allocate and 'compute' the whole prompt of ``r``, then cache its full blocks."""
    hit = hit if hit is not None else kv.lookup(r)
    assert kv.allocate(r, r.input_len - len(hit) * kv.block_size, hit)
    r.num_computed = r.input_len
    kv.cache_full_blocks(r)


def test_null_block_is_reserved():
    kv = KVCacheManager(10, 16, True)
    assert kv.num_blocks == 9 and kv.num_free == 9 and kv.num_used == 0
    with pytest.raises(ValueError):
        KVCacheManager(1, 16, True)


def test_allocation_counts_blocks_and_fails_when_out():
    kv = KVCacheManager(5, 4, False)  # 4 usable blocks of 4 tokens
    r = Request(0, 0, 10, 2)
    assert kv.allocate(r, 10)
    assert len(r.block_ids) == 3 and kv.num_used == 3
    r.num_computed = 10
    assert kv.allocate(r, 2)  # 12 tokens still fit in 3 blocks
    assert len(r.block_ids) == 3
    r.num_computed = 12
    assert kv.allocate(r, 4)  # 16 tokens: the 4th block
    other = Request(1, 0, 1, 1)
    assert not kv.allocate(other, 1)  # nothing left; a failed allocation takes nothing
    assert other.block_ids == [] and kv.num_used == 4
    kv.free_request(r)
    assert kv.num_free == 4 and r.block_ids == []


def test_shared_prefix_hit_is_block_aligned():
    kv = KVCacheManager(50, 16, True)
    a = Request(0, 0, 40, 2, input_ids=ids(0, 40))
    run_prefill(kv, a)  # 2 full blocks cached (32 tokens); the 8-token tail is not
    b = Request(1, 0, 50, 2, input_ids=ids(0, 35) + ids(1000, 15))
    hit = kv.lookup(b)
    assert hit == a.block_ids[:2]  # 35 shared tokens -> 32 (2 whole blocks)
    c = Request(2, 0, 50, 2, input_ids=ids(0, 20) + ids(2000, 30))
    assert kv.lookup(c) == a.block_ids[:1]
    d = Request(3, 0, 50, 2, input_ids=[99] + ids(1, 49))  # differs in the first token
    assert kv.lookup(d) == []


def test_no_hits_without_token_ids_or_with_caching_off():
    kv = KVCacheManager(50, 16, True)
    a = Request(0, 0, 40, 2, input_ids=ids(0, 40))
    run_prefill(kv, a)
    assert kv.lookup(Request(1, 0, 40, 2)) == []
    off = KVCacheManager(50, 16, False)
    a2 = Request(0, 0, 40, 2, input_ids=ids(0, 40))
    run_prefill(off, a2)
    assert off.lookup(Request(1, 0, 40, 2, input_ids=ids(0, 40))) == []


@pytest.mark.parametrize("n, expect_blocks", [(32, 1), (33, 2), (47, 2), (48, 2), (49, 3)])
def test_full_prompt_hit_leaves_last_token_to_compute(n, expect_blocks):
    kv = KVCacheManager(50, 16, True)
    a = Request(0, 0, 64, 2, input_ids=ids(0, 64))
    run_prefill(kv, a)
    b = Request(1, 0, n, 2, input_ids=ids(0, n))
    hit = kv.lookup(b)
    assert len(hit) == expect_blocks == (n - 1) // 16
    assert n - len(hit) * 16 >= 1


def test_scheduler_uses_prefix_hit_and_computes_the_rest():
    o = SimOptions(enable_prefix_caching=True, max_num_batched_tokens=1000)
    s = Scheduler(0, o, KVCacheManager(50, 16, True))
    a = Request(0, 0, 48, 1, input_ids=ids(0, 48))
    s.add_request(a)
    b0 = s.schedule(0)
    s.complete(b0, 1, GapRuns())
    assert a.finish_ns == 1  # freed, but its blocks keep their contents
    same = Request(1, 0, 48, 1, input_ids=ids(0, 48))
    s.add_request(same)
    b1 = s.schedule(2)
    assert b1.num_new == [16]  # 2 of 3 blocks hit: the last block recomputes
    assert same.prefix_hit == 32 and same.num_computed == 48  # advanced at scheduling
    assert b1.shape.prefill_kv == 32
    assert s.kv.hit_tokens == 32 and s.kv.queried_tokens == 96


def test_freed_blocks_keep_contents_until_reused_and_hits_revive_them():
    kv = KVCacheManager(20, 4, True)
    a = Request(0, 0, 8, 2, input_ids=ids(0, 8))
    run_prefill(kv, a)
    blocks = list(a.block_ids)
    kv.free_request(a)
    assert kv.num_free == kv.num_blocks
    b = Request(1, 0, 9, 2, input_ids=ids(0, 9))
    hit = kv.lookup(b)
    assert hit == blocks
    assert kv.allocate(b, 1, hit)
    assert b.block_ids[:2] == blocks
    assert all(kv.ref[x] == 1 for x in blocks)
    assert all(x not in kv.free for x in blocks)  # revived: out of the free queue
    assert kv.num_used == 3


def test_shared_blocks_are_reference_counted():
    kv = KVCacheManager(20, 4, True)
    a = Request(0, 0, 9, 2, input_ids=ids(0, 9))
    run_prefill(kv, a)
    b = Request(1, 0, 9, 2, input_ids=ids(0, 9))
    hit = kv.lookup(b)
    assert len(hit) == 2
    assert kv.allocate(b, 1, hit)
    assert [kv.ref[x] for x in hit] == [2, 2]
    used = kv.num_used
    assert used == 4  # 2 shared + one tail block each
    kv.free_request(a)
    assert kv.num_used == 3 and all(x not in kv.free for x in hit)
    kv.free_request(b)
    assert kv.num_used == 0


def test_eviction_is_lru_and_removes_cached_prefixes():
    kv = KVCacheManager(5, 4, True)  # 4 usable blocks
    a = Request(0, 0, 8, 1, input_ids=ids(0, 8))
    b = Request(1, 0, 8, 1, input_ids=ids(100, 8))
    run_prefill(kv, a)
    run_prefill(kv, b)
    a_blocks = list(a.block_ids)
    kv.free_request(a)  # freed first: evicted first; its last block before its first
    kv.free_request(b)
    probe_a = Request(9, 0, 9, 1, input_ids=ids(0, 9))
    probe_b = Request(9, 0, 9, 1, input_ids=ids(100, 9))
    assert len(kv.lookup(probe_a)) == 2 and len(kv.lookup(probe_b)) == 2
    c = Request(2, 0, 4, 1, input_ids=ids(500, 4))
    assert kv.allocate(c, 4)
    assert c.block_ids == [a_blocks[1]]
    assert len(kv.lookup(probe_a)) == 1  # a's second block was reused
    assert len(kv.lookup(probe_b)) == 2
    d = Request(3, 0, 4, 1, input_ids=ids(600, 4))
    assert kv.allocate(d, 4)
    assert kv.lookup(probe_a) == []  # a's prefix is gone entirely
    assert len(kv.lookup(probe_b)) == 2  # b (freed later) survives


def test_eviction_order_tail_first():
    kv = KVCacheManager(4, 4, True)  # 3 usable blocks
    a = Request(0, 0, 12, 1, input_ids=ids(0, 12))
    run_prefill(kv, a)
    blocks = list(a.block_ids)
    kv.free_request(a)
    assert list(kv.free) == blocks[::-1]
    c = Request(1, 0, 4, 1)
    kv.allocate(c, 4)
    assert c.block_ids == [blocks[2]]
    probe = Request(9, 0, 13, 1, input_ids=ids(0, 13))
    assert len(kv.lookup(probe)) == 2


def test_can_admit_counts_free_cached_hit_blocks():
    kv = KVCacheManager(4, 4, True)  # 3 usable blocks
    a = Request(0, 0, 8, 1, input_ids=ids(0, 8))
    run_prefill(kv, a)
    kv.free_request(a)
    b = Request(1, 0, 13, 1, input_ids=ids(0, 13))
    hit = kv.lookup(b)
    assert len(hit) == 2
    # 13 tokens = 4 blocks > 3 usable even though 2 are hits
    assert not kv.can_admit(b, hit, True, 5)
    c = Request(2, 0, 12, 1, input_ids=ids(0, 12))
    hit = kv.lookup(c)
    assert kv.can_admit(c, hit, True, 4)


def test_prefix_hits_reported_end_to_end(bundle_root):
    shared = ids(0, 256)
    w = flat_workload([(i * 50_000_000, 288, 4) for i in range(4)],
                      ids=[shared + ids(10_000 * (i + 1), 32) for i in range(4)])
    r = sim.simulate(make_cluster(200), w, opts_for(bundle_root))
    t = r.requests_table()
    assert list(t.prefix_hit_tokens) == [0, 256, 256, 256]
    assert r.summary["prefix_hit_tokens"] == 768
    assert r.summary["prefix_hit_ratio"] == pytest.approx(768 / (4 * 288))
    off = sim.simulate(make_cluster(200), w, opts_for(bundle_root, enable_prefix_caching=False))
    assert (off.requests_table().prefix_hit_tokens == 0).all()
    # hits skip compute, so TTFT of the later requests is lower with caching
    assert (t.ttft_ns[1:].to_numpy() < off.requests_table().ttft_ns[1:].to_numpy()).all()
