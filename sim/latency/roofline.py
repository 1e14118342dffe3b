"""The roofline provider: per-layer time from a hardware spec and calibrated efficiencies.

For every layer the provider counts the FLOPs and the bytes it moves on one tensor-
parallel rank, and turns them into time with a per-op-class "soft" roofline::

    t = (c**p + m**p) ** (1/p) + overhead,   c = flops / (peak * eff_compute),
                                             m = bytes / (mem_bw * eff_mem)

``p`` -> infinity is the classic max() roofline; the fitted ``p`` (about 2-4) captures
the partial overlap of compute and memory traffic near the ridge point that real kernels
show. The efficiencies, exponents and fixed overheads per op class come from
``profiles/roofline_calibration.yaml``, fitted by ``experiments/calibrate_roofline.py``
against the measured vLLM bundles, pooled across GPUs so they transfer to GPUs with no
bundle. Two attention effects that a plain roofline misses are modelled explicitly:

- prefill attention needs enough (query row x head) work items to fill the GPU; a small
  chunk runs as if it had ``min_parallel_rows / heads_per_rank`` query rows;
- in a batch that mixes prefill and decode, vLLM runs one varlen kernel and each decode
  query occupies a padded query tile, so decode attention becomes compute-bound with
  ``decode_pad_rows`` effective rows per decode.

Per-layer work depends on the token count only (except attention), so the dense part of
a block is cached per token count; ``layer_times`` is a handful of float operations.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import InputError
from sim.hardware import HardwareSpec, load_hardware
from sim.latency.base import LATENCY_PROVIDERS, BatchShape, LatencyProvider, LayerTimes
from sim.model import (HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec, check_fp8_hardware,
                       expert_shard_ranks)
from sim.paths import profiles_root

#: op class of every layer name the model walks
LAYER_CLASS = {
    "qkv_proj": "gemm", "o_proj": "gemm", "gate_up_proj": "gemm", "down_proj": "gemm",
    "layernorm": "elementwise", "final_layernorm": "elementwise", "qk_norm": "elementwise",
    "rotary_emb": "elementwise", "act_fn": "elementwise", "embedding": "elementwise",
    "lm_head": "lm_head", "sampler": "sampler", "attention": "attention", "moe": "moe",
}
CLASSES = ("gemm", "elementwise", "lm_head", "sampler", "attn_prefill", "attn_decode",
           "attn_mixed", "moe")

#: Used when the calibration file is absent: plain roofline guesses, not fitted.
DEFAULT_CALIBRATION: dict[str, dict[str, float]] = {
    "gemm": {"eff_compute": 0.8, "eff_mem": 0.85, "overhead_us": 4.0, "p": 3.0},
    "elementwise": {"eff_compute": 1.0, "eff_mem": 0.7, "overhead_us": 2.0, "p": 3.0},
    "lm_head": {"eff_compute": 0.8, "eff_mem": 0.85, "overhead_us": 4.0, "p": 3.0},
    "sampler": {"eff_compute": 1.0, "eff_mem": 0.3, "overhead_us": 10.0, "p": 3.0},
    "attn_prefill": {"eff_compute": 0.6, "eff_mem": 0.7, "overhead_us": 8.0, "p": 3.0,
                     "min_parallel_rows": 8192.0},
    "attn_decode": {"eff_compute": 0.5, "eff_mem": 0.8, "overhead_us": 8.0, "p": 3.0},
    "attn_mixed": {"decode_pad_rows": 64.0},
    "moe": {"eff_compute": 0.6, "eff_mem": 0.85, "overhead_us": 20.0, "p": 3.0},
}


def calibration_path() -> Path:
    return profiles_root() / "roofline_calibration.yaml"


def load_calibration(path: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Per-class factors from the calibration YAML (defaults for anything it lacks)."""
    path = Path(path) if path is not None else calibration_path()
    out = {k: dict(v) for k, v in DEFAULT_CALIBRATION.items()}
    if not path.is_file():
        return out
    import yaml

    from sim.errors import MAX_NUMBER, read_text_input
    from sim.yamlio import strict_load, yaml_problem

    text = read_text_input(path, "a roofline calibration", "a YAML")
    try:
        data = strict_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"malformed YAML ({yaml_problem(exc)})", source=str(path)) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise InputError(f"the calibration must be a mapping (classes: ...), got a "
                         f"{type(data).__name__}", source=str(path))
    classes = data.get("classes") or {}
    if not isinstance(classes, dict):
        raise InputError("field 'classes' must be a mapping", source=str(path))
    for cls, params in classes.items():
        if cls not in out:
            raise InputError(f"unknown op class {cls!r} in 'classes'; known: "
                             f"{', '.join(CLASSES)}", source=str(path))
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise InputError(f"field 'classes.{cls}' must be a mapping of its parameters "
                             f"({', '.join(sorted(out[cls]))}), got {params!r}",
                             source=str(path))
        for k, v in params.items():
            if k not in out[cls]:
                raise InputError(f"unknown parameter {cls}.{k}; known: {sorted(out[cls])}",
                                 source=str(path))
            if isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not 0 < v <= MAX_NUMBER:  # NaN fails too
                raise InputError(f"{cls}.{k} must be a positive number <= 1e+15, got {v!r}",
                                 source=str(path))
            out[cls][k] = float(v)
    return out


# ---------------------------------------------------------------------- work counts
class RankDims:
    """Per-rank dimensions of one model under tensor parallelism ``tp``. An MoE layer's
    experts are sharded over ``moe_tp`` ranks inside each expert: ``tp`` without expert
    parallelism, 1 with it (each EP rank holds whole experts; vLLM 0.19's
    FusedMoEParallelConfig)."""

    __slots__ = (
        "b",
        "d",
        "kvb",
        "h",
        "hkv",
        "hq",
        "inter",
        "moe_inter",
        "n_experts",
        "top_k",
        "vocab_full",
        "vocab_rank",
        "wb",
    )

    def __init__(self, m: ModelSpec, tp: int, moe_tp: int | None = None) -> None:
        self.h = m.hidden_size
        self.hq = m.num_attention_heads / tp
        self.hkv = max(1.0, m.num_key_value_heads / tp)   # KV heads replicate when tp > kv
        self.d = m.head_dim
        self.inter = m.intermediate_size / tp
        self.vocab_rank = m.vocab_size / tp
        self.vocab_full = m.vocab_size                    # the sampler sees gathered logits
        self.b = m.dtype_bytes                            # activations (bf16 in W8A8)
        self.wb = m.weight_dtype_bytes()                  # quantized linear weights
        self.kvb = m.kv_dtype_bytes()                     # KV-cache elements
        self.moe_inter = m.moe_intermediate_size / (tp if moe_tp is None else moe_tp)
        self.n_experts = m.num_experts
        self.top_k = m.num_experts_per_tok


def gemm_work(tokens, k: float, n: float, b: int, wb: int | None = None):
    """(flops, bytes) of a [tokens x k] @ [k x n] matmul: activations of ``b`` bytes,
    weights of ``wb`` bytes (default ``b``; 1 for FP8 weights, whose per-token activation
    quantization is fused into the GEMM's input read)."""
    wb = b if wb is None else wb
    return 2.0 * tokens * k * n, wb * k * n + b * (tokens * k + tokens * n)


def dense_work(name: str, r: RankDims, tokens):
    """(class, flops, bytes) of one token-indexed layer (works on floats and arrays)."""
    h, hq, hkv, d, b = r.h, r.hq, r.hkv, r.d, r.b
    if name == "qkv_proj":
        return ("gemm", *gemm_work(tokens, h, (hq + 2 * hkv) * d, b, r.wb))
    if name == "o_proj":
        return ("gemm", *gemm_work(tokens, hq * d, h, b, r.wb))
    if name == "gate_up_proj":
        return ("gemm", *gemm_work(tokens, h, 2 * r.inter, b, r.wb))
    if name == "down_proj":
        return ("gemm", *gemm_work(tokens, r.inter, h, b, r.wb))
    if name in ("layernorm", "final_layernorm"):
        # vLLM fuses the residual add into RMSNorm: read x and residual, write both.
        return "elementwise", 4.0 * tokens * h, 4.0 * b * tokens * h
    if name == "qk_norm":
        return "elementwise", 4.0 * tokens * (hq + hkv) * d, 2.0 * b * tokens * (hq + hkv) * d
    if name == "rotary_emb":
        return "elementwise", 6.0 * tokens * (hq + hkv) * d, 2.0 * b * tokens * (hq + hkv) * d
    if name == "act_fn":
        # SiLU(gate) * up: read 2 x inter, write inter
        return "elementwise", 5.0 * tokens * r.inter, 3.0 * b * tokens * r.inter
    if name == "embedding":
        return "elementwise", 0.0 * tokens, 2.0 * b * tokens * h + 8.0 * tokens
    raise InputError(f"roofline has no work model for layer {name!r}")


def per_sequence_work(name: str, r: RankDims, seqs):
    if name == "lm_head":
        return ("lm_head", *gemm_work(seqs, r.h, r.vocab_rank, r.b))
    if name == "sampler":
        # fp32 logits over the full vocabulary: softmax / top-k / top-p passes
        return "sampler", 8.0 * seqs * r.vocab_full, 4.0 * seqs * r.vocab_full
    raise InputError(f"roofline has no work model for layer {name!r}")


def prefill_attention_work(r: RankDims, chunk, kv, min_rows: float, maximum=max,
                           varlen_work: int = 0):
    """(flops, bytes) of prefill attention: ``chunk`` new tokens over ``kv`` cached ones.

    Query rows below ``min_rows / heads`` are padded (the GPU is not filled). Several
    prompts in one step run as one varlen kernel: ``varlen_work`` (BatchShape's
    ``prefill_work``, sum of c_i (2 kv_i + c_i)) is then their query-key pairs, twice,
    in place of ``chunk`` x (2 ``kv`` + ``chunk``) for the sums; the KV they read is
    the sums' either way."""
    q_eff = maximum(chunk, min_rows / r.hq)
    if varlen_work:
        flops = 2.0 * r.hq * r.d * (q_eff / chunk) * varlen_work
    else:
        flops = 4.0 * r.hq * r.d * q_eff * (kv + 0.5 * chunk)
    # q in, out written in the activation dtype; new K/V written and cached K/V read in
    # the KV-cache dtype
    nbytes = r.d * (r.b * chunk * 2.0 * r.hq + r.kvb * (chunk + kv) * 2.0 * r.hkv)
    return flops, nbytes


def decode_attention_work(r: RankDims, n_decode, kv_sum, pad_rows: float = 1.0):
    """(flops, bytes) of decode attention: ``n_decode`` queries reading ``kv_sum`` KV."""
    flops = 4.0 * r.hq * r.d * kv_sum * pad_rows
    nbytes = r.d * (r.kvb * kv_sum * 2.0 * r.hkv + r.b * n_decode * 2.0 * r.hq)
    return flops, nbytes


def moe_work(r: RankDims, tokens, activated):
    """(flops, bytes) of a fused MoE layer: router + ``activated`` experts' weights."""
    flops = 2.0 * tokens * r.top_k * 3.0 * r.h * r.moe_inter + 2.0 * tokens * r.h * r.n_experts
    nbytes = (r.wb * activated * 3.0 * r.h * r.moe_inter
              + r.b * (r.h * r.n_experts + 2.0 * tokens * r.h + 2.0 * tokens * r.top_k * r.moe_inter))
    return flops, nbytes


def soft_roofline(c, m, p):
    """(c^p + m^p)^(1/p), computed stably; works on floats and numpy arrays."""
    if hasattr(c, "shape") or hasattr(m, "shape"):
        import numpy as np  # calibration path only

        big = np.maximum(c, m)
        small = np.minimum(c, m)
        return big * (1.0 + (small / np.where(big > 0, big, 1.0)) ** p) ** (1.0 / p)
    if c >= m:
        return c * (1.0 + (m / c) ** p) ** (1.0 / p) if c > 0 else 0.0
    return m * (1.0 + (c / m) ** p) ** (1.0 / p)


#: the classes whose kernels the catalogue's measured GEMM rates describe (cuBLAS GEMMs;
#: lm_head is one); attention (FlashAttention), MoE (fused_moe) and the elementwise
#: kernels were not measured and keep the datasheet figures
MEASURED_GEMM_CLASSES = ("gemm", "lm_head")


def measured_ceiling(datasheet: float, measured: float | None, efficiency: float) -> float:
    """The rate to scale a GEMM class's calibrated efficiency by: the datasheet figure,
    cut where the card was measured to sustain less than the calibrated efficiency says.

    The GEMM efficiencies are fitted on GPUs that run GEMMs at about their datasheet peak
    and bandwidth (``efficiency`` ~1); a card measured below that (Hopper's tensor cores
    sustain ~75% of the datasheet within 700 W, its GEMMs stream weights at ~85% of the
    HBM figure) runs them at the measured rate."""
    if measured is None:
        return datasheet
    return datasheet * min(1.0, measured / (datasheet * efficiency))


# ---------------------------------------------------------------------- provider
class _Class:
    """Per-class constants folded with the hardware: seconds per FLOP and per byte."""

    __slots__ = ("ovh_ns", "p", "s_byte", "s_flop")

    def __init__(self, params: dict[str, float], peak: float, bw: float) -> None:
        self.s_flop = 1e9 / (peak * params.get("eff_compute", 1.0))    # ns per FLOP
        self.s_byte = 1e9 / (bw * params.get("eff_mem", 1.0))          # ns per byte
        self.p = params.get("p", 3.0)
        self.ovh_ns = params.get("overhead_us", 0.0) * 1e3

    def ns(self, flops: float, nbytes: float) -> float:
        return soft_roofline(flops * self.s_flop, nbytes * self.s_byte, self.p) + self.ovh_ns


class RooflineProvider(LatencyProvider):
    """Calibrated soft roofline on the hardware catalogue's datasheet numbers, no faster
    than the card's measured sustained rates where the catalogue has them
    (:func:`measured_ceiling`).

    Precision: FP8 weights (``quantization: fp8``) run the GEMM and MoE classes at the
    hardware's fp8 peak and move 1-byte weights; an FP8 KV cache halves the KV bytes that
    attention moves, its compute stays at the model dtype's peak (the cache is dequantized
    in the kernel, as aiconfigurator's vLLM FP8-KV data shows); lm_head, norms and
    activations stay in the model dtype. The per-class
    efficiencies are the bf16 fit, applied unchanged to FP8 (no FP8 bundle to fit yet).
    """

    kind = "roofline"

    def __init__(self, model: ModelSpec, hardware: str | HardwareSpec, tp: int = 1, *,
                 calibration: str | Path | dict | None = None, ep_size: int = 1,
                 **_ignored) -> None:
        model.check_tp(tp)
        self.model = model
        self.hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
        check_fp8_hardware(model, self.hw.name)
        self.tp = tp
        self.source = f"roofline({self.hw.name})" if model.precision == "bf16" \
            else f"roofline({self.hw.name}, {model.precision})"
        cal = calibration if isinstance(calibration, dict) else load_calibration(calibration)
        self.calibration = cal
        weights_dtype = "fp8" if model.is_fp8 else model.dtype
        # the classes that run on the weights' dtype (FP8 GEMMs), the rest on the model's
        dtypes = {"gemm": weights_dtype, "moe": weights_dtype}
        self._cls = {c: _Class(*self._class_rates(c, cal[c], dtypes.get(c, model.dtype)))
                     for c in CLASSES if c != "attn_mixed"}
        # moe_ns is one rank's MoE layer in the instance's layout (whole experts with EP)
        self._r = RankDims(model, tp, expert_shard_ranks(tp, ep_size))
        self._min_rows = cal["attn_prefill"]["min_parallel_rows"]
        self._pad = cal["attn_mixed"]["decode_pad_rows"]
        seq = model.block_sequence
        ia = seq.index("attention")
        self._pre = seq[:ia]
        self._post = seq[ia + 1:]
        self._is_moe = model.is_moe
        self._dense_cache: dict[int, tuple] = {}
        self._seq_cache: dict[int, tuple] = {}
        self._moe_cache: dict[tuple[int, int], int] = {}

    def _class_rates(self, cls: str, params: dict, dtype: str) -> tuple[dict, float, float]:
        """An op class's (parameters, peak FLOP/s, bandwidth) on this card: the datasheet
        figures at ``dtype``; for the GEMM classes cut to the card's measured sustained
        rates, with its fitted overlap exponent."""
        hw = self.hw
        peak, bw = hw.peak_flops(dtype), hw.mem_bw_Bps
        if cls not in MEASURED_GEMM_CLASSES:
            return params, peak, bw
        params = dict(params)
        peak = measured_ceiling(peak, hw.measured_flops(dtype), params["eff_compute"])
        measured_bw = hw.measured_mem_bw_GBps
        bw = measured_ceiling(bw, None if measured_bw is None else measured_bw * 1e9,
                              params["eff_mem"])
        if hw.gemm_overlap_p is not None:
            params["p"] = hw.gemm_overlap_p
        return params, peak, bw

    # -------------------------------------------------------------- per layer
    def dense_ns(self, name: str, tokens: int) -> float:
        cls, f, b = dense_work(name, self._r, tokens)
        return self._cls[cls].ns(f, b)

    def per_sequence_ns(self, name: str, seqs: int) -> float:
        cls, f, b = per_sequence_work(name, self._r, seqs)
        return self._cls[cls].ns(f, b)

    def attention_ns(self, shape: BatchShape) -> float:
        r = self._r
        pc, nd = shape.prefill_tokens, shape.num_decode
        if pc:
            pre = self._cls["attn_prefill"]
            f, b = prefill_attention_work(r, pc, shape.prefill_kv, self._min_rows,
                                          varlen_work=shape.prefill_work)
            if not nd:
                return pre.ns(f, b)
            # mixed batch: one varlen kernel; decodes occupy padded query tiles
            dec = self._cls["attn_decode"]
            fd, bd = decode_attention_work(r, nd, shape.decode_kv_sum, self._pad)
            t_pre = soft_roofline(f * pre.s_flop, b * pre.s_byte, pre.p)
            t_dec = soft_roofline(fd * pre.s_flop, bd * dec.s_byte, pre.p)
            return t_pre + t_dec + pre.ovh_ns
        if nd:
            f, b = decode_attention_work(r, nd, shape.decode_kv_sum)
            return self._cls["attn_decode"].ns(f, b)
        return 0.0

    def moe_ns(self, tokens: int, activated_experts: int) -> int:
        if not self._is_moe:
            raise InputError(f"{self.model.name} is not an MoE model")
        key = (tokens, activated_experts)
        v = self._moe_cache.get(key)
        if v is None:
            f, b = moe_work(self._r, tokens, activated_experts)
            v = max(1, int(self._cls["moe"].ns(f, b)))
            if len(self._moe_cache) < 1 << 16:
                self._moe_cache[key] = v
        return v

    # -------------------------------------------------------------- cached pieces
    def _dense_parts(self, t: int) -> tuple:
        parts = self._dense_cache.get(t)
        if parts is None:
            def row(names):
                out = []
                for n in names:
                    ns = self.moe_ns(t, self.expected_active_experts(t)) if n == "moe" \
                        else self.dense_ns(n, t)
                    out.append((n, max(1, int(ns))))
                return tuple(out)

            pre, post = row(self._pre), row(self._post)
            prologue = row(PROLOGUE)
            head_dense = row(HEAD_DENSE)
            dense_sum = (sum(x for _, x in pre) + sum(x for _, x in post))
            edge_sum = sum(x for _, x in prologue) + sum(x for _, x in head_dense)
            parts = (pre, post, prologue, head_dense, dense_sum, edge_sum)
            if len(self._dense_cache) < 1 << 16:
                self._dense_cache[t] = parts
        return parts

    def _seq_parts(self, s: int) -> tuple:
        parts = self._seq_cache.get(s)
        if parts is None:
            head = tuple((n, max(1, int(self.per_sequence_ns(n, s)))) for n in HEAD_PER_SEQUENCE)
            parts = (head, sum(x for _, x in head))
            if len(self._seq_cache) < 1 << 16:
                self._seq_cache[s] = parts
        return parts

    # -------------------------------------------------------------- protocol
    def layer_times(self, shape: BatchShape) -> LayerTimes:
        pre, post, prologue, head_dense, _, _ = self._dense_parts(
            self.dense_tokens(shape.num_tokens))
        head, _ = self._seq_parts(shape.num_seqs)
        attn = max(1, int(self.attention_ns(shape)))
        return LayerTimes(prologue, pre + (("attention", attn),) + post, head_dense + head,
                          self.model.num_hidden_layers)

    def iteration_ns(self, shape: BatchShape) -> int:
        """Whole-iteration compute time on one NPU (sum of ``layer_times``)."""
        _, _, _, _, dense_sum, edge_sum = self._dense_parts(self.dense_tokens(shape.num_tokens))
        _, seq_sum = self._seq_parts(shape.num_seqs)
        attn = max(1, int(self.attention_ns(shape)))
        return edge_sum + seq_sum + self.model.num_hidden_layers * (dense_sum + attn)

    @classmethod
    def covers(cls, model: ModelSpec, hardware: str, tp: int, profiles_dirs=()) -> str | None:
        try:
            hw = load_hardware(hardware)
        except InputError:
            return f"hardware {hardware!r} is not in the catalogue"
        if (model.is_fp8 or model.kv_is_fp8) and "fp8" not in hw.peak_tflops:
            return f"{hw.name} has no fp8 peak"
        return None


LATENCY_PROVIDERS.register("roofline", RooflineProvider)

__all__ = [
    "CLASSES",
    "LAYER_CLASS",
    "RankDims",
    "RooflineProvider",
    "decode_attention_work",
    "dense_work",
    "load_calibration",
    "moe_work",
    "per_sequence_work",
    "prefill_attention_work",
    "soft_roofline",
]
