# mypy: disable-error-code="union-attr,index,arg-type,attr-defined"
# (compiled by mypyc where a C compiler is at hand: sim/native.py. Those checks stay off
# because an Optional read after a guard compiles to a generic, checked operation.)
"""The main loop: LLMServingSim's 10 steps as a discrete-event loop over instances.

Per event time ``now`` (integer ns): route the requests that have arrived; retire the
iterations that end now (tokens, finished requests, released session turns and
closed-loop follow-ups); then every idle instance schedules its next batch, the backend
times it, and its completion becomes the next event. When every instance is idle the
clock jumps to the next arrival. An event leap (sim.leap) advances an instance over many
such event times at once, in one instance's case through an arrival's admission too
(``_Run._try_leap``). No I/O, logging or pandas inside the loop.
"""

from __future__ import annotations

import heapq
import logging
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import accumulate
from operator import lt
from typing import Final

from astrasim import GraphBuilder

from sim.backend import SystemBackend, make_backend
from sim.cluster import ClusterConfig, GiB, InstanceConfig
from sim.errors import InputError
from sim.gate import GATE_POLICIES
from sim.kv_cache import KVCacheManager, PrefixTier, private_depths
from sim.leap import (LeapPlan, apply_leap, finished_in, finishing, plan_leap, segment_end,
                      steady_decode, step_shape)
from sim.latency.base import AUTO_ORDER, BatchShape, LatencyProvider, load_providers
from sim.memory import MemoryBudget, effective_max_model_len, memory_budget
from sim.metrics import GapRuns, RunResult, TimeSeries, stats_ms, summarize
from sim.model import ModelSpec, load_model  # noqa: F401  (sim.engine.load_model, as before)
from sim.moe_wave import MoEWave, cudagraph_size, max_capture_size
from sim.options import SimOptions
from sim.power import PowerModel, iteration_link_bytes, iteration_memory_bytes
from sim.request import Request
from sim.router import ROUTING_POLICIES
from sim.scheduler import Batch, Scheduler
from sim.topology import (ASTRA, Link, Topology, check_links, group_topology, instance_topology,
                          intra_node_link, link_between, transfer_topology)
from sim.validate import dp_group_size, instance_model, validate_cluster
from sim.workload import Workload


_log = logging.getLogger("sim.memory")

#: an entry of the heap of steps in flight: (end time, push order, unit, payload), the
#: payload a list of the unit's (instance, batch) pairs, a landed PD transfer's request,
#: or None
InFlight = tuple[int, int, int, list | Request | None]


@dataclass
class InstanceRuntime:
    instance_id: int
    config: InstanceConfig
    model: ModelSpec
    opts: SimOptions
    tp: int
    pp: int
    num_kv_blocks: int
    provider: LatencyProvider
    scheduler: Scheduler
    lower_tier: PrefixTier | None = None
    pim: object | None = None
    #: the instance's own ASTRA-Sim network (TP group x pipeline stages)
    network: Topology | None = None
    #: vLLM's memory accounting behind num_kv_blocks (None when the KV cache lives in PIM)
    memory: MemoryBudget | None = None


def _max_model_len(inst: InstanceRuntime) -> int:
    """vLLM's max_model_len: the option where given, else the model's position limit."""
    return effective_max_model_len(inst.opts, inst.model)


def _log_memory(inst: InstanceRuntime) -> None:
    if inst.memory is not None and _log.isEnabledFor(logging.INFO):
        for line in inst.memory.log_lines(_max_model_len(inst)):
            _log.info("instance %d: %s", inst.instance_id, line)


def _resolve_provider(kind: str, inst: InstanceConfig, model: ModelSpec, opts: SimOptions,
                      where: str = "<cluster>") -> LatencyProvider:
    """Build the instance's provider; ``auto`` takes the first of measured > aic > roofline
    that covers (hardware, model at its precision, tp) and builds, and records why."""
    registry = load_providers()
    kw = {"profiles_dirs": opts.profiles_dirs, "max_tokens": max(opts.max_num_batched_tokens, 16384),
          "max_seqs": max(opts.max_num_seqs, 1024), "ep_size": inst.ep_size}
    if kind != "auto":
        try:
            return registry.create(kind, model, inst.hardware, inst.tp_size,
                                   source="--latency-provider", **kw)
        except InputError as exc:
            if kind not in registry:
                raise
            raise InputError(f"instance {inst.instance_id} (hardware={inst.hardware!r}, "
                             f"{kind} latency): {exc}", source=where) from None
    skipped: list[str] = []
    for name in AUTO_ORDER:
        if name not in registry:
            continue
        why_not = registry.get(name).covers(model, inst.hardware, inst.tp_size,
                                            opts.profiles_dirs)
        if why_not is None:
            if registry.get(name).exact_coverage:  # a build error is the user's to fix
                prov = _resolve_provider(name, inst, model, opts, where)
                prov.note = f"auto picked {name}" + (f" ({'; '.join(skipped)})" if skipped else "")
                return prov
            try:
                prov = registry.create(name, model, inst.hardware, inst.tp_size, **kw)
            except InputError as exc:  # covered on paper but cannot build: try the next
                why_not = f"cannot build: {exc}"
            else:
                prov.note = f"auto picked {name}" + (f" ({'; '.join(skipped)})" if skipped else "")
                return prov
        skipped.append(f"{name}: {why_not}")
    # Nothing covers it: the last resort's own error names the problem (e.g. an unknown
    # hardware with the known ones listed).
    prov = _resolve_provider(AUTO_ORDER[-1], inst, model, opts, where)
    prov.note = "auto: " + "; ".join(skipped)
    return prov


def cudagraph_padding(opts: SimOptions) -> list[int] | None:
    """vLLM 0.19's CUDA-graph padding table for ``opts`` (entry t: the capture size a t-token
    step runs as, up to max_cudagraph_capture_size, default min(2 x max_num_seqs, 512));
    None in eager mode (max_cudagraph_capture_size 0)."""
    cap = max_capture_size(opts)
    if cap <= 0:
        return None
    return [0] + [cudagraph_size(t, cap) or t for t in range(1, cap + 1)]  # (t <= cap: a size)


def build_instances(cluster: ClusterConfig, opts: SimOptions) -> list[InstanceRuntime]:
    validate_cluster(cluster, opts)
    check_links(cluster)
    out = []
    for inst in cluster.instances:
        o = opts.for_instance(inst.overrides)
        model = instance_model(inst, o)
        budget = memory_budget(inst, model, o.block_size, o.max_num_batched_tokens, o.max_num_seqs,
                               dp_group_size(cluster, inst))
        blocks = budget.num_blocks
        pim = None
        if o.enable_attn_offloading:
            pim = _build_pim(cluster, inst, model, o)
            # The KV cache lives in the PIM devices: the instance's share of them.
            blocks = int(pim.capacity_GiB * GiB // (model.kv_bytes_per_token(1, 1) * o.block_size))
        kv = KVCacheManager(blocks, o.block_size, o.enable_prefix_caching)
        provider = _resolve_provider(o.latency_provider, inst, model, o, cluster.source)
        provider.set_cudagraph_padding(cudagraph_padding(o))
        out.append(InstanceRuntime(inst.instance_id, inst, model, o, inst.tp_size, inst.pp_size,
                                   blocks, provider, Scheduler(inst.instance_id, o, kv), pim=pim,
                                   network=instance_topology(cluster, inst),
                                   memory=None if pim is not None else budget))
        _log_memory(out[-1])
    return out


def _build_pim(cluster: ClusterConfig, inst: InstanceConfig, model: ModelSpec, opts: SimOptions):
    from sim.pim import PimAttention, load_pim

    node = cluster.nodes[inst.node_id]
    dev = load_pim(str(node.pim_config))
    devices = int(node.cpu_mem.mem_size_gib // dev.capacity_GiB) // len(node.instances)
    if devices < 1:
        raise InputError(f"{cluster.source}: nodes[{node.node_id}] has too few {dev.name} PIM "
                         f"devices to give instance {inst.instance_id} one")
    if opts.pim_mode == "local":
        # host memory's bus, given to ASTRA-Sim as LLMServingSim gives it (unchanged, one hop)
        link = Link("FullyConnected", node.cpu_mem.mem_bw_GBps, node.cpu_mem.mem_latency_ns,
                    "host memory", ASTRA)
    else:
        link = intra_node_link(cluster, inst)
    return PimAttention(dev, devices, model, inst.tp_size, link)


def _pim_layers_graph(layers: int, subs: list[tuple[int, int, int, int]]):
    """Graphs of ``layers`` decoder layers with decode attention on PIM (NPU 0 the
    accelerator, NPU 1 the PIM devices). Each sub-batch (pre-attention NPU ns, PIM ns,
    post-attention NPU ns, q bytes) is a chain: pre -> SEND q -> PIM compute -> SEND out
    -> post -> next layer's pre. Sub-batches are independent chains, so with two of them
    one's NPU work overlaps the other's PIM attention (NeuPIMs); each device still runs
    one computation at a time."""
    npu, pim = GraphBuilder(0), GraphBuilder(1)
    last: list[int | None] = [None] * len(subs)  # (each chain's last node)
    tag = 0
    for _layer in range(layers):
        for s, (pre, att, post, qb) in enumerate(subs):
            deps = [] if last[s] is None else [last[s]]
            a = npu.comp(max(1, pre), deps=deps, name="npu_pre_attention")
            npu.send(1, qb, tag=tag + 1, deps=[a], name="q_to_pim")
            r = pim.recv(0, qb, tag=tag + 1, deps=[], name="q_at_pim")
            c = pim.comp(max(1, att), deps=[r], name="pim_attention")
            pim.send(0, qb, tag=tag + 2, deps=[c], name="out_from_pim")
            o = npu.recv(1, qb, tag=tag + 2, deps=[], name="out_at_npu")
            last[s] = npu.comp(max(1, post), deps=[o], name="npu_post_attention")
            tag += 2
    return {0: npu.build(), 1: pim.build()}


def pim_iteration_ns(backend, inst: InstanceRuntime, shape: BatchShape, interleave: bool) -> int:
    """An iteration with decode attention offloaded to PIM, timed by the system backend.

    The NPU runs every dense layer and the prefill attention (its time comes from the
    backend for the batch without decodes, TP communication included); PIM runs the decode
    attention; q and the attention output cross the NPU-PIM link as SEND/RECV. With
    sub-batch interleaving the batch splits into two halves that pipeline through NPU and
    PIM. Layers repeat, so two layers are simulated and the rest extrapolated from the
    steady-state difference (layer-block reuse)."""
    layers = inst.model.num_hidden_layers
    pim = inst.pim
    network = transfer_topology(pim.link)

    def sub_batch(part: BatchShape, nd: int, kv_sum: int, kv_max: int):
        npu_shape = BatchShape(part.num_tokens, part.num_seqs, part.prefill_tokens,
                               part.prefill_kv, 0, 0, 0, 0)
        total = backend.iteration_ns(inst, npu_shape)
        lt = inst.provider.layer_times(npu_shape)
        ends = sum(t for _, t in lt.prologue) + sum(t for _, t in lt.head)
        per_layer = max(0, total - ends) / layers
        names = [n for n, _ in lt.block]
        cut = names.index("attention") + 1 if "attention" in names else 0
        block = sum(t for _, t in lt.block) or 1
        pre = per_layer * sum(t for _, t in lt.block[:cut]) / block
        return ends, (int(pre), pim.attention_ns(nd, kv_sum, kv_max),
                      int(per_layer - pre), pim.q_bytes(nd))

    if interleave and shape.num_decode >= 2:
        nd_a = shape.num_decode // 2
        half = BatchShape(max(1, shape.num_tokens // 2), max(1, shape.num_seqs // 2),
                          shape.prefill_tokens // 2, shape.prefill_kv // 2, 0, 0, 0, 0)
        ends, a = sub_batch(half, nd_a, shape.decode_kv_sum // 2, shape.decode_kv_max)
        _, b = sub_batch(half, shape.num_decode - nd_a, shape.decode_kv_sum - shape.decode_kv_sum // 2,
                         shape.decode_kv_max)
        subs = [a, b]
    else:
        ends, one = sub_batch(shape, shape.num_decode, shape.decode_kv_sum, shape.decode_kv_max)
        subs = [one]
    t1 = backend.run_graphs(network, _pim_layers_graph(1, subs), name="pim1")
    if layers == 1:
        return ends + t1
    t2 = backend.run_graphs(network, _pim_layers_graph(2, subs), name="pim2")
    return int(ends + t1 + (layers - 1) * (t2 - t1))


def kv_transfer_ns(backend, cluster: ClusterConfig, src: InstanceRuntime,
                   dst: InstanceRuntime, tokens: int) -> tuple[int, int]:
    """(ns, bytes) to move ``tokens`` tokens of KV from a prefill to a decode instance.

    Each of the source's tp ranks sends its shard over its own link, in parallel: the
    backend simulates one rank's SEND of its shard to its decode-side peer (a RECV) over the
    link between the two instances.
    """
    shard = src.model.kv_bytes_per_token(src.tp, src.pp) * tokens
    network = transfer_topology(link_between(cluster, src.config, dst.config))
    send, recv = GraphBuilder(0), GraphBuilder(1)
    send.send(1, shard, tag=1, name="kv_send")
    recv.recv(0, shard, tag=1, name="kv_recv")
    t = backend.run_graphs(network, {0: send.build(), 1: recv.build()}, name="kv_transfer")
    return t, shard * src.tp * src.pp


def _build_tiers(cluster: ClusterConfig, opts: SimOptions,
                 instances: list[InstanceRuntime]) -> None:
    """Create the lower prefix-cache tiers: per instance, or one per node when shared."""
    if opts.prefix_storage is None or not opts.enable_prefix_caching:
        return
    for node in cluster.nodes:
        members = [i for i in instances if i.config.node_id == node.node_id]
        if opts.prefix_storage == "CPU":
            size_gib = node.cpu_mem.mem_size_gib
            bw, lat = node.cpu_mem.mem_bw_GBps, node.cpu_mem.mem_latency_ns
        else:
            cxl = cluster.cxl_mem
            size_gib, bw, lat = cxl["mem_size"], cxl["mem_bw"], cxl.get("mem_latency", 0)
        shared = None
        for inst in members:
            block_bytes = inst.model.kv_bytes_per_token(1, 1) * inst.opts.block_size
            inst.scheduler.tier_block_bytes = block_bytes
            share = size_gib if opts.enable_prefix_sharing else size_gib / len(members)
            cap = int(share * GiB // block_bytes)
            if opts.enable_prefix_sharing:
                if shared is None:
                    shared = PrefixTier(opts.prefix_storage, cap, bw, lat)
                tier = shared
            else:
                tier = PrefixTier(opts.prefix_storage, cap, bw, lat)
            inst.lower_tier = tier
            inst.scheduler.kv.lower_tier = tier


def _scheduling_units(instances: list[InstanceRuntime]) -> list[list[int]]:
    """Instances that step together. Members of a DP group serving an MoE model run in
    waves (they meet at every MoE all-to-all); every other instance steps alone."""
    units: list[list[int]] = []
    by_group: dict[str, list[int]] = {}
    for idx, inst in enumerate(instances):
        g = inst.config.dp_group
        if g is not None and inst.model.is_moe:
            if str(g) not in by_group:
                by_group[str(g)] = []
                units.append(by_group[str(g)])
            by_group[str(g)].append(idx)
        else:
            units.append([idx])
    return units


def _tier_loads_ns(instances, payload) -> int:
    """Time to load lower-tier prefix hits for steps whose graph is not built per node."""
    return sum(instances[idx].lower_tier.load_ns(b.tier_load_bytes)
               for idx, b in payload if b.tier_load_bytes)


#: steps a stretch's plan covers past those the last step's time fits before the horizon
#: (``_Run._step_cap``). Counted in instructions, the 3k-request synthetic run costs ~1%
#: less with 6 than with 16 (shorter tables, fewer finishes accounted for) and more with
#: 3 or 2 (stretches cut short where steps got shorter than the last one, as a batch
#: shrinks: the next stretch is planned anew)
STEP_CAP_MARGIN: Final = 6

#: the dummy step an idle DP-group member runs so that it joins the collectives (vLLM)
DUMMY_SHAPE = BatchShape(num_tokens=1, num_seqs=1, prefill_tokens=1)


def _fresh_requests(workload: Workload) -> list[Request]:
    """Copies of the workload's requests (so a Workload can be simulated many times)."""
    out = []
    for head in workload.requests:
        prev: Request | None = None
        r: Request | None = head
        while r is not None:
            c = Request(r.rid, r.arrival_ns, r.input_len, r.output_len, r.input_ids, r.output_ids,
                        r.session_id, r.sub_index, r.tool_ns)
            c.priority = r.priority
            if prev is None:
                out.append(c)
            else:
                prev.next_sub = c
            prev = c
            r = r.next_sub
    return out


class Simulator:
    """One simulation of a cluster. Reusable: ``run`` may be called with new workloads."""

    def __init__(self, cluster: ClusterConfig, opts: SimOptions,
                 backend: SystemBackend | None = None) -> None:
        self.cluster = cluster
        self.opts = opts
        self.instances = build_instances(cluster, opts)
        self._owns_backend = backend is None
        self.backend = backend if backend is not None else make_backend(opts)
        self.moe_wave = MoEWave(self.backend,
                                lambda members, npus: group_topology(cluster, members, npus),
                                lambda inst, tp: _resolve_provider(
                                    inst.provider.kind, replace(inst.config, tp_size=tp),
                                    inst.model, inst.opts, cluster.source))
        PowerModel(cluster, opts.timeseries_interval_ns)  # validates the power blocks early

    def run(self, workload: Workload) -> RunResult:
        """Simulate ``workload`` from an empty cluster (the workload is not modified)."""
        return _Run(self, workload).loop()

    def _moe_wave_ns(self, members: list[InstanceRuntime], shapes: list[BatchShape | None],
                     gate) -> int:
        """One lockstep step of an expert-parallel domain (a DP group serving an MoE model,
        or one instance with ep > 1); ``shapes[i]`` is None for an idle member, which runs
        a dummy batch. See ``sim.moe_wave``."""
        return self.moe_wave.step_ns(members, shapes, gate)

    def describe(self) -> dict:
        kinds = sorted({i.provider.kind for i in self.instances})
        return {
            "latency_provider": kinds[0] if len(kinds) == 1 else "mixed:" + ",".join(kinds),
            "latency_source": {str(i.instance_id): i.provider.source for i in self.instances},
            "latency_note": {str(i.instance_id): i.provider.note for i in self.instances
                             if i.provider.note},
            "precision": {str(i.instance_id): i.model.precision for i in self.instances},
            "backend": self.backend.name,
            "num_instances": len(self.instances),
            "num_npus": sum(i.config.num_npus for i in self.instances),
            "kv_blocks": {str(i.instance_id): i.num_kv_blocks for i in self.instances},
            "kv_cache": {str(i.instance_id): i.memory.as_dict(_max_model_len(i))
                         for i in self.instances if i.memory is not None},
            "energy_j": None,
            "power_modelled": bool(self.cluster.nodes and all(n.power for n in self.cluster.nodes)),
        }

    def close(self) -> None:
        """Release the backend if this simulator created it (a caller's is left running)."""
        if self._owns_backend:
            self.backend.close()


class _Run:
    """One ``Simulator.run``: the state of the discrete-event loop and its steps, by concern.

    The event core (``loop``) picks the next event time; arrivals are routed
    (``_route_due``); iterations that end are retired (``_retire_due``: tokens,
    completions, follow-up arrivals, PD hand-offs); idle units schedule and time their
    next step (``_schedule_units``, ``_step_ns`` per unit kind, ``_launch``); ``result``
    builds the summary.
    """

    def __init__(self, sim: Simulator, workload: Workload) -> None:
        self.wall0 = time.perf_counter()
        self.sim = sim
        self.instances = sim.instances
        self.opts = opts = sim.opts
        self.backend = sim.backend
        heads = _fresh_requests(workload)
        self.all_reqs: list[Request] = []
        all_reqs = self.all_reqs
        for h in heads:
            r: Request | None = h
            while r is not None:
                all_reqs.append(r)
                r = r.next_sub
        self._reset_instances()
        self.schedulers = [i.scheduler for i in self.instances]
        #: longest sequence a request may reach: the smallest instance's
        self.max_model_len = min(s.max_model_len for s in self.schedulers)
        self._init_routing()
        self.transfers_ns: list[int] = []
        self.transfer_bytes = 0
        self.power = PowerModel(sim.cluster, opts.timeseries_interval_ns)
        self.steps: dict[int, list[tuple[int, int, int, int]]] = {}
        self.series = TimeSeries(opts.timeseries_interval_ns)
        self.itl = GapRuns()
        self._init_arrivals(workload, heads)
        self._init_units()
        self.gate = GATE_POLICIES.create(opts.expert_routing_policy, opts.seed,
                                         source="expert_routing_policy")
        self.now = 0
        self.remaining = len(all_reqs)
        self.rejected: list[Request] = []

    def _reset_instances(self) -> None:
        # (a request's private blocks are its own only while no other shares its id)
        unique = len({r.rid for r in self.all_reqs}) == len(self.all_reqs)
        private: dict[int, dict[int, int]] = {}  # by block size
        for inst in self.instances:
            o = inst.opts
            if unique and o.enable_prefix_caching and o.block_size not in private:
                private[o.block_size] = private_depths(self.all_reqs, o.block_size)
            kv = KVCacheManager(inst.num_kv_blocks, o.block_size, o.enable_prefix_caching,
                                private=private.get(o.block_size))
            inst.scheduler = sch = Scheduler(inst.instance_id, inst.opts, kv)
            sch.role = inst.config.pd_type
            # Without --max-model-len vLLM takes the model's position limit.
            sch.max_model_len = _max_model_len(inst) or sch.max_model_len
        _build_tiers(self.sim.cluster, self.opts, self.instances)

    def _init_routing(self) -> None:
        """With PD disaggregation new requests go to prefill instances, and finished
        prefills to decode instances chosen by pd_decode_policy."""
        opts, schedulers = self.opts, self.schedulers
        self.router = ROUTING_POLICIES.create(opts.routing_policy, opts.seed,
                                              source="--request-routing-policy")
        pd = any(i.config.pd_type for i in self.instances)
        self.entry_scheds = [schedulers[i] for i, inst in enumerate(self.instances)
                             if not pd or inst.config.pd_type == "prefill"]
        self.decode_scheds = [schedulers[i] for i, inst in enumerate(self.instances)
                              if inst.config.pd_type == "decode"]
        self.decode_router = ROUTING_POLICIES.create(opts.pd_decode_policy, opts.seed,
                                                     source="pd_decode_policy") if pd else None
        if not pd:  # a wrong name is refused even where no instance would use it
            ROUTING_POLICIES.get(opts.pd_decode_policy, source="pd_decode_policy")

    def _init_arrivals(self, workload: Workload, heads: list[Request]) -> None:
        """Pending arrivals: a heap of (arrival_ns, rid, request); closed-loop clients
        release the backlog one request per finished one."""
        self.pending: list[tuple[int, int, Request]] = []
        self.clients = workload.closed_loop_clients
        # a leap may run through finishes: none releases another request
        self.leap_finishes = self.clients == 0 and not any(
            r.next_sub is not None for r in self.all_reqs)
        self.paced = workload.paced  # a freed client sends the next request at its own time
        self.backlog: list[Request] = []
        if self.clients > 0:
            self.backlog = list(reversed(heads))
            for c in range(min(self.clients, len(self.backlog))):
                r = self.backlog.pop()
                r.arrival_ns = r.arrival_ns if self.paced else 0
                r.client_id = c
                heapq.heappush(self.pending, (0, r.rid, r))
        else:
            for r in heads:
                heapq.heappush(self.pending, (r.arrival_ns, r.rid, r))

    def _init_units(self) -> None:
        """Iterations in flight: (end_ns, seq, unit index, [(instance index, batch)] or
        None). A unit is one instance, or a DP group stepping in lockstep. None is a
        wake-up (an async unit's next scheduling point, a decode instance whose KV
        transfer lands). A Request payload is a landed PD KV transfer. A unit with
        pipeline stages runs vLLM's batch queue of pp batches (``_schedule_pipeline``)."""
        self.units = units = _scheduling_units(self.instances)
        self.unit_of = {idx: u for u, members in enumerate(units) for idx in members}
        self.in_flight: list[InFlight] = []
        self.seq = 0
        n_units = len(units)
        self.inflight_count = [0] * n_units
        self.free_at = [0] * n_units
        self.depth = depth = [self.instances[m[0]].pp for m in units]
        #: units with pipeline stages: a batch enters the first stage once the one before
        #: it has left it (``free_at``), and the engine keeps up to pp batches queued
        self.pipelined = [d > 1 for d in depth]
        #: pipelined units with async scheduling: vLLM 0.19's first stages receive each
        #: step's sampled token ids from the last stage (a broadcast on the compute stream,
        #: every step) before they run the next one, so steps do not overlap in the stages
        self.serial_pipeline = [d > 1 and self.instances[m[0]].opts.async_enabled
                                for d, m in zip(depth, units)]
        #: (pipelined) per batch in flight, oldest first, the empty steps vLLM queued
        #: behind it: each holds a slot of the batch queue until the batch is processed
        self.trail: list[deque] = [deque() for _ in units]
        # Async scheduling (vLLM's batch queue of 2): step N+1 is scheduled while step N
        # runs and starts when N ends; a unit schedules again only after a step of its own
        # completes (or right after scheduling one), so arrivals wait for that point.
        self.async_unit = [self.instances[m[0]].opts.async_enabled and depth[u] == 1
                           for u, m in enumerate(units)]
        for u, a in enumerate(self.async_unit):
            if a:
                depth[u] = 2
        self.busy_until = [0] * n_units
        self.may_chain = [False] * n_units
        # Pipeline stages keep batches in order: one leaves the last stage after the one
        # before it (a short decode step cannot overtake a long prefill chunk).
        self.last_out = [0] * n_units
        self.leap_unit = [self._leapable(u) for u in range(n_units)]
        #: units whose step is a plain iteration of their lead instance (not an MoE wave,
        #: no attention on PIM)
        self.plain_unit = [not self._moe_wave(m) and self.instances[m[0]].pim is None
                           for m in units]
        #: with one unit, a wake-up at the time a step is scheduled is needed only when
        #: the unit may schedule again then (with more units, another may act at it)
        self.lone_unit = n_units == 1
        #: per instance, the last leap's last step time (sizes the next leap's first chunk)
        self.last_step_ns = [0] * len(self.instances)

    # ------------------------------------------------------------------ event core
    def loop(self) -> RunResult:
        max_time = self.opts.max_sim_time_ns
        self.progress = _Progress(len(self.all_reqs)) if self.opts.progress else None
        pending, in_flight = self.pending, self.in_flight
        while self.remaining > 0:
            t_next = self._next_event_time()
            if t_next > self.now:
                self.now = t_next
            now = self.now
            if max_time is not None and now > max_time:
                break
            if pending and pending[0][0] <= now:
                self._route_due()
            if in_flight and in_flight[0][0] <= now:
                self._retire_due()
                # Arrivals released at exactly `now` by completions are routed before
                # scheduling.
                if pending and pending[0][0] <= now:
                    self._route_due()
            self._schedule_units()
        if self.progress is not None:
            self.progress.close()
        return self.result()

    def _next_event_time(self) -> int:
        """An iteration ending or (if some unit could take work) an arrival."""
        in_flight, pending = self.in_flight, self.pending
        t_next = in_flight[0][0] if in_flight else None
        if pending and (t_next is None or pending[0][0] < t_next) and any(
                map(lt, self.inflight_count, self.depth)):
            t_next = pending[0][0]
        if t_next is None:
            raise RuntimeError("simulation stalled: requests remain but nothing can run")
        return t_next

    def _push(self, t: int, unit: int, payload) -> None:
        self.seq += 1
        heapq.heappush(self.in_flight, (t, self.seq, unit, payload))

    # ------------------------------------------------------------------ arrivals
    def _route_due(self, until: int | None = None) -> None:
        """Route the arrivals due by ``until`` (default: now)."""
        pending = self.pending
        now = self.now if until is None else until
        while pending and pending[0][0] <= now:
            self._route(heapq.heappop(pending)[2])

    def _route(self, req: Request) -> None:
        if req.input_len >= self.max_model_len:
            # vLLM refuses a prompt that leaves no room to generate (and its session's
            # later turns, which would extend it); a closed-loop client moves on.
            r: Request | None = req
            while r is not None:
                r.rejected = True
                self.rejected.append(r)
                self.remaining -= 1
                r = r.next_sub
            if self.clients > 0 and self.backlog:
                nxt = self.backlog.pop()
                nxt.arrival_ns = (nxt.arrival_ns if self.paced and nxt.arrival_ns > req.arrival_ns
                                  else req.arrival_ns)
                nxt.client_id = req.client_id
                heapq.heappush(self.pending, (nxt.arrival_ns, nxt.rid, nxt))
            return
        self.entry_scheds[self.router.choose(req, self.entry_scheds)].add_request(req)

    def _release_followers(self, req: Request, end: int) -> None:
        """A finished request frees its session's next turn and its closed-loop client."""
        nxt = req.next_sub
        if nxt is not None:
            nxt.arrival_ns = end + nxt.tool_ns
            heapq.heappush(self.pending, (nxt.arrival_ns, nxt.rid, nxt))
        if self.clients > 0 and self.backlog:
            r = self.backlog.pop()
            r.arrival_ns = r.arrival_ns if self.paced and r.arrival_ns > end else end
            r.client_id = req.client_id
            heapq.heappush(self.pending, (r.arrival_ns, r.rid, r))

    # ------------------------------------------------------------------ completion
    def _retire_due(self) -> None:
        """Retire the iterations (and wake-ups, landed KV transfers) that end now."""
        in_flight, now = self.in_flight, self.now
        while in_flight and in_flight[0][0] <= now:
            end, _, unit, payload = heapq.heappop(in_flight)
            if payload is None:
                continue
            if payload.__class__ is Request:
                # A PD KV transfer has landed: the prefill side frees the blocks it kept.
                self.schedulers[payload.prefill_instance].release_handoff(payload.handoff_blocks)
                payload.handoff_blocks = None
                continue
            self.inflight_count[unit] -= 1
            self.may_chain[unit] = True
            if self.pipelined[unit]:
                self.trail[unit].popleft()
            for idx, batch in payload:
                self._complete(idx, batch, end)

    def _complete(self, idx: int, batch, end: int) -> None:
        sch = self.schedulers[idx]
        finished = sch.complete(batch, end, self.itl)
        self.series.record(end, batch.prefill_tokens, batch.decode_tokens,
                           len(sch.running), len(sch.waiting), sch.kv.usage())
        for req in finished:
            self.remaining -= 1
            self._release_followers(req, end)
        if self.progress is not None and finished:
            self.progress.update(len(self.all_reqs) - self.remaining, self.now)
        if sch.handoffs:
            self._hand_off(idx, sch)

    # ------------------------------------------------------------------ PD hand-off
    def _hand_off(self, idx: int, sch: Scheduler) -> None:
        """Finished prefills move to a decode instance, which pulls their KV."""
        for req in sch.handoffs:
            req.prefill_instance = idx
            req.remote_kv = True
            self.decode_scheds[self.decode_router.choose(req, self.decode_scheds)].add_request(req)
        sch.handoffs.clear()

    def _start_transfers(self, idx: int, inst: InstanceRuntime) -> None:
        """Time the KV transfers of the requests a decode instance just admitted; each
        lands as an event that frees the prefill side's blocks."""
        sim, now = self.sim, self.now
        for req in inst.scheduler.admitted_transfers:
            src = self.instances[req.prefill_instance]
            t, nbytes = kv_transfer_ns(self.backend, sim.cluster, src, inst,
                                       req.kv_transfer_tokens)
            req.ready_ns = now + t
            req.kv_transfer_ns = t
            self.transfers_ns.append(t)
            self.transfer_bytes += nbytes
            if self.power.enabled:
                self.power.add_link_bytes(src.config.node_id, now, nbytes)
            self._push(req.ready_ns, self.unit_of[idx], req)
        inst.scheduler.admitted_transfers.clear()

    # ------------------------------------------------------------------ step dispatch
    def _schedule_units(self) -> None:
        """Idle units schedule their next batch (every member of a DP group at once). A
        stretch that takes an arrival's completion (one unit only: ``_arrival_completion``)
        moves the clock there, where the unit schedules at once (unless the stretch has
        taken that step too)."""
        while self._schedule_units_now():
            pass

    def _schedule_units_now(self) -> bool:
        """``_schedule_units`` at the clock's time; True where a stretch moved the clock."""
        now = self.now
        inflight_count, depth, free_at = self.inflight_count, self.depth, self.free_at
        async_unit, may_chain, leap_unit = self.async_unit, self.may_chain, self.leap_unit
        for unit, members in enumerate(self.units):
            busy = inflight_count[unit]
            if self.pipelined[unit]:
                # (blocked on its oldest batch until that batch's output is processed)
                if not busy or may_chain[unit]:
                    may_chain[unit] = False
                    self._schedule_pipeline(unit, members, busy)
                continue
            if busy >= depth[unit] or free_at[unit] > now:
                continue
            if busy and async_unit[unit] and not may_chain[unit]:
                continue
            if leap_unit[unit] and self._try_leap(unit):
                if self.now != now:
                    return True
                continue
            may_chain[unit] = False
            payload = []
            for idx in members:
                batch = self._schedule_instance(idx, now, busy)
                if batch is not None:
                    payload.append((idx, batch))
            if payload:
                self._launch(unit, members, payload, self._step_ns(unit, members, payload))
        return False

    def _schedule_pipeline(self, unit: int, members: list[int], busy: int) -> None:
        """vLLM's ``step_with_batch_queue`` with a queue of pp batches, at a point where
        the engine is not blocked (its oldest batch was just processed, or none is in
        flight): it schedules while the queue has room; a batch scheduled with the queue
        still not full is followed at once by another schedule. An empty schedule (with
        requests left) takes a queue slot too, and the engine then blocks until its
        oldest batch is done and processed (as it does with the queue full): arrivals
        meanwhile wait for that."""
        now, trail, depth = self.now, self.trail[unit], self.depth[unit]
        schedulers = self.schedulers
        while busy + sum(trail) < depth:
            has_requests = any(schedulers[i].running or schedulers[i].waiting for i in members)
            payload = []
            for idx in members:
                batch = self._schedule_instance(idx, now, busy)
                if batch is not None:
                    payload.append((idx, batch))
            if not payload:
                if busy and has_requests:
                    trail[-1] += 1
                return
            self._launch(unit, members, payload, self._step_ns(unit, members, payload))
            trail.append(0)
            busy += 1

    def _schedule_instance(self, idx: int, now: int, busy: int) -> Batch | None:
        """One instance's next batch (None: nothing to run); ``busy``: its unit's steps in
        flight."""
        sch = self.schedulers[idx]
        batch = sch.schedule(now)
        while batch is None and sch.preempted_last and not busy:
            # Its preemptions left the step empty (the request being scheduled was itself
            # the lowest priority victim). vLLM's engine executes the empty step at once
            # and schedules again with the freed blocks; with a step in flight it waits
            # for that step instead (its completion wakes this unit).
            batch = sch.schedule(now)
        if sch.admitted_transfers:
            self._start_transfers(idx, self.instances[idx])
        if (batch is None and sch.waiting and not sch.running and not busy
                and not sch.held_handoffs and not sch.receiving):
            _raise_unschedulable(self.instances[idx])
        return batch

    def _step_ns(self, unit: int, members: list[int], payload: list) -> int:
        """The step's time, by unit kind: an MoE wave of a DP group (or ep > 1), an
        iteration with attention on PIM, or a plain iteration through the backend."""
        instances = self.instances
        lead = instances[members[0]]
        if self.plain_unit[unit]:
            # Lower-tier prefix hits are loaded (a MEM_LOAD node) before the step.
            batch = payload[0][1]
            dur = self.backend.iteration_ns(lead, batch.shape, batch.tier_load_bytes)
        elif self._moe_wave(members):
            by_idx = dict(payload)
            shapes = [by_idx[i].shape if i in by_idx else None for i in members]
            dur = self.sim._moe_wave_ns([instances[i] for i in members], shapes, self.gate)
            dur += _tier_loads_ns(instances, payload)
        else:  # attention on PIM
            dur = pim_iteration_ns(self.backend, lead, payload[0][1].shape,
                                   lead.opts.enable_sub_batch_interleaving)
            dur += _tier_loads_ns(instances, payload)
        return dur if dur > 1 else 1

    def _moe_wave(self, members: list[int]) -> bool:
        """Whether the unit steps as an expert-parallel wave: a DP group serving an MoE
        model, or one instance with ep > 1."""
        lead = self.instances[members[0]]
        return lead.model.is_moe and (len(members) > 1 or lead.config.ep_size > 1)

    def _launch(self, unit: int, members: list[int], payload: list, dur: int) -> None:
        """Put a timed step in flight: async units chain it after the step running;
        pipelined ones start it once the batch before has left the first stage (equal
        stages), or with async scheduling once it has left the last (``serial_pipeline``),
        and keep batches in order through the stages."""
        now = self.now
        start = now
        pipelined = self.pipelined[unit]
        if pipelined:
            start = max(now, self.free_at[unit])
            if self.serial_pipeline[unit] and self.last_out[unit] > start:
                start = self.last_out[unit]
        if self.async_unit[unit]:
            start = self.busy_until[unit] if self.busy_until[unit] > now else now
            self.busy_until[unit] = start + dur
            self.may_chain[unit] = True  # vLLM schedules the next step right away
            if not self.lone_unit or self.inflight_count[unit] + 1 < self.depth[unit]:
                self._push(now, unit, None)
        end = start + dur
        if pipelined:
            out = self.last_out[unit] + max(1, dur // self.depth[unit])
            if out > end:
                end = out
            self.last_out[unit] = end
        if self.power.enabled:
            self._record_power(members, payload, start, dur)
        self.inflight_count[unit] += 1
        self._push(end, unit, payload)
        if pipelined:
            # Equal stages: the next batch may enter stage 0 after one stage time.
            self.free_at[unit] = start + max(1, dur // self.depth[unit])

    def _record_power(self, members: list[int], payload: list, start: int, dur: int) -> None:
        by_idx = dict(payload)
        for i in members:
            shape = by_idx[i].shape if i in by_idx else DUMMY_SHAPE
            inst = self.instances[i]
            self.steps.setdefault(inst.instance_id, []).append(
                (start, start + dur, iteration_memory_bytes(inst, shape),
                 iteration_link_bytes(inst, shape)))

    # ------------------------------------------------------------------ event leaping
    def _leapable(self, unit: int) -> bool:
        """Units a leap may advance: one instance stepping through the plain backend path
        (no DP/EP wave, no PIM, no pipeline stages, no PD role)."""
        members = self.units[unit]
        inst = self.instances[members[0]]
        return (self.opts.event_leaping and len(members) == 1 and inst.pim is None
                and inst.pp == 1 and inst.config.pd_type is None
                and not (inst.model.is_moe and inst.config.ep_size > 1))

    def _others_inert(self, unit: int) -> bool:
        """Whether no other unit can act before its own next event: each is full, waiting
        for a stage or its own step, or has nothing to schedule."""
        now = self.now
        for v, members in enumerate(self.units):
            if v == unit:
                continue
            if self.pipelined[v]:
                if self.inflight_count[v] and not self.may_chain[v]:
                    continue  # blocked on its oldest batch
            elif self.inflight_count[v] >= self.depth[v] or self.free_at[v] > now:
                continue
            if self.async_unit[v] and self.inflight_count[v] and not self.may_chain[v]:
                continue
            for idx in members:
                s = self.schedulers[idx]
                if s.running or s.waiting or s.receiving:
                    return False
        return True

    def _try_leap(self, unit: int) -> bool:
        """Advance ``unit`` over a stretch of pure-decode steps up to the next event of
        anything else (sim.leap); False (nothing done) where no stretch applies. Where that
        event is an arrival that finds the unit full, the stretch also takes the
        completion that frees it, routes the arrivals due by then and moves the clock
        there (``_arrival_completion``), where the unit schedules next: where the plan
        covers that step, the stretch takes its decodes and the scheduler adds the waiting
        queue (``Scheduler.schedule_after_decodes``), the step is put in flight and (async)
        the stretch takes the completion of the step before it too
        (``_run_into_arrival``). Where the plan's last completion may let the waiting head
        in (``LeapPlan.admits_next``), the stretch that gets there takes the next step's
        decodes the same way."""
        idx = self.units[unit][0]
        sch = self.schedulers[idx]
        if not sch.running:
            return False
        b1 = None
        if self.async_unit[unit]:
            if self.inflight_count[unit] != 1:
                return False
            for b1 in self.in_flight:
                if b1[2] == unit and b1[3].__class__ is list:
                    break
            else:
                return False
            if not steady_decode(sch, b1[3][0][1]):
                return False
        elif self.inflight_count[unit] or not steady_decode(sch, None):
            return False
        if not self._others_inert(unit):
            return False
        horizon = self._horizon(b1)
        if b1 is not None and b1[0] >= horizon:
            return False
        in_flight = b1[3][0][1] if b1 is not None else None  # (async) the step in flight
        plan = plan_leap(sch, in_flight, self.leap_finishes and b1 is not None,
                         self._step_cap(idx, b1, horizon))
        if plan is None or (plan.leaving and (self.clients > 0 or any(
                sch.running[i].next_sub is not None for i in plan.leaving))):
            return False  # (a finished request that releases another: step it)
        durations, completions = self._leap_times(idx, plan, b1, horizon)
        own_end: int | None = None  # (async) the end of the step left in flight, if taken
        if plan.admits_next and len(completions) == len(durations) == plan.max_completions:
            # The stretch has got to its last completion, where the unit schedules next:
            # that step's decodes are taken, the waiting queue scheduled after them.
            arrival_end: int | None = completions[-1]
            decodes_next = True
        else:
            arrival_end = self._arrival_completion(plan, b1, horizon, durations, completions)
            decodes_next = arrival_end is not None and _plan_takes_step(plan, len(durations))
            if arrival_end is not None:
                completions.append(arrival_end)
                if decodes_next and b1 is not None:
                    own_end = self._own_completion(plan, b1, arrival_end + durations[-1],
                                                   len(completions))
                    if own_end is not None:
                        completions.append(own_end)
        if b1 is not None:
            self.in_flight.remove(b1)
            heapq.heapify(self.in_flight)
        finished = finished_in(plan, len(completions)) if plan.bounds else len(plan.leaving)
        decodes = self._apply_leap(unit, idx, plan, durations, completions, in_flight,
                                   wake_up=arrival_end is None, decodes_next=decodes_next)
        if arrival_end is not None:
            self._run_into_arrival(unit, idx, arrival_end, decodes, own_end)
        if finished:
            self.remaining -= finished
            if self.progress is not None:
                self.progress.update(len(self.all_reqs) - self.remaining, completions[-1])
        return True

    def _step_cap(self, idx: int, own_step: InFlight | None, horizon: int) -> int:
        """A bound on the steps a stretch plans for: those the last step's time lets fit
        before the horizon, and ``STEP_CAP_MARGIN`` more (a stretch stopped there is
        followed by another; the plan's tables, and the finishes it accounts for, are as
        long as the bound)."""
        last = self.last_step_ns[idx]
        if last <= 0:
            return 64
        t = own_step[0] if own_step is not None else self.now
        return max(0, horizon - t) // last + STEP_CAP_MARGIN

    def _horizon(self, own_step: InFlight | None) -> int:
        """The first time at which something other than the leaping unit's own step may
        happen: an arrival, another event in flight, or the end of simulated time."""
        h = self.pending[0][0] if self.pending else 1 << 62
        # (events told apart by their sequence numbers: compiled, a tuple read from the
        # heap is a new object, so identity would not do)
        own = own_step[1] if own_step is not None else -1
        for e in self.in_flight:
            if e[0] < h and e[1] != own:
                h = e[0]
        if self.opts.max_sim_time_ns is not None and self.opts.max_sim_time_ns + 1 < h:
            h = self.opts.max_sim_time_ns + 1
        return h

    def _run_into_arrival(self, unit: int, idx: int, arrival_end: int, decodes: Batch | None,
                          own_end: int | None) -> None:
        """After a stretch that took the completion an arrival waits for (at
        ``arrival_end``): route the arrivals due by then (that completion's record sees
        them queued) and move the clock there. With ``decodes`` (the plan's next step,
        taken), the scheduler adds the waiting queue to it and the step is put in
        flight; (async) with ``own_end``, the step that was left in flight, whose
        completion the stretch has taken too (a token each, nothing finishing), completes
        then, after the arrivals due by then (its record sees the new step's state)."""
        sch = self.schedulers[idx]
        self._route_due(arrival_end)
        # (with own_end, its record comes after: it is given its own state below)
        self.series.set_state_at(arrival_end, waiting=len(sch.waiting))
        self.now = arrival_end
        if decodes is None:
            return
        self.may_chain[unit] = False
        if own_end is not None:
            self.inflight_count[unit] += 1  # (the step left in flight is, until own_end)
        payload = [(idx, sch.schedule_after_decodes(decodes, arrival_end))]
        self._launch(unit, [idx], payload, self._step_ns(unit, [idx], payload))
        if own_end is not None:
            self.inflight_count[unit] -= 1
            self.may_chain[unit] = True
            self.now = own_end
            self._route_due(own_end)
            self.series.set_state_at(own_end, len(sch.running), len(sch.waiting),
                                     sch.kv.usage())

    def _nothing_else_by(self, end: int, own_step: InFlight | None) -> bool:
        """Whether no event but ``own_step`` comes by ``end`` (nor the end of simulated
        time)."""
        max_time = self.opts.max_sim_time_ns
        if max_time is not None and end > max_time:
            return False
        own = own_step[1] if own_step is not None else -1
        for e in self.in_flight:
            if e[0] <= end and e[1] != own:
                return False
        return True

    def _own_completion(self, plan: LeapPlan, own_step: InFlight, end: int,
                        done: int) -> int | None:
        """(Async) ``end``, the end of the step a stretch leaves in flight when it takes
        the step the unit schedules at its last completion, where the stretch may take
        that completion too: the plan allowing one more and nothing else by then."""
        if done < plan.max_completions and self._nothing_else_by(end, own_step):
            return end
        return None

    def _arrival_completion(self, plan: LeapPlan, own_step: InFlight | None, horizon: int,
                            durations: list[int], completions: list[int]) -> int | None:
        """Where the horizon is an arrival that finds the unit full (one more step in
        flight than completed: sync one, async two) and nothing else happens until the
        first of those steps ends, the time it ends: step by step, the arrivals due by
        then are routed, then that step completes, then the unit schedules. The stretch
        may take that completion too (the plan allowing one more); None where not. (One
        unit only: with more, an arrival is routed when it comes, and another may take
        it.)"""
        done = len(completions)
        if (not self.lone_unit or len(durations) != done + 1 or done >= plan.max_completions
                or not self.pending or self.pending[0][0] != horizon):
            return None
        async_ = own_step is not None
        end = (completions[-1] if completions else self.now) + durations[done - async_]
        if end < horizon:
            return None  # (the stretch stopped short of the arrival)
        return end if self._nothing_else_by(end, own_step) else None

    def _leap_times(self, idx: int, plan: LeapPlan, own_step: InFlight | None,
                    horizon: int) -> tuple[list[int], list[int]]:
        """Step durations and completion times of the stretch. Each completion before
        ``horizon`` is in; the step after the last completion is scheduled (and stays in
        flight) whenever it may be, so every step timed is a step taken. (Async) that
        step is the one scheduled at the last completion: where the step before it ends
        at or past the horizon (the engine schedules it at that completion, before
        anything else happens), it is in too and the stretch ends with two steps in
        flight (one more duration than completions)."""
        inst, max_done = self.instances[idx], plan.max_completions
        if own_step is None:  # sync: step j runs from the (j-1)-th completion
            completions: list[int] = []
            t, limit = self.now, plan.max_steps
        else:  # async: step j runs after the step in flight, completions start with it
            completions = [own_step[0]]
            t, limit = own_step[0], min(plan.max_steps, max_done)
        timer = getattr(self.backend, "decode_stretch", None) if limit >= 2 else None
        # Timed in chunks, each sized for the steps that fit before the horizon at the
        # last step's time, then at the chunk's last (any chunking gives the same values).
        last = self.last_step_ns[idx]
        chunk = max(2, (horizon - t) // last + 2) if last > 0 else 16
        durations: list[int] = []
        bounds = plan.bounds
        extra = False  # (async) the step scheduled at the last completion is being timed
        j = 0
        while j < limit:
            shape = step_shape(plan, j)
            count = 1 if extra else min(chunk, limit - j,
                                        segment_end(plan, j) - j if bounds else chunk)
            stretch = timer(inst, shape, count) if timer is not None else None
            if stretch is None:
                timer = None
                d = self.backend.iteration_ns(inst, shape, 0)
                chunk_ns = [d if d > 1 else 1]
            else:
                chunk_ns = stretch.durations
                if min(chunk_ns) < 1:
                    chunk_ns = [d if d > 1 else 1 for d in chunk_ns]
            if extra:
                durations.append(chunk_ns[0])
                if stretch is not None:
                    stretch.record(1)
                break
            # step j + i ends at ends[i + 1]; it completes unless it ends at or past the
            # horizon, the completions are all taken, or (async) it is the plan's last
            n = len(chunk_ns)
            ends = list(accumulate(chunk_ns, initial=t))
            stop = bisect_left(ends, horizon, 1) - 1
            cap = max_done - len(completions)
            if own_step is not None and limit - j - 1 < cap:
                cap = limit - j - 1
            if cap < stop:
                stop = cap
            if stop >= n:  # all of them complete
                durations += chunk_ns
                completions += ends[1:]
                t = ends[-1]
                j += n
                if stretch is not None:
                    stretch.record(n)
                    chunk = max(2, (horizon - t) // chunk_ns[-1] + 2)  # (steps seldom shrink)
                continue
            durations += chunk_ns[:stop + 1]
            completions += ends[1:stop + 1]
            j += stop + 1
            taken = stop + 1
            if (own_step is not None and ends[stop + 1] >= horizon and j < limit
                    and (not bounds or j not in bounds)):
                # (async) step j is scheduled at the last completion, before the horizon
                if taken < n:
                    durations.append(chunk_ns[taken])
                    taken += 1
                else:
                    extra = True
            if stretch is not None:
                stretch.record(taken)
            if not extra:
                break
        self.last_step_ns[idx] = durations[-1]
        return durations, completions

    def _apply_leap(self, unit: int, idx: int, plan: LeapPlan, durations: list[int],
                    completions: list[int], in_flight: Batch | None, wake_up: bool = True,
                    decodes_next: bool = False) -> Batch | None:
        """Apply the stretch: the scheduler's state, the steps left in flight, the time
        series and power rows; ``wake_up``: the unit's next scheduling point at the last
        completion is an event (else the caller schedules it). ``decodes_next``: the
        plan's next step, scheduled at the last completion, is taken too, and its batch
        (not timed, not put in flight) returned for the caller to complete."""
        inst = self.instances[idx]
        sch = inst.scheduler
        steps = len(durations)
        batches = apply_leap(sch, plan, steps + decodes_next, self.now, completions, self.itl,
                             steps)
        decodes = batches.pop() if decodes_next else None
        usable = sch.kv.num_blocks
        waiting = len(sch.waiting)
        free0, pops_through = plan.free0, plan.pops_through
        freed = list(accumulate(plan.freed_at))  # freed[k]: by the k-th completion
        last_freed = len(freed) - 1

        def kv_usage(k: int) -> float:  # after completion k (0-based)
            f = freed[k + 1] if k < last_freed else freed[-1]
            return (usable - (free0 + f - pops_through[k])) / usable

        if plan.bounds and plan.bounds[0] < len(completions):  # finishes past the first
            _record_leap_series(self.series, plan, completions, in_flight, waiting, kv_usage)
        else:
            n = len(sch.running)
            first = 0
            if completions and in_flight is not None:  # it may finish prompts
                self.series.record(completions[0], in_flight.prefill_tokens,
                                   in_flight.decode_tokens, n, waiting, kv_usage(0))
                first = 1
            self.series.record_decode_steps(completions, n, n, waiting, kv_usage, first)
        async_ = self.async_unit[unit]
        starts = completions[:steps] if async_ else [self.now, *completions][:steps]
        if len(starts) < steps:  # (async) the last step starts when the one before ends
            starts.append(starts[-1] + durations[-2])
        if self.power.enabled:
            rows = self.steps.setdefault(inst.instance_id, [])
            for j, (start, d) in enumerate(zip(starts, durations)):
                shape = step_shape(plan, j)
                rows.append((start, start + d, iteration_memory_bytes(inst, shape),
                             iteration_link_bytes(inst, shape)))
        first = steps - len(batches)  # the first step still in flight
        for j, batch in enumerate(batches, first):
            self._push(starts[j] + durations[j], unit, [(idx, batch)])
        if async_:
            self.busy_until[unit] = starts[-1] + durations[-1]
            self.may_chain[unit] = True
            # (the step in flight at the start is among those completed)
            self.inflight_count[unit] += len(batches) - 1
        else:
            self.inflight_count[unit] += len(batches)
        if wake_up and completions and len(batches) == async_:
            # The step-by-step loop schedules the unit again at its last completion (async
            # with two steps in flight it cannot: the stretch has taken that step).
            self._push(completions[-1], unit, None)
        return decodes

    # ------------------------------------------------------------------ summary
    def result(self) -> RunResult:
        schedulers, now, power = self.schedulers, self.now, self.power
        wall = time.perf_counter() - self.wall0
        summary = summarize(self.all_reqs, self.itl, now, wall,
                            sum(s.num_preemptions for s in schedulers),
                            sum(s.kv.hit_tokens for s in schedulers),
                            sum(s.kv.queried_tokens for s in schedulers))
        summary.update(self.sim.describe())
        lower = sum(s.kv.lower_hit_tokens for s in schedulers)
        queried = sum(s.kv.queried_tokens for s in schedulers)
        hits = summary["prefix_hit_tokens"]
        summary["prefix_hit_tokens_npu"] = hits - lower
        summary["prefix_hit_tokens_lower_tier"] = lower
        summary["prefix_hit_ratio_npu"] = (hits - lower) / queried if queried else 0.0
        summary["prefix_hit_ratio_lower_tier"] = lower / queried if queried else 0.0
        summary["prefix_storage"] = self.opts.prefix_storage
        if power.enabled:
            energy = power.finalize(self.instances, self.steps, now)
            gen = sum(r.num_output for r in self.all_reqs)
            summary.update(energy)
            summary["energy_per_output_token_j"] = energy["energy_j"] / gen if gen else None
            summary["avg_power_w"] = energy["energy_j"] / (now / 1e9) if now else None
            self.series.power = power.power_series()
        summary["rejected_requests"] = len(self.rejected)
        summary["kv_transfers"] = len(self.transfers_ns)
        summary["kv_transfer_bytes"] = self.transfer_bytes
        summary["kv_transfer_ms"] = stats_ms(self.transfers_ns) if self.transfers_ns else None
        extrap: dict[str, int] = {}
        for inst in self.instances:
            for k, v in inst.provider.extrapolations().items():
                extrap[k] = extrap.get(k, 0) + v
        summary["latency_extrapolations"] = extrap
        # one number a search can constrain on: lookups the latency data did not cover
        summary["latency_off_grid_lookups"] = sum(extrap.values())
        return RunResult(self.all_reqs, summary, self.series)


def _plan_takes_step(plan: LeapPlan, j: int) -> bool:
    """Whether step ``j`` of the stretch may be taken as planned: within its steps and
    before any finish it does not cover, so that its batch is the step before's less the
    requests finished by then. (A waiting head's lookup at step ``j`` is the scheduler's:
    the stretch accounts those of the steps before.)"""
    return j < plan.max_steps and j < plan.max_completions and j not in plan.bounds


def _record_leap_series(series: TimeSeries, plan: LeapPlan, completions: list[int],
                        in_flight: Batch | None, waiting: int,
                        kv_usage: Callable[[int], float]) -> None:
    """The time-series records of an (async) leap in which requests finish past the
    first completion, as each completion's would be: the step in flight at the start may
    finish prompts; completion k (0-based) then gives a token to each request in its
    step and leaves running those that do not finish there."""
    drops = plan.drops
    done = len(completions)
    total = len(drops)
    ends = sorted([drops[i] for i in finishing(plan, done)])
    e = 0  # the requests finished so far
    first = 0
    if in_flight is not None:  # it may finish prompts
        while e < len(ends) and ends[e] <= 0:
            e += 1
        series.record(completions[0], in_flight.prefill_tokens, in_flight.decode_tokens,
                      total - e, waiting, kv_usage(0))
        first = 1
    k = first
    while k < done:
        gen = total - e  # (the requests in step k - 1: not finished before completion k)
        e0 = e
        while e < len(ends) and ends[e] <= k:
            e += 1
        # completions up to the next finish give the same tokens and leave the same running
        hi = k + 1 if e > e0 else (min(done, ends[e]) if e < len(ends) else done)
        series.record_decode_steps(completions, gen, total - e, waiting, kv_usage, k, hi)
        k = hi


def _raise_unschedulable(inst: InstanceRuntime) -> None:
    """An idle instance whose waiting head can never be scheduled: say why."""
    head = inst.scheduler.waiting[0]
    o = inst.opts
    if (not o.enable_chunked_prefill and o.max_num_batched_tokens
            and head.num_tokens > o.max_num_batched_tokens):
        generated = head.num_tokens - head.input_len
        needs = (f"has a {head.num_tokens}-token prompt" if not generated else
                 f"was preempted after {generated} generated tokens: its "
                 f"{head.input_len}-token prompt and those must be recomputed, "
                 f"{head.num_tokens} tokens in one step,")
        raise InputError(
            f"request {head.rid} {needs} but "
            f"max_num_batched_tokens={o.max_num_batched_tokens} and chunked "
            "prefill is off; raise max_num_batched_tokens or enable chunked "
            "prefill")
    raise InputError(
        f"request {head.rid} needs {head.num_tokens} tokens of KV but instance "
        f"{inst.instance_id} holds at most "
        f"{(inst.num_kv_blocks - 1) * inst.opts.block_size}")


class _Progress:
    """A rich progress bar, shown only when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        import sys
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import Progress
            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task("simulating", total=total)

    def update(self, done: int, now_ns: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done,
                            description=f"simulating (t={now_ns / 1e9:.1f}s)")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def simulate(cluster: ClusterConfig, workload: Workload, options: SimOptions | None = None,
             backend: SystemBackend | None = None) -> RunResult:
    """Simulate ``workload`` on ``cluster``; the workload is not modified."""
    sim = Simulator(cluster, options or SimOptions(), backend)
    try:
        return sim.run(workload)
    finally:
        sim.close()
