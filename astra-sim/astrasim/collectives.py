"""Collective and point-to-point timing, reproducing upstream ASTRA-Sim's system layer on
its congestion-unaware analytical network.

Units and primitives (one dimension with N NPUs, link bandwidth B in GB/s, latency lat ns,
endpoint delay ed ns, local memory bandwidth L in GB/s):

    link(m, h) = floor(h*lat + m / (B * 2^30/1e9))   a message of m bytes over h hops
                                                      (the analytical backend's binary GB)
    reduce(m)  = 3 * floor(m / (L*1e9) * 1e9)         one write + two reads of m bytes
                                                      (the system layer's decimal GB/s)
    hop(dist)  = Ring: min(dist, N-dist); FullyConnected: 1; Switch: 2

``comm_size`` is read per collective type as upstream's algorithms read their
``data_size`` D: the input buffer of an all-reduce, reduce-scatter and all-to-all, but the
*per-NPU contribution* of an all-gather (its output is N*D). Messages use integer byte
counts (D // N etc.), as upstream's uint64 arithmetic does.

Every algorithm is a sequence of "bundles": each costs ``ed`` (the memory-bus hop between
NPU and network) plus, when it carries a received packet that needs reducing,
``reduce(m)``; between bundles a packet crosses the network (``link``). A phase with s
sends has s+1 bundles. Which bundles reduce follows upstream's packet accounting: per
round one "zero-latency" (never reduced) packet then the others; all-reduce reduces in
the first round only, reduce-scatter in every round.

ring (neighbour ring, h = hop(1)):
    all-reduce     2(N-1) link(D//N) + (N-1) reduce(D//N) + (2N-1) ed
    reduce-scatter (N-1) [link(D//N) + reduce(D//N)]  + N ed
    all-gather     (N-1) link(D)                      + N ed
    all-to-all     s link(D//N) + (s+1) ed,   s = N(N-1)/2 (store-and-forward ring)
direct (every peer at once, h = hop of the farthest peer; reductions run concurrently):
    all-reduce     2 link(D//N) + reduce(D//N) + 3 ed
    reduce-scatter link(D//N) + reduce(D//N) + 2 ed
    all-gather     link(D) + 2 ed;     all-to-all  link(D//N) + 2 ed
halvingDoubling (N a power of two, K = log2 N; packet k of the halving half carries
D//2^k to the peer 2^(k-1) away, the doubling half retraces it; all-gather sends
D, 2D, 4D... to peers N/2, N/4, ... away; all-to-all is not implemented upstream):
    the packets' link times + ed per bundle + reduce of packets 2..K (all-reduce and
    reduce-scatter; upstream's first packet of a round is never reduced)
doubleBinaryTree (N a power of two; upstream runs its tree all-reduce of D whatever the
collective type): a root over a complete binary tree in in-order positions, every message
the whole D; see _double_binary_tree. On FullyConnected, d = log2 N:
    (2d+1) ed + 2d link(D) + (2d-1) reduce(D)

Only the dimensions the collective type's implementation list covers take part (upstream
builds one logical dimension per list entry; a key left out covers every dimension).
Multi-dimensional collectives run one phase per involved dimension (N = 1 skipped), each
phase's D being the previous phase's output: all-reduce with localBWAware =
reduce-scatter up the dimensions, all-reduce on the last, all-gather back down;
baseline = a full all-reduce per dimension; reduce-scatter ascending (D shrinking by N);
all-gather *descending* (upstream reverses the dimension order; D growing by N);
all-to-all a full all-to-all of D per dimension.

Chunking: the collective is split into chunks of D // C bytes (C = preferred-dataset-
splits; ceil(D / chunk) chunks; a non-all-gather chunk is at least the total NPU count,
as upstream clamps it). Each dimension has one queue that runs at most
A = active-chunks-per-dimension chunk phases at once; congestion-unaware, concurrent
chunks do not slow each other. A chunk enters its next phase's queue when it leaves the
previous one; waiting chunk phases start in arrival order (upstream gives every chunk of a
collective the collective's one LIFO/FIFO priority, and its queues keep equal priorities in
insertion order). The collective ends when its last chunk leaves its last phase.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from astrasim.chakra import CollectiveCommType as CT
from astrasim.config import ConfigError, Dim, Network, SystemConfig

AR, AG, RS, A2A = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
_COMM_NAMES = {CT.ALL_REDUCE: AR, CT.ALL_GATHER: AG, CT.REDUCE_SCATTER: RS,
               CT.REDUCE_SCATTER_BLOCK: RS, CT.ALL_TO_ALL: A2A, CT.BARRIER: AR}


class UnsupportedCollective(ValueError):
    pass


def _round_flags(steps: int, zero: int, nonzero: int, reduces_every_round: bool,
                 reduces_first_round: bool) -> list[bool]:
    """Whether each of the steps+1 bundles of a sequential algorithm carries a reduction.
    Upstream inserts packets in rounds of ``zero`` un-reduced packets followed by
    ``nonzero`` packets that are reduced for reduce-scatter always and for all-reduce in
    every other round starting with the first."""
    flags = []
    z = nz = 0
    odd_round = False
    for _ in range(steps + 1):
        if z == 0 and nz == 0:
            z, nz = zero, nonzero
            odd_round = not odd_round
        if z > 0:
            z -= 1
            flags.append(False)
        else:
            nz -= 1
            flags.append(reduces_every_round or (reduces_first_round and odd_round))
    return flags


class CollectiveModel:
    def __init__(self, network: Network, system: SystemConfig) -> None:
        self.net = network
        self.sys = system
        self.ed = system.endpoint_delay
        nd = network.ndims
        self.impls = {c: system.impl(c, nd) for c in (AR, AG, RS, A2A)}
        for c, impls in self.impls.items():
            for d, (name, dim) in enumerate(zip(impls, network.dims)):
                if name in ("halvingDoubling", "doubleBinaryTree") and dim.npus & (dim.npus - 1):
                    raise ConfigError(f"{system.source}: {c.replace('_', '-')}-implementation"
                                      f"[{d}] {name} needs a power-of-two NPU count, "
                                      f"dimension {d} has {dim.npus}")
        self._memo: dict = {}
        self._all_dims = (True,) * nd

    # ---------- primitives ----------
    @staticmethod
    def link(dim: Dim, m: float, hops: int) -> int:
        return math.floor(hops * dim.latency + m / dim.bytes_per_ns)

    def reduce(self, m: float) -> int:
        # upstream: static_cast<uint64_t>(size / (local-mem-bw * 1e9) * 1e9), three times
        return 3 * int(m / (self.sys.local_mem_bw * 1e9) * 1e9)

    # ---------- one phase: one algorithm on one dimension ----------
    @staticmethod
    def final_size(algo: str, comm: str, n: int, data: int) -> int:
        """The data size a phase hands to the next phase (upstream's final_data_size)."""
        if algo == "doubleBinaryTree":  # upstream runs its tree all-reduce for any type
            return data
        if comm == RS:
            return data // n
        if comm == AG:
            return data * n
        return data

    def phase_time(self, algo: str, comm: str, dim: Dim, data: int) -> int:
        """Cycles of one phase: ``algo`` running ``comm`` on ``dim`` with data size
        ``data`` (upstream's per-algorithm data_size: see the module docstring)."""
        n = dim.npus
        if n <= 1:
            return 0
        if algo == "doubleBinaryTree":
            return self._double_binary_tree(dim, data)
        if algo == "ring":
            return self._ring(comm, dim, data)
        if algo == "direct":
            return self._direct(comm, dim, data)
        if algo == "halvingDoubling":
            return self._halving_doubling(comm, dim, data)
        raise ConfigError(f"unknown collective implementation {algo!r}")

    def _sequential(self, dim: Dim, packets, flags) -> int:
        """One packet in flight at a time: bundle i (ed, plus a reduction of its packet
        when flagged) then packet i crosses the network; a final bundle closes the phase.
        ``packets`` = (bytes, hop distance) for every bundle (one more than the sends)."""
        t = 0
        for i, ((m, dist), red) in enumerate(zip(packets, flags)):
            t += self.ed + (self.reduce(m) if red else 0)
            if i < len(packets) - 1:
                t += self.link(dim, m, dim.hops(dist))
        return t

    def _ring(self, comm: str, dim: Dim, data: int) -> int:
        n = dim.npus
        steps = {AR: 2 * (n - 1), A2A: n * (n - 1) // 2}.get(comm, n - 1)
        m = data if comm == AG else data // n
        flags = _round_flags(steps, 1, n - 1, comm == RS, comm == AR)
        return self._sequential(dim, [(m, 1)] * (steps + 1), flags)

    def _direct(self, comm: str, dim: Dim, data: int) -> int:
        """All N-1 peers at once (upstream's AllToAll algorithm, window N-1): the phase
        waits for the farthest peer; the N-1 reductions of a round run concurrently."""
        n = dim.npus
        h = max(dim.hops(k) for k in range(1, n))
        if comm == AG:
            return self.link(dim, data, h) + 2 * self.ed
        m = data // n
        if comm == AR:
            return 2 * self.link(dim, m, h) + self.reduce(m) + 3 * self.ed
        if comm == RS:
            return self.link(dim, m, h) + self.reduce(m) + 2 * self.ed
        return self.link(dim, m, h) + 2 * self.ed

    def _halving_doubling(self, comm: str, dim: Dim, data: int) -> int:
        n = dim.npus
        if comm == A2A:
            raise UnsupportedCollective("halvingDoubling has no all-to-all (upstream exits "
                                        "on it); use ring or direct for all-to-all")
        k = n.bit_length() - 1
        steps = 2 * k if comm == AR else k
        if comm == AG:
            offset, mult, msg = n // 2, 0.5, data
        else:
            offset, mult, msg = 1, 2, data // 2
        packets = []
        for _ in range(steps + 1):
            packets.append((msg, offset))
            offset, msg = int(offset * mult), int(msg / mult)
            if offset == n and comm == AR:
                mult = 0.5
                offset, msg = int(offset * mult), int(msg / mult)
        flags = _round_flags(steps, 1, k - 1, comm == RS, comm == AR)
        return self._sequential(dim, packets, flags)

    def _double_binary_tree(self, dim: Dim, data: int) -> int:
        """Upstream's DoubleBinaryTreeAllReduce on one of its two trees (mirror images, so
        equally long): a root with one child, that child the top of a complete binary tree
        over the other NPUs, numbered in order along the dimension. Every message carries
        the whole D. Leaves send up after one bundle; an inner node forwards up one bundle
        and one reduction after its later child arrives; the root reduces and sends down;
        an inner node reduces and sends down to both children; a leaf ends one bundle after
        its parent's message. The phase ends with the last NPU."""
        ed, red = self.ed, self.reduce(data)
        depth = dim.npus.bit_length() - 1  # levels under the root

        def subtree(lo: int, levels: int):
            """(position, up_send_time, children) of the in-order subtree at ``lo``."""
            if levels == 1:
                return lo, ed, ()
            left = subtree(lo, levels - 1)
            me = lo + (1 << (levels - 1)) - 1
            right = subtree(me + 1, levels - 1)
            arrive = max(t + self.link(dim, data, dim.hops(me - p)) for p, t, _ in (left, right))
            return me, arrive + ed + red, (left, right)

        def down(node, recv_time: int) -> int:
            pos, _, kids = node
            if not kids:
                return recv_time + ed
            send = recv_time + ed + red
            return max([send] + [down(k, send + self.link(dim, data, dim.hops(k[0] - pos)))
                                 for k in kids])

        child = subtree(0, depth)  # RootMax: the subtree on 0..N-2, the root at N-1
        root = dim.npus - 1
        hop = self.link(dim, data, dim.hops(root - child[0]))
        root_send = child[1] + hop + ed + red
        return max(root_send, down(child, root_send + hop))

    # ---------- phases of a (multi-dimensional) collective ----------
    def phases(self, comm: str, data: int, dims: tuple[int, ...]) -> list[tuple[str, str, int, int]]:
        """(algorithm, phase collective, dimension index, data size) per phase, in order;
        each phase's data size is the previous phase's final size."""
        impl = self.impls[comm]
        if comm == AR and self.sys.collective_optimization == "localBWAware" and len(dims) > 1:
            plan = [(RS, d) for d in dims[:-1]] + [(AR, dims[-1])] + \
                   [(AG, d) for d in reversed(dims[:-1])]
        elif comm == AG:
            plan = [(AG, d) for d in reversed(dims)]
        else:
            plan = [(comm, d) for d in dims]
        out = []
        for c, d in plan:
            out.append((impl[d], c, d, data))
            data = self.final_size(impl[d], c, self.net.dims[d].npus, data)
        return out

    def time(self, comm_type: int, size_bytes: float, involved_dim=None) -> int:
        """Cycles of a collective of ``size_bytes`` over the ``involved_dim`` dimensions
        (a bool per dimension; None = all). Memoized."""
        key = (comm_type, size_bytes, tuple(involved_dim) if involved_dim is not None else None)
        t = self._memo.get(key)
        if t is not None:
            return t
        comm = _COMM_NAMES.get(comm_type)
        if comm is None:
            try:
                name = CT(comm_type).name
            except ValueError:
                name = str(comm_type)
            raise UnsupportedCollective(f"collective type {name} is not modelled "
                                        f"(supported: ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, "
                                        f"ALL_TO_ALL, BARRIER)")
        if comm_type == CT.BARRIER:
            size_bytes = 0
        inv = involved_dim if involved_dim is not None else self._all_dims
        if len(inv) != self.net.ndims:
            raise ValueError(f"involved_dim has {len(inv)} entries but the network has "
                             f"{self.net.ndims} dimensions")
        covered = len(self.impls[comm])  # upstream: one logical dimension per entry
        dims = tuple(d for d, (on, dim) in enumerate(zip(inv, self.net.dims))
                     if on and dim.npus > 1 and d < covered)
        t = self._chunked(comm, int(size_bytes), dims) if dims else 0
        self._memo[key] = t
        return t

    def _chunks(self, comm: str, size: int) -> tuple[int, int]:
        """(chunk bytes, chunk count) as upstream's determine_chunk_size splits a
        collective."""
        splits = self.sys.preferred_dataset_splits
        chunk = size // splits
        total = self.net.num_npus
        if comm != AG and total > chunk:
            chunk, size = total, splits * total
        if size <= 0:
            return 0, 0
        if chunk <= 0:  # an all-gather smaller than the split count: one chunk
            return size, 1
        return chunk, -(-size // chunk)

    def _chunked(self, comm: str, size: int, dims: tuple[int, ...]) -> int:
        chunk, count = self._chunks(comm, size)
        if count == 0:
            return 0
        phases = [(d, self.phase_time(a, c, self.net.dims[d], data))
                  for a, c, d, data in self.phases(comm, chunk, dims)]
        if count == 1:
            return sum(t for _, t in phases)
        return self._schedule(phases, count)

    def _schedule(self, phases: list[tuple[int, int]], count: int) -> int:
        """Finish time of ``count`` identical chunks flowing through ``phases`` ((queue,
        cycles) each), every queue running at most active-chunks-per-dimension at once.
        Every chunk of a collective has the collective's one priority, so a queue serves
        its waiting chunk phases in arrival order."""
        slots = self.sys.active_chunks_per_dimension
        running = {q: 0 for q, _ in phases}
        waiting: dict[int, deque] = {q: deque() for q, _ in phases}
        events: list = []  # (finish time, start order, phase index)
        order = 0
        end = 0

        def start(q, now):
            nonlocal order
            while running[q] < slots and waiting[q]:
                j = waiting[q].popleft()
                running[q] += 1
                order += 1
                heapq.heappush(events, (now + phases[j][1], order, j))

        for _ in range(count):
            waiting[phases[0][0]].append(0)
            start(phases[0][0], 0)
        while events:
            now, _, j = heapq.heappop(events)
            q = phases[j][0]
            running[q] -= 1
            if j + 1 < len(phases):
                waiting[phases[j + 1][0]].append(j + 1)
            else:
                end = now
            start(q, now)
            if j + 1 < len(phases):
                start(phases[j + 1][0], now)
        return end

    # ---------- point to point ----------
    def p2p_time(self, src: int, dst: int, size_bytes: float) -> int:
        """A message routed dimension by dimension: the hop latencies add up, the slowest
        dimension on the path sets the bandwidth: floor(sum h_d*lat_d + m/min B_d)."""
        if src == dst:
            return 0
        key = ("p2p", src, dst, size_bytes)
        t = self._memo.get(key)
        if t is not None:
            return t
        cs, cd = self.net.coords(src), self.net.coords(dst)
        lat = 0.0
        bw = math.inf
        for a, b, dim in zip(cs, cd, self.net.dims):
            if a != b:
                lat += dim.hops(b - a) * dim.latency
                bw = min(bw, dim.bytes_per_ns)
        t = math.floor(lat + size_bytes / bw)
        self._memo[key] = t
        return t
