"""The main loop: LLMServingSim's 10 steps as a discrete-event loop over instances.

Per event time ``now`` (integer ns): route the requests that have arrived; retire the
iterations that end now (tokens, finished requests, released session turns and
closed-loop follow-ups); then every idle instance schedules its next batch, the backend
times it, and its completion becomes the next event. When every instance is idle the
clock jumps to the next arrival. No I/O, logging or pandas inside the loop.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from sim.backend import AnalyticalBackend, SystemBackend
from sim.cluster import GiB, ClusterConfig, InstanceConfig, unsupported_features
from sim.errors import InputError
from sim.kv_cache import KVCacheManager, PrefixTier
from sim.latency.base import LATENCY_PROVIDERS
from sim.metrics import RunResult, TimeSeries, stats_ms, summarize
from sim.model import ModelSpec, load_model
from sim.options import SimOptions
from sim.request import Request
from sim.router import ROUTING_POLICIES
from sim.scheduler import Batch, Scheduler
from sim.workload import Workload


@dataclass
class InstanceRuntime:
    instance_id: int
    config: InstanceConfig
    model: ModelSpec
    opts: SimOptions
    tp: int
    pp: int
    num_kv_blocks: int
    provider: object
    scheduler: Scheduler
    lower_tier: PrefixTier | None = None


def _import_providers() -> None:
    # Providers register themselves on import; optional ones may be absent.
    import sim.latency.measured  # noqa: F401
    for mod in ("sim.latency.roofline", "sim.latency.aic"):
        try:
            __import__(mod)
        except ImportError:
            pass


def kv_capacity_blocks(inst: InstanceConfig, model: ModelSpec, block_size: int) -> int:
    """KV blocks per instance: (mem_size * mem_util - weights) / block bytes, per NPU."""
    usable = inst.npu_mem.mem_size_gib * GiB * inst.npu_mem.mem_util
    weights = model.weight_bytes(inst.tp_size, inst.pp_size, inst.ep_size)
    free = usable - weights
    where = f"instance {inst.instance_id} ({inst.model_name} on {inst.hardware})"
    if free <= 0:
        raise InputError(
            f"{where}: weights need {weights / GiB:.2f} GiB per NPU but only "
            f"{usable / GiB:.2f} GiB is usable (npu_mem.mem_size={inst.npu_mem.mem_size_gib} GiB x "
            f"mem_util={inst.npu_mem.mem_util}); raise tp_size/pp_size or use a larger device")
    blocks = int(free // (model.kv_bytes_per_token(inst.tp_size, inst.pp_size) * block_size))
    if blocks < 2:
        raise InputError(f"{where}: no room for KV cache after the weights "
                         f"({free / GiB:.3f} GiB left)")
    return blocks


def _resolve_provider(kind: str, inst: InstanceConfig, model: ModelSpec, opts: SimOptions):
    _import_providers()
    if kind == "auto":
        from sim.latency.measured import find_bundle
        bundle = find_bundle(inst.hardware, model, opts.profiles_dirs)
        if bundle is not None and (bundle / f"tp{inst.tp_size}").is_dir():
            kind = "measured"
        elif "roofline" in LATENCY_PROVIDERS:
            kind = "roofline"
        else:
            kind = "measured"  # raises the "no bundle" error with the searched folders
    return LATENCY_PROVIDERS.create(kind, model, inst.hardware, inst.tp_size,
                                    profiles_dirs=opts.profiles_dirs,
                                    max_tokens=max(opts.max_num_batched_tokens, 16384),
                                    max_seqs=max(opts.max_num_seqs, 1024),
                                    source="--latency-provider")


def validate_cluster(cluster: ClusterConfig, opts: SimOptions) -> None:
    """Raise InputError if the cluster cannot be simulated: unknown names, tp that does not
    divide the heads, weights that do not fit, or features not modelled yet."""
    opts.validate()
    problems = unsupported_features(cluster)
    if problems:
        raise InputError(problems[0])
    for inst in cluster.instances:
        where = f"{cluster.source}: instance {inst.instance_id}"
        model = load_model(inst.model_name, source=f"{where}: model_name")
        model.check_tp(inst.tp_size, source=where)
        o = opts.for_instance(inst.overrides)
        o.validate()
        kv_capacity_blocks(inst, model, o.block_size)
    roles = [i.pd_type for i in cluster.instances]
    if any(roles):
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


def build_instances(cluster: ClusterConfig, opts: SimOptions) -> list[InstanceRuntime]:
    validate_cluster(cluster, opts)
    out = []
    for inst in cluster.instances:
        model = load_model(inst.model_name)
        o = opts.for_instance(inst.overrides)
        blocks = kv_capacity_blocks(inst, model, o.block_size)
        kv = KVCacheManager(blocks, o.block_size, o.enable_prefix_caching)
        provider = _resolve_provider(o.latency_provider, inst, model, o)
        out.append(InstanceRuntime(inst.instance_id, inst, model, o, inst.tp_size, inst.pp_size,
                                   blocks, provider, Scheduler(inst.instance_id, o, kv)))
    return out


def _link(cluster: ClusterConfig, a: InstanceConfig, b: InstanceConfig) -> tuple[float, float]:
    """(GB/s, ns) of the link between two instances: intra-node is dimension 0 of
    link_bw/link_latency, inter-node the last dimension."""
    dim = 0 if a.node_id == b.node_id else -1

    def pick(v):
        return float(v[dim] if isinstance(v, list) else v)

    return pick(cluster.link_bw_GBps), pick(cluster.link_latency_ns)


def kv_transfer_ns(cluster: ClusterConfig, src: InstanceRuntime, dst: InstanceRuntime,
                   tokens: int) -> tuple[int, int]:
    """(ns, bytes) to move ``tokens`` tokens of KV from a prefill to a decode instance.

    Each of the source's tp ranks sends its shard over its own link, in parallel, so the
    time is one shard's bytes over one link plus the link latency.
    """
    shard = src.model.kv_bytes_per_token(src.tp, src.pp) * tokens
    bw, lat = _link(cluster, src.config, dst.config)
    return int(lat + shard / (bw * (1 << 30) / 1e9)), shard * src.tp * src.pp


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


def _fresh_requests(workload: Workload) -> list[Request]:
    """Copies of the workload's requests (so a Workload can be simulated many times)."""
    out = []
    for head in workload.requests:
        prev = None
        r = head
        while r is not None:
            c = Request(r.rid, r.arrival_ns, r.input_len, r.output_len, r.input_ids, r.output_ids,
                        r.session_id, r.sub_index, r.tool_ns)
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
        if backend is None:
            lat = cluster.link_latency_ns
            lat = lat[0] if isinstance(lat, list) else lat
            bw = cluster.link_bw_GBps
            bw = bw[0] if isinstance(bw, list) else bw
            backend = AnalyticalBackend(float(bw), float(lat))
        self.backend = backend

    def run(self, workload: Workload) -> RunResult:
        wall0 = time.perf_counter()
        opts = self.opts
        heads = _fresh_requests(workload)
        all_reqs: list[Request] = []
        for h in heads:
            r = h
            while r is not None:
                all_reqs.append(r)
                r = r.next_sub
        # Reset per-run instance state.
        for inst in self.instances:
            kv = KVCacheManager(inst.num_kv_blocks, inst.opts.block_size,
                                inst.opts.enable_prefix_caching)
            inst.scheduler = Scheduler(inst.instance_id, inst.opts, kv)
            inst.scheduler.role = inst.config.pd_type
        _build_tiers(self.cluster, self.opts, self.instances)
        schedulers = [i.scheduler for i in self.instances]
        router = ROUTING_POLICIES.create(opts.routing_policy, opts.seed,
                                         source="--request-routing-policy")
        # With PD disaggregation new requests go to prefill instances, and finished prefills
        # to decode instances chosen by pd_decode_policy.
        pd = any(i.config.pd_type for i in self.instances)
        entry = [i for i, inst in enumerate(self.instances)
                 if not pd or inst.config.pd_type == "prefill"]
        entry_scheds = [schedulers[i] for i in entry]
        decode_idx = [i for i, inst in enumerate(self.instances) if inst.config.pd_type == "decode"]
        decode_scheds = [schedulers[i] for i in decode_idx]
        decode_router = ROUTING_POLICIES.create(opts.pd_decode_policy, opts.seed,
                                                source="pd_decode_policy") if pd else None
        transfers_ns: list[int] = []
        transfer_bytes = 0
        backend = self.backend
        series = TimeSeries(opts.timeseries_interval_ns)
        itl: list[int] = []

        # Pending arrivals: a heap of (arrival_ns, rid, request).
        pending: list[tuple[int, int, Request]] = []
        clients = workload.closed_loop_clients
        backlog: list[Request] = []
        if clients > 0:
            backlog = list(reversed(heads))
            for c in range(min(clients, len(backlog))):
                r = backlog.pop()
                r.arrival_ns = 0
                r.client_id = c
                heapq.heappush(pending, (0, r.rid, r))
        else:
            for r in heads:
                heapq.heappush(pending, (r.arrival_ns, r.rid, r))

        # Iterations in flight: (end_ns, seq, instance index, batch or None). A None batch is
        # a wake-up: with pipeline parallelism an instance may issue its next batch once
        # the previous one has left the first stage, up to pp batches in flight.
        in_flight: list[tuple[int, int, int, Batch | None]] = []
        seq = 0
        n_inst = len(self.instances)
        inflight_count = [0] * n_inst
        free_at = [0] * n_inst
        depth = [inst.pp for inst in self.instances]
        now = 0
        remaining = len(all_reqs)
        max_time = opts.max_sim_time_ns
        progress = _Progress(len(all_reqs)) if opts.progress else None
        while remaining > 0:
            # 1. Next event time: an iteration ending or (if something is idle) an arrival.
            t_next = in_flight[0][0] if in_flight else None
            if pending and (t_next is None or pending[0][0] < t_next):
                if any(inflight_count[i] < depth[i] for i in range(n_inst)):
                    t_next = pending[0][0] if t_next is None else min(t_next, pending[0][0])
            if t_next is None:
                raise RuntimeError("simulation stalled: requests remain but nothing can run "
                                   "(a request larger than an instance's KV capacity?)")
            if t_next > now:
                now = t_next
            if max_time is not None and now > max_time:
                break
            # 2. Route arrivals.
            while pending and pending[0][0] <= now:
                _, _, req = heapq.heappop(pending)
                entry_scheds[router.choose(req, entry_scheds)].add_request(req)
            # 3. Retire iterations that end now.
            while in_flight and in_flight[0][0] <= now:
                end, _, idx, batch = heapq.heappop(in_flight)
                if batch is None:
                    continue
                inflight_count[idx] -= 1
                sch = schedulers[idx]
                finished = sch.complete(batch, end, itl)
                series.record(end, batch.prefill_tokens, batch.decode_tokens + len(finished) * 0,
                              len(sch.running), len(sch.waiting), sch.kv.usage())
                for req in finished:
                    remaining -= 1
                    nxt = req.next_sub
                    if nxt is not None:
                        nxt.arrival_ns = end + nxt.tool_ns
                        heapq.heappush(pending, (nxt.arrival_ns, nxt.rid, nxt))
                    if clients > 0 and backlog:
                        r = backlog.pop()
                        r.arrival_ns = end
                        r.client_id = req.client_id
                        heapq.heappush(pending, (end, r.rid, r))
                if progress is not None and finished:
                    progress.update(len(all_reqs) - remaining, now)
                if sch.handoffs:
                    for req in sch.handoffs:
                        req.prefill_instance = idx
                        req.remote_kv = True
                        decode_scheds[decode_router.choose(req, decode_scheds)].add_request(req)
                    sch.handoffs.clear()
            # Arrivals released at exactly `now` by completions are routed before scheduling.
            while pending and pending[0][0] <= now:
                _, _, req = heapq.heappop(pending)
                entry_scheds[router.choose(req, entry_scheds)].add_request(req)
            # 4. Idle instances schedule their next batch.
            for idx, inst in enumerate(self.instances):
                if inflight_count[idx] >= depth[idx] or free_at[idx] > now:
                    continue
                batch = inst.scheduler.schedule(now)
                if inst.scheduler.admitted_transfers:
                    for req in inst.scheduler.admitted_transfers:
                        src = self.instances[req.prefill_instance]
                        t, nbytes = kv_transfer_ns(self.cluster, src, inst, req.num_tokens - 1)
                        req.ready_ns = now + t
                        req.kv_transfer_ns = t
                        transfers_ns.append(t)
                        transfer_bytes += nbytes
                        seq += 1
                        heapq.heappush(in_flight, (req.ready_ns, seq, idx, None))
                    inst.scheduler.admitted_transfers.clear()
                if batch is None:
                    if (inst.scheduler.waiting and not inst.scheduler.running
                            and inflight_count[idx] == 0):
                        head = inst.scheduler.waiting[0]
                        raise InputError(
                            f"request {head.rid} needs {head.num_tokens} tokens of KV but instance "
                            f"{inst.instance_id} holds at most "
                            f"{(inst.num_kv_blocks - 1) * inst.opts.block_size}")
                    continue
                dur = backend.iteration_ns(inst, batch.shape)
                if batch.tier_load_bytes:
                    # Lower-tier prefix hits are loaded before the step computes on them.
                    dur += inst.lower_tier.load_ns(batch.tier_load_bytes)
                dur = max(1, dur)
                inflight_count[idx] += 1
                seq += 1
                heapq.heappush(in_flight, (now + dur, seq, idx, batch))
                if depth[idx] > 1:
                    # Equal stages: the next batch may enter stage 0 after one stage time.
                    free_at[idx] = now + max(1, dur // depth[idx])
                    seq += 1
                    heapq.heappush(in_flight, (free_at[idx], seq, idx, None))
        if progress is not None:
            progress.close()
        wall = time.perf_counter() - wall0
        summary = summarize(all_reqs, itl, now, wall,
                            sum(s.num_preemptions for s in schedulers),
                            sum(s.kv.hit_tokens for s in schedulers),
                            sum(s.kv.queried_tokens for s in schedulers))
        summary.update(self.describe())
        lower = sum(s.kv.lower_hit_tokens for s in schedulers)
        queried = sum(s.kv.queried_tokens for s in schedulers)
        summary["prefix_hit_tokens_npu"] = summary["prefix_hit_tokens"] - lower
        summary["prefix_hit_tokens_lower_tier"] = lower
        summary["prefix_hit_ratio_npu"] = (summary["prefix_hit_tokens"] - lower) / queried if queried else 0.0
        summary["prefix_hit_ratio_lower_tier"] = lower / queried if queried else 0.0
        summary["prefix_storage"] = self.opts.prefix_storage
        summary["kv_transfers"] = len(transfers_ns)
        summary["kv_transfer_bytes"] = transfer_bytes
        summary["kv_transfer_ms"] = stats_ms(transfers_ns) if transfers_ns else None
        extrap = {}
        for inst in self.instances:
            for k, v in inst.provider.extrapolations().items():
                extrap[k] = extrap.get(k, 0) + v
        summary["latency_extrapolations"] = extrap
        return RunResult(all_reqs, summary, series)

    def describe(self) -> dict:
        kinds = sorted({i.provider.kind for i in self.instances})
        return {
            "latency_provider": kinds[0] if len(kinds) == 1 else "mixed:" + ",".join(kinds),
            "latency_source": {str(i.instance_id): i.provider.source for i in self.instances},
            "backend": self.backend.name,
            "num_instances": len(self.instances),
            "num_npus": sum(i.config.num_npus for i in self.instances),
            "kv_blocks": {str(i.instance_id): i.num_kv_blocks for i in self.instances},
            "energy_j": None,
        }

    def close(self) -> None:
        self.backend.close()


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
