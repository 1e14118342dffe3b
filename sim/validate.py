"""Cluster checks before anything is built: each refusal names the file and the field.

:func:`validate_cluster` raises :class:`~sim.errors.InputError` for a cluster the simulator
cannot run with these options: unknown names, tp that does not divide the heads, weights
that do not fit, DP groups whose members differ, PD roles without a partner, a prefix tier
or PIM offload without the memory it needs, and features not modelled yet. One function
per concern, called in the order the user would fix them.
"""

from __future__ import annotations

from sim.cluster import ClusterConfig, InstanceConfig, unsupported_features
from sim.errors import InputError
from sim.memory import memory_budget
from sim.metrics import MAX_SERIES_BUCKETS  # the time series' row cap (arrivals are held to it)
from sim.model import ModelSpec, expert_shard_ranks, load_model, served_model
from sim.options import SimOptions
from sim.power import PowerModel


def instance_model(inst: InstanceConfig, opts: SimOptions, where: str | None = None) -> ModelSpec:
    """The model as ``inst`` serves it: its precision (quantization, kv_cache_dtype) applied."""
    return served_model(inst.model_name, inst.hardware, opts.quantization, opts.kv_cache_dtype,
                        source=where)


def validate_cluster(cluster: ClusterConfig, opts: SimOptions) -> None:
    """Raise InputError if the cluster cannot be simulated: unknown names, tp that does not
    divide the heads, weights that do not fit, or features not modelled yet."""
    opts.validate()
    problems = unsupported_features(cluster)
    if problems:
        raise InputError(problems[0])
    _check_instances(cluster, opts)
    PowerModel(cluster, opts.timeseries_interval_ns)  # complete power blocks, or none
    _check_pim(cluster, opts)
    groups = _check_experts(cluster)
    _check_dp_groups(cluster, opts, groups)
    _check_ep_domains(cluster, groups)
    _check_pd_roles(cluster)
    _check_prefix_tiers(cluster, opts)


def _where(cluster: ClusterConfig, inst: InstanceConfig) -> str:
    return f"{cluster.source}: instance {inst.instance_id}"


#: KV blocks a whole cluster may have: the simulator keeps state per block (~30 bytes),
#: so 2**25 blocks is about 1 GB; npu_mem.mem_size 10**6 GiB (5 * 10**8 blocks) took a
#: minute and 14 GB, 20,000 H100 instances on one node ran out of time and memory
MAX_KV_BLOCKS = 2**25


def _check_instances(cluster: ClusterConfig, opts: SimOptions) -> None:
    """Each instance's own options, model, tp and memory; the cluster's KV blocks."""
    total = 0
    for inst in cluster.instances:
        where = _where(cluster, inst)
        o = opts.for_instance(inst.overrides)
        o.validate()
        model = instance_model(inst, o, where)
        model.check_tp(inst.tp_size, source=where)
        model.check_pp(inst.pp_size, source=where)
        dp = dp_group_size(cluster, inst)
        model.check_weight_blocks(inst.tp_size, expert_shard_ranks(inst.tp_size, inst.ep_size, dp),
                                  source=where)
        blocks = memory_budget(inst, model, o.block_size, o.max_num_batched_tokens,
                               o.max_num_seqs, dp).num_blocks
        total += blocks
        if total > MAX_KV_BLOCKS:
            raise InputError(
                f"{where}: the cluster's KV caches reach {total:,} blocks here (this "
                f"instance: {blocks:,}, from npu_mem.mem_size={inst.npu_mem.mem_size_gib:g} "
                f"GiB or num_gpu_blocks_override); allowed: at most {MAX_KV_BLOCKS:,} in "
                "all (the simulator keeps state per block): fewer instances or less memory")


def _check_pim(cluster: ClusterConfig, opts: SimOptions) -> None:
    """PIM offload needs PIM devices that fit in each node's CPU memory; sub-batch
    interleaving needs pp 1 (as in NeuPIMs)."""
    if opts.enable_attn_offloading:
        from sim.pim import load_pim

        for node in cluster.nodes:
            if not node.pim_config:
                raise InputError(f"{cluster.source}: --enable-attn-offloading needs PIM devices: "
                                 f"nodes[{node.node_id}].cpu_mem has no pim_config")
            dev = load_pim(str(node.pim_config),
                           source=f"{cluster.source}: nodes[{node.node_id}].cpu_mem.pim_config")
            if node.cpu_mem.mem_size_gib < dev.capacity_GiB:
                raise InputError(f"{cluster.source}: nodes[{node.node_id}].cpu_mem.mem_size="
                                 f"{node.cpu_mem.mem_size_gib} GiB holds no whole {dev.name} "
                                 f"device ({dev.capacity_GiB} GiB)")
    if opts.enable_sub_batch_interleaving:
        for inst in cluster.instances:
            if inst.pp_size > 1:
                raise InputError(f"{_where(cluster, inst)}: sub-batch "
                                 f"interleaving is not supported with pp_size={inst.pp_size} > 1 "
                                 "(as in NeuPIMs)")


def _check_experts(cluster: ClusterConfig) -> dict[str, list[InstanceConfig]]:
    """ep_size only on MoE models, dividing their experts; returns the DP groups."""
    groups: dict[str, list[InstanceConfig]] = {}
    for inst in cluster.instances:
        model = load_model(inst.model_name)
        where = _where(cluster, inst)
        if inst.ep_size > 1:
            if not model.is_moe:
                raise InputError(f"{where}: ep_size={inst.ep_size} but {model.name} is not a "
                                 "mixture-of-experts model")
            if model.num_experts % inst.ep_size:
                raise InputError(f"{where}: ep_size={inst.ep_size} does not divide the "
                                 f"{model.num_experts} experts of {model.name}")
        if inst.dp_group is not None:
            groups.setdefault(str(inst.dp_group), []).append(inst)
    return groups


def _check_dp_groups(cluster: ClusterConfig, opts: SimOptions,
                     groups: dict[str, list[InstanceConfig]]) -> None:
    """Members of a DP group step together: same model, shape, hardware and exchange."""
    for name, members in groups.items():
        first = members[0]
        for m in members[1:]:
            for field in ("model_name", "tp_size", "pp_size", "ep_size", "hardware"):
                if getattr(m, field) != getattr(first, field):
                    raise InputError(
                        f"{cluster.source}: dp_group {name!r}: instance {m.instance_id} has "
                        f"{field}={getattr(m, field)!r} but instance {first.instance_id} has "
                        f"{getattr(first, field)!r}; members of a DP group must match")
            a, b = (opts.for_instance(i.overrides).all2all_backend for i in (m, first))
            if a != b:
                raise InputError(f"{cluster.source}: dp_group {name!r}: instance {m.instance_id} "
                                 f"has all2all_backend={a!r} but instance {first.instance_id} "
                                 f"has {b!r}; members of a DP group must match")


def _check_ep_domains(cluster: ClusterConfig, groups: dict[str, list[InstanceConfig]]) -> None:
    """The experts shard over the instance, or its whole DP group."""
    for inst in cluster.instances:
        if inst.ep_size > 1:
            domain = groups.get(str(inst.dp_group), [inst]) if inst.dp_group is not None else [inst]
            npus = sum(m.num_npus for m in domain)
            if npus % inst.ep_size:
                raise InputError(
                    f"{cluster.source}: instance {inst.instance_id}: its expert-parallel domain "
                    f"(the instance, or its dp_group) has {npus} NPU(s), not a multiple of "
                    f"ep_size={inst.ep_size}")


def _check_pd_roles(cluster: ClusterConfig) -> None:
    """With PD disaggregation every instance has a role and each role a partner."""
    roles = [i.pd_type for i in cluster.instances]
    if not any(roles):
        return
    if not all(roles):
        raise InputError(f"{cluster.source}: with prefill/decode disaggregation every "
                         "instance needs pd_type 'prefill' or 'decode'")
    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        if role in roles and other not in roles:
            raise InputError(f"{cluster.source}: pd_type {role!r} instances need at least one "
                             f"{other!r} instance to pair with")
    if len({i.model_name for i in cluster.instances}) > 1:
        raise InputError(f"{cluster.source}: prefill and decode instances must serve the "
                         "same model")


def _check_prefix_tiers(cluster: ClusterConfig, opts: SimOptions) -> None:
    """A lower prefix tier needs its memory; sharing needs one model per node."""
    if opts.prefix_storage == "CXL" and not cluster.cxl_mem:
        raise InputError(f"{cluster.source}: --prefix-storage CXL needs a cxl_mem block in the "
                         "cluster config")
    if opts.prefix_storage == "CPU":
        for node in cluster.nodes:
            if node.cpu_mem is None:
                raise InputError(f"{cluster.source}: nodes[{node.node_id}] has no cpu_mem for "
                                 "--prefix-storage CPU")
    if opts.enable_prefix_sharing:
        for node in cluster.nodes:
            if len({i.model_name for i in node.instances}) > 1:
                raise InputError(f"{cluster.source}: nodes[{node.node_id}]: prefix sharing needs "
                                 "every instance of the node to serve the same model")


def dp_group_size(cluster: ClusterConfig, inst: InstanceConfig) -> int:
    """Members of ``inst``'s DP group (1 outside one)."""
    if inst.dp_group is None:
        return 1
    return sum(1 for i in cluster.instances if str(i.dp_group) == str(inst.dp_group))


def check_workload(workload, cluster: ClusterConfig, opts: SimOptions) -> None:
    """Refuse a workload this cluster cannot replay, before anything is built: arrivals
    (with a session's tool pauses) so late that the time series would not fit, or token
    ids past the model's vocabulary (vLLM refuses such a prompt: "Token id ... is out of
    vocabulary"). Closed-loop workloads ignore their arrival times."""
    if not workload.closed_loop_clients or workload.paced:
        check_span(workload, opts.timeseries_interval_ns)
    vocab, name = min((instance_model(i, opts.for_instance(i.overrides)).vocab_size,
                       i.model_name) for i in cluster.instances)
    check_token_ids(workload, vocab, name)


def check_token_ids(workload, vocab: int, model_name: str) -> None:
    """Every token id of the workload inside ``vocab``."""
    for r in workload.all_requests():
        for key, ids in (("input_tok_ids", r.input_ids), ("output_tok_ids", r.output_ids)):
            if ids is not None and len(ids) and max(ids) >= vocab:
                raise InputError(f"{workload.source}: request {r.rid}: {key} holds token id "
                                 f"{max(ids)}, out of the vocabulary of {model_name} "
                                 f"(vocab_size={vocab}); allowed: 0..{vocab - 1}")


def check_span(workload, interval: int) -> None:
    """The latest start (arrival plus a session's tool pauses) within the time series'
    :data:`MAX_SERIES_BUCKETS` rows of ``interval`` ns."""
    src = workload.source
    for first in workload.requests:
        t, r = first.arrival_ns, first.next_sub
        while r is not None:  # a later turn starts at least its tool pause after
            t, r = t + r.tool_ns, r.next_sub
        if t // interval >= MAX_SERIES_BUCKETS:
            need = t // (MAX_SERIES_BUCKETS * 10**9) + 1  # whole seconds a row
            raise InputError(
                f"{src}: request {first.rid} starts {t / 1e9:.4g} s into the run (arrival "
                "plus its session's tool pauses); the time series would need "
                f"{t // interval + 1:,} rows of {interval / 1e9:g} s; allowed: at most "
                f"{MAX_SERIES_BUCKETS:,} (--timeseries-interval-s {need} or more, or earlier "
                "arrivals)")
