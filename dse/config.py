"""From a trial's knob values to what sim runs: a cluster config, options, a workload.

Also the pre-checks that reject a configuration before any simulation (devices over the
budget, an instance wider than a node, whatever ``sim.validate_cluster`` refuses:
weights that do not fit, tp that does not divide the heads, ..., and a KV cache that cannot
hold the workload's longest request) and the export of a configuration as the equivalent
``vllm serve`` command line.
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import dataclass
from typing import Any

from dse.space import OPTION_KNOBS, Space, pd_split
from sim.errors import InputError
from sim.options import DEFAULT_MEM_UTIL


def devices_per_instance(params: dict) -> int:
    return int(params["tp"]) * int(params["pp"])


def replicas_for(space: Space, params: dict) -> int:
    """Replicas as chosen, or as many instances as the budget holds when not a knob."""
    if params.get("replicas") is not None:
        return int(params["replicas"])
    per = devices_per_instance(params)
    per_node = space.devices_per_node // per if per <= space.devices_per_node else 0
    if per_node == 0:
        return 1  # rejected later with the reason
    nodes = space.total_devices // space.devices_per_node
    rest = space.total_devices % space.devices_per_node
    return max(1, nodes * per_node + rest // per)


def build_cluster(space: Space, params: dict) -> dict:
    """The LLMServingSim cluster mapping for one configuration."""
    hw = params.get("hardware", space.hardware[0])
    info = space.hw_info[hw]
    cd = space.cluster_defaults
    per = devices_per_instance(params)
    replicas = replicas_for(space, params)
    per_node = max(1, space.devices_per_node // per)
    pd_types: list[str | None] = [None] * replicas
    if params.get("pd") and replicas >= 2:
        n_p, n_d = pd_split(params.get("pd_ratio", "1:1"), replicas)
        pd_types = ["prefill"] * n_p + ["decode"] * n_d
    elif params.get("pd"):
        pd_types = ["prefill"]
    instance_base: dict[str, Any] = {
        "model_name": space.model, "hardware": hw,
        "npu_mem": {"mem_size": cd.get("npu_mem_size") or info.mem_size_GiB,
                    "mem_bw": cd.get("npu_mem_bw") or info.mem_bw_GBps,
                    "mem_latency": 0, "mem_util": cd.get("mem_util", DEFAULT_MEM_UTIL)},
        "num_npus": per, "tp_size": int(params["tp"]), "pp_size": int(params["pp"]),
    }
    if space.is_moe:
        instance_base["ep_size"] = int(params.get("ep", 1))
    nodes = []
    for start in range(0, replicas, per_node):
        insts = []
        for r in range(start, min(replicas, start + per_node)):
            inst = dict(instance_base)
            inst["pd_type"] = pd_types[r]
            if int(params.get("dp", 1)) > 1:
                # Consecutive replicas form data-parallel groups of dp instances.
                inst["dp_group"] = f"dp{r // int(params['dp'])}"
            insts.append(inst)
        cpu = dict(cd["cpu_mem"])
        if params.get("pim_mode", "off") != "off":
            cpu["pim_config"] = info.pim_config
            cpu["mem_size"] = max(cpu.get("mem_size", 0), info.pim_mem_GiB or 0)
        node: dict[str, Any] = {"num_instances": len(insts), "cpu_mem": cpu, "instances": insts}
        if params.get("_power") or any(o.name in ("energy_per_token", "avg_power")
                                       for o in space.objectives):
            node["power"] = cd.get("power") or default_power_block(hw, info)
        nodes.append(node)
    # The space's own link figures, as a cluster file reads them (sim/topology.py: the
    # GPU-to-GPU path, 2^30 B/s, ns per message); left out, the catalogue's physical link.
    out: dict[str, Any] = {"num_nodes": len(nodes)}
    for key in ("link_bw", "link_latency"):
        if cd.get(key) is not None:
            out[key] = cd[key]
    out["nodes"] = nodes
    if params.get("collective_algorithm", "ring") != "ring":
        out["collective_algorithm"] = params["collective_algorithm"]
    if params.get("prefix_tier", "npu") == "cxl":
        # A CXL memory expander for the lower prefix tier (space cluster defaults may override).
        out["cxl_mem"] = cd.get("cxl_mem") or {"mem_size": 512, "mem_bw": 64, "mem_latency": 250,
                                               "num_devices": 1}
    return out


def default_power_block(hw: str, info) -> dict:
    """A node power block (LLMServingSim's schema) from the hardware catalogue: the NPU idles
    at its idle power, runs at its TDP, and stays at the midpoint for 18 ms after a step.
    The host components use typical server figures; a space can give its own under
    cluster.power."""
    idle = info.power_idle_W if info.power_idle_W is not None else 50.0
    tdp = info.power_tdp_W if info.power_tdp_W is not None else 400.0
    return {"base_node_power": 60,
            "npu": {hw: {"idle_power": idle, "active_power": tdp,
                         "standby_power": (idle + tdp) / 2, "standby_duration": 18}},
            "cpu": {"idle_power": 10, "active_power": 200, "util": 0.15},
            "dram": {"dimm_size": 32, "idle_power": 2.0, "energy_per_bit": 6.0},
            "link": {"num_links": 1, "idle_power": 5, "energy_per_bit": 4.0},
            "nic": {"num_nics": 1, "idle_power": 20},
            "storage": {"num_devices": 2, "idle_power": 5}}


def sim_options(space: Space, params: dict) -> dict:
    """Keyword arguments for ``sim.SimOptions``."""
    # knobs of SimOptions fields as declared in sim/options.py (the rest shape the cluster)
    opts = {k: spec.to_option(params[k]) for k, spec in OPTION_KNOBS.items() if k in params}
    opts = {k: v for k, v in opts.items() if v is not None}  # None: SimOptions' default
    opts["latency_provider"] = space.simulator["latency_provider"]
    opts["backend"] = space.simulator["backend"]
    opts["seed"] = space.simulator["seed"]
    tier = params.get("prefix_tier", "npu")
    if tier != "npu":
        # Blocks evicted from the NPU's prefix cache are kept in CPU memory or CXL.
        opts["prefix_storage"] = tier.upper()
        opts["enable_prefix_sharing"] = bool(params.get("prefix_sharing", False))
    if params.get("pim_mode", "off") != "off":
        opts["enable_attn_offloading"] = True
        opts["pim_mode"] = params["pim_mode"]
        opts["enable_sub_batch_interleaving"] = bool(params.get("sub_batch_interleaving", False))
    if space.simulator.get("max_sim_time_s"):
        opts["max_sim_time_ns"] = int(space.simulator["max_sim_time_s"] * 1e9)
    return opts


@dataclass
class TrialConfig:
    """Everything one trial evaluates, plain data so it travels to a worker."""

    number: int
    params: dict
    cluster: dict
    options: dict
    devices_used: int
    summary: dict


def make_trial_config(space: Space, number: int, params: dict) -> TrialConfig:
    params = space.complete(params)
    cluster = build_cluster(space, params)
    replicas = replicas_for(space, params)
    per = devices_per_instance(params)
    n_inst = sum(len(n["instances"]) for n in cluster["nodes"])
    summary = {"num_nodes": cluster["num_nodes"], "num_instances": n_inst,
               "devices_per_instance": per, "replicas": replicas,
               "devices_used": n_inst * per, "hardware": params["hardware"]}
    if params.get("pd"):
        summary["prefill_instances"] = sum(
            i["pd_type"] == "prefill" for n in cluster["nodes"] for i in n["instances"])
    return TrialConfig(number, params, cluster, sim_options(space, params),
                       n_inst * per, summary)


def sim_inputs(cfg: TrialConfig):
    """The trial's cluster and options as sim takes them (the ``auto`` backend made the
    in-process one: nothing here runs it). Raises InputError for what sim refuses."""
    import sim
    from dse.worker import resolve_backend

    cluster = sim.parse_cluster(cfg.cluster, source=f"trial {cfg.number}")
    return cluster, sim.SimOptions(**resolve_backend(cfg.options, "inproc"))


def precheck(space: Space, cfg: TrialConfig) -> str | None:
    """Why this configuration cannot work, or None. Asks sim for everything model-related."""
    per = cfg.summary["devices_per_instance"]
    if per > space.devices_per_node:
        return (f"an instance needs tp*pp={per} devices but a node has "
                f"{space.devices_per_node} (budget.devices_per_node)")
    if cfg.devices_used > space.total_devices:
        return (f"uses {cfg.devices_used} devices ({cfg.summary['replicas']} replicas x {per}), "
                f"over the budget of {space.total_devices}")
    if cfg.params.get("pd") and cfg.summary["replicas"] < 2:
        return "PD disaggregation needs at least 2 instances (one prefill, one decode)"
    from sim.options import vllm_refusal

    p = cfg.params
    why = vllm_refusal(int(p["max_num_seqs"]), int(p["max_num_batched_tokens"]),
                       int(p["block_size"]))
    if why:
        return why
    try:
        import sim

        cluster, opts = sim_inputs(cfg)
        sim.validate_cluster(cluster, opts)
        return (provider_refusal(cluster, opts)
                or longest_request_refusal(space, sim.kv_capacity(cluster, opts)))
    except InputError as exc:
        msg = str(exc)
        return msg.split(": ", 1)[1] if msg.startswith(f"trial {cfg.number}: ") else msg


@functools.lru_cache(maxsize=1)
def _providers():
    """sim's latency-provider registry, its modules imported once."""
    from sim.latency.base import load_providers

    return load_providers()


def provider_refusal(cluster, opts) -> str | None:
    """Why the latency provider the space names (not ``auto``, which falls back) cannot
    answer for an instance, from the provider's own coverage check (no build), or None:
    the simulation would stop at building it (a measured bundle without this hardware,
    model precision or tp)."""
    from sim.validate import instance_model

    registry = None
    for inst in cluster.instances:
        o = opts.for_instance(inst.overrides)
        if o.latency_provider == "auto":
            continue
        registry = registry or _providers()
        if o.latency_provider not in registry:
            continue
        model = instance_model(inst, o)
        why = registry.get(o.latency_provider).covers(model, inst.hardware, inst.tp_size,
                                                       o.profiles_dirs)
        if why:
            return (f"the {o.latency_provider} latency provider does not cover "
                    f"{model.name} on {inst.hardware} tp={inst.tp_size}: {why}")
    return None


def longest_request_refusal(space: Space, capacities) -> str | None:
    """Why the KV cache cannot hold the workload's longest request even alone, or None:
    the simulation would stop at it and vLLM would refuse to start with a max_model_len
    that serves it (or start and never schedule it). The workload is built only for an
    instance that cannot hold a request of its own max_model_len (e.g. the model's 131,072
    positions on a 24 GB card); every other holds whatever request it serves. dse's
    instances of one configuration share their options, so the prefill instances of PD
    hold as much as the decode ones that must hold the whole request."""
    for cap in capacities:
        if cap.holds(cap.max_model_len):
            continue
        longest = _longest_sequence(space, cap.max_model_len)
        if longest and not cap.holds(longest):
            vllm = (f"would refuse to start with --max-model-len {longest}"
                    if cap.start_refusal(longest) else
                    f"would start with --max-model-len {longest} but never schedule it")
            return (f"the KV cache cannot hold the workload's longest request even alone: "
                    f"{longest:,} tokens (prompt + output) against at most "
                    f"{cap.longest_request:,} in instance {cap.instance_id} "
                    f"({cap.budget.num_blocks:,} KV blocks of {cap.block_size}, one of them "
                    f"vLLM's null block); vLLM {vllm}")
    return None


_WORKLOAD: dict[str, Any] = {}
_LONGEST: dict[tuple[str, int], int] = {}


def _longest_sequence(space: Space, max_model_len: int) -> int:
    """The space workload's ``longest_sequence`` (kept per workload and length)."""
    key = (json.dumps(space.workload, sort_keys=True, default=str), max_model_len)
    if key not in _LONGEST:
        if len(_LONGEST) > 64:
            _LONGEST.clear()
        _LONGEST[key] = space_workload(space).longest_sequence(max_model_len)
    return _LONGEST[key]


def space_workload(space: Space):
    """The space's workload, built as the workers build it (the same requests every trial
    simulates; a capacity search's other rates draw the same lengths). The last one built
    is kept."""
    import sim

    wl = space.workload
    key = json.dumps(wl, sort_keys=True, default=str)
    if key not in _WORKLOAD:
        _WORKLOAD.clear()
        _WORKLOAD[key] = (sim.load_jsonl(wl["path"], limit=wl.get("limit"))
                          if wl["kind"] == "file"
                          else sim.generate(sim.workload_from_mapping(dict(wl["spec"]))))
    return _WORKLOAD[key]


def check_space_cluster(space: Space) -> None:
    """Refuse, at load, cluster settings sim would refuse in every trial (a space's
    ``cluster:`` block builds every trial's cluster): one probe cluster, parsed by sim."""
    import sim

    params = space.complete({})
    try:
        sim.parse_cluster(build_cluster(space, params), source="cluster")
    except InputError as exc:
        raise InputError(f"{space.path}: {exc}") from None


def vllm_command(space: Space, params: dict, dp_size: int | None = None,
                 max_model_len: int | None = None) -> str:
    """The ``vllm serve`` command line of one server of this configuration: an instance,
    or a data-parallel group of ``dp_size`` instances (default: the configuration's dp on
    an MoE model, else 1), with ``--max-model-len`` where ``max_model_len`` is given. Its
    flags are generated from the declarations of the cluster fields and options they set
    (``sim.cluster_schema.vllm_serve_args``)."""
    import sim
    from sim.cluster_schema import vllm_serve_args
    from sim.options import OPTION_NAMES

    p = space.complete(params)
    instance = build_cluster(space, p)["nodes"][0]["instances"][0]
    opts = {k: v for k, v in sim_options(space, p).items() if k in OPTION_NAMES}
    if max_model_len is not None:
        opts["max_model_len"] = max_model_len
    if dp_size is None:
        dp_size = int(p.get("dp", 1)) if space.is_moe else 1
    args = ["vllm", "serve", space.model,
            *vllm_serve_args(instance, sim.SimOptions(**opts), dp_size=dp_size)]
    return " ".join(shlex.quote(a) for a in args)
