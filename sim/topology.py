"""The one description of each instance's network, for ``llmsim run`` and ``llmsim
astra-config`` alike.

An instance runs on its own ASTRA-Sim network: dimension 0 its TP group, dimension 1 (when
pp > 1) its pipeline stages, both on the node's intra-node links. A transfer between two
instances (a PD KV hand-off, an MoE layer's DP/EP exchange, a PIM pool's link) crosses one
link: the intra-node one within a node, the scale-out one (InfiniBand / RoCE) between
nodes. Each dimension carries a topology, a per-direction bandwidth, a latency and the
collective algorithm it runs (``ring`` unless the cluster's ``collective_algorithm`` says
otherwise).

Where the values come from, and what they mean there:

- **The cluster file's** ``link_bw`` / ``link_latency`` (a number, or one per dimension:
  intra-node, inter-node) are read as the format's owner, LLMServingSim, reads them: they
  describe the GPU-to-GPU path, which LLMServingSim hands to ASTRA-Sim as a
  ``FullyConnected`` dimension. ``link_bw`` goes into ASTRA-Sim's network file unchanged,
  in ASTRA-Sim's "GB/s" (2^30 B/s, as its analytical network counts it); ``link_latency``
  is ns per message (one hop on FullyConnected), e.g. an end-to-end NCCL measurement
  between two GPUs.
- **The hardware catalogue** (profiles/hardware: ``link_bw_GBps`` / ``link_latency_ns`` /
  ``link_topology`` and the ``scale_out_*`` fields) gives the values a cluster file leaves
  out, as physical links: decimal GB/s (1e9 B/s, as vendors quote links) per direction,
  ns per hop, on the physical topology ASTRA-Sim models: NVLink through NVSwitch and PCIe
  through the host's root complex are a ``Switch`` (one per-GPU link into the switch, two
  hops from GPU to GPU), other links a ``Ring``; the scale-out NIC a ``Switch``. Where the
  catalogue holds the intra-node link as collectives measured between two of its cards
  see it (``measured_link_bw_GiBps`` / ``measured_link_latency_ns``, in a cluster file's
  terms), that stands in for the physical one, as LLMServingSim's measured hardware
  defaults stand in for link values a cluster file leaves out.

The rule holds per dimension and per value: a dimension whose latency the file gives is
FullyConnected with that per-message latency, else it keeps the catalogue's topology and
per-hop latency; its bandwidth is the file's (2^30 B/s) where given, else the catalogue's
(decimal). ``Link.unit`` records which, and ``Topology.network()`` writes ASTRA-Sim's unit.

The system layer's local-mem-bw (the cost of a reduction) is the NPU's memory bandwidth
from the cluster file (``npu_mem.mem_bw``), as LLMServingSim sets it; ASTRA-Sim's system
file reads it as decimal GB/s.
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


#: ``Link.unit`` of a catalogue link: decimal GB/s (1e9 B/s)
DECIMAL = "GB/s"
#: ``Link.unit`` of a cluster file's ``link_bw``: ASTRA-Sim's "GB/s" (2^30 B/s)
ASTRA = "GiB/s"
#: a cluster file's per-message latency puts its dimension on this topology (one hop)
FILE_TOPOLOGY = "FullyConnected"


@dataclass(frozen=True)
class Link:
    """One link kind: ``topology`` as ASTRA-Sim models it, per-direction bandwidth
    ``bw_GBps`` counted in ``unit`` (``DECIMAL``: 1e9 B/s, the catalogue's; ``ASTRA``:
    2^30 B/s, a cluster file's ``link_bw``), ``latency_ns`` per hop (per message on a
    FullyConnected link, one hop)."""

    topology: str
    bw_GBps: float
    latency_ns: float
    kind: str = ""
    unit: str = DECIMAL

    def __post_init__(self) -> None:
        if self.unit not in (DECIMAL, ASTRA):
            raise ValueError(f"Link.unit must be {DECIMAL!r} or {ASTRA!r}, got {self.unit!r}")

    @property
    def astra_bw(self) -> float:
        """The bandwidth in ASTRA-Sim's network-file unit (2^30 B/s)."""
        return self.bw_GBps if self.unit == ASTRA else self.bw_GBps * ASTRA_GBPS

    @property
    def bytes_per_ns(self) -> float:
        """The bandwidth in bytes per ns (= decimal GB/s)."""
        return self.bw_GBps / ASTRA_GBPS if self.unit == ASTRA else self.bw_GBps


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
        """network.yml's content (bandwidth in ASTRA-Sim's 2^30 B/s unit: a cluster file's
        ``link_bw`` as given, a catalogue figure converted from decimal GB/s)."""
        return {"topology": [d.link.topology for d in self.dims],
                "npus_count": [d.npus for d in self.dims],
                "bandwidth": [d.link.astra_bw for d in self.dims],
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
    """(intra-node, inter-node) algorithm of the cluster file (checked by its schema)."""
    value = cluster.collective_algorithm
    if value is None:
        return DEFAULT_ALGORITHM, DEFAULT_ALGORITHM
    vals = value if isinstance(value, list) else [value]
    return vals[0], vals[-1]


def _file_link(cluster: ClusterConfig, inst: InstanceConfig, dim: int,
               physical: Link | None) -> Link:
    """The link of dimension ``dim`` (0 intra-node, -1 inter-node): the cluster file's
    values where it gives them (bandwidth in ASTRA-Sim's 2^30 B/s, latency per message on a
    FullyConnected dimension), the catalogue's ``physical`` link for the rest (decimal
    GB/s, per-hop latency on its own topology)."""
    bw = _pick(cluster, cluster.link_bw_GBps, "link_bw", dim)
    lat = _pick(cluster, cluster.link_latency_ns, "link_latency", dim)
    if bw == 0:
        raise InputError("field 'link_bw' must be > 0", source=cluster.source)
    if physical is None:
        for field, v in (("link_bw", bw), ("link_latency", lat)):
            if v is None:
                raise InputError(f"field {field!r} is not given and hardware {inst.hardware!r} "
                                 "is not in the catalogue (profiles/hardware) to take it from",
                                 source=cluster.source)
        return Link(FILE_TOPOLOGY, bw, lat, "", ASTRA)
    topology, latency = (FILE_TOPOLOGY, lat) if lat is not None else \
        (physical.topology, physical.latency_ns)
    bandwidth, unit = (bw, ASTRA) if bw is not None else (physical.bw_GBps, physical.unit)
    return Link(topology, bandwidth, latency, physical.kind, unit)


def physical_intra_node_link(hw) -> Link:
    """The catalogue's intra-node link of hardware ``hw``: as measured collectives between
    two of its cards see it where the catalogue has that (``measured_link_*``: a cluster
    file's terms, one hop of the per-message latency, 2^30 B/s), else the physical link
    (decimal GB/s, per hop on its own topology)."""
    if hw.measured_link_bw_GiBps is not None:
        return Link(FILE_TOPOLOGY, hw.measured_link_bw_GiBps, hw.measured_link_latency_ns,
                    f"{hw.link_type} (measured)", ASTRA)
    return Link(hw.link_topology, hw.link_bw_GBps, hw.link_latency_ns, hw.link_type)


def physical_inter_node_link(hw) -> Link:
    """The catalogue's scale-out link of hardware ``hw``: through a switch."""
    return Link("Switch", hw.scale_out_bw_GBps, hw.scale_out_latency_ns, hw.scale_out_type)


def intra_node_link(cluster: ClusterConfig, inst: InstanceConfig) -> Link:
    """The link between two NPUs of ``inst``'s node."""
    hw = _hardware(inst.hardware, cluster.source)
    return _file_link(cluster, inst, 0, None if hw is None else physical_intra_node_link(hw))


def inter_node_link(cluster: ClusterConfig, inst: InstanceConfig) -> Link:
    """The scale-out link from ``inst``'s node to another node."""
    hw = _hardware(inst.hardware, cluster.source)
    return _file_link(cluster, inst, -1, None if hw is None else physical_inter_node_link(hw))


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
    an intra-node ``link_bw`` about twice the hardware's per-direction figure (a
    bidirectional number, as LLMServingSim's H100 example writes NVLink's 900 GB/s; compared
    in one unit: the file's 2^30 B/s converted to the catalogue's decimal GB/s), a zero
    latency, or the direct algorithm on a switched fabric (optimistic without congestion)."""
    out = []
    seen = set()
    for inst in cluster.instances:
        if inst.hardware in seen:
            continue
        seen.add(inst.hardware)
        hw = _hardware(inst.hardware, cluster.source)
        bw = _pick(cluster, cluster.link_bw_GBps, "link_bw", 0)
        if hw is None or bw is None:
            continue
        decimal = Link(FILE_TOPOLOGY, bw, 0, unit=ASTRA).bytes_per_ns
        twice = 2 * hw.link_bw_GBps
        if abs(decimal - twice) <= 0.1 * twice:
            out.append(f"{cluster.source}: link_bw {bw:g} (ASTRA-Sim GB/s of 2^30 B/s, "
                       f"{decimal:.4g} decimal GB/s) is about twice {hw.name}'s "
                       f"{hw.link_type or 'link'} {hw.link_bw_GBps:g} decimal GB/s per "
                       "direction: it looks like a bidirectional figure, but link_bw is per "
                       "direction")
    lats = {_pick(cluster, cluster.link_latency_ns, "link_latency", d) for d in (0, -1)}
    if 0.0 in lats:
        out.append(f"{cluster.source}: link_latency 0 ns: every real GPU-to-GPU message takes "
                   "time (link_latency is ns per message; profiles/hardware's link_latency_ns "
                   "give each link's per-hop figure)")
    if "direct" in _cluster_algorithms(cluster) and any(
            _switched(cluster, i) and i.tp_size > 2 for i in cluster.instances):
        out.append(f"{cluster.source}: collective_algorithm direct on a switched fabric: the "
                   "congestion-unaware network gives each of a GPU's N-1 concurrent messages "
                   "the whole per-GPU link, so direct collectives come out up to N-1 times "
                   "too fast (ring keeps to the link)")
    for msg in out:
        log.warning(msg)
    return out


def _switched(cluster: ClusterConfig, inst: InstanceConfig) -> bool:
    """Whether ``inst``'s GPUs share one per-GPU link into a switch: the modelled
    topology's, or (where the cluster file's latency makes the dimension FullyConnected)
    the hardware's physical one."""
    if intra_node_link(cluster, inst).topology == "Switch":
        return True
    hw = _hardware(inst.hardware, cluster.source)
    return hw is not None and hw.link_topology == "Switch"
