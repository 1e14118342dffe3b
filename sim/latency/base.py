"""The latency-provider interface: per-layer compute time of one iteration's batch.

A provider answers "how long does each layer take for this batch shape" for one
(hardware, model, tp) triple. It builds whatever lookup tables it needs once, at
construction; the per-iteration call does no I/O. Three providers implement it:
``measured`` (LLMServingSim-format profile bundles), ``roofline`` (hardware spec plus
calibrated efficiency factors) and ``aic`` (aiconfigurator's per-op database, optional).
``--latency-provider auto`` takes the first of measured > aic > roofline that covers the
(hardware, model with its precision, tp).
"""

from __future__ import annotations

from dataclasses import dataclass
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

from sim.errors import InputError
from sim.registry import Registry

if TYPE_CHECKING:
    from sim.model import ModelSpec


@dataclass(slots=True, unsafe_hash=True)
class BatchShape:
    """What one iteration computes, in the coordinates the profiles are keyed on.

    ``num_tokens`` is every token computed this step (prefill chunk tokens plus one per
    decode); ``num_seqs`` the sequences that produce logits (lm_head/sampler rows).
    Prefill requests contribute ``prefill_tokens`` new tokens that attend to
    ``prefill_kv`` tokens already cached (sums over the requests; ``prefill_work`` keeps
    the per-request pairing that attention cost depends on); decode requests read ``decode_kv_sum`` cached
    tokens in total (the longest read is ``decode_kv_max``).

    Never changed once built, and hashed by value, but not frozen: a frozen dataclass
    sets each field through ``object.__setattr__``, which made building one (once a step,
    and once a step of every event leap) several times slower.
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
    #: sum of the squared decode KV lengths (with ``decode_kv_sum`` and ``num_decode``: their
    #: variance); 0 = not known
    decode_kv_sq_sum: int = 0

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


@dataclass(slots=True)
class DecodeStretch:
    """Iteration times of a stretch of pure-decode steps, computed at once (event leaping):
    ``durations[j]`` is ``iteration_ns`` of step ``j``; ``record(k)`` books what the
    first ``k`` steps would have booked step by step (off-grid lookups), since only the
    steps a leap takes count."""

    durations: list[int]
    record: Callable[[int], None]


class LatencyProvider(ABC):
    """Per-layer latency for one (hardware, model, tp): the contract the engine calls.

    A subclass implements :meth:`layer_times` (and :meth:`moe_ns` for MoE models) and
    registers itself with ``LATENCY_PROVIDERS.register(name, cls)``; everything else has
    a default here. The model spec it is built for carries the precision
    (``model.quantization``, ``model.kv_cache_dtype``), so one provider serves one
    precision.
    """

    #: the registry name ("measured", "roofline", "aic"): recorded in every output
    kind: str = ""
    #: human-readable origin, e.g. the bundle folder or "roofline(H100-SXM)"
    source: str = ""
    #: the model spec (with its precision) this provider answers for
    model: ModelSpec
    #: whether :meth:`covers` is exact (a failing build is then an error, not a reason for
    #: ``auto`` to try the next provider)
    exact_coverage: bool = True
    #: why ``auto`` picked this provider, or what it fell back from ("" when chosen by name)
    note: str = ""
    #: vLLM's CUDA-graph padding (``set_cudagraph_padding``): entry t is the token count a
    #: t-token step runs as; None: eager, every step at its own count
    graph_pad: list[int] | None = None

    def set_cudagraph_padding(self, padded: list[int] | None) -> None:
        """Run steps as vLLM 0.19 runs them under CUDA graphs (FULL_AND_PIECEWISE): a step
        of t <= max_cudagraph_capture_size tokens replays the graph captured for the
        smallest capture size >= t (its input padded to that size: CudagraphDispatcher's
        _bs_to_padded_graph_size), full for a uniform decode batch, piecewise for a mixed
        one; larger steps run at their own count. ``padded[t]`` is that size.

        The padding reaches the token-wise layers (the GEMMs, norms, activation, rotary,
        embedding, the MoE router and experts) and the TP all-reduces between them, which
        the graph runs over every padded row; attention runs over the real requests (the padded ones have no KV),
        and lm_head and the sampler over the rows that produce logits (the runner gathers
        them after the graph)."""
        self.graph_pad = padded

    def dense_tokens(self, tokens: int) -> int:
        """The token count the token-wise layers of a ``tokens``-token step run at."""
        pad = self.graph_pad
        return pad[tokens] if pad is not None and tokens < len(pad) else tokens

    @abstractmethod
    def layer_times(self, shape: BatchShape) -> LayerTimes:
        """Per-layer times for this batch. MoE layers assume all tokens are local."""

    def iteration_ns(self, shape: BatchShape) -> int:
        """Whole-iteration compute time on one NPU (providers may pre-sum it faster)."""
        return self.layer_times(shape).total_ns()

    def decode_stretch(self, shape: BatchShape, steps: int) -> DecodeStretch | None:
        """``iteration_ns`` of ``steps`` pure-decode steps, the first of ``shape``, each
        reading one more KV token per request (sum + num_decode, max + 1, min + 1); None
        where the provider has nothing faster than calling ``iteration_ns`` per step."""
        return None

    def moe_ns(self, tokens: int, activated_experts: int) -> int:
        """One MoE layer on one rank, in its instance's expert layout (the ``ep_size`` the
        provider is built with: whole experts on an expert-parallel rank, else a 1/tp
        shard of every expert, as vLLM lays them out): ``tokens`` x top_k token-expert
        assignments on ``activated_experts`` of the rank's experts."""
        raise InputError(f"{self.model.name} is not a mixture-of-experts model"
                         if not self.model.is_moe else
                         f"the {self.kind} latency provider has no MoE timing")

    def expected_active_experts(self, tokens: int) -> int:
        """Distinct experts ``tokens`` tokens activate (the model spec's expectation)."""
        return self.model.expected_active_experts(tokens)

    def extrapolations(self) -> dict[str, int]:
        """Count of lookups that fell outside the measured grid, by axis (reported)."""
        return {}

    @classmethod
    def covers(cls, model: ModelSpec, hardware: str, tp: int, profiles_dirs=()) -> str | None:
        """Why this provider cannot answer for (model with its precision, hardware, tp)
        without building it, or None when it can (``auto`` and the coverage matrix ask)."""
        return None


#: name -> provider class, called as cls(model, hardware, tp, **options). The only list of
#: provider names: the CLI choices, the cluster/dse option checks and ``auto`` read it.
LATENCY_PROVIDERS: Registry[LatencyProvider] = Registry("latency provider")
#: the order ``--latency-provider auto`` tries: best data first
AUTO_ORDER = ("measured", "aic", "roofline")


def load_providers() -> Registry[LatencyProvider]:
    """Import every module of this package (each provider registers itself on import) and
    return the registry: a new provider is one new module here, nothing else."""
    import importlib
    import pkgutil

    import sim.latency as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{info.name}")
    return LATENCY_PROVIDERS


def provider_names(with_auto: bool = True) -> list[str]:
    """Registered provider names (plus ``auto``): what --latency-provider accepts."""
    names = load_providers().names()
    return (["auto"] if with_auto else []) + names


def auto_choice(model: ModelSpec, hardware: str, tp: int, profiles_dirs=()) -> tuple[str, str]:
    """(provider name, why) that ``auto`` picks: the first of AUTO_ORDER that covers the case."""
    reg = load_providers()
    skipped = []
    for name in AUTO_ORDER:
        if name not in reg:
            continue
        why_not = reg.get(name).covers(model, hardware, tp, profiles_dirs)
        if why_not is None:
            head = f"auto picked {name}"
            return name, head + (f" ({'; '.join(skipped)})" if skipped else "")
        skipped.append(f"{name}: {why_not}")
    raise InputError(f"no latency provider covers {model.name} on {hardware} tp={tp}: "
                     + "; ".join(skipped))
