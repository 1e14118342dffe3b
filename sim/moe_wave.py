"""One lockstep step of an MoE model served with data-parallel attention and expert
parallelism, as vLLM 0.19 executes it.

vLLM runs every DP rank as its own engine core with its own scheduler. While any rank has
work, all of them step together (a "wave"): a rank with nothing scheduled runs a dummy
batch so that it joins the collectives of the MoE layers. Before each forward the ranks
agree on their token counts (``coordinate_batch_across_dp``: one small all-reduce done on
the host under async scheduling); when every rank runs a CUDA graph (its token count is
at most ``max_cudagraph_capture_size``) all of them pad to the largest capture size among
them, otherwise each runs its own count.

Inside the forward every decoder layer is: the rank's own attention and dense layers on
its tokens, then the MoE layer, whose exchange depends on ``all2all_backend``:

- ``allgather_reducescatter`` (vLLM 0.19's default): before the experts an all-gather over
  the DP group of every rank's hidden states and router logits, after them a
  reduce-scatter of the expert outputs of all the gathered tokens (the unquantized MoE
  method's naive dispatch: ``dispatch_router_logits`` / ``combine``, pynccl on the compute
  stream, in the model's dtype; with unequal token counts, eager waves, vLLM groups one
  broadcast / reduce per root, which the all-gather at the largest share bounds below);
- ``naive``: each DP rank in turn broadcasts its hidden states and router logits, and
  the outputs are combined by an all-reduce of all the gathered tokens;
- ``deepep_high_throughput`` / ``deepep_low_latency``: an all-to-all that sends each
  token only to the EP ranks owning one of its top-k experts (dispatch), and the same
  volume back (combine).

Each EP rank runs only its own experts (``expert_placement_strategy: linear``: rank r owns
the contiguous range r * E/ep ... (r+1) * E/ep - 1), on the token-expert assignments the
gate policy gives it. A collective waits for its slowest participant, so each layer takes
the slowest rank's attention/dense part, the exchange, and the slowest EP rank's experts.

With one DP rank (a single instance whose TP ranks are its EP ranks) there is no exchange:
every TP rank holds all tokens, runs its experts, and the TP all-reduce after the MoE
layer (part of the instance's iteration graph) combines them.

With TP > 1 as well as DP > 1 and expert parallelism, vLLM 0.19 runs *sequence-parallel
MoE* (``use_sequence_parallel_moe``; allgather_reducescatter and DeepEP): each TP rank takes
its 1/tp slice of the DP rank's tokens into the MoE layer, the exchange runs over the whole
EP group (dp x tp ranks), and the TP group all-gathers the MoE output instead of
all-reducing it. With ``naive`` every TP rank exchanges all its tokens over its DP group
and the TP all-reduce stays.

A DP group *without* expert parallelism (ep_size 1) still gathers every DP rank's tokens
into each MoE layer (vLLM dispatches whenever dp > 1), but every rank holds every expert,
its intermediate dimension sharded over all dp x tp ranks (``flatten_tp_across_dp``): each
rank runs all gathered tokens through all experts on its 1/(dp x tp) shard.

The collectives are timed by the system backend on the group's network as sim.topology
describes it (the link between the members: the cluster file's GPU-to-GPU values as
LLMServingSim gives them to ASTRA-Sim, else the catalogue's physical link; the cluster's
collective algorithm; one rank per member, or per TP rank in sequence-parallel MoE),
memoised by size, as decode steps repeat them. On the catalogue's link inside one node the
calls take what was measured between those cards (sim.backend.measured_collectives):
allgather_reducescatter's all-gather and reduce-scatter NCCL's own (the hardware
catalogue's ``nccl_us``), naive's broadcasts NCCL's and its all-reduce vLLM's
(``vllm_all_reduce_us``). NCCL's 5-10 us a call dominate a decode wave's exchange on
NVLink, where the link model's hops are a fraction of a microsecond
(experiments/moe_exchange_vs_nccl.py). DeepEP's dispatch and combine take its kernels'
measured times where the card and the model's shape were measured (sim.deepep: H100, H200,
B200; 8-GPU measurements, FP8 dispatch read at the bytes vLLM sends); elsewhere, and on a
cluster file's link, the link model's all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from astrasim import GraphBuilder

from sim.errors import InputError
from sim.latency.base import BatchShape
from sim.model import expert_shard_ranks
from sim.options import ALL2ALL_BACKENDS

#: vLLM 0.19's default (its resolved config: parallel_config.all2all_backend)
DEFAULT_ALL2ALL_BACKEND = ALL2ALL_BACKENDS[0]
#: backends with which vLLM 0.19 runs sequence-parallel MoE (use_sequence_parallel_moe)
SP_MOE_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency")

#: the step an idle DP rank runs (vLLM's execute_dummy_batch: one token, no sampling)
DUMMY_SHAPE = BatchShape(num_tokens=1, num_seqs=1, num_decode=1, decode_kv_sum=1,
                         decode_kv_max=1, decode_kv_min=1)


def default_max_cudagraph_capture_size(max_num_seqs: int) -> int:
    """vLLM 0.19's default largest CUDA-graph batch: min(2 * max_num_seqs, 512)."""
    return min(2 * max_num_seqs, 512)


def max_capture_size(opts) -> int:
    """The largest CUDA-graph batch of a run: its max_cudagraph_capture_size, else vLLM
    0.19's default for its max_num_seqs (0: eager)."""
    cap = opts.max_cudagraph_capture_size
    return default_max_cudagraph_capture_size(opts.max_num_seqs) if cap is None else cap


def cudagraph_size(tokens: int, max_size: int) -> int | None:
    """The capture size a ``tokens``-token batch is padded to, or None when it runs without
    a CUDA graph. vLLM 0.19's default capture sizes are 1, 2, 4, then multiples of 8 below
    256 and of 16 from 256 up to ``max_size``."""
    if tokens > max_size or max_size < 1:
        return None
    for size in (1, 2, 4):
        if tokens <= size:
            return min(size, max_size)
    step = 8 if tokens < 256 else 16
    return min(-(-tokens // step) * step, max_size)


def dp_padded_tokens(tokens: list[int], max_capture: int) -> list[int]:
    """Tokens each DP rank runs after vLLM's DP padding: with every rank in CUDA-graph mode
    all pad to the largest capture size among them; with any rank in eager mode
    (synchronised mode NONE) each runs its own count."""
    sizes = [cudagraph_size(t, max_capture) for t in tokens]
    if any(s is None for s in sizes):
        return list(tokens)
    top = max(sizes)
    return [top] * len(tokens)


@dataclass(frozen=True)
class RankStep:
    """One DP rank's share of a wave (ns, whole step)."""

    attention_ns: int
    #: the other non-MoE compute: embedding, norms, projections, lm_head, sampler, and the
    #: rank's TP all-reduces
    dense_ns: int
    #: its EP ranks' expert compute (the slowest of its TP ranks)
    moe_ns: int
    #: the MoE exchange (dispatch + combine) of every layer
    comm_ns: int
    #: waiting for slower ranks at the layers' collectives
    wait_ns: int
    tokens: int
    real: bool


@dataclass(frozen=True)
class WaveStep:
    wave_ns: int
    ranks: tuple[RankStep, ...]
    #: each rank's batch as it ran (None: a dummy batch); kept only for recorded waves
    #: (``MoEWave.record``), for breakdown reports
    shapes: tuple[BatchShape | None, ...] = ()


def _rank_parts(backend, inst, shape: BatchShape, real: bool) -> tuple[int, int, int, int, int]:
    """(prologue, one block without its MoE layer, head, attention per block, TP
    communication per block) of one DP rank. The head (lm_head, sampler) is skipped for a
    dummy batch, which samples nothing."""
    lt = inst.provider.layer_times(shape)
    layers = lt.num_blocks
    block = moe_full = attn = 0
    for name, ns in lt.block:  # (one pass: the block's total, its MoE and its attention)
        block += ns
        if name == "moe":
            moe_full += ns
        elif name == "attention":
            attn += ns
    tp_comm = 0
    if inst.tp > 1 or inst.pp > 1:
        # the rank's own communication (TP all-reduces, stage hops) from its iteration graph
        tp_comm = max(0, backend.iteration_ns(inst, shape) - lt.total_ns()) // max(1, layers)
    block = block - moe_full + tp_comm
    head = sum(ns for _, ns in lt.head) if real else 0
    return sum(ns for _, ns in lt.prologue), block, head, attn, tp_comm


def _with_tokens(s: BatchShape, tokens: int) -> BatchShape:
    """``s`` with ``num_tokens`` replaced (``dataclasses.replace``, built directly: it
    costs several times less, once per padded rank and wave)."""
    return BatchShape(tokens, s.num_seqs, s.prefill_tokens, s.prefill_kv, s.num_decode,
                      s.decode_kv_sum, s.decode_kv_max, s.decode_kv_min, s.prefill_work,
                      s.decode_kv_sq_sum)


def ranks_hit_fraction(num_experts: int, top_k: int, ep: int) -> float:
    """Probability that a token's top-k experts include at least one of a given EP rank's
    E/ep experts (k distinct experts drawn uniformly)."""
    local = num_experts // ep
    return 1.0 - comb(num_experts - local, top_k) / comb(num_experts, top_k)


class MoEWave:
    """Times lockstep steps of expert-parallel domains (see the module docstring)."""

    def __init__(self, backend, network, flat_provider=None) -> None:
        self.backend = backend
        #: network(member InstanceConfigs, npus) -> the Topology (sim.topology) of an MoE
        #: exchange among ``npus`` ranks of those instances
        self.network = network
        #: flat_provider(instance, tp) -> a latency provider of the instance's model at
        #: another TP degree (the experts of a DP group without expert parallelism are
        #: sharded over dp * tp ranks); raises InputError when none covers it
        self.flat_provider = flat_provider
        self._exchange: dict[tuple, int] = {}
        #: (member instance ids, npus) -> (Topology, the measured collectives on it or None:
        #: sim.backend.measured_collectives): a group's network is fixed for a run
        self._networks: dict[tuple, tuple] = {}
        self._tp_swap: dict[tuple, int] = {}
        self._flat: dict[tuple, object] = {}
        #: when a list, every wave's WaveStep is appended (for breakdown reports)
        self.record: list | None = None

    def step_ns(self, members: list, shapes: list[BatchShape | None], gate) -> int:
        return self.step(members, shapes, gate).wave_ns

    def step(self, members: list, shapes: list[BatchShape | None], gate) -> WaveStep:
        """``members`` are the DP ranks (instances); ``shapes[i]`` is rank i's batch or
        None when it has nothing scheduled (it runs a dummy batch)."""
        lead = members[0]
        model, opts = lead.model, lead.opts
        real = [s is not None for s in shapes]
        own = [s if s is not None else DUMMY_SHAPE for s in shapes]
        dp = len(members)
        if dp > 1:
            padded = dp_padded_tokens([s.num_tokens for s in own], max_capture_size(opts))
            # the padding is for the MoE layers and their exchange (num_tokens_across_dp);
            # each rank's attention stays its own varlen batch (prefill_work kept)
            own = [s if p == s.num_tokens else _with_tokens(s, p)
                   for s, p in zip(own, padded)]
        sp = sequence_parallel_moe(opts.all2all_backend, dp, lead.tp, lead.config.ep_size)
        parts = [_rank_parts(self.backend, m, s, r) for m, s, r in zip(members, own, real)]
        if sp:
            # the MoE output is all-gathered over the TP group instead of all-reduced
            parts = [(pro, blk + self._tp_swap_ns(m, s.num_tokens), head, attn, tpc)
                     for (pro, blk, head, attn, tpc), m, s in zip(parts, members, own)]
        layers = model.num_hidden_layers
        total = sum(s.num_tokens for s in own)
        if dp > 1 and lead.config.ep_size == 1:
            mine_moe = [self._flat_expert_ns(lead, dp, total, gate)] * dp
            experts = mine_moe[:1]
        else:
            experts = self._expert_ns(lead.provider, lead, total if dp > 1 else own[0].num_tokens,
                                      gate)
            mine_moe = _member_share(experts, dp)
        exch = self._exchange_ns(members, [s.num_tokens for s in own], sp) if dp > 1 else 0
        # every layer: the slowest rank's attention/dense part, the exchange, the slowest
        # EP rank's experts (the collectives wait for the last to arrive)
        wave = (max(p[0] for p in parts)
                + layers * (max(p[1] for p in parts) + exch + max(experts))
                + max(p[2] for p in parts))
        ranks = []
        for (pro, blk, head, attn, _), s, r, moe in zip(parts, own, real, mine_moe):
            busy_dense = pro + layers * (blk - attn) + head
            mine = busy_dense + layers * (attn + moe + exch)
            ranks.append(RankStep(layers * attn, busy_dense, layers * moe, layers * exch,
                                  wave - mine, s.num_tokens, r))
        if self.record is not None:
            out = WaveStep(int(wave), tuple(ranks), tuple(shapes))
            self.record.append(out)
            return out
        return WaveStep(int(wave), tuple(ranks))

    def _expert_ns(self, prov, inst, tokens: int, gate, ep: int | None = None) -> list[int]:
        """Each EP rank's expert compute for ``tokens`` tokens entering the layer: the gate
        spreads tokens * top_k assignments over the ep ranks; a rank's time is the
        profile's at the tokens that give its assignments and its activated experts."""
        model = inst.model
        k = model.num_experts_per_tok
        ep = inst.config.ep_size if ep is None else ep
        return [prov.moe_ns(-(-assignments // k), max(1, active)) if assignments else 0
                for assignments, active in gate.assign(tokens, model.num_experts, k, ep)]

    def _flat_expert_ns(self, inst, dp: int, tokens: int, gate) -> int:
        """Expert compute of one rank of a DP group without expert parallelism. vLLM
        (FusedMoEParallelConfig.make, flatten_tp_across_dp) then shards every expert's
        intermediate dimension over all dp * tp ranks of the group, and each rank runs the
        gathered tokens of the whole group through all experts on its shard: the latency
        data at TP degree dp * tp where there is some, else the instance's own scaled by
        tp / (dp * tp) (the fused-MoE kernel's weight bytes and FLOPs both scale with the
        intermediate width)."""
        flat_tp = expert_shard_ranks(inst.tp, 1, dp)
        key = (id(inst.provider), flat_tp)
        prov = self._flat.get(key, False)
        if prov is False:
            prov = None
            if self.flat_provider is not None:
                try:
                    prov = self.flat_provider(inst, flat_tp)
                except InputError:
                    prov = None
            self._flat[key] = prov
        if prov is not None:
            return self._expert_ns(prov, inst, tokens, gate, ep=1)[0]
        full = self._expert_ns(inst.provider, inst, tokens, gate, ep=1)[0]
        return -(-full * inst.tp // flat_tp)

    def _tp_swap_ns(self, inst, tokens: int) -> int:
        """Sequence-parallel MoE: one TP all-gather of the rank's 1/tp share of the MoE
        output in place of the TP all-reduce of the whole output (ns, may be negative)."""
        key = (id(inst.network), inst.tp, inst.pp, tokens)
        t = self._tp_swap.get(key)
        if t is None:
            from sim.backend import (custom_all_reduce_below, measured_all_reduce,
                                     measured_collectives)
            from sim.graph_generator import tp_all_reduce

            row = inst.model.hidden_size * inst.model.dtype_bytes
            share = -(-tokens // inst.tp) * row
            involved = [True] + [False] * (len(inst.network.dims) - 1)
            # the all-reduce as the step runs it; the all-gather at NCCL's measured time
            # on the catalogue's link (read at the whole gathered buffer), else the link's
            one_shot, curve = custom_all_reduce_below(inst), measured_all_reduce(inst)
            gather = measured_collectives(inst.config.hardware, inst.network,
                                          inst.tp).get("all_gather")
            ar, ag = {}, {}
            for r in range(inst.tp):
                b = GraphBuilder(r)
                tp_all_reduce(b, tokens * row, involved, one_shot, "tp_all_reduce", curve)
                ar[r] = b.build()
                b = GraphBuilder(r)
                if gather is not None:
                    b.comp(gather.ns(share * inst.tp), name="sp_moe_all_gather")
                else:
                    b.all_gather(share, involved_dim=involved, name="sp_moe_all_gather")
                ag[r] = b.build()
            t = self._tp_swap[key] = (self.backend.run_graphs(inst.network, ag, name="sp_ag")
                                      - self.backend.run_graphs(inst.network, ar, name="tp_ar"))
        return t

    def _exchange_ns(self, members: list, tokens: list[int], sp: bool = False) -> int:
        """Dispatch + combine of one MoE layer over the DP group (over the whole EP group
        of dp * tp ranks, each with its 1/tp share of its DP rank's tokens, in
        sequence-parallel MoE), timed by the backend on the group's network."""
        lead = members[0]
        model = lead.model
        kind = lead.opts.all2all_backend
        if sp:
            tokens = [-(-t // lead.tp) for t in tokens for _ in range(lead.tp)]
        n = len(tokens)
        width = model.dtype_bytes
        hidden = model.hidden_size * width
        logits = model.num_experts * width
        group = (tuple(m.config.instance_id for m in members), n)
        known = self._networks.get(group)
        if known is None:
            from sim.backend import measured_collectives

            network = self.network([m.config for m in members], n)
            known = self._networks[group] = (
                network, measured_collectives(lead.config.hardware, network, n) or None)
        network, curves = known
        measured = None if curves is None else lead.config.hardware
        if kind == "allgather_reducescatter":
            # all_gatherv of (hidden states, router logits); reduce_scatterv of the outputs
            # (sizes are the whole gathered buffer; unequal shares cost the largest one)
            key = (kind, n, max(tokens), hidden, logits, network, measured)
        elif kind == "naive":
            key = (kind, n, tuple(tokens), hidden, logits, network, measured)
        else:
            if measured is not None:
                # DeepEP's kernels as measured on the card for the model's shape
                key = (kind, n, max(tokens), measured, model.name)
                t = self._exchange.get(key)
                if t is None:
                    t = self._exchange[key] = _deepep_ns(lead, kind, max(tokens))
                if t >= 0:
                    return t
            frac = ranks_hit_fraction(model.num_experts, model.num_experts_per_tok,
                                      lead.config.ep_size)
            key = (kind, n, max(tokens), int(hidden * frac), 0, network, None)
            curves = None
        t = self._exchange.get(key)
        if t is None:
            graphs = exchange_graphs(kind, n, tokens, hidden, logits, key[3], curves)
            t = self._exchange[key] = self.backend.run_graphs(network, graphs,
                                                              name="moe_exchange")
        return t


def sequence_parallel_moe(backend: str, dp: int, tp: int, ep: int) -> bool:
    """vLLM 0.19's ParallelConfig.use_sequence_parallel_moe: with expert parallelism over
    DP > 1 and TP > 1 and an all-to-all backend that supports it (allgather_reducescatter,
    DeepEP), each TP rank sends only its 1/tp slice of the tokens through the MoE layer
    (the exchange runs over the whole EP group) and the TP group all-gathers the output."""
    return (backend in SP_MOE_BACKENDS and ep > 1 and tp > 1 and dp > 1)


def _member_share(per_ep_rank: list[int], dp: int) -> list[int]:
    """Each DP member's expert time: the slowest of the EP ranks it hosts (EP rank r lives
    on member r * dp // ep; with fewer EP ranks than members, members share one)."""
    ep = len(per_ep_rank)
    out = [0] * dp
    for r, t in enumerate(per_ep_rank):
        m = r * dp // ep
        out[m] = max(out[m], t)
    for m in range(dp):
        if not out[m]:
            out[m] = per_ep_rank[m * ep // dp]
    return out


def _deepep_ns(inst, kind: str, tokens: int) -> int:
    """One layer's DeepEP dispatch + combine on the instance's card for its model's shape
    (sim.deepep), -1 where that card or shape was not measured. An FP8 model dispatches
    FP8 activations, any other its own dtype."""
    from sim.deepep import deepep_exchange_ns

    model = inst.model
    width = 1 if model.quantization == "fp8" else model.dtype_bytes
    t = deepep_exchange_ns(inst.config.hardware, kind, model.hidden_size,
                           model.num_experts_per_tok, model.num_experts, tokens, width)
    return -1 if t is None else t


def exchange_graphs(kind: str, dp: int, tokens: list[int], hidden: int, logits: int,
                    a2a_row: int, curves: dict | None = None) -> dict:
    """Per-rank graphs of one MoE layer's dispatch and combine (sizes in bytes; ``hidden``
    and ``logits`` are one token's hidden state and router logits, ``a2a_row`` one token's
    hidden state times the chance it goes to a given rank). ``curves``: the group's
    measured collectives (sim.backend.measured_collectives); the backend's collectives
    that have one take its time, the others run on the network."""
    graphs = {}
    curves = curves or {}
    if kind == "allgather_reducescatter" and {"all_gather", "reduce_scatter"} <= curves.keys():
        # NCCL's all-gather and reduce-scatter, each read at the whole buffer's bytes
        gathered = dp * max(tokens)
        for r in range(dp):
            b = GraphBuilder(r)
            d = b.comp(curves["all_gather"].ns(gathered * (hidden + logits)),
                       name="moe_dispatch_all_gather")
            b.comp(curves["reduce_scatter"].ns(gathered * hidden), deps=[d],
                   name="moe_combine_reduce_scatter")
            graphs[r] = b.build()
        return graphs
    if kind == "naive" and {"broadcast", "vllm_all_reduce"} <= curves.keys():
        # one NCCL broadcast per rank in turn, then vLLM's all-reduce of all the tokens
        t = sum(curves["broadcast"].ns(n * (hidden + logits)) for n in tokens)
        t += curves["vllm_all_reduce"].ns(sum(tokens) * hidden)
        for r in range(dp):
            b = GraphBuilder(r)
            b.comp(t, name="moe_naive_broadcasts_all_reduce")
            graphs[r] = b.build()
        return graphs
    if kind == "allgather_reducescatter":
        # ASTRA-Sim reads an all-gather's size as each NPU's contribution (the padded
        # largest share) and a reduce-scatter's as the whole input buffer
        gathered = dp * max(tokens)
        for r in range(dp):
            b = GraphBuilder(r)
            d = b.all_gather(max(tokens) * (hidden + logits), involved_dim=[True],
                             name="moe_dispatch_all_gather")
            b.reduce_scatter(gathered * hidden, involved_dim=[True], deps=[d],
                             name="moe_combine_reduce_scatter")
            graphs[r] = b.build()
        return graphs
    if kind == "naive":
        # every rank broadcasts its share in turn (root -> each peer), then an all-reduce
        builders = [GraphBuilder(r) for r in range(dp)]
        last: list[list[int]] = [[] for _ in range(dp)]
        tag = 0
        for root in range(dp):
            size = tokens[root] * (hidden + logits)
            for peer in range(dp):
                if peer == root:
                    continue
                tag += 1
                s = builders[root].send(peer, size, tag=tag, deps=last[root],
                                        name="moe_dispatch_broadcast")
                rcv = builders[peer].recv(root, size, tag=tag, deps=last[peer],
                                          name="moe_dispatch_broadcast")
                last[peer] = [rcv]
                last[root] = [s]
        for r, b in enumerate(builders):
            b.all_reduce(sum(tokens) * hidden, involved_dim=[True], deps=last[r],
                         name="moe_combine_all_reduce")
            graphs[r] = b.build()
        return graphs
    # DeepEP: an all-to-all of each token's hidden state to the ranks that own its experts
    # (the buffer per rank is dp shares of tokens * a2a_row bytes), and back
    for r in range(dp):
        b = GraphBuilder(r)
        d = b.all_to_all(dp * max(tokens) * a2a_row, involved_dim=[True],
                         name="moe_dispatch_all_to_all")
        b.all_to_all(dp * max(tokens) * a2a_row, involved_dim=[True], deps=[d],
                     name="moe_combine_all_to_all")
        graphs[r] = b.build()
    return graphs
