"""Cluster configuration in LLMServingSim's JSON schema (YAML with the same fields too).

A cluster has nodes; a node has CPU memory and instances; an instance serves one model
on ``num_npus`` NPUs of one hardware type with tp/pp/ep parallelism. Memory sizes are in
GiB, bandwidths in GB/s, latencies in ns, as in LLMServingSim. Anything the simulator does
not model yet is refused with a message naming the field, never ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.errors import InputError, read_text_input
from sim.options import DEFAULT_MEM_UTIL, INSTANCE_OPTIONS, check_instance_value

GiB = 1 << 30

_MEM = "mem_size (GiB), mem_bw (GB/s), mem_latency (ns)"
#: every field of a cluster file, declared once: where -> {field: meaning}. The loader
#: refuses any other field, and the README's cluster reference is generated from these
#: (``python -m dse.reference``). An instance may also set the options declared with scope
#: "instance" in sim/options.py (:data:`INSTANCE_SCHEDULER_KEYS`).
CLUSTER_FIELDS: dict[str, dict[str, str]] = {
    "": {
        "num_nodes": "number of nodes; must match `nodes` (default: as listed)",
        "link_bw": "the GPU-to-GPU link as LLMServingSim gives it to ASTRA-Sim: per direction "
                   "in ASTRA-Sim's GB/s (2^30 B/s), one FullyConnected hop; a number or one "
                   "per network dimension, e.g. [intra-node, inter-node] (default: the "
                   "hardware catalogue's physical link, decimal GB/s on its topology)",
        "link_latency": "ns per GPU-to-GPU message (one hop); a number or one per dimension "
                        "(default: the hardware catalogue's per-hop latency)",
        "nodes": "the nodes: a non-empty list (required)",
        "cxl_mem": "a CXL memory expander for the CXL prefix tier",
        "collective_algorithm": "ring, direct, halvingDoubling or doubleBinaryTree: a name or "
                                "one per dimension (default: ring)",
    },
    "cxl_mem": {"mem_size": "GiB (required)", "mem_bw": "GB/s (required)",
                "mem_latency": "ns (default 0)", "num_devices": "devices (default 1)"},
    "nodes[]": {
        "num_instances": "must match `instances` when given",
        "cpu_mem": f"the node's CPU memory: {_MEM}, pim_config",
        "instances": "the instances: a non-empty list (required)",
        "power": "LLMServingSim's power blocks: base_node_power, npu.<hardware>, cpu, dram, "
                 "link, nic, storage",
    },
    "nodes[].cpu_mem": {"mem_size": "GiB (required)", "mem_bw": "GB/s (required)",
                        "mem_latency": "ns (default 0)",
                        "pim_config": "PIM devices in this memory (a DRAMSim3 .ini)"},
    "nodes[].instances[]": {
        "model_name": "model: a profiles/models name or HF id (required)",
        "hardware": "hardware catalogue name (required)",
        "npu_mem": f"each NPU's memory: {_MEM}, mem_util (required)",
        "num_npus": "must equal tp_size * pp_size (default: that)",
        "tp_size": "tensor-parallel size (default 1)",
        "pp_size": "pipeline-parallel size (default 1)",
        "ep_size": "expert-parallel size, MoE models (default 1)",
        "dp_group": "instances with the same name form one data-parallel group",
        "pd_type": "prefill or decode (PD disaggregation; default: neither)",
        "placement": "weight/KV placement across memories (not modelled yet: refused)",
        "dtype": "LLMServingSim's dtype field (read; the model spec's dtype is used)",
        "num_gpu_blocks_override": "vLLM's num_gpu_blocks_override: use this many KV blocks",
    },
    "nodes[].instances[].npu_mem": {
        "mem_size": "GiB (required)", "mem_bw": "GB/s (required)",
        "mem_latency": "ns (default 0)",
        "mem_util": f"vLLM's gpu_memory_utilization (default {DEFAULT_MEM_UTIL})"},
}
# Options an instance may override (LLMServingSim's per-instance fields): those declared
# with scope "instance" in sim/options.py.
INSTANCE_SCHEDULER_KEYS = INSTANCE_OPTIONS
_INSTANCE_KEYS = {*CLUSTER_FIELDS["nodes[].instances[]"], *INSTANCE_SCHEDULER_KEYS}
_NODE_KEYS = set(CLUSTER_FIELDS["nodes[]"])
_TOP_KEYS = set(CLUSTER_FIELDS[""])


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


#: no field of a cluster is meaningfully this large (GiB, GB/s, ns, counts): a typo
MAX_FIELD = 1e15
#: memory sizes (GiB) above 1 PiB cannot be a device or a node
MAX_MEM_GIB = float(1 << 20)


def _num(d: dict, key: str, where: str, *, default=None, positive=True, integer=False,
         maximum: float = MAX_FIELD):
    """A finite number from ``d[key]``: > 0 when ``positive``, else >= 0; at most ``maximum``."""
    if key not in d or d[key] is None:
        if default is None:
            raise InputError(f"missing field {key!r}", source=where)
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise InputError(f"field {key!r} must be a number, got {v!r}", source=where)
    if integer and (v in (float("inf"), float("-inf")) or int(v) != v):
        raise InputError(f"field {key!r} must be an integer, got {v!r}", source=where)
    if positive and v <= 0:
        raise InputError(f"field {key!r} must be > 0, got {v!r}", source=where)
    if v < 0:
        raise InputError(f"field {key!r} must be >= 0, got {v!r}", source=where)
    if v > maximum:
        raise InputError(f"field {key!r} must be <= {maximum:.15g}, got {v!r}", source=where)
    return int(v) if integer else float(v)


def _mem(d: Any, where: str, *, need_util: bool) -> MemorySpec:
    if not isinstance(d, dict):
        raise InputError("must be an object with mem_size, mem_bw, mem_latency", source=where)
    if need_util:  # an NPU's memory (a node's cpu_mem is checked with its pim_config)
        _check_keys(d, set(CLUSTER_FIELDS["nodes[].instances[].npu_mem"]), where)
    util = _num(d, "mem_util", where, default=DEFAULT_MEM_UTIL) if need_util else 1.0
    if not 0 < util <= 1:
        raise InputError(f"field 'mem_util' must be in (0, 1], got {util}", source=where)
    return MemorySpec(
        mem_size_gib=_num(d, "mem_size", where, maximum=MAX_MEM_GIB),
        mem_bw_GBps=_num(d, "mem_bw", where),
        mem_latency_ns=_num(d, "mem_latency", where, default=0.0, positive=False),
        mem_util=util,
    )


def _check_keys(d: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise InputError(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}", source=where)


def parse_cluster(data: Any, source: str = "<cluster>") -> ClusterConfig:
    """Validate a cluster mapping (LLMServingSim schema) into a :class:`ClusterConfig`."""
    if not isinstance(data, dict):
        raise InputError("cluster config must be a JSON/YAML object", source=source)
    _check_keys(data, _TOP_KEYS, source)
    nodes_raw = data.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise InputError("field 'nodes' must be a non-empty list", source=source)
    num_nodes = _num(data, "num_nodes", source, default=len(nodes_raw), integer=True)
    if num_nodes != len(nodes_raw):
        raise InputError(f"num_nodes={num_nodes} but {len(nodes_raw)} node(s) are listed",
                         source=source)
    nodes: list[NodeConfig] = []
    iid = 0
    for n_idx, nd in enumerate(nodes_raw):
        where = f"{source}: nodes[{n_idx}]"
        if not isinstance(nd, dict):
            raise InputError("must be an object", source=where)
        _check_keys(nd, _NODE_KEYS, where)
        inst_raw = nd.get("instances")
        if not isinstance(inst_raw, list) or not inst_raw:
            raise InputError("field 'instances' must be a non-empty list", source=where)
        if "num_instances" in nd and nd["num_instances"] != len(inst_raw):
            raise InputError(f"num_instances={nd['num_instances']} but {len(inst_raw)} "
                             "instance(s) are listed", source=where)
        cpu = _mem(nd["cpu_mem"], f"{where}.cpu_mem", need_util=False) if nd.get("cpu_mem") else None
        insts = []
        for i_idx, ins in enumerate(inst_raw):
            iw = f"{where}.instances[{i_idx}]"
            if not isinstance(ins, dict):
                raise InputError("must be an object", source=iw)
            _check_keys(ins, _INSTANCE_KEYS, iw)
            for key in ("model_name", "hardware"):
                if not isinstance(ins.get(key), str) or not ins[key]:
                    raise InputError(f"field {key!r} must be a non-empty string", source=iw)
            tp = _num(ins, "tp_size", iw, default=1, integer=True)
            pp = _num(ins, "pp_size", iw, default=1, integer=True)
            ep = _num(ins, "ep_size", iw, default=1, integer=True)
            num_npus = _num(ins, "num_npus", iw, default=tp * pp, integer=True)
            if num_npus != tp * pp:
                raise InputError(f"num_npus={num_npus} must equal tp_size*pp_size={tp * pp}",
                                 source=iw)
            pd = ins.get("pd_type")
            if pd not in (None, "prefill", "decode"):
                raise InputError(f"field 'pd_type' must be null, 'prefill' or 'decode', got {pd!r}",
                                 source=iw)
            overrides = {k: ins[k] for k in INSTANCE_SCHEDULER_KEYS if ins.get(k) is not None}
            for key, value in overrides.items():
                check_instance_value(key, value, iw)
            insts.append(InstanceConfig(
                instance_id=iid, node_id=n_idx, model_name=ins["model_name"],
                hardware=ins["hardware"], npu_mem=_mem(ins.get("npu_mem"), f"{iw}.npu_mem",
                                                       need_util=True),
                num_npus=num_npus, tp_size=tp, pp_size=pp, ep_size=ep,
                dp_group=ins.get("dp_group"), pd_type=pd, dtype=ins.get("dtype"),
                kv_cache_dtype=ins.get("kv_cache_dtype"), placement=ins.get("placement"),
                num_gpu_blocks_override=(
                    int(_num(ins, "num_gpu_blocks_override", iw, integer=True))
                    if ins.get("num_gpu_blocks_override") is not None else None),
                overrides=overrides))
            iid += 1
        cpu_raw = nd.get("cpu_mem") or {}
        if isinstance(cpu_raw, dict):
            _check_keys(cpu_raw, set(CLUSTER_FIELDS["nodes[].cpu_mem"]), f"{where}.cpu_mem")
        nodes.append(NodeConfig(node_id=n_idx, cpu_mem=cpu, instances=tuple(insts),
                                power=_power(nd.get("power"), f"{where}.power"), pim_config=cpu_raw.get("pim_config")
                                if isinstance(cpu_raw, dict) else None))
    return ClusterConfig(nodes=tuple(nodes),
                         link_bw_GBps=_per_dim_field(data, "link_bw", source, positive=True),
                         link_latency_ns=_per_dim_field(data, "link_latency", source,
                                                        positive=False),
                         cxl_mem=_cxl(data.get("cxl_mem"), source), source=source,
                         raw=data)


def _per_dim_field(data: dict, key: str, source: str, *,
                   positive: bool) -> float | list | None:
    """link_bw (GB/s, > 0) or link_latency (ns, >= 0): a number, or a list of them (one per
    network dimension), or absent (None: the hardware's link, see sim/topology.py). Checked
    here, whatever the number of NPUs, so a bad link is refused even where no collective
    would use it."""
    v = data.get(key)
    if v is None:
        return None
    if isinstance(v, list):
        if not v:
            raise InputError(f"field {key!r} must be a number or a non-empty list of numbers",
                             source=source)
        return [_num({key: x}, key, source, positive=positive) if x is not None else
                _num({key: "null"}, key, source) for x in v]
    return _num(data, key, source, positive=positive)


def _power(raw: Any, where: str) -> dict | None:
    """A node's power block (LLMServingSim's schema): its shape and numbers are checked
    here; which fields each section needs is checked where power is modelled."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("must be an object (base_node_power, npu, cpu, dram, link, nic, "
                         "storage)", source=where)
    for key, v in raw.items():
        if key == "npu":
            if not isinstance(v, dict) or not all(isinstance(b, dict) for b in v.values()):
                raise InputError("field 'npu' must map hardware names to objects of numbers",
                                 source=where)
            for hw, block in v.items():
                for f in block:
                    _num(block, f, f"{where}.npu.{hw}", positive=False)
        elif isinstance(v, dict):
            for f in v:
                _num(v, f, f"{where}.{key}", positive=False)
        else:
            _num(raw, key, where, positive=False)
    return raw


def _cxl(raw: Any, source: str) -> dict | None:
    """cxl_mem: {mem_size, mem_bw, mem_latency, num_devices}, all numbers."""
    if raw is None:
        return None
    where = f"{source}: cxl_mem"
    if not isinstance(raw, dict):
        raise InputError("must be an object with mem_size, mem_bw, mem_latency, num_devices",
                         source=where)
    _check_keys(raw, set(CLUSTER_FIELDS["cxl_mem"]), where)
    _num(raw, "mem_size", where, maximum=MAX_MEM_GIB)
    _num(raw, "mem_bw", where)
    _num(raw, "mem_latency", where, default=0.0, positive=False)
    _num(raw, "num_devices", where, default=1, integer=True)
    return raw


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load_cluster(path: str | Path) -> ClusterConfig:
    """Read a cluster config file (.json, or .yaml/.yml with the same fields)."""
    path = Path(path)
    text = read_text_input(path, "a cluster config", "a JSON or YAML")
    if path.suffix in (".yaml", ".yml"):
        import yaml  # only for YAML configs (startup time of `llmsim run`)

        syntax_errors: tuple[type[Exception], ...] = (yaml.YAMLError,)
    else:
        syntax_errors = (json.JSONDecodeError,)
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else \
            json.loads(text, parse_constant=_refuse_constant)
    except syntax_errors as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"malformed cluster config: {msg}", source=str(path)) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"malformed cluster config: {exc or 'nested too deeply'}",
                         source=str(path)) from None
    return parse_cluster(data, str(path))


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
    """The README's cluster-file table: one row per field of :data:`CLUSTER_FIELDS`, then
    the options an instance may set."""
    from sim.options import declarations

    rows = ["| field | meaning |", "|---|---|"]
    for where, entries in CLUSTER_FIELDS.items():
        for key, meaning in entries.items():
            rows.append(f"| `{where + '.' if where else ''}{key}` | {meaning} |")
    for name, _, default, opt in declarations():
        if name in INSTANCE_SCHEDULER_KEYS:
            rows.append(f"| `nodes[].instances[].{name}` | this instance's {name} option "
                        f"(default: the run's, `{default!r}`) |")
    return "\n".join(rows) + "\n"
