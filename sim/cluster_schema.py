"""The cluster file (LLMServingSim's JSON schema; YAML with the same fields too) as pydantic
models: every level refuses unknown fields, every field says what it accepts.

A cluster has nodes; a node has CPU memory, instances and optionally a power block; an
instance serves one model on ``num_npus`` NPUs of one hardware type with tp/pp/ep
parallelism and may override the run's options declared with scope ``instance`` in
:mod:`sim.options` (those fields are generated from the declarations). Memory sizes are in
GiB, bandwidths in GB/s, latencies in ns, as in LLMServingSim.

:func:`normalize` turns a mapping into the plain data :mod:`sim.cluster` builds its
dataclasses from (and caches: a warm ``llmsim run`` imports no pydantic). A bad field is
one :class:`~sim.errors.InputError` naming the file, the field path
(``nodes[0].instances[1].npu_mem.mem_util``) and what is allowed. The README's cluster
reference is generated from these models (``python -m dse.reference``), and so are the
``vllm serve`` flags of an instance (:func:`vllm_serve_args`: the fields' and the options'
:class:`~sim.options.VllmArg`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, create_model, model_validator

from sim.options import (DEFAULT_MEM_UTIL, INSTANCE, INSTANCE_OPTIONS, SimOptions, VllmArg,
                         declarations)
from sim.schema import (DEFAULT, Bool, Rule, Section, Text, allowed, annotation_at,
                        check_number, choice, fail, field_rule, fill_defaults, num,
                        reference_default, text, validate)

#: memory sizes (GiB) above 1 PiB cannot be a device or a node
MAX_MEM_GIB = float(1 << 20)


def _algorithms() -> list[str]:
    """ASTRA-Sim's collective algorithms (the names a cluster file may give)."""
    from astrasim.config import IMPLEMENTATIONS

    return list(IMPLEMENTATIONS.values())


def _per_dim(*, exclusive: bool) -> Any:
    """A number, or a list of one per network dimension (intra-node, inter-node): > 0
    (``exclusive``) or >= 0."""
    def check(v: Any) -> Any:
        if v is None:
            return DEFAULT
        if isinstance(v, list):
            if not 1 <= len(v) <= 2:
                raise fail("must be a number or a list of one per network dimension "
                           f"(intra-node, inter-node), got {v!r}")
            return [check_number(x, minimum=0, exclusive=exclusive) for x in v]
        return check_number(v, minimum=0, exclusive=exclusive)

    op = ">" if exclusive else ">="
    return Annotated[Any, BeforeValidator(check),
                     Rule(f"number {op} 0, or [intra-node, inter-node]")]


def _algorithm_names(v: Any) -> Any:
    if v is None:
        return DEFAULT
    names = v if isinstance(v, list) else [v]
    if not 1 <= len(names) <= 2:
        raise fail("must be a name or a list of one name per dimension (intra-node, "
                   f"inter-node), got {v!r}")
    known = _algorithms()
    for name in names:
        if not isinstance(name, str) or name not in known:
            raise fail(f"unknown algorithm {name!r}; known: {allowed(known)}")
    return v


def _group_name(v: Any) -> Any:
    if v is None:
        return DEFAULT
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise fail(f"must be a name (a string or an integer), got {v!r}")
    return v


def _mapping(v: Any) -> Any:
    if v is None:
        return DEFAULT
    if not isinstance(v, dict):
        raise fail(f"must be a mapping, got {v!r}")
    return v


_W = num(minimum=0, required=True)


# ---------------------------------------------------------------- memories
class Memory(Section):
    mem_size: num(minimum=0, exclusive=True, maximum=MAX_MEM_GIB, required=True) = Field(
        description="GiB (required)")
    mem_bw: num(minimum=0, exclusive=True, required=True) = Field(description="GB/s (required)")
    mem_latency: num(minimum=0) = Field(0.0, description="ns")


class NpuMem(Section):
    mem_size: num(minimum=0, exclusive=True, maximum=MAX_MEM_GIB) = Field(
        None, description="GiB (default: the hardware catalogue's memory size, as "
                          "LLMServingSim takes it from its hardware profile)")
    mem_bw: num(minimum=0, exclusive=True) = Field(
        None, description="GB/s (default: the hardware catalogue's memory bandwidth)")
    mem_latency: num(minimum=0) = Field(0.0, description="ns")
    mem_util: Annotated[num(minimum=0, exclusive=True, maximum=1),
                        VllmArg("--gpu-memory-utilization")] = Field(
        DEFAULT_MEM_UTIL, description="vLLM's gpu_memory_utilization (llmsim run's "
                                      "--gpu-memory-utilization replaces it)")


class CpuMem(Memory):
    pim_config: Text = Field(None, description="PIM devices in this memory (a DRAMSim3 .ini "
                                               "or a profiles/pim name)")


class CxlMem(Memory):
    num_devices: num(integer=True, minimum=1) = Field(1, description="devices")


# ---------------------------------------------------------------- power (sim/power.py)
class NpuPower(Section):
    idle_power: _W = Field(description="W while the NPU idles")
    active_power: _W = Field(description="W while an iteration of its instance runs")
    standby_power: _W = Field(description="W for up to standby_duration after one")
    standby_duration: _W = Field(description="ms")


class CpuPower(Section):
    idle_power: _W = Field(description="W")
    active_power: _W = Field(description="W")
    util: _W = Field(description="share of the time at active power (constant)")


class DramPower(Section):
    dimm_size: num(minimum=0, exclusive=True, required=True) = Field(
        description="GiB per DIMM (cpu_mem.mem_size / dimm_size DIMMs)")
    idle_power: _W = Field(description="W per DIMM")
    energy_per_bit: _W = Field(description="pJ per bit an iteration reads from memory")


class LinkPower(Section):
    num_links: _W = Field(description="links")
    idle_power: _W = Field(description="W per link")
    energy_per_bit: _W = Field(description="pJ per bit moved over links")


class NicPower(Section):
    num_nics: _W = Field(description="NICs")
    idle_power: _W = Field(description="W per NIC")


class StoragePower(Section):
    num_devices: _W = Field(description="devices")
    idle_power: _W = Field(description="W per device")


class Power(Section):
    base_node_power: _W = Field(description="W, always on")
    npu: dict[str, NpuPower] = Field(description="per hardware name of the node's instances")
    cpu: CpuPower = Field(description="the host CPU")
    dram: DramPower = Field(description="the node's CPU memory")
    link: LinkPower = Field(description="the GPU-to-GPU links")
    nic: NicPower = Field(description="network cards")
    storage: StoragePower = Field(description="storage devices")


# ---------------------------------------------------------------- instances
def _option_field(name: str, kind: str, default: Any, opt) -> tuple[Any, Any]:
    """The instance field of an option declared with scope "instance"."""
    if opt.choices is not None or opt.accepts is not None:
        values = opt.choices if opt.choices is not None else opt.accepts
        ann = choice(values, opt.allowed)
    elif kind == "bool":
        ann = Bool
    elif kind == "int":
        ann = num(integer=True, minimum=opt.minimum)
    else:
        ann = Text
    return ann, Field(None, description=f"this instance's {name} option (default: the "
                                        f"run's, `{default!r}`)")


class _InstanceFields(Section):
    model_name: text(required=True) = Field(description="model: a profiles/models name or HF id (required)")
    hardware: text(required=True) = Field(description="hardware catalogue name (required)")
    npu_mem: NpuMem = Field(default_factory=NpuMem,
                            description="each NPU's memory (default: every field's default)")
    num_npus: num(integer=True, minimum=1) = Field(
        None, description="must equal tp_size * pp_size (default: that)")
    tp_size: Annotated[num(integer=True, minimum=1), VllmArg("--tensor-parallel-size")] = Field(
        1, description="tensor-parallel size")
    pp_size: Annotated[num(integer=True, minimum=1), VllmArg("--pipeline-parallel-size")] = \
        Field(1, description="pipeline-parallel size")
    ep_size: Annotated[num(integer=True, minimum=1),
                       VllmArg("--enable-expert-parallel", omit=(1,), switch=True)] = Field(
        1, description="expert-parallel size, MoE models")
    dp_group: Annotated[Any, BeforeValidator(_group_name), Rule("a name"),
                        VllmArg("--data-parallel-size", omit=(1,))] = Field(
        None, description="instances with the same name form one data-parallel group (the "
                          "`vllm serve` value: the group's size)")
    pd_type: choice(("prefill", "decode")) = Field(
        None, description="PD disaggregation role (default: neither)")
    placement: Annotated[Any, BeforeValidator(_mapping), Rule("mapping")] = Field(
        None, description="weight/KV placement across memories (not modelled yet: refused)")
    dtype: Text = Field(None, description="LLMServingSim's dtype field (read; the model "
                                          "spec's dtype is used)")
    num_gpu_blocks_override: Annotated[num(integer=True, minimum=1),
                                       VllmArg("--num-gpu-blocks-override", omit=(None,))] = \
        Field(None, description="vLLM's num_gpu_blocks_override: use this many KV blocks")
    kv_cache_memory_bytes: Annotated[num(integer=True, minimum=1),
                                     VllmArg("--kv-cache-memory-bytes", omit=(None,))] = \
        Field(None, description="vLLM's kv_cache_memory_bytes: each worker's KV cache in "
                                "bytes, in place of what mem_util leaves after profiling")

    @model_validator(mode="after")
    def _npus_are_tp_times_pp(self):
        fill_defaults(self)
        want = self.tp_size * self.pp_size
        if self.num_npus is None:
            object.__setattr__(self, "num_npus", want)
        elif self.num_npus != want:
            raise fail(f"num_npus={self.num_npus} must equal tp_size*pp_size={want}")
        return self


Instance = create_model(
    "Instance", __base__=_InstanceFields,
    __doc__="One instance: a model on num_npus NPUs, and its own option values.",
    **{name: _option_field(name, kind, default, opt)
       for name, kind, default, opt in declarations() if opt.scope == INSTANCE})


# ---------------------------------------------------------------- nodes, the cluster
class Node(Section):
    num_instances: num(integer=True, minimum=1) = Field(
        None, description="must match `instances` when given")
    cpu_mem: CpuMem | None = Field(None, description="the node's CPU memory")
    instances: list[Instance] = Field(min_length=1, description="the instances: a non-empty "
                                                                "list (required)")
    power: Power | None = Field(None, description="LLMServingSim's power block (all nodes or "
                                                  "none)")

    @model_validator(mode="after")
    def _count_matches(self):
        fill_defaults(self)
        if self.num_instances is not None and self.num_instances != len(self.instances):
            raise fail(f"num_instances={self.num_instances} but {len(self.instances)} "
                       "instance(s) are listed")
        return self


class Cluster(Section):
    """A cluster file."""

    num_nodes: num(integer=True, minimum=1) = Field(
        None, description="number of nodes; must match `nodes` (default: as listed)")
    link_bw: _per_dim(exclusive=True) = Field(
        None, description="the GPU-to-GPU link as LLMServingSim gives it to ASTRA-Sim: per "
        "direction in ASTRA-Sim's GB/s (2^30 B/s), one FullyConnected hop (default: the "
        "hardware catalogue's physical link, decimal GB/s on its topology)")
    link_latency: _per_dim(exclusive=False) = Field(
        None, description="ns per GPU-to-GPU message, one hop (default: the hardware "
                          "catalogue's per-hop latency)")
    nodes: list[Node] = Field(min_length=1, description="the nodes: a non-empty list "
                                                        "(required)")
    cxl_mem: CxlMem | None = Field(None, description="a CXL memory expander for the CXL "
                                                     "prefix tier")
    collective_algorithm: Annotated[Any, BeforeValidator(_algorithm_names),
                                    Rule("a name or [intra-node, inter-node]")] = Field(
        None, description="ASTRA-Sim's collective algorithm: " + ", ".join(_algorithms())
        + " (default: ring)")

    @model_validator(mode="after")
    def _count_matches(self):
        fill_defaults(self)
        if self.num_nodes is not None and self.num_nodes != len(self.nodes):
            raise fail(f"num_nodes={self.num_nodes} but {len(self.nodes)} node(s) are listed")
        return self


# ---------------------------------------------------------------- the plain result
def _memory(m: Memory | None, util: float = 1.0) -> dict | None:
    if m is None:
        return None
    return {"mem_size_gib": m.mem_size, "mem_bw_GBps": m.mem_bw,
            "mem_latency_ns": m.mem_latency, "mem_util": util}


def _instance(ins: BaseModel) -> dict:
    overrides = {k: getattr(ins, k) for k in INSTANCE_OPTIONS if getattr(ins, k) is not None}
    return {"model_name": ins.model_name, "hardware": ins.hardware,
            "npu_mem": _memory(ins.npu_mem, ins.npu_mem.mem_util), "num_npus": ins.num_npus,
            "tp_size": ins.tp_size, "pp_size": ins.pp_size, "ep_size": ins.ep_size,
            "dp_group": ins.dp_group, "pd_type": ins.pd_type, "dtype": ins.dtype,
            "kv_cache_dtype": ins.kv_cache_dtype, "placement": ins.placement,
            "num_gpu_blocks_override": ins.num_gpu_blocks_override,
            "kv_cache_memory_bytes": ins.kv_cache_memory_bytes, "overrides": overrides}


def normalize(data: Any, source: str) -> dict:
    """The cluster mapping ``data`` validated, as plain data (marshal-able): what
    :mod:`sim.cluster` builds a ClusterConfig from. Power and CXL blocks stay as given."""
    c = validate(Cluster, data, source=source)
    nodes = []
    for raw_node, node in zip(data["nodes"], c.nodes):
        nodes.append({
            "cpu_mem": _memory(node.cpu_mem),
            "pim_config": node.cpu_mem.pim_config if node.cpu_mem is not None else None,
            "power": raw_node["power"] if node.power is not None else None,
            "instances": [_instance(i) for i in node.instances]})
    cxl = data.get("cxl_mem")
    return {"nodes": nodes, "link_bw": c.link_bw, "link_latency": c.link_latency,
            "cxl_mem": {k: v for k, v in cxl.items() if v is not None} if c.cxl_mem else None,
            "collective_algorithm": c.collective_algorithm}


# ---------------------------------------------------------------- vllm serve
def vllm_arg(f) -> VllmArg | None:
    return next((m for m in f.metadata if isinstance(m, VllmArg)), None)


def vllm_serve_args(instance: Mapping, options: SimOptions | None = None, *,
                    dp_size: int = 1) -> list[str]:
    """The ``vllm serve`` flags (after the model) of a server running ``instance`` (a
    cluster file's instance mapping) under ``options`` (the run's; the instance's own
    values override them) with ``dp_size`` data-parallel ranks. Each flag comes from the
    :class:`~sim.options.VllmArg` of a field or an option; a flag whose ``needs`` are not
    on the line is left out. Each flag appears once."""
    ins = validate(Instance, dict(instance), "instance")
    opts = (options or SimOptions()).for_instance(_instance(ins)["overrides"])
    pairs: list[tuple[VllmArg, list[str]]] = []
    for name, f in _InstanceFields.model_fields.items():
        spec = vllm_arg(f)
        if spec is not None:
            pairs.append((spec, spec.render(dp_size if name == "dp_group" else
                                            getattr(ins, name))))
    mem = vllm_arg(NpuMem.model_fields["mem_util"])
    pairs.append((mem, mem.render(ins.npu_mem.mem_util)))
    for name, _, _, opt in declarations():
        if opt.vllm is not None:
            pairs.append((opt.vllm, opt.vllm.render(getattr(opts, name))))
    present = {args[0] for _, args in pairs if args}
    out = [a for spec, args in pairs if set(spec.needs) <= present for a in args]
    flags = [a for a in out if a.startswith("--")]
    if len(flags) != len(set(flags)):
        raise ValueError(f"a vllm serve flag is declared twice: {flags}")
    return out


# ---------------------------------------------------------------- the reference
def markdown_reference() -> str:
    """The README's cluster-file table: one row per field of these models."""
    rows = ["| field | accepts | default | `vllm serve` | meaning |", "|---|---|---|---|---|"]
    _rows(Cluster, "", rows)
    return "\n".join(rows) + "\n"


def _rows(model: type[BaseModel], prefix: str, rows: list[str]) -> None:
    options = {n: (o, kind == "bool") for n, kind, _, o in declarations()}
    for name, f in model.model_fields.items():
        ann = annotation_at(model, (name,))
        origin = getattr(ann, "__origin__", None)
        path, sub, accepts = prefix + name, None, field_rule(f)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub, below, accepts = ann, path + ".", "mapping"
        elif origin is list:
            sub, below, accepts = annotation_at(model, (name, 0)), path + "[].", "list"
        elif origin is dict:
            sub, below = annotation_at(model, (name, "x")), path + ".<hardware>."
            accepts = "mapping"
        default = reference_default(f)
        shown = "" if default is None or sub is not None else f"`{default!r}`"
        option = options[name] if model is Instance and name in INSTANCE_OPTIONS else None
        spec = vllm_arg(f) or (option[0].vllm if option else None)
        vllm = f"`{spec.spelled(bool(option and option[1]))}`" if spec is not None else ""
        meaning = (f.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {accepts} | {shown} | {vllm} | {meaning} |")
        if sub is not None:
            _rows(sub, below, rows)
