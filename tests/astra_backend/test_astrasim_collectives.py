"""Collectives as upstream ASTRA-Sim times them (see astrasim/collectives.py's docstring).

The expected values here are written from upstream's algorithms (Ring, AllToAll,
HalvingDoubling, Sys::generate_collective, PacketBundle), independently of the module's
code; tests/astra_backend/test_astrasim_reference.py compares with upstream's own output.
"""

from __future__ import annotations

import math
import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import ConfigError, Engine, Network, SystemConfig, UnsupportedCollective

LAT = {"Ring": 500.0, "FullyConnected": 250.0, "Switch": 700.0}
BW = {"Ring": 50.0, "FullyConnected": 100.0, "Switch": 25.0}
ED = 10
MEMBW = 1600.0
S = 6 * (1 << 20)  # 6 MiB: not a multiple of every N, so integer messages get truncated


def bpn(gbps):
    return gbps * (1 << 30) / 1e9


def hop(topo, n, dist):
    dist %= n
    if dist == 0:
        return 0
    return {"Ring": min(dist, n - dist), "FullyConnected": 1, "Switch": 2}[topo]


def link(topo, m, h=None, n=None):
    h = hop(topo, n, 1) if h is None else h
    return math.floor(h * LAT[topo] + m / bpn(BW[topo]))


def red(m):
    # local-mem-bw is decimal GB/s in the system layer (GB/s * 1e9 bytes/s)
    return 3 * int(m / (MEMBW * 1e9) * 1e9)


def ring(comm, topo, n, d):
    """Upstream's Ring: all-reduce 2(N-1) sends of D/N with N-1 reductions; reduce-scatter
    N-1 sends with a reduction each; all-gather N-1 sends of the whole per-NPU D;
    all-to-all N(N-1)/2 sends of D/N; ed per bundle (sends + 1)."""
    m = d // n
    if comm == "ar":
        return 2 * (n - 1) * link(topo, m, n=n) + (n - 1) * red(m) + (2 * n - 1) * ED
    if comm == "rs":
        return (n - 1) * (link(topo, m, n=n) + red(m)) + n * ED
    if comm == "ag":
        return (n - 1) * link(topo, d, n=n) + n * ED
    s = n * (n - 1) // 2
    return s * link(topo, m, n=n) + (s + 1) * ED


def engine(topos, ns, impl="ring", **sys_kw):
    net = Network.build(list(topos), list(ns), [BW[t] for t in topos], [LAT[t] for t in topos])
    impls = [impl] * len(topos)  # one entry per dimension (a shorter list covers fewer)
    d = {"endpoint-delay": ED, "local-mem-bw": MEMBW, "all-reduce-implementation": impls,
         "all-gather-implementation": impls, "reduce-scatter-implementation": impls,
         "all-to-all-implementation": impls, **sys_kw}
    return Engine(net, SystemConfig.from_dict(d))


CTS = {"ar": CT.ALL_REDUCE, "rs": CT.REDUCE_SCATTER, "ag": CT.ALL_GATHER, "a2a": CT.ALL_TO_ALL}
TOPOS = ["Ring", "FullyConnected", "Switch"]


def test_ring_all_reduce_hand_value():
    # Ring(8), 1 MiB: msg 131072 B; link floor(500 + 131072/53.687) = 2941;
    # reduce 3*floor(131072/1600) = 243; 14*2941 + 7*243 + 15*10
    e = engine(["Ring"], [8])
    assert e.collective_time(CT.ALL_REDUCE, 1 << 20, [True]) == 14 * 2941 + 7 * 243 + 150


def test_local_mem_bw_is_decimal():
    # 1600 GB/s decimal: 262144 B take 163.84 ns -> 163 (binary GB would give 152)
    e = engine(["FullyConnected"], [2])
    t = e.collective_time(CT.REDUCE_SCATTER, 1 << 20, [True])
    assert t == link("FullyConnected", 1 << 19, n=2) + 3 * 327 + 2 * ED


def test_all_gather_comm_size_is_per_npu_input():
    # each of the N-1 ring steps forwards a whole per-NPU block of comm_size bytes
    e = engine(["Ring"], [8])
    lk = math.floor(500 + (1 << 20) / bpn(50.0))
    assert e.collective_time(CT.ALL_GATHER, 1 << 20, [True]) == 7 * lk + 8 * ED


@pytest.mark.parametrize("topo", TOPOS)
@pytest.mark.parametrize("comm", list(CTS))
@pytest.mark.parametrize("n", [2, 4, 5, 8])
def test_ring_1d(topo, comm, n):
    e = engine([topo], [n])
    assert e.collective_time(CTS[comm], S, [True]) == ring(comm, topo, n, S)


@pytest.mark.parametrize("t0", TOPOS)
@pytest.mark.parametrize("t1", TOPOS)
@pytest.mark.parametrize("comm", list(CTS))
def test_ring_2d_local_bw_aware(t0, t1, comm):
    n0, n1 = 4, 3
    e = engine([t0, t1], [n0, n1])
    if comm == "ar":
        want = ring("rs", t0, n0, S) + ring("ar", t1, n1, S // n0) + ring("ag", t0, n0, S // n0)
    elif comm == "rs":
        want = ring("rs", t0, n0, S) + ring("rs", t1, n1, S // n0)
    elif comm == "ag":
        # upstream reverses the dimension order for all-gather: the last dimension first
        want = ring("ag", t1, n1, S) + ring("ag", t0, n0, S * n1)
    else:
        want = ring("a2a", t0, n0, S) + ring("a2a", t1, n1, S)
    assert e.collective_time(CTS[comm], S, [True, True]) == want
    assert e.collective_time(CTS[comm], S, None) == want
    # one involved dimension = the 1-D collective on that dimension
    assert e.collective_time(CTS[comm], S, [True, False]) == ring(comm, t0, n0, S)
    assert e.collective_time(CTS[comm], S, [False, True]) == ring(comm, t1, n1, S)
    assert e.collective_time(CTS[comm], S, [False, False]) == 0


def test_baseline_all_reduce_runs_full_all_reduce_per_dim():
    e = engine(["Ring", "Switch"], [4, 2], **{"collective-optimization": "baseline"})
    assert e.collective_time(CT.ALL_REDUCE, S, [True, True]) == \
        ring("ar", "Ring", 4, S) + ring("ar", "Switch", 2, S)


@pytest.mark.parametrize("topo", TOPOS)
@pytest.mark.parametrize("n", [4, 7])
def test_direct_1d(topo, n):
    # every peer at once: the farthest peer sets the time; the N-1 reductions of a round
    # run concurrently, so one reduction is on the critical path
    e = engine([topo], [n], impl="direct")
    m = S // n
    h = max(hop(topo, n, k) for k in range(1, n))
    lk = link(topo, m, h=h)
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == 2 * lk + red(m) + 3 * ED
    assert e.collective_time(CT.REDUCE_SCATTER, S, [True]) == lk + red(m) + 2 * ED
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == link(topo, S, h=h) + 2 * ED
    assert e.collective_time(CT.ALL_TO_ALL, S, [True]) == lk + 2 * ED


@pytest.mark.parametrize("topo", TOPOS)
def test_halving_doubling_1d(topo):
    n = 8
    e = engine([topo], [n], impl="halvingDoubling")
    # halving: D/2 to the peer 1 away, D/4 to 2 away, D/8 to 4 away; the first packet of
    # the round is not reduced, the other two are
    halves = [(S // 2, 1), (S // 4, 2), (S // 8, 4)]
    rs = sum(link(topo, m, h=hop(topo, n, o)) for m, o in halves) + red(S // 4) + red(S // 8)
    assert e.collective_time(CT.REDUCE_SCATTER, S, [True]) == rs + 4 * ED
    # all-reduce retraces the halving steps back (4, 2, 1 away), without reductions
    back = sum(link(topo, m, h=hop(topo, n, o)) for m, o in reversed(halves))
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == rs + back + 7 * ED
    # all-gather: D, 2D, 4D to the peers 4, 2, 1 away
    ag = sum(link(topo, S << k, h=hop(topo, n, n >> (k + 1))) for k in range(3))
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == ag + 4 * ED
    with pytest.raises(UnsupportedCollective, match="all-to-all"):
        e.collective_time(CT.ALL_TO_ALL, S, [True])


def test_halving_doubling_two_npus_never_reduces():
    # K = 1: every packet is a round's first ("zero-latency") packet
    e = engine(["Switch"], [2], impl="halvingDoubling")
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == 2 * link("Switch", S // 2, h=2) + 3 * ED


def test_halving_doubling_needs_power_of_two():
    with pytest.raises(ConfigError, match="power-of-two"):
        engine(["Ring"], [6], impl="halvingDoubling")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_double_binary_tree_all_reduce(n):
    # upstream's tree: a root over a complete binary tree, every message the whole D, one
    # bundle (ed) per send and a reduction per inner node / root on the way up and down.
    # On FullyConnected every edge is one hop: d = log2 N levels below the root give
    # (2d+1) ed + 2d link(D) + (2d-1) reduce(D)
    e = engine(["FullyConnected"], [n], impl="doubleBinaryTree")
    d = n.bit_length() - 1
    lk = link("FullyConnected", S, h=1)
    want = (2 * d + 1) * ED + 2 * d * lk + (2 * d - 1) * red(S)
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == want
    # upstream builds the tree all-reduce whatever the collective type
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == want


def test_double_binary_tree_on_a_ring_pays_the_hop_distances():
    # N = 4 on a Ring: in-order positions 0 (leaf), 1 (inner), 2 (leaf), root 3; the root's
    # child is position 1, two hops away on a ring of 4
    e = engine(["Ring"], [4], impl="doubleBinaryTree")
    l1, l2 = link("Ring", S, h=1), link("Ring", S, h=2)
    r = red(S)
    up_inner = ED + l1 + ED + r
    root_send = up_inner + l2 + ED + r
    inner_send = root_send + l2 + ED + r
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == inner_send + l1 + ED


def test_double_binary_tree_needs_power_of_two():
    with pytest.raises(ConfigError, match="power-of-two"):
        engine(["Ring"], [6], impl="doubleBinaryTree")


@pytest.mark.parametrize("chunks", [2, 4])
def test_chunk_pipeline_one_active_chunk_one_dim(chunks):
    e = engine(["Ring"], [4], **{"preferred-dataset-splits": chunks,
                                 "active-chunks-per-dimension": 1})
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == chunks * ring("ar", "Ring", 4, S // chunks)


@pytest.mark.parametrize("active", [1, 2, 3, 4])
def test_active_chunks_do_not_share_bandwidth(active):
    # congestion-unaware: `active` chunks run side by side, each at full speed
    e = engine(["Ring"], [4], **{"preferred-dataset-splits": 4,
                                 "active-chunks-per-dimension": active})
    waves = -(-4 // active)
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == waves * ring("ar", "Ring", 4, S // 4)


@pytest.mark.parametrize("policy", ["LIFO", "FIFO"])
def test_chunks_share_one_queue_per_dimension(policy):
    # 2-D localBWAware all-reduce, 2 chunks, 1 active chunk per dimension: the
    # reduce-scatter and the all-gather of dimension 0 queue on the same dimension
    e = engine(["Ring", "Switch"], [4, 2], **{"preferred-dataset-splits": 2,
                                            "active-chunks-per-dimension": 1,
                                            "scheduling-policy": policy})
    c = S // 2
    rs, ar, ag = ring("rs", "Ring", 4, c), ring("ar", "Switch", 2, c // 4), \
        ring("ag", "Ring", 4, c // 4)
    assert rs > ar  # the second chunk still holds dimension 0 when the first needs it back
    # first chunk: RS [0, rs], AR [rs, rs+ar]; second chunk: RS [rs, 2rs] holds dim 0,
    # so the first chunk's AG runs [2rs, 2rs+ag]; the second chunk's AR [2rs, 2rs+ar],
    # its AG after both
    want = max(2 * rs + ag, 2 * rs + ar) + ag
    assert e.collective_time(CT.ALL_REDUCE, S, [True, True]) == want


def test_tiny_chunks_are_clamped_to_the_npu_count():
    # upstream's determine_chunk_size: a chunk is at least one byte per NPU
    e = engine(["Ring"], [8], **{"preferred-dataset-splits": 4})
    assert e.collective_time(CT.ALL_REDUCE, 8, [True]) == \
        4 * ring("ar", "Ring", 8, 8)


def test_memoized_and_single_npu_dims_skipped():
    e = engine(["Ring", "Switch"], [1, 4])
    assert e.collective_time(CT.ALL_REDUCE, S, [True, False]) == 0
    assert e.collective_time(CT.ALL_REDUCE, S, [True, True]) == ring("ar", "Switch", 4, S)
    assert e.coll._memo  # cached


@pytest.mark.parametrize("topo", TOPOS)
def test_p2p(topo):
    e = engine([topo, "Switch"], [4, 2])
    m = 1 << 20
    # same dimension-1 coordinate, 2 apart on dimension 0
    assert e.p2p_time(0, 2, m) == math.floor(hop(topo, 4, 2) * LAT[topo] + m / bpn(BW[topo]))
    # both dimensions differ: latencies add, slower bandwidth wins
    want = math.floor(hop(topo, 4, 1) * LAT[topo] + 2 * LAT["Switch"]
                      + m / min(bpn(BW[topo]), bpn(BW["Switch"])))
    assert e.p2p_time(0, 5, m) == want
    assert e.p2p_time(3, 3, m) == 0


@pytest.mark.parametrize("policy", ["LIFO", "FIFO"])
def test_a_dimension_queue_serves_chunk_phases_in_arrival_order(policy):
    # 3 chunks, 1 active per dimension: the first chunk's all-gather reaches dimension 0
    # while the third chunk's reduce-scatter has waited there since the start. Every chunk
    # carries the collective's one priority, so arrival order decides (either policy).
    e = engine(["Ring", "Switch"], [4, 2], **{"preferred-dataset-splits": 3,
                                            "active-chunks-per-dimension": 1,
                                            "scheduling-policy": policy})
    c = S // 3
    rs, ar, ag = ring("rs", "Ring", 4, c), ring("ar", "Switch", 2, c // 4), \
        ring("ag", "Ring", 4, c // 4)
    assert ar <= rs
    # dim 0: RS0 RS1 RS2 back to back, then AG0, AG1, and AG2 once its AR is done
    want = max(3 * rs + 2 * ag, 3 * rs + ar) + ag
    assert e.collective_time(CT.ALL_REDUCE, S, [True, True]) == want
