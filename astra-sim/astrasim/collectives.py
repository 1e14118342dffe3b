"""Collective and point-to-point timing on the congestion-unaware analytical network.

Notation for one dimension with N NPUs, link bandwidth B (bytes/ns = GBps*2^30/1e9),
link latency lat (ns), endpoint delay ed (ns) and local memory bandwidth L (bytes/ns,
converted from the system's ``local-mem-bw`` GB/s the same way as B):

    link(m, h) = floor(h*lat + m/B)          one message of m bytes over h hops
    reduce(m)  = 3*floor(m/L)                 two reads + one write of m bytes
    hop(dist)  = Ring: min(dist, N-dist); FullyConnected: 1; Switch: 2

Every phase (one collective algorithm on one dimension) costs ed once up front plus ed
per step. ``S`` is the collective's full buffer: the input of an all-reduce /
reduce-scatter / all-to-all and the output of an all-gather, so every step of the ring
algorithms moves S/N bytes.

ring (neighbour exchange, h = hop(1)):
    all-reduce     2(N-1)*link(S/N) + (N-1)*reduce(S/N) + (2N-1)*ed
    reduce-scatter (N-1)*link(S/N)  + (N-1)*reduce(S/N) + N*ed
    all-gather     (N-1)*link(S/N)                      + N*ed
    all-to-all     sum_{j=1..N-1} link((N-j)*S/N)       + N*ed   (store-and-forward)
direct (one step to all peers at once, congestion-unaware; h = hop of the farthest peer):
    all-reduce     2*link(S/N) + (N-1)*reduce(S/N) + 3*ed
    reduce-scatter link(S/N)   + (N-1)*reduce(S/N) + 2*ed
    all-gather     link(S/N) + 2*ed;   all-to-all  link(S/N) + 2*ed
halvingDoubling (N a power of two, K = log2 N):
    reduce-scatter sum_{k=1..K} [link(S/2^k, hop(N/2^k)) + reduce(S/2^k)] + (K+1)*ed
    all-gather     sum_{k=1..K} link(S*2^(k-1)/N, hop(2^(k-1)))           + (K+1)*ed
    all-reduce     the two above back to back                             + (2K+1)*ed
    all-to-all     sum_{k=1..K} link(S/2, hop(2^(k-1)))                   + (K+1)*ed
doubleBinaryTree (all-reduce only; other collectives use ring), D = floor(log2 N):
    all-reduce     sum_{j<D} [link(S/2, hop(2^j)) + reduce(S/2)]
                   + sum_{j<D} link(S/2, hop(2^j)) + (2D+1)*ed

Multi-dimensional collectives run one phase per involved dimension (dims with N = 1 are
skipped). all-reduce with collective-optimization localBWAware: reduce-scatter on the
involved dims in ascending order (buffer shrinking by N each), all-reduce on the last
one, all-gather back down; baseline: a full all-reduce of S on each dim in turn.
reduce-scatter: ascending, S, S/N1, S/(N1 N2)...; all-gather: ascending with buffer
S/prod(N of the later dims) growing to S; all-to-all: a full all-to-all of S per dim.

Chunking: the buffer is split into C = preferred-dataset-splits chunks of S/C that flow
through the phases as a pipeline. A phase holds at most A = active-chunks-per-dimension
chunks at once and those share its bandwidth (the phase time of a chunk is computed with
B/min(A, C)). Chunk i finishes phase j at
    f[i][j] = max(f[i][j-1], f[i-A][j]) + t_j      (f[.][-1] = 0, f[i-A][.] = 0 for i < A)
and the collective takes f[C-1][last]. With C = 1 this is the sum of the phase times;
with A = 1 it is sum_j t_j + (C-1)*max_j t_j.
"""

from __future__ import annotations

import math

from astrasim.chakra import CollectiveCommType as CT
from astrasim.config import ConfigError, Dim, Network, SystemConfig, gbps_to_bytes_per_ns

AR, AG, RS, A2A = "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
_COMM_NAMES = {CT.ALL_REDUCE: AR, CT.ALL_GATHER: AG, CT.REDUCE_SCATTER: RS,
               CT.REDUCE_SCATTER_BLOCK: RS, CT.ALL_TO_ALL: A2A, CT.BARRIER: AR}


class UnsupportedCollective(ValueError):
    pass


class CollectiveModel:
    def __init__(self, network: Network, system: SystemConfig) -> None:
        self.net = network
        self.sys = system
        self.ed = system.endpoint_delay
        self.L = gbps_to_bytes_per_ns(system.local_mem_bw)
        nd = network.ndims
        self.impls = {c: system.impl(c, nd) for c in (AR, AG, RS, A2A)}
        for c, impls in self.impls.items():
            for d, (name, dim) in enumerate(zip(impls, network.dims)):
                if name == "halvingDoubling" and dim.npus & (dim.npus - 1):
                    raise ConfigError(f"{system.source}: {c.replace('_', '-')}-implementation"
                                      f"[{d}] halvingDoubling needs a power-of-two NPU count, "
                                      f"dimension {d} has {dim.npus}")
        self._memo: dict = {}
        self._all_dims = (True,) * nd

    # ---------- primitives ----------
    @staticmethod
    def link(dim: Dim, m: float, hops: int, share: int = 1) -> int:
        return math.floor(hops * dim.latency + m * share / dim.bytes_per_ns)

    def reduce(self, m: float) -> int:
        return 3 * math.floor(m / self.L)

    # ---------- one phase: one algorithm on one dimension ----------
    def phase_time(self, algo: str, comm: str, dim: Dim, S: float, share: int = 1) -> int:
        N = dim.npus
        if N <= 1:
            return 0
        ed = self.ed
        link, red = self.link, self.reduce
        if algo == "doubleBinaryTree" and comm != AR:
            algo = "ring"
        if algo == "ring":
            h = dim.hops(1)
            m = S / N
            if comm == AR:
                return 2 * (N - 1) * link(dim, m, h, share) + (N - 1) * red(m) + (2 * N - 1) * ed
            if comm == RS:
                return (N - 1) * (link(dim, m, h, share) + red(m)) + N * ed
            if comm == AG:
                return (N - 1) * link(dim, m, h, share) + N * ed
            return sum(link(dim, (N - j) * S / N, h, share) for j in range(1, N)) + N * ed
        if algo == "direct":
            h = max(dim.hops(k) for k in range(1, N))
            m = S / N
            if comm == AR:
                return 2 * link(dim, m, h, share) + (N - 1) * red(m) + 3 * ed
            if comm == RS:
                return link(dim, m, h, share) + (N - 1) * red(m) + 2 * ed
            return link(dim, m, h, share) + 2 * ed
        if algo == "halvingDoubling":
            K = N.bit_length() - 1

            def rs():
                return sum(link(dim, S / 2**k, dim.hops(N >> k), share) + red(S / 2**k)
                           for k in range(1, K + 1))

            def ag():
                return sum(link(dim, S * 2 ** (k - 1) / N, dim.hops(2 ** (k - 1)), share)
                           for k in range(1, K + 1))

            if comm == AR:
                return rs() + ag() + (2 * K + 1) * ed
            if comm == RS:
                return rs() + (K + 1) * ed
            if comm == AG:
                return ag() + (K + 1) * ed
            return sum(link(dim, S / 2, dim.hops(2 ** (k - 1)), share)
                       for k in range(1, K + 1)) + (K + 1) * ed
        if algo == "doubleBinaryTree":
            D = N.bit_length() - 1
            up = sum(link(dim, S / 2, dim.hops(2**j), share) + red(S / 2) for j in range(D))
            down = sum(link(dim, S / 2, dim.hops(2**j), share) for j in range(D))
            return up + down + (2 * D + 1) * ed
        raise ConfigError(f"unknown collective implementation {algo!r}")

    # ---------- phases of a (multi-dimensional) collective ----------
    def phases(self, comm: str, S: float, dims: tuple[int, ...]) -> list[tuple[str, str, Dim, float]]:
        """(algorithm, phase collective, dimension, buffer bytes) per phase, in order."""
        D = self.net.dims
        impl = self.impls[comm]
        out = []
        if comm == AR:
            if self.sys.collective_optimization == "baseline" or len(dims) == 1:
                return [(impl[d], AR, D[d], S) for d in dims]
            size = S
            down = []
            for d in dims[:-1]:
                out.append((impl[d], RS, D[d], size))
                down.append((impl[d], AG, D[d], size))
                size /= D[d].npus
            out.append((impl[dims[-1]], AR, D[dims[-1]], size))
            out.extend(reversed(down))
            return out
        if comm == RS:
            size = S
            for d in dims:
                out.append((impl[d], RS, D[d], size))
                size /= D[d].npus
            return out
        if comm == AG:
            size = S / math.prod(D[d].npus for d in dims)
            for d in dims:
                size *= D[d].npus
                out.append((impl[d], AG, D[d], size))
            return out
        return [(impl[d], A2A, D[d], S) for d in dims]

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
        dims = tuple(d for d, (on, dim) in enumerate(zip(inv, self.net.dims))
                     if on and dim.npus > 1)
        if not dims:
            t = 0
        else:
            t = self._pipelined(self.phases(comm, float(size_bytes), dims))
        self._memo[key] = t
        return t

    def _pipelined(self, phases) -> int:
        C = self.sys.preferred_dataset_splits
        A = self.sys.active_chunks_per_dimension
        share = min(A, C)
        ts = [self.phase_time(a, c, dim, S / C, share) for a, c, dim, S in phases]
        if C == 1:
            return sum(ts)
        if A == 1:
            return sum(ts) + (C - 1) * max(ts)
        f = [[0] * len(ts) for _ in range(C)]
        for i in range(C):
            prev = 0
            for j, t in enumerate(ts):
                slot = f[i - A][j] if i >= A else 0
                prev = max(prev, slot) + t
                f[i][j] = prev
        return f[C - 1][-1]

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
