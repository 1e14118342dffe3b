"""The one description of each instance's network, for ``llmsim run`` and ``llmsim
astra-config`` alike.

An instance runs on its own ASTRA-Sim network: dimension 0 its TP group, dimension 1 (when
pp > 1) its pipeline stages, both on the node's intra-node links. A transfer between two
instances (a PD KV hand-off) crosses one link: the intra-node one within a node, the
scale-out one (InfiniBand / RoCE) between nodes. Each dimension carries

- the physical topology ASTRA-Sim models: NVLink through NVSwitch and PCIe through the
  host's root complex are a ``Switch`` (one per-GPU link into the switch, two hops from GPU
  to GPU); other links a ``Ring``;
- the link's *per-direction* bandwidth and *per-hop* latency;
- the collective algorithm the dimension runs (``ring`` unless the cluster's
  ``collective_algorithm`` says otherwise).

Where the values come from: the cluster file's ``link_bw`` / ``link_latency`` (a number,
or one per dimension: intra-node, inter-node), else the instance's hardware catalogue entry
(``link_bw_GBps`` / ``link_latency_ns`` / ``link_topology`` and the ``scale_out_*``
fields). The system layer's local-mem-bw (the cost of a reduction) is the NPU's memory
bandwidth from the cluster file (``npu_mem.mem_bw``), as LLMServingSim sets it.

Units: bandwidths here are decimal GB/s (1e9 B/s, as vendors quote links); ASTRA-Sim's
network file counts 2^30 B/s per "GB/s", so ``Topology.network()`` converts. Its
system file's local-mem-bw is decimal GB/s already.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from astrasim.config import IMPLEMENTATIONS

from sim.cluster import ClusterConfig, InstanceConfig
from sim.errors import InputError

#: ASTRA-Sim network bandwidth unit (2^30 B/s) per decimal GB/s
ASTRA_GBPS = 1e9 / (1 << 30)
#: the collective algorithms astra-sim implements (its one list)
ALGORITHMS = tuple(IMPLEMENTATIONS.values())
#: what a two-NPU-or-more dimension of an instance network uses when nothing is said
DEFAULT_ALGORITHM = "ring"
#: the system-layer keys every network shares (upstream's defaults otherwise)
ENDPOINT_DELAY_NS = 10
#: local-mem-bw of networks that carry no reductions (transfers, PIM links), GB/s
_PLAIN_MEM_BW = 1600.0


log = logging.getLogger("sim.topology")


@dataclass(frozen=True)
class Link:
    """One physical link kind: per-direction bandwidth (decimal GB/s), per-hop latency."""

    topology: str
    bw_GBps: float
    latency_ns: float
    kind: str = ""


@dataclass(frozen=True)
class Dim:
    """One dimension of a network: ``npus`` NPUs on ``link``, running ``algorithm``."""

    npus: int
    link: Link
    algorithm: str = DEFAULT_ALGORITHM


@dataclass(frozen=True)
class Topology:
    """A whole ASTRA-Sim network plus the system-layer settings that go with it."""

    dims: tuple[Dim, ...]
    local_mem_bw_GBps: float = _PLAIN_MEM_BW
    all_to_all: str = "direct"
    chunks: int = 1

    @property
    def npus(self) -> int:
        n = 1
        for d in self.dims:
            n *= d.npus
        return n

    def network(self) -> dict:
        """network.yml's content (bandwidth in ASTRA-Sim's 2^30 B/s unit)."""
        return {"topology": [d.link.topology for d in self.dims],
                "npus_count": [d.npus for d in self.dims],
                "bandwidth": [d.link.bw_GBps * ASTRA_GBPS for d in self.dims],
                "latency": [d.link.latency_ns for d in self.dims]}

    def system(self) -> dict:
        """system.json's content."""
        algos = [d.algorithm for d in self.dims]
        return {"scheduling-policy": "LIFO", "endpoint-delay": ENDPOINT_DELAY_NS,
                "active-chunks-per-dimension": 1, "preferred-dataset-splits": self.chunks,
                "all-reduce-implementation": algos, "all-gather-implementation": algos,
                "reduce-scatter-implementation": algos,
                "all-to-all-implementation": [self.all_to_all] * len(self.dims),
                "collective-optimization": "localBWAware",
                "local-mem-bw": self.local_mem_bw_GBps}


def network_dict(net) -> dict:
    """network.yml content of a Topology or of a plain network dict (taken as is)."""
    return net.network() if isinstance(net, Topology) else net


def system_dict(net) -> dict:
    """system.json content of a Topology, or the plain system for a network dict (ring
    collectives, direct all-to-all): the form the engine's transfer, PIM and all-to-all
    networks use."""
    if isinstance(net, Topology):
        return net.system()
    nd = len(net["npus_count"])
    return {"scheduling-policy": "LIFO", "endpoint-delay": ENDPOINT_DELAY_NS,
            "active-chunks-per-dimension": 1, "preferred-dataset-splits": 1,
            "all-reduce-implementation": ["ring"] * nd,
            "all-gather-implementation": ["ring"] * nd,
            "reduce-scatter-implementation": ["ring"] * nd,
            "all-to-all-implementation": ["direct"] * nd,
            "collective-optimization": "localBWAware", "local-mem-bw": _PLAIN_MEM_BW}


# ---------------------------------------------------------------- links of a cluster
def _hardware(name: str, source: str):
    """The catalogue entry, or None for hardware the catalogue does not know (a profile
    bundle of one's own): its links must then come from the cluster file."""
    from sim.hardware import known_hardware, load_hardware

    try:
        return load_hardware(name, source)
    except InputError:
        if name in known_hardware():
            raise
        return None


def _resolve(cluster: ClusterConfig, inst: InstanceConfig, given, field: str, default):
    if given is not None:
        return given
    if default is None:
        raise InputError(f"field {field!r} is not given and hardware {inst.hardware!r} is not "
                         "in the catalogue (profiles/hardware) to take it from",
                         source=cluster.source)
    return default


def _pick(cluster: ClusterConfig, value, field: str, dim: int) -> float | None:
    """Entry ``dim`` (0 intra-node, -1 inter-node) of a cluster link field: a number (every
    dimension) or a list of one (every dimension) or two (intra-node, inter-node)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, list) and len(value) in (1, 2) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value):
        return float(value[dim])
    raise InputError(f"field {field!r} must be a non-negative number or a list of one per "
                     f"dimension (intra-node, inter-node), got {value!r}", source=cluster.source)


def _cluster_algorithms(cluster: ClusterConfig) -> tuple[str, str]:
    raw = cluster.raw.get("collective_algorithm") if cluster.raw else None
    if raw is None:
        return DEFAULT_ALGORITHM, DEFAULT_ALGORITHM
    vals = raw if isinstance(raw, list) else [raw]
    if not vals or len(vals) > 2:
        raise InputError("field 'collective_algorithm' must be a name or a list of one "
                         f"name per dimension (intra-node, inter-node), got {raw!r}",
                         source=cluster.source)
    for v in vals:
        if v not in ALGORITHMS:
            raise InputError(f"field 'collective_algorithm': unknown algorithm {v!r}; "
                             f"known: {', '.join(ALGORITHMS)}", source=cluster.source)
    return vals[0], vals[-1]


def intra_node_link(cluster: ClusterConfig, inst: InstanceConfig) -> Link:
    """The link between two NPUs of ``inst``'s node."""
    hw = _hardware(inst.hardware, cluster.source)
    bw = _pick(cluster, cluster.link_bw_GBps, "link_bw", 0)
    lat = _pick(cluster, cluster.link_latency_ns, "link_latency", 0)
    if bw == 0:
        raise InputError("field 'link_bw' must be > 0", source=cluster.source)
    return Link(hw.link_topology if hw else "Ring",
                _resolve(cluster, inst, bw, "link_bw", hw and hw.link_bw_GBps),
                _resolve(cluster, inst, lat, "link_latency", hw and hw.link_latency_ns),
                hw.link_type if hw else "")


def inter_node_link(cluster: ClusterConfig, inst: InstanceConfig) -> Link:
    """The scale-out link from ``inst``'s node to another node (through a switch)."""
    hw = _hardware(inst.hardware, cluster.source)
    bw = _pick(cluster, cluster.link_bw_GBps, "link_bw", -1)
    lat = _pick(cluster, cluster.link_latency_ns, "link_latency", -1)
    if bw == 0:
        raise InputError("field 'link_bw' must be > 0", source=cluster.source)
    return Link("Switch", _resolve(cluster, inst, bw, "link_bw", hw and hw.scale_out_bw_GBps),
                _resolve(cluster, inst, lat, "link_latency", hw and hw.scale_out_latency_ns),
                hw.scale_out_type if hw else "")


def link_between(cluster: ClusterConfig, a: InstanceConfig, b: InstanceConfig) -> Link:
    """The link a transfer between instances ``a`` and ``b`` crosses."""
    if a.node_id == b.node_id:
        return intra_node_link(cluster, a)
    return inter_node_link(cluster, a)


def instance_topology(cluster: ClusterConfig, inst: InstanceConfig) -> Topology:
    """``inst``'s own network: TP group x pipeline stages on the intra-node link."""
    link = intra_node_link(cluster, inst)
    algo = _cluster_algorithms(cluster)[0]
    dims = [Dim(inst.tp_size, link, algo)]
    if inst.pp_size > 1:
        dims.append(Dim(inst.pp_size, link, algo))
    return Topology(tuple(dims), local_mem_bw_GBps=inst.npu_mem.mem_bw_GBps)


def transfer_topology(link: Link, npus: int = 2) -> Topology:
    """``npus`` NPUs joined by one ``link`` (a KV hand-off, an all-to-all group)."""
    return Topology((Dim(npus, link),))


def group_topology(cluster: ClusterConfig, members: list[InstanceConfig] | tuple,
                   npus: int) -> Topology:
    """``npus`` NPUs, one rank from each of a group of instances (an MoE layer's DP or EP
    group exchanging tokens), joined by the link between them: the intra-node link when
    every member is on one node, else the scale-out one; running the cluster's collective
    algorithm for that link, with the NPU's memory bandwidth for the reductions."""
    first = members[0]
    one_node = all(m.node_id == first.node_id for m in members)
    intra, inter = _cluster_algorithms(cluster)
    if one_node:
        link, algo = intra_node_link(cluster, first), intra
    else:
        link, algo = inter_node_link(cluster, first), inter
    return Topology((Dim(npus, link, algo),), local_mem_bw_GBps=first.npu_mem.mem_bw_GBps)


def cluster_topology(cluster: ClusterConfig, npus_per_node: int) -> Topology:
    """The whole cluster as one network: dimension 0 a node's NPUs, dimension 1 the nodes."""
    first = cluster.instances[0]
    intra, inter = _cluster_algorithms(cluster)
    dims = [Dim(npus_per_node, intra_node_link(cluster, first), intra)]
    if len(cluster.nodes) > 1:
        dims.append(Dim(len(cluster.nodes), inter_node_link(cluster, first), inter))
    return Topology(tuple(dims), local_mem_bw_GBps=first.npu_mem.mem_bw_GBps)


def check_links(cluster: ClusterConfig) -> list[str]:
    """Warnings (also logged on ``sim.topology``) for a cluster file's links that look wrong:
    an intra-node bandwidth twice the hardware's per-direction figure (a bidirectional
    number, as LLMServingSim's H100 example writes NVLink's 900 GB/s), a zero latency, or
    the direct algorithm on a switch (optimistic without congestion)."""
    out = []
    seen = set()
    for inst in cluster.instances:
        if inst.hardware in seen:
            continue
        seen.add(inst.hardware)
        hw = _hardware(inst.hardware, cluster.source)
        bw = _pick(cluster, cluster.link_bw_GBps, "link_bw", 0)
        if hw is not None and bw is not None and abs(bw - 2 * hw.link_bw_GBps) <= 0.1 * hw.link_bw_GBps:
            out.append(f"{cluster.source}: link_bw {bw:g} GB/s is twice {hw.name}'s "
                       f"{hw.link_type or 'link'} {hw.link_bw_GBps:g} GB/s per direction: it "
                       "looks like a bidirectional figure, but link_bw is per direction")
    lats = {_pick(cluster, cluster.link_latency_ns, "link_latency", d) for d in (0, -1)}
    if 0.0 in lats:
        out.append(f"{cluster.source}: link_latency 0 ns: every real link hop takes time "
                   "(NVLink ~0.5 us, PCIe ~1 us, InfiniBand ~1 us; see profiles/hardware)")
    if "direct" in _cluster_algorithms(cluster) and any(
            intra_node_link(cluster, i).topology == "Switch" and i.tp_size > 2
            for i in cluster.instances):
        out.append(f"{cluster.source}: collective_algorithm direct on a switch: the "
                   "congestion-unaware network gives each of a GPU's N-1 concurrent messages "
                   "the whole per-GPU link, so direct collectives come out up to N-1 times "
                   "too fast (ring keeps to the link)")
    for msg in out:
        log.warning(msg)
    return out
