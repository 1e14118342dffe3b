"""The latency-provider interface: per-layer compute time of one iteration's batch.

A provider answers "how long does each layer take for this batch shape" for one
(hardware, model, tp) triple. It builds whatever lookup tables it needs once, at
construction; the per-iteration call does no I/O. Three providers implement it:
``measured`` (LLMServingSim-format profile bundles), ``roofline`` (hardware spec plus
calibrated efficiency factors) and ``aic`` (aiconfigurator's per-op database, optional).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sim.registry import Registry


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one iteration computes, in the coordinates the profiles are keyed on.

    ``num_tokens`` is every token computed this step (prefill chunk tokens plus one per
    decode); ``num_seqs`` the sequences that produce logits (lm_head/sampler rows).
    Prefill requests contribute ``prefill_tokens`` new tokens that attend to
    ``prefill_kv`` tokens already cached (sums over the requests; ``prefill_work`` keeps
    the per-request pairing that attention cost depends on); decode requests read ``decode_kv_sum`` cached
    tokens in total (the longest read is ``decode_kv_max``).
    """

    num_tokens: int
    num_seqs: int
    prefill_tokens: int = 0
    prefill_kv: int = 0
    num_decode: int = 0
    decode_kv_sum: int = 0
    decode_kv_max: int = 0
    decode_kv_min: int = 0
    #: FlashAttention varlen work of the prefill requests, sum of c_i * (2 kv_i + c_i) (twice
    #: the causal query-key pairs of chunk c_i over kv_i cached tokens); 0 = one request,
    #: ``prefill_tokens`` over ``prefill_kv``
    prefill_work: int = 0

    @property
    def decode_kv_mean(self) -> int:
        return self.decode_kv_sum // self.num_decode if self.num_decode else 0


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Per-layer compute time (ns) of one iteration on one NPU of the instance.

    ``block`` is one decoder block; the model runs ``num_blocks`` of them (per pipeline
    stage the engine divides them). ``prologue`` runs before the first block
    (embedding) and ``head`` after the last (final norm, lm_head, sampler).
    """

    prologue: tuple[tuple[str, int], ...]
    block: tuple[tuple[str, int], ...]
    head: tuple[tuple[str, int], ...]
    num_blocks: int

    def total_ns(self) -> int:
        pro = sum(t for _, t in self.prologue)
        blk = sum(t for _, t in self.block)
        hd = sum(t for _, t in self.head)
        return pro + self.num_blocks * blk + hd


@runtime_checkable
class LatencyProvider(Protocol):
    """Per-layer latency for one (hardware, model, tp)."""

    #: "measured", "roofline" or "aic": recorded in every output.
    kind: str
    #: Human-readable origin, e.g. the bundle folder or "roofline(H100-SXM)".
    source: str

    def layer_times(self, shape: BatchShape) -> LayerTimes:
        """Per-layer times for this batch. MoE layers assume all tokens are local."""
        ...

    def moe_ns(self, tokens: int, activated_experts: int) -> int:
        """One MoE layer on one rank: ``tokens`` routed to ``activated_experts`` experts."""
        ...

    def extrapolations(self) -> dict[str, int]:
        """Count of lookups that fell outside the measured grid, by axis (reported)."""
        ...


#: name -> factory(model: ModelSpec, hardware: str, tp: int, **options) -> LatencyProvider
LATENCY_PROVIDERS: Registry[LatencyProvider] = Registry("latency provider")
