"""Closed forms of the analytical collectives (see astrasim/collectives.py's docstring)."""

from __future__ import annotations

import math
import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import ConfigError, Engine, Network, SystemConfig

LAT = {"Ring": 500.0, "FullyConnected": 250.0, "Switch": 700.0}
BW = {"Ring": 50.0, "FullyConnected": 100.0, "Switch": 25.0}
ED = 10
MEMBW = 1600.0
S = 6 * (1 << 20)  # 6 MiB: not a multiple of every N, so fractional messages occur


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
    return 3 * math.floor(m / bpn(MEMBW))


def ring(comm, topo, n, s):
    m = s / n
    if comm == "ar":
        return 2 * (n - 1) * link(topo, m, n=n) + (n - 1) * red(m) + (2 * n - 1) * ED
    if comm == "rs":
        return (n - 1) * link(topo, m, n=n) + (n - 1) * red(m) + n * ED
    if comm == "ag":
        return (n - 1) * link(topo, m, n=n) + n * ED
    return sum(link(topo, (n - j) * s / n, n=n) for j in range(1, n)) + n * ED


def engine(topos, ns, impl="ring", **sys_kw):
    net = Network.build(list(topos), list(ns), [BW[t] for t in topos], [LAT[t] for t in topos])
    d = {"endpoint-delay": ED, "local-mem-bw": MEMBW, "all-reduce-implementation": [impl],
         "all-gather-implementation": [impl], "reduce-scatter-implementation": [impl],
         "all-to-all-implementation": [impl], **sys_kw}
    return Engine(net, SystemConfig.from_dict(d))


CTS = {"ar": CT.ALL_REDUCE, "rs": CT.REDUCE_SCATTER, "ag": CT.ALL_GATHER, "a2a": CT.ALL_TO_ALL}
TOPOS = ["Ring", "FullyConnected", "Switch"]


def test_ring_all_reduce_documented_closed_form():
    n, s = 8, 1 << 20
    e = engine(["Ring"], [n])
    B = 50.0 * 2**30 / 1e9
    L = 1600.0 * 2**30 / 1e9
    lk = math.floor(1 * 500.0 + (s / n) / B)
    rd = 3 * math.floor((s / n) / L)
    assert e.collective_time(CT.ALL_REDUCE, s, [True]) == 2 * (n - 1) * lk + (n - 1) * rd + (2 * n - 1) * ED
    assert e.collective_time(CT.ALL_REDUCE, s, [True]) == 42920  # hand-checked value


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
        want = ring("rs", t0, n0, S) + ring("ar", t1, n1, S / n0) + ring("ag", t0, n0, S)
    elif comm == "rs":
        want = ring("rs", t0, n0, S) + ring("rs", t1, n1, S / n0)
    elif comm == "ag":
        want = ring("ag", t0, n0, S / n1) + ring("ag", t1, n1, S)
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
    e = engine([topo], [n], impl="direct")
    m = S / n
    h = max(hop(topo, n, k) for k in range(1, n))
    lk = link(topo, m, h=h)
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == 2 * lk + (n - 1) * red(m) + 3 * ED
    assert e.collective_time(CT.REDUCE_SCATTER, S, [True]) == lk + (n - 1) * red(m) + 2 * ED
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == lk + 2 * ED
    assert e.collective_time(CT.ALL_TO_ALL, S, [True]) == lk + 2 * ED


@pytest.mark.parametrize("topo", TOPOS)
def test_halving_doubling_1d(topo):
    n, K = 8, 3
    e = engine([topo], [n], impl="halvingDoubling")
    rs = sum(link(topo, S / 2**k, h=hop(topo, n, n >> k)) + red(S / 2**k) for k in range(1, K + 1))
    ag = sum(link(topo, S * 2 ** (k - 1) / n, h=hop(topo, n, 2 ** (k - 1))) for k in range(1, K + 1))
    a2a = sum(link(topo, S / 2, h=hop(topo, n, 2 ** (k - 1))) for k in range(1, K + 1))
    assert e.collective_time(CT.REDUCE_SCATTER, S, [True]) == rs + (K + 1) * ED
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == ag + (K + 1) * ED
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == rs + ag + (2 * K + 1) * ED
    assert e.collective_time(CT.ALL_TO_ALL, S, [True]) == a2a + (K + 1) * ED


def test_halving_doubling_needs_power_of_two():
    with pytest.raises(ConfigError, match="power-of-two"):
        engine(["Ring"], [6], impl="halvingDoubling")


@pytest.mark.parametrize("topo", TOPOS)
def test_double_binary_tree_all_reduce(topo):
    n, D = 8, 3
    e = engine([topo], [n], impl="doubleBinaryTree")
    up = sum(link(topo, S / 2, h=hop(topo, n, 2**j)) + red(S / 2) for j in range(D))
    down = sum(link(topo, S / 2, h=hop(topo, n, 2**j)) for j in range(D))
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == up + down + (2 * D + 1) * ED
    # other collectives fall back to ring
    assert e.collective_time(CT.ALL_GATHER, S, [True]) == ring("ag", topo, n, S)


@pytest.mark.parametrize("chunks", [2, 4])
def test_chunk_pipeline_one_active_chunk(chunks):
    e = engine(["Ring", "Switch"], [4, 2], **{"preferred-dataset-splits": chunks,
                                            "active-chunks-per-dimension": 1})
    c = S / chunks
    ts = [ring("rs", "Ring", 4, c), ring("ar", "Switch", 2, c / 4), ring("ag", "Ring", 4, c)]
    assert e.collective_time(CT.ALL_REDUCE, S, [True, True]) == sum(ts) + (chunks - 1) * max(ts)


def test_chunk_pipeline_active_chunks_share_bandwidth():
    # 1-D, C chunks, A = C: all chunks run concurrently at B/C, so one phase of S/C at B/C
    e = engine(["Ring"], [4], **{"preferred-dataset-splits": 2, "active-chunks-per-dimension": 2})
    n, c = 4, S / 2
    lk = math.floor(500.0 + (c / n) * 2 / bpn(50.0))
    t = 2 * (n - 1) * lk + (n - 1) * red(c / n) + (2 * n - 1) * ED
    assert e.collective_time(CT.ALL_REDUCE, S, [True]) == t


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
