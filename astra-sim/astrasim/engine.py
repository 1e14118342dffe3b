"""Discrete-event executor of per-NPU Chakra graphs on the analytical system model.

Per NPU there are four resources, each running one node at a time:
  compute (COMP nodes), cpu (COMP nodes with is_cpu_op), comm (COMM_COLL and
  COMM_SEND) and mem (MEM_LOAD / MEM_STORE). Different resources overlap, so compute
  overlaps communication while independent collectives serialize on the comm resource.
A node becomes ready when all its data_deps and ctrl_deps have finished; a ready node
starts when its resource is free (ready queue order: FIFO = earliest ready first, LIFO =
latest ready first; ties by node position).

* COMP: ``duration_ns`` cycles, or with roofline-enabled and a num_ops attribute
  floor(max(num_ops / peak, tensor_size / local_mem_bw)) (peak in TFLOPS -> ops/ns,
  local-mem-bw in decimal GB/s = bytes/ns, as upstream's Roofline reads it).
* MEM_LOAD / MEM_STORE: floor(latency + tensor_size / bandwidth) of the memory config.
* COMM_COLL: holds the comm resource from the moment it starts on this NPU; when every
  participant has started it, all of them finish ``collective_time`` later. Participants
  are the NPUs that share this NPU's coordinates on the dimensions not in involved_dim
  (and are part of this run). Instances are matched across NPUs by (group, comm_tag,
  occurrence number).
* COMM_SEND: holds the sender's comm resource for p2p_time(src, dst, size) and delivers
  the message at the end; COMM_RECV holds no resource and finishes at
  max(ready time, delivery time). Messages match by (src, dst, comm_tag) in FIFO order.
* Other node types take no time.

Exposed communication of an NPU = the time during which a collective, send or pending
receive is in progress and no compute node is running.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from astrasim.chakra import NodeType
from astrasim.collectives import CollectiveModel
from astrasim.config import MemoryConfig, Network, SystemConfig, gbps_to_bytes_per_ns

R_COMPUTE, R_CPU, R_COMM, R_MEM = 0, 1, 2, 3
_NONE, _RECV = -1, -2
_COMP, _SEND, _RECVT, _COLL = (NodeType.COMP_NODE, NodeType.COMM_SEND_NODE,
                               NodeType.COMM_RECV_NODE, NodeType.COMM_COLL_NODE)
_MEMS = (NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE)


class WorkloadError(ValueError):
    """An execution graph that cannot run (unknown dependency, deadlock, bad attribute)."""


@dataclass(frozen=True, slots=True)
class Result:
    cycles: int
    exposed_comm_cycles: int


class Engine:
    """``Engine(network, system, memory)``; ``run(graphs)`` simulates one iteration from
    cycle 0 and returns {npu: Result}."""

    def __init__(self, network: Network, system: SystemConfig | None = None,
                 memory: MemoryConfig | None = None) -> None:
        self.network = network
        self.system = system or SystemConfig()
        self.memory = memory or MemoryConfig()
        self.coll = CollectiveModel(network, self.system)
        m, s = self.memory, self.system
        if m.memory_type != "NO_MEMORY_EXPANSION":
            self._mem_lat, bw = m.remote_mem_latency, m.remote_mem_bw
        else:
            self._mem_lat = m.local_mem_latency if m.local_mem_latency is not None \
                else s.local_mem_latency
            bw = m.local_mem_bw if m.local_mem_bw is not None else s.local_mem_bw
        self._mem_bpns = gbps_to_bytes_per_ns(bw)
        self._roof = s.roofline_enabled
        self._peak_ops_per_ns = s.peak_perf * 1e3
        # the roofline's bandwidth is local-mem-bw in decimal GB/s (upstream: * 1e9 B/s)
        self._local_bpns = s.local_mem_bw
        self._lifo = s.scheduling_policy == "LIFO"
        self._groups: dict = {}

    @classmethod
    def from_files(cls, network_path, system_path=None, memory_path=None) -> Engine:
        return cls(Network.load(network_path),
                   SystemConfig.load(system_path) if system_path else None,
                   MemoryConfig.load(memory_path) if memory_path else None)

    # ---------------- timing helpers ----------------
    def collective_time(self, comm_type: int, size_bytes: float, involved_dims=None) -> int:
        """Cycles of one collective; ValueError (a malformed node) when its comm_type or
        comm_size is not a number (an attribute present without a value decodes as None)."""
        for name, v in (("comm_type", comm_type), ("comm_size", size_bytes)):
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{name} must be a number, got {v!r}")
        return self.coll.time(int(comm_type), size_bytes,
                              tuple(bool(x) for x in involved_dims)
                              if involved_dims is not None else None)

    def p2p_time(self, src: int, dst: int, size_bytes: float) -> int:
        return self.coll.p2p_time(src, dst, size_bytes)

    def mem_time(self, size_bytes: float) -> int:
        return math.floor(self._mem_lat + size_bytes / self._mem_bpns)

    def comp_time(self, node) -> int:
        if self._roof:
            ops = node.attrs.get("num_ops")
            if ops:
                ts = node.attrs.get("tensor_size") or 0
                return math.floor(max(ops / self._peak_ops_per_ns, ts / self._local_bpns))
        return node.duration_ns

    def _group(self, npu: int, inv) -> tuple[int, ...]:
        key = (npu, inv)
        g = self._groups.get(key)
        if g is None:
            net = self.network
            if inv is None:
                inv = (True,) * net.ndims
            if len(inv) != net.ndims:
                raise WorkloadError(f"NPU {npu}: involved_dim {list(inv)} has {len(inv)} "
                                    f"entries but the network has {net.ndims} dimensions")
            c = net.coords(npu)
            members = [()]
            for d, dim in enumerate(net.dims):
                vals = range(dim.npus) if inv[d] else (c[d],)
                members = [m + (v,) for m in members for v in vals]
            g = self._groups[key] = tuple(sorted(net.npu_id(m) for m in members))
        return g

    # ---------------- the executor ----------------
    def run(self, graphs) -> dict[int, Result]:
        """Simulate one iteration of ``graphs`` ({npu_id: Graph} or a list of Graphs, keyed
        by their npu_id), every NPU starting at cycle 0."""
        if not isinstance(graphs, dict):
            graphs = {g.npu_id: g for g in graphs}
        if not graphs:
            return {}
        n = self.network.num_npus
        for npu in graphs:
            if not 0 <= npu < n:
                raise WorkloadError(f"NPU {npu} is outside the network (0..{n - 1})")
        # SPMD fast path: every NPU runs the same nodes (the same list object, or equal
        # ones) and there are no point-to-point messages, so all NPUs reach every
        # collective together and one NPU's timeline is every NPU's.
        it = iter(graphs.values())
        first = next(it).nodes
        if all(g.nodes is first or g.nodes == first for g in it) and not any(
                nd.type == _SEND or nd.type == _RECVT for nd in first):
            r = _run_solo(self, next(iter(graphs)), first)
            return {npu: r for npu in graphs}
        return _Sim(self, graphs).run()


class _Sim:
    __slots__ = (
        "_group_ids",
        "_group_sizes",
        "busy",
        "children",
        "coll_count",
        "coll_wait",
        "comm_iv",
        "comp_iv",
        "done",
        "dur",
        "eng",
        "finish",
        "graphs",
        "heap",
        "mail",
        "nodes",
        "pending",
        "present",
        "ready",
        "recv_wait",
        "res",
        "seq",
        "start",
    )

    def __init__(self, eng: Engine, graphs: dict) -> None:
        self.eng = eng
        self.graphs = graphs
        self.present = set(graphs)
        self._group_ids: dict[tuple, int] = {}
        self._group_sizes: list[int] = []
        self.heap: list = []
        self.seq = 0
        self.coll_wait: dict = {}
        self.coll_count: dict = {}
        self.mail: dict = {}
        self.recv_wait: dict = {}
        self.busy = {}
        self.ready = {}
        self.nodes = {}
        self.res = {}
        self.dur = {}
        self.children = {}
        self.pending = {}
        self.done = {}
        self.finish = {}
        self.start = {}
        self.comm_iv = {}
        self.comp_iv = {}
        eng_comp, eng_mem = eng.comp_time, eng.mem_time
        for npu, g in graphs.items():
            nodes = g.nodes
            idx = {nd.id: i for i, nd in enumerate(nodes)}
            if len(idx) != len(nodes):
                raise WorkloadError(f"NPU {npu}: duplicate node ids in the graph")
            k = len(nodes)
            res = [_NONE] * k
            dur = [0] * k
            children: list[list[int]] = [[] for _ in range(k)]
            pending = [0] * k
            for i, nd in enumerate(nodes):
                t = nd.type
                if t == _COMP:
                    res[i] = R_CPU if nd.attrs.get("is_cpu_op") else R_COMPUTE
                    dur[i] = eng_comp(nd)
                elif t == _COLL or t == _SEND:
                    res[i] = R_COMM
                elif t == _RECVT:
                    res[i] = _RECV
                elif t in _MEMS:
                    res[i] = R_MEM
                    dur[i] = eng_mem(nd.attrs.get("tensor_size") or 0)
                _wire_deps(npu, i, nd, idx, children, pending)
            self.nodes[npu] = nodes
            self.res[npu] = res
            self.dur[npu] = dur
            self.children[npu] = children
            self.pending[npu] = pending
            self.busy[npu] = [False, False, False, False]
            self.ready[npu] = [[], [], [], []]
            self.done[npu] = 0
            self.finish[npu] = 0
            self.start[npu] = [0] * k
            self.comm_iv[npu] = []
            self.comp_iv[npu] = []

    def _push(self, t, npu, i):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, npu, i))

    def _make_ready(self, npu, i, t):
        r = self.res[npu][i]
        if r >= 0:
            key = -t if self.eng._lifo else t
            heapq.heappush(self.ready[npu][r], (key, i))
        elif r == _NONE:
            self._push(t, npu, i)
        else:  # receive
            self.start[npu][i] = t
            nd = self.nodes[npu][i]
            a = nd.attrs
            src = a.get("comm_src", 0)
            mkey = (src, a.get("comm_dst", npu), a.get("comm_tag", 0))
            q = self.mail.get(mkey)
            if q:
                arrival = q.pop(0)
                self._push(max(t, arrival), npu, i)
            else:
                self.recv_wait.setdefault(mkey, []).append((npu, i, t))

    def _dispatch(self, npu, t):
        busy = self.busy[npu]
        ready = self.ready[npu]
        for r in (R_COMPUTE, R_CPU, R_COMM, R_MEM):
            if busy[r] or not ready[r]:
                continue
            _, i = heapq.heappop(ready[r])
            busy[r] = True
            self.start[npu][i] = t
            if r != R_COMM:
                self._push(t + self.dur[npu][i], npu, i)
                continue
            nd = self.nodes[npu][i]
            a = nd.attrs
            if nd.type == _SEND:
                dst = a.get("comm_dst")
                if dst is None:
                    raise WorkloadError(f"NPU {npu}: send node {nd.id} has no comm_dst")
                src = a.get("comm_src", npu)
                arrival = t + self.eng.p2p_time(src, dst, a.get("comm_size", 0))
                self._push(arrival, npu, i)
                mkey = (src, dst, a.get("comm_tag", 0))
                w = self.recv_wait.get(mkey)
                if w:
                    rn, ri, rt = w.pop(0)
                    self._push(max(rt, arrival), rn, ri)
                else:
                    self.mail.setdefault(mkey, []).append(arrival)
            else:
                self._start_coll(npu, i, nd, t)

    def _start_coll(self, npu, i, nd, t):
        a = nd.attrs
        inv = a.get("involved_dim")
        inv = tuple(bool(x) for x in inv) if inv is not None else None
        try:
            T = self.eng.collective_time(a.get("comm_type", 0), a.get("comm_size", 0), inv)
        except ValueError as e:
            raise WorkloadError(f"NPU {npu}: node {nd.id} ({nd.name!r}): {e}") from None
        group = self.eng._group(npu, inv)
        # The participants present in this run, interned per group: a small id keys the
        # bookkeeping, so starting a collective costs O(1), not O(group size).
        gid = self._group_ids.get(group)
        if gid is None:
            gid = self._group_ids[group] = len(self._group_sizes)
            self._group_sizes.append(sum(1 for p in group if p in self.present))
        parts = gid
        tag = a.get("comm_tag", 0)
        ck = (npu, parts, tag)
        occ = self.coll_count.get(ck, 0)
        self.coll_count[ck] = occ + 1
        key = (parts, tag, occ)
        w = self.coll_wait.get(key)
        if w is None:
            w = self.coll_wait[key] = []
        w.append((npu, i, T))
        if len(w) == self._group_sizes[gid]:
            T = max(x[2] for x in w)
            for p, j, _ in w:
                self._push(t + T, p, j)
            del self.coll_wait[key]

    def run(self) -> dict[int, Result]:
        for npu, pending in self.pending.items():
            for i, c in enumerate(pending):
                if c == 0:
                    self._make_ready(npu, i, 0)
            self._dispatch(npu, 0)
        heap = self.heap
        pop = heapq.heappop
        while heap:
            t, _, npu, i = pop(heap)
            r = self.res[npu][i]
            if r >= 0:
                self.busy[npu][r] = False
                if r == R_COMPUTE:
                    self.comp_iv[npu].append((self.start[npu][i], t))
                elif r == R_COMM:
                    self.comm_iv[npu].append((self.start[npu][i], t))
            elif r == _RECV:
                self.comm_iv[npu].append((self.start[npu][i], t))
            self.done[npu] += 1
            self.finish[npu] = max(self.finish[npu], t)
            pending = self.pending[npu]
            for c in self.children[npu][i]:
                pending[c] -= 1
                if pending[c] == 0:
                    self._make_ready(npu, c, t)
            self._dispatch(npu, t)
        out = {}
        for npu, nodes in self.nodes.items():
            if self.done[npu] != len(nodes):
                self._stuck(npu)
            out[npu] = Result(self.finish[npu], _exposed(self.comm_iv[npu], self.comp_iv[npu]))
        return out

    def _stuck(self, npu):
        pending = self.pending[npu]
        waiting = [nd for nd, c in zip(self.nodes[npu], pending) if c == 0]
        started = [f"{nd.id} ({nd.name!r}, {_type_name(nd.type)})" for nd in waiting][:3]
        raise WorkloadError(
            f"NPU {npu}: {len(self.nodes[npu]) - self.done[npu]} node(s) never finished "
            f"(dependency cycle, a collective some participant never reaches, or a "
            f"send/recv without its partner); blocked at: {', '.join(started) or 'a cycle'}")


def _wire_deps(npu: int, i: int, nd, idx: dict, children: list, pending: list) -> None:
    """Record node ``i``'s dependencies (data and control, de-duplicated): each dependency
    gets ``i`` as a child and ``i`` waits for all of them."""
    deps = nd.data_deps
    if nd.ctrl_deps:
        deps = list(dict.fromkeys([*deps, *nd.ctrl_deps]))
    elif len(deps) > 1:
        deps = list(dict.fromkeys(deps))
    for dep in deps:
        j = idx.get(dep)
        if j is None:
            raise WorkloadError(f"NPU {npu}: node {nd.id} ({nd.name!r}) depends on unknown "
                                f"node {dep}")
        children[j].append(i)
    pending[i] = len(deps)


def _type_name(t) -> str:
    try:
        return NodeType(t).name
    except ValueError:
        return f"type {t}"


def _run_solo(eng: Engine, npu: int, nodes) -> Result:
    """One NPU alone, collectives taking their full time as soon as they start (valid
    when every participant runs this same graph: they all reach each collective
    together). A tight single-function version of _Sim for the common SPMD case."""
    k = len(nodes)
    idx = {nd.id: i for i, nd in enumerate(nodes)}
    if len(idx) != k:
        raise WorkloadError(f"NPU {npu}: duplicate node ids in the graph")
    res = [_NONE] * k
    dur = [0] * k
    children: list[list[int]] = [[] for _ in range(k)]
    pending = [0] * k
    coll_time = eng.collective_time
    for i, nd in enumerate(nodes):
        t = nd.type
        if t == _COMP:
            if nd.attrs.get("is_cpu_op"):
                res[i] = R_CPU
            else:
                res[i] = R_COMPUTE
            dur[i] = eng.comp_time(nd) if eng._roof else nd.duration_ns
        elif t == _COLL:
            res[i] = R_COMM
            a = nd.attrs
            inv = a.get("involved_dim")
            try:
                dur[i] = coll_time(a.get("comm_type", 0), a.get("comm_size", 0), inv)
            except ValueError as e:
                raise WorkloadError(f"NPU {npu}: node {nd.id} ({nd.name!r}): {e}") from None
        elif t in _MEMS:
            res[i] = R_MEM
            dur[i] = eng.mem_time(nd.attrs.get("tensor_size") or 0)
        _wire_deps(npu, i, nd, idx, children, pending)

    push, pop = heapq.heappush, heapq.heappop
    lifo = eng._lifo
    heap: list = []  # (finish time, seq, node)
    ready: list[list] = [[], [], [], []]
    busy = [False, False, False, False]
    start = [0] * k
    comm_iv: list = []
    comp_iv: list = []
    seq = 0
    for i in range(k):
        if pending[i] == 0:
            r = res[i]
            if r >= 0:
                push(ready[r], (0, i))
            else:
                seq += 1
                push(heap, (0, seq, i))
    t = 0
    done = 0
    finish = 0
    while True:
        for r in (R_COMPUTE, R_CPU, R_COMM, R_MEM):
            q = ready[r]
            if q and not busy[r]:
                i = pop(q)[1]
                busy[r] = True
                start[i] = t
                seq += 1
                push(heap, (t + dur[i], seq, i))
        if not heap:
            break
        t, _, i = pop(heap)
        done += 1
        finish = t
        r = res[i]
        if r >= 0:
            busy[r] = False
            if r == R_COMPUTE:
                comp_iv.append((start[i], t))
            elif r == R_COMM:
                comm_iv.append((start[i], t))
        for c in children[i]:
            pending[c] -= 1
            if pending[c] == 0:
                rc = res[c]
                if rc >= 0:
                    push(ready[rc], (-t if lifo else t, c))
                else:
                    seq += 1
                    push(heap, (t, seq, c))
    if done != k:
        stuck = [f"{nd.id} ({nd.name!r})" for nd, p in zip(nodes, pending) if p][:3]
        raise WorkloadError(f"NPU {npu}: {k - done} node(s) never finished (dependency "
                            f"cycle); e.g. {', '.join(stuck)}")
    return Result(finish, _exposed(comm_iv, comp_iv))


def _exposed(comm: list, comp: list) -> int:
    """Measure of union(comm) minus union(comp); comp intervals are disjoint and sorted."""
    if not comm:
        return 0
    comm.sort()
    merged = []
    cs, ce = comm[0]
    for s, e in comm[1:]:
        if s <= ce:
            ce = max(ce, e)
        else:
            merged.append((cs, ce))
            cs, ce = s, e
    merged.append((cs, ce))
    total = 0
    j = 0
    nc = len(comp)
    for s, e in merged:
        total += e - s
        while j < nc and comp[j][1] <= s:
            j += 1
        k = j
        while k < nc and comp[k][0] < e:
            a, b = comp[k]
            total -= min(b, e) - max(a, s)
            k += 1
    return total
