"""Cluster config -> ASTRA-Sim input files (network.yml, system.json, memory config).

The NPUs of the cluster form a multi-dimensional topology: dimension 0 is the NPUs of one
node (the intra-node links), dimension 1 the nodes (when there is more than one). NPU ids
are assigned instance by instance in config order, so an instance's NPUs are contiguous
within its node. ``link_bw`` and ``link_latency`` may be scalars (every dimension) or
lists (one value per dimension), as in LLMServingSim.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from sim.cluster import ClusterConfig
from sim.errors import InputError


@dataclass(frozen=True)
class SystemLayout:
    network: dict
    system: dict
    memory: dict
    #: instance id -> the global NPU ids it runs on
    npus: dict[int, tuple[int, ...]]

    @property
    def num_npus(self) -> int:
        return math.prod(self.network["npus_count"])


def _per_dim(value, ndims: int, field: str, source: str) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)] * ndims
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        if len(value) == 1:
            return [float(value[0])] * ndims
        if len(value) != ndims:
            raise InputError(f"field {field!r} lists {len(value)} values but the topology has "
                             f"{ndims} dimension(s)", source=source)
        return [float(v) for v in value]
    raise InputError(f"field {field!r} must be a number or a list of numbers, got {value!r}",
                     source=source)


def build_layout(cluster: ClusterConfig, *, collective_impl: str = "ring",
                 endpoint_delay_ns: int = 10, chunks: int = 1,
                 local_mem_bw_GBps: float = 1600.0) -> SystemLayout:
    npus_per_node = max(sum(i.num_npus for i in n.instances) for n in cluster.nodes)
    for n in cluster.nodes:
        if sum(i.num_npus for i in n.instances) != npus_per_node:
            raise InputError("every node must hold the same number of NPUs "
                             f"(node {n.node_id} differs)", source=cluster.source)
    dims = [npus_per_node] + ([len(cluster.nodes)] if len(cluster.nodes) > 1 else [])
    nd = len(dims)
    bw = _per_dim(cluster.link_bw_GBps, nd, "link_bw", cluster.source)
    lat = _per_dim(cluster.link_latency_ns, nd, "link_latency", cluster.source)
    network = {
        "topology": ["Ring" if d > 2 else "FullyConnected" for d in dims][:1]
        + (["Switch"] if nd > 1 else []),
        "npus_count": dims, "bandwidth": bw, "latency": lat,
    }
    system = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": endpoint_delay_ns,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": chunks,
        "all-reduce-implementation": [collective_impl] * nd,
        "all-gather-implementation": [collective_impl] * nd,
        "reduce-scatter-implementation": [collective_impl] * nd,
        "all-to-all-implementation": ["direct"] * nd,
        "collective-optimization": "localBWAware",
        "local-mem-bw": local_mem_bw_GBps,
        "boost-mode": 0,
    }
    memory = {"memory-type": "NO_MEMORY_EXPANSION"}
    npus: dict[int, tuple[int, ...]] = {}
    for n in cluster.nodes:
        base = n.node_id * npus_per_node
        off = 0
        for inst in n.instances:
            npus[inst.instance_id] = tuple(range(base + off, base + off + inst.num_npus))
            off += inst.num_npus
    return SystemLayout(network, system, memory, npus)


def write_layout(layout: SystemLayout, folder: str | Path) -> dict[str, Path]:
    """Write the three ASTRA-Sim input files; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"network": folder / "network.yml", "system": folder / "system.json",
             "memory": folder / "memory.json"}
    paths["network"].write_text(yaml.safe_dump(layout.network, default_flow_style=None,
                                               sort_keys=False))
    paths["system"].write_text(json.dumps(layout.system, indent=2) + "\n")
    paths["memory"].write_text(json.dumps(layout.memory, indent=2) + "\n")
    return paths
