"""The lazily built free-block queue hands out and evicts blocks exactly as a fully built
LRU queue (an ordered dict of every block id) would."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from sim_testkit import flat_workload, make_cluster, opts_for

import sim
import sim.kv_cache
from sim.kv_cache import FreeBlockQueue, KVCacheManager
from sim.request import Request


class EagerQueue(FreeBlockQueue):
    """Every block materialised up front: no range of never-used blocks, all of them in
    the list of freed ones."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.freed = list(range(num_blocks))
        self.pos = list(range(num_blocks))
        self.count = num_blocks
        self.next_fresh = num_blocks


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("compact_from", [1024, 3])
def test_queue_matches_an_ordered_dict_under_random_operations(seed, compact_from,
                                                               monkeypatch):
    monkeypatch.setattr(FreeBlockQueue, "COMPACT_FROM", compact_from)
    compactions = []
    compact = FreeBlockQueue.compact
    monkeypatch.setattr(FreeBlockQueue, "compact",
                        lambda self: compactions.append(1) or compact(self))
    rng = random.Random(seed)
    n = 40
    q = FreeBlockQueue(n)
    ref: OrderedDict[int, None] = OrderedDict.fromkeys(range(n))
    taken: list[int] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.3 and ref:
            got = q.popleft()
            assert got == ref.popitem(last=False)[0]
            taken.append(got)
        elif op < 0.45 and ref and q.next_fresh == q.end:
            k = rng.randrange(1, len(ref) + 1)
            got = q.pop_freed_many(k)
            assert got == [ref.popitem(last=False)[0] for _ in range(k)]
            taken += got
        elif op < 0.85 and taken:
            bid = taken.pop(rng.randrange(len(taken)))
            q.append(bid)
            ref[bid] = None
            # stale entries (popped or revived blocks) are dropped as they pile up
            assert len(q.freed) <= max(q.COMPACT_FROM, 3 * q.count)
        elif ref:
            bid = rng.choice(list(ref))  # anywhere, a never-used block inside the range too
            q.remove(bid)
            del ref[bid]
            taken.append(bid)
        assert list(q) == list(ref) and len(q) == len(ref)
        probe = rng.randrange(n)
        assert (probe in q) == (probe in ref)
    with pytest.raises(KeyError):
        q.remove(taken[0]) if taken else q.remove(n)
    for outside in (-1, n, n + 5):  # (not block ids: in no queue)
        assert outside not in q
        with pytest.raises(KeyError):
            q.remove(outside)
    assert bool(compactions) == (compact_from < n)  # (a list of 40 blocks never gets to 1024)


def _churn(kv: KVCacheManager, seed: int) -> list:
    """Random admissions (with prefix hits), growth and releases; what each one got."""
    rng = random.Random(seed)
    live: list[Request] = []
    log: list = []
    for rid in range(300):
        if live and (rng.random() < 0.4 or kv.num_free < 8):
            r = live.pop(rng.randrange(len(live)))
            kv.free_request(r)
            continue
        n = rng.randrange(5, 60)
        prefix = rng.randrange(3)  # a few shared prompt starts
        r = Request(rid, 0, n, 4, input_ids=[prefix] * min(n, 24) + list(range(n - 24)))
        hit = kv.lookup(r)
        ok = kv.allocate(r, n - len(hit) * kv.block_size, hit)
        log.append((ok, len(hit), list(r.block_ids)))
        if ok:
            r.num_computed = n
            kv.cache_full_blocks(r)
            live.append(r)
    return log


@pytest.mark.parametrize("seed", range(4))
def test_manager_allocates_and_evicts_as_with_an_eager_queue(seed, monkeypatch):
    lazy = _churn(KVCacheManager(64, 4, True), seed)
    monkeypatch.setattr(sim.kv_cache, "FreeBlockQueue", EagerQueue)
    eager_kv = KVCacheManager(64, 4, True)
    assert isinstance(eager_kv.free, EagerQueue)
    assert _churn(eager_kv, seed) == lazy
    # prefix hits happened, and freed blocks were handed out again (evicting contents)
    assert any(h for _, h, _ in lazy)
    assert sum(len(b) - h for _, h, b in lazy) > eager_kv.num_blocks


def _tight_run(root):
    # shared prompt starts and a KV cache too small for the load: hits and preemptions
    specs = [(i * 2_000_000, 200 + 37 * (i % 7), 60 + 11 * (i % 5)) for i in range(40)]
    ids = [[i % 3] * 96 + list(range(n - 96)) for i, (_, n, _) in enumerate(specs)]
    r = sim.simulate(make_cluster(120), flat_workload(specs, ids), opts_for(root))
    summary = {k: v for k, v in r.summary.items()
               if k not in ("wall_s", "speedup_vs_real_time")}
    return r.requests_table(), r.requests_table().to_csv(), summary


def test_simulation_is_identical_with_an_eager_queue(bundle_root, monkeypatch):
    lazy = _tight_run(bundle_root)
    monkeypatch.setattr(sim.kv_cache, "FreeBlockQueue", EagerQueue)
    eager = _tight_run(bundle_root)
    assert lazy[1:] == eager[1:]  # the per-request CSV byte for byte, and the summary
    rows = lazy[0]
    assert sum(rows["preemptions"]) > 0 and sum(rows["prefix_hit_tokens"]) > 0
