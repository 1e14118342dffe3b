"""Cluster config -> ASTRA-Sim input files (network.yml, system.json, memory config).

Everything comes from ``sim.topology``, the same description ``llmsim run`` simulates:
each instance's own network (its TP group x pipeline stages, what the backend times an
iteration on) and the cluster as a whole (dimension 0 the NPUs of one node, dimension 1
the nodes when there is more than one). NPU ids are assigned instance by instance in
config order, so an instance's NPUs are contiguous within its node. ``link_bw`` and
``link_latency`` may be scalars (every dimension) or lists (one value per dimension), as
in LLMServingSim.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from sim.cluster import ClusterConfig
from sim.errors import InputError
from sim.topology import Topology, cluster_topology, instance_topology


@dataclass(frozen=True)
class SystemLayout:
    network: dict
    system: dict
    memory: dict
    #: instance id -> the global NPU ids it runs on
    npus: dict[int, tuple[int, ...]]
    #: instance id -> the network ``llmsim run`` times that instance's iterations on
    instances: dict[int, Topology] | None = None

    @property
    def num_npus(self) -> int:
        return math.prod(self.network["npus_count"])


def _with_algorithm(topo: Topology, algorithm: str | None) -> Topology:
    if algorithm is None:
        return topo
    return replace(topo, dims=tuple(replace(d, algorithm=algorithm) for d in topo.dims))


def build_layout(cluster: ClusterConfig, *, collective_impl: str | None = None) -> SystemLayout:
    """The cluster's network and every instance's own one (``collective_impl`` overrides
    the cluster's ``collective_algorithm`` on every dimension)."""
    npus_per_node = max(sum(i.num_npus for i in n.instances) for n in cluster.nodes)
    for n in cluster.nodes:
        if sum(i.num_npus for i in n.instances) != npus_per_node:
            raise InputError("every node must hold the same number of NPUs "
                             f"(node {n.node_id} differs)", source=cluster.source)
    topo = _with_algorithm(cluster_topology(cluster, npus_per_node), collective_impl)
    system = {**topo.system(), "boost-mode": 0}
    memory = {"memory-type": "NO_MEMORY_EXPANSION"}
    npus: dict[int, tuple[int, ...]] = {}
    for n in cluster.nodes:
        base = n.node_id * npus_per_node
        off = 0
        for inst in n.instances:
            npus[inst.instance_id] = tuple(range(base + off, base + off + inst.num_npus))
            off += inst.num_npus
    instances = {i.instance_id: _with_algorithm(instance_topology(cluster, i), collective_impl)
                 for i in cluster.instances}
    return SystemLayout(topo.network(), system, memory, npus, instances)


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
    for iid, topo in (layout.instances or {}).items():
        sub = folder / f"instance{iid}"
        sub.mkdir(exist_ok=True)
        (sub / "network.yml").write_text(yaml.safe_dump(topo.network(), default_flow_style=None,
                                                        sort_keys=False))
        (sub / "system.json").write_text(json.dumps(topo.system(), indent=2) + "\n")
        (sub / "memory.json").write_text(json.dumps(layout.memory, indent=2) + "\n")
        paths[f"instance{iid}"] = sub
    return paths
