"""Cluster configuration in LLMServingSim's JSON schema (YAML with the same fields too).

A cluster has nodes; a node has CPU memory and instances; an instance serves one model
on ``num_npus`` NPUs of one hardware type with tp/pp/ep parallelism. Memory sizes are in
GiB, bandwidths in GB/s, latencies in ns, as in LLMServingSim. Anything the simulator does
not model yet is refused with a message naming the field, never ignored.

The file's fields are declared once, as the pydantic models of :mod:`sim.cluster_schema`
(which the README's cluster reference is generated from). :func:`load_cluster` keeps the
validated result of a file in the user cache (:mod:`sim.cache`), keyed by the file's
bytes and the schema's sources, so a warm ``llmsim run`` imports no pydantic;
:func:`parse_cluster` (a mapping in memory) always validates.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.errors import InputError, read_text_input, unique_keys
from sim.options import DEFAULT_MEM_UTIL

GiB = 1 << 30
#: bump when the plain form :func:`sim.cluster_schema.normalize` returns changes shape
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class MemorySpec:
    mem_size_gib: float
    mem_bw_GBps: float
    mem_latency_ns: float = 0.0
    mem_util: float = DEFAULT_MEM_UTIL


@dataclass(frozen=True)
class InstanceConfig:
    instance_id: int
    node_id: int
    model_name: str
    hardware: str
    npu_mem: MemorySpec
    num_npus: int = 1
    tp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    dp_group: str | None = None
    pd_type: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    placement: dict | None = None
    #: vLLM's cache_config.num_gpu_blocks_override: use this many KV blocks, whatever the
    #: memory accounting gives (it must still leave room for the cache)
    num_gpu_blocks_override: int | None = None
    #: vLLM's kv_cache_memory_bytes: each worker's KV cache in bytes, in place of what
    #: gpu_memory_utilization leaves after profiling
    kv_cache_memory_bytes: int | None = None
    #: per-instance overrides of SimOptions scheduler knobs
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeConfig:
    node_id: int
    cpu_mem: MemorySpec | None
    instances: tuple[InstanceConfig, ...]
    power: dict | None = None
    #: cpu_mem.pim_config: PIM devices attached to the node's CPU memory
    pim_config: str | dict | None = None


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    #: the GPU-to-GPU path as LLMServingSim gives it to ASTRA-Sim (sim/topology.py): per
    #: direction in ASTRA-Sim's "GB/s" (2^30 B/s); a number or one per dimension (intra-node,
    #: inter-node); None: the hardware catalogue's link (decimal GB/s on its topology)
    link_bw_GBps: float | list | None = None
    #: ns per message (one FullyConnected hop); a number or one per dimension; None: the
    #: hardware catalogue's per-hop latency on its topology
    link_latency_ns: float | list | None = None
    cxl_mem: dict | None = None
    #: ASTRA-Sim's collective algorithm: a name, or one per dimension; None: ring
    collective_algorithm: str | list | None = None
    source: str = "<cluster>"
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def instances(self) -> tuple[InstanceConfig, ...]:
        return tuple(i for n in self.nodes for i in n.instances)

    def with_overrides(self, **kw) -> ClusterConfig:
        return replace(self, **kw)

    def map_instances(self, change) -> ClusterConfig:
        """This cluster with every instance replaced by ``change(instance)``."""
        nodes = tuple(replace(n, instances=tuple(change(i) for i in n.instances))
                      for n in self.nodes)
        return replace(self, nodes=nodes)

    def with_mem_util(self, util: float) -> ClusterConfig:
        """This cluster with every instance's npu_mem.mem_util set to ``util`` (vLLM's
        gpu_memory_utilization of a run being replayed)."""
        return self.map_instances(
            lambda i: replace(i, npu_mem=replace(i.npu_mem, mem_util=float(util))))


def _npu_memory(ins: dict, where: str) -> MemorySpec:
    """An instance's NPU memory; a size or bandwidth the file leaves out is its hardware's
    (the catalogue's), as LLMServingSim takes them from its hardware profile when a
    cluster file gives only ``npu_mem.mem_util``."""
    mem = dict(ins["npu_mem"])
    missing = [k for k in ("mem_size_gib", "mem_bw_GBps") if mem[k] is None]
    if missing:
        from sim.hardware import known_hardware, load_hardware

        field = "mem_size" if "mem_size_gib" in missing else "mem_bw"
        try:
            hw = load_hardware(ins["hardware"])
        except InputError:
            raise InputError(
                f"{where}.npu_mem.{field}: not given, and hardware {ins['hardware']!r} is "
                f"not in the catalogue to take it from; give npu_mem.{field} or one of: "
                f"{', '.join(known_hardware())}") from None
        if mem["mem_size_gib"] is None:
            mem["mem_size_gib"] = hw.mem_size_GiB
        if mem["mem_bw_GBps"] is None:
            mem["mem_bw_GBps"] = hw.mem_bw_GBps
    return MemorySpec(**mem)


def _from_plain(plain: dict, source: str, raw: Any) -> ClusterConfig:
    """The ClusterConfig of :func:`sim.cluster_schema.normalize`'s plain data."""
    nodes, iid = [], 0
    for n_idx, nd in enumerate(plain["nodes"]):
        insts = []
        for i_idx, ins in enumerate(nd["instances"]):
            mem = _npu_memory(ins, f"{source}: nodes[{n_idx}].instances[{i_idx}]")
            insts.append(InstanceConfig(instance_id=iid, node_id=n_idx,
                                        **{**ins, "npu_mem": mem}))
            iid += 1
        cpu = MemorySpec(**nd["cpu_mem"]) if nd["cpu_mem"] is not None else None
        if nd["pim_config"]:  # checked at each load: the cached form cannot see the file
            from sim.pim import resolve_pim

            resolve_pim(str(nd["pim_config"]), f"{source}: nodes[{n_idx}].cpu_mem.pim_config")
        nodes.append(NodeConfig(node_id=n_idx, cpu_mem=cpu, instances=tuple(insts),
                                power=nd["power"], pim_config=nd["pim_config"]))
    return ClusterConfig(nodes=tuple(nodes), link_bw_GBps=plain["link_bw"],
                         link_latency_ns=plain["link_latency"], cxl_mem=plain["cxl_mem"],
                         collective_algorithm=plain["collective_algorithm"], source=source,
                         raw=raw)


def parse_cluster(data: Any, source: str = "<cluster>") -> ClusterConfig:
    """Validate a cluster mapping (LLMServingSim schema) into a :class:`ClusterConfig`."""
    from sim.cluster_schema import normalize

    return _from_plain(normalize(data, source), source, data)


def _schema_sources() -> list[Path]:
    """The files the validated form of a cluster file depends on, besides the file."""
    import astrasim.config

    here = Path(__file__).resolve().parent
    return [here / n for n in ("cluster_schema.py", "schema.py", "options.py", "cluster.py",
                               "model.py")] + [Path(astrasim.config.__file__)]


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _read(path: Path) -> tuple[str, Any]:
    text = read_text_input(path, "a cluster config", "a JSON or YAML")
    if path.suffix in (".yaml", ".yml"):
        import yaml  # only for YAML configs (startup time of `llmsim run`)

        from sim.yamlio import strict_load, yaml_problem
        try:
            return text, strict_load(text)
        except yaml.YAMLError as exc:
            raise InputError(f"malformed cluster config: {yaml_problem(exc)}",
                             source=str(path)) from None
        except RecursionError:
            raise InputError("malformed cluster config: nested too deeply",
                             source=str(path)) from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"malformed cluster config: {msg}", source=str(path)) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"malformed cluster config: {exc or 'nested too deeply'}",
                         source=str(path)) from None
    return text, data


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster config file (.json, or .yaml/.yml with the same fields); its validated
    form comes from the user cache when the file and the schema are unchanged."""
    from sim.cache import cached

    path = Path(path)
    text, data = _read(path)

    def build() -> dict:
        from sim.cluster_schema import normalize

        return normalize(data, str(path))

    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=20).digest()
    plain = cached("cluster", _schema_sources(), build,
                   params=(SCHEMA_VERSION, path.suffix in (".yaml", ".yml"), digest))
    return _from_plain(plain, str(path), data)


# Features of the schema that the simulator does not model yet. Each check names the field;
# entries are removed as the features land.
def unsupported_features(cluster: ClusterConfig) -> list[str]:
    problems = []
    for inst in cluster.instances:
        where = f"{cluster.source}: instance {inst.instance_id}"
        if inst.placement:
            problems.append(f"{where}: placement (weight/KV placement across memories) is not "
                            "modelled yet")
    return problems


def markdown_reference() -> str:
    """The README's cluster-file table, from the models of :mod:`sim.cluster_schema`."""
    from sim.cluster_schema import markdown_reference as reference

    return reference()
