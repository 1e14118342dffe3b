"""Per-iteration execution graphs (Chakra-style) for one instance.

An instance with tensor-parallel degree tp and pp pipeline stages runs on tp * pp NPUs,
numbered stage-major (npu = stage * tp + rank; dimension 0 of the instance's network is the
TP group, dimension 1 the pipeline). Each NPU's graph is:

- stage 0: the prologue (embedding), then its share of the decoder blocks; with tp > 1 the
  vocabulary-parallel embedding's partial rows are summed by a TP ALL_REDUCE of the
  activations (vLLM's VocabParallelEmbedding);
- later stages: a RECV of the previous stage's activations, then their blocks;
- inside a block, consecutive compute layers merge into one COMP node, and a TP ALL_REDUCE
  of the activations (tokens * hidden * dtype bytes, dimension 0 only) follows every
  row-parallel layer (o_proj, down_proj, moe) when tp > 1: a COMP node of vLLM's measured
  all-reduce time where the card has that curve and the link is the catalogue's
  (``all_reduce_curve``, :func:`sim.backend.measured_all_reduce`: vLLM's kernels read and
  write across the link themselves); else, below ``one_shot_below`` bytes, vLLM's one-stage
  custom all-reduce of two ranks: each rank reads the peer's whole buffer and adds it to
  its own, one transfer of the buffer, an ALL_GATHER of that size per rank (the addition
  streams with the transfer);
- the last stage ends with the head (final norm, lm_head, sampler); with tp > 1 each rank's
  lm_head computes its vocabulary shard of the logits and a TP ALL_GATHER of the shards
  (``logits_bytes`` per rank) runs before the sampler, which every rank runs over the whole
  vocabulary (vLLM's LogitsProcessor: ``use_all_gather`` is True on CUDA); other stages
  SEND their activations on;
- a MEM_LOAD of KV blocks fetched from a lower prefix-cache tier comes first.

The block's node pattern is computed once per iteration and replicated for every block;
without pipeline stages the TP ranks share one node list.
"""

from __future__ import annotations

from astrasim import Graph, GraphBuilder

from sim.latency.base import LayerTimes
from sim.model import TP_ALLREDUCE_AFTER

COMP, ALLREDUCE = 0, 1


def block_pattern(block: tuple[tuple[str, int], ...], tp: int) -> list[tuple[int, int]]:
    """[(COMP, ns) | (ALLREDUCE, 0)] for one decoder block, consecutive compute merged."""
    out: list[tuple[int, int]] = []
    acc = 0
    for name, ns in block:
        acc += ns
        if tp > 1 and name in TP_ALLREDUCE_AFTER:
            out.append((COMP, acc))
            out.append((ALLREDUCE, 0))
            acc = 0
    if acc:
        out.append((COMP, acc))
    return out


def blocks_per_stage(num_blocks: int, pp: int) -> list[int]:
    base, extra = divmod(num_blocks, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def logits_shard_bytes(vocab_size: int, tp: int, num_seqs: int, dtype_bytes: int) -> int:
    """One TP rank's share of the step's logits, the per-rank size of their all-gather:
    ``num_seqs`` rows of the rank's slice of the vocabulary padded to a multiple of 64
    (vLLM's ParallelLMHead, DEFAULT_VOCAB_PADDING_SIZE), in the activation dtype (the
    lm_head GEMM's output; the sampler casts to float32 after the gather)."""
    padded = -(-vocab_size // 64) * 64
    return num_seqs * (-(-padded // tp)) * dtype_bytes


def _head_split(head: tuple[tuple[str, int], ...]) -> tuple[int, int]:
    """(ns before the logits all-gather, ns after it): the sampler runs after."""
    after = sum(ns for name, ns in head if name == "sampler")
    return sum(ns for _, ns in head) - after, after


def tp_all_reduce(b: GraphBuilder, size_bytes: int, involved, one_shot_below: int = 0,
                  name: str = "", all_reduce_curve=None) -> int:
    """A TP all-reduce of ``size_bytes`` (see the module docstring): vLLM's measured time
    (``all_reduce_curve``, a :class:`sim.backend.MeasuredCurve`); else below
    ``one_shot_below`` bytes an all-gather of the buffer on the link; else a ring."""
    if all_reduce_curve is not None:
        return b.comp(all_reduce_curve.ns(size_bytes), name=name or "vllm_all_reduce")
    if size_bytes < one_shot_below:
        return b.all_gather(size_bytes, involved_dim=involved, name=name or "custom_all_reduce")
    return b.all_reduce(size_bytes, involved_dim=involved, name=name)


def build_graphs(lt: LayerTimes, tp: int, pp: int, act_bytes: int,
                 load_bytes: int = 0, ndims: int | None = None, logits_bytes: int = 0,
                 ends: bool = True, one_shot_below: int = 0,
                 all_reduce_curve=None) -> dict[int, Graph]:
    """Graphs of every NPU; ``ndims`` is the network's dimension count (default: 2 when
    pp > 1), so a single stage's graph can run on a pipelined instance's network.
    ``logits_bytes`` is one rank's logits shard (:func:`logits_shard_bytes`); ``ends``
    False leaves out the TP collectives of the prologue and head (the embedding's
    all-reduce, the logits' all-gather): a graph of decoder blocks alone; all-reduces below
    ``one_shot_below`` bytes run as vLLM's custom one (:func:`tp_all_reduce`)."""
    pattern = block_pattern(lt.block, tp)
    prologue = sum(ns for _, ns in lt.prologue)
    head_pre, head_post = _head_split(lt.head)
    involved = [True] + [False] * ((ndims or (2 if pp > 1 else 1)) - 1)
    tp_ends = ends and tp > 1
    graphs: dict[int, Graph] = {}
    for stage, n_blocks in enumerate(blocks_per_stage(lt.num_blocks, pp)):
        for rank in range(tp):
            npu = stage * tp + rank
            if rank and pp == 1:
                # Without pipeline send/recv every rank's graph is the same: share the
                # node list (built and encoded once; the engine runs shared lists SPMD).
                graphs[npu] = graphs[stage * tp].copy_for(npu)
                continue
            b = GraphBuilder(npu)
            if load_bytes:
                b.mem_load(load_bytes, name="kv_tier_load")
            if stage == 0:
                acc = prologue
                if tp_ends:
                    if acc:
                        b.comp(acc)
                        acc = 0
                    tp_all_reduce(b, act_bytes, involved, one_shot_below, "embedding_all_reduce",
                                  all_reduce_curve)
            else:
                b.recv(npu - tp, act_bytes, tag=stage, name="pp_recv")
                acc = 0
            for _ in range(n_blocks):
                for kind, ns in pattern:
                    if kind == COMP:
                        acc += ns
                    else:
                        if acc:
                            b.comp(acc)
                            acc = 0
                        tp_all_reduce(b, act_bytes, involved, one_shot_below,
                                      all_reduce_curve=all_reduce_curve)
            if stage == pp - 1:
                acc += head_pre
                if tp_ends and logits_bytes:
                    if acc:
                        b.comp(acc)
                        acc = 0
                    b.all_gather(logits_bytes, involved_dim=involved, name="logits_all_gather")
                acc += head_post
                if acc:
                    b.comp(acc)
            else:
                if acc:
                    b.comp(acc)
                b.send(npu + tp, act_bytes, tag=stage + 1, name="pp_send")
            graphs[npu] = b.build()
    return graphs


def tp_collective_graphs(tp: int, collective: str, size_bytes: int, ndims: int = 1,
                         one_shot_below: int = 0, all_reduce_curve=None) -> dict[int, Graph]:
    """Every rank of one TP group running one collective (``all_reduce`` or ``all_gather``)
    over dimension 0 of a network of ``ndims`` dimensions, nothing else (an all-reduce as
    :func:`tp_all_reduce` runs it)."""
    involved = [True] + [False] * (ndims - 1)
    b = GraphBuilder(0)
    if collective == "all_reduce":
        tp_all_reduce(b, size_bytes, involved, one_shot_below, "tp_all_reduce",
                      all_reduce_curve)
    else:
        getattr(b, collective)(size_bytes, involved_dim=involved, name=f"tp_{collective}")
    first = b.build()
    return {npu: first.copy_for(npu) if npu else first for npu in range(tp)}


def stage_transfer_graphs(tp: int, act_bytes: int) -> dict[int, Graph]:
    """Stage 0 rank 0 sends one stage boundary's activations to stage 1 rank 0."""
    sender, receiver = GraphBuilder(0), GraphBuilder(tp)
    sender.send(tp, act_bytes, tag=1, name="pp_send")
    receiver.recv(0, act_bytes, tag=1, name="pp_recv")
    return {0: sender.build(), tp: receiver.build()}
