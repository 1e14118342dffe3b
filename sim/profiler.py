"""Measure a latency bundle in LLMServingSim's format with PyTorch reference kernels.

``profile_bundle`` runs one transformer block of a model (random weights of the right
shapes, sharded for each tensor-parallel degree) on a GPU (or, for tests, the CPU) and
writes::

    <out_dir>/<HW>/<model.name>/<variant>/meta.yaml
    <out_dir>/<HW>/<model.name>/<variant>/tp<N>/dense.csv         layer,tokens,time_us
    <out_dir>/<HW>/<model.name>/<variant>/tp<N>/per_sequence.csv  layer,sequences,time_us
    <out_dir>/<HW>/<model.name>/<variant>/tp<N>/attention.csv
        prefill_chunk,kv_prefill,n_decode,kv_decode,time_us
    <out_dir>/<HW>/<model.name>/<variant>/tp<N>/moe.csv           tokens,activated_experts,time_us

which the ``measured`` latency provider reads like a vLLM-measured bundle. The kernels
are plain PyTorch, not vLLM's; ``meta.yaml`` says so: cuBLAS GEMMs, a padded batched-GEMM
MoE, and for attention on CUDA one FlashAttention-2 varlen forward over the prompt chunk
and every decode (the kernel family vLLM 0.19 runs for a step; ``attention_kernel`` in
``meta.yaml``), elsewhere ``scaled_dot_product_attention`` for the prompt and a batched
GEMV per decode.

Attention coordinates: ``prefill_chunk`` new tokens of one prefill request that attend
to ``kv_prefill`` cached tokens plus themselves (causal, aligned to the end of the KV),
together with ``n_decode`` decode requests that each read ``kv_decode`` cached tokens.
Grouped-query attention is honoured (K/V carry ``num_key_value_heads / tp`` heads).

Timing: ``warmup`` unrecorded calls, then the median of ``iterations`` samples. On CUDA a
sample replays a CUDA graph of the call repeated back to back (``_Timer``): the GPU's time
without the host's launch latency, as vLLM's graphs and busy eager steps run. On CPU,
``time.perf_counter`` around each call. PyTorch is optional and imported lazily.
"""

from __future__ import annotations

import csv
import datetime as _dt
import itertools
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim.errors import InputError
from sim.model import HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec

PROFILER_VERSION = "1.1.0"
TORCH_MISSING = "llmsim profile needs PyTorch: pip install '.[profile]'"
VARIANT_BY_DTYPE = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
                    "half": "fp16", "float32": "fp32", "fp32": "fp32"}
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# ---------------------------------------------------------------------------- grid
def _geometric(lo: int, hi: int, factor: float = 2.0) -> list[int]:
    out, v = [], float(lo)
    while v <= hi + 1e-9:
        out.append(round(v))
        v *= factor
    if out[-1] != hi:
        out.append(hi)
    return sorted(set(out))


def _token_grid(hi: int) -> list[int]:
    """1..16 step 1, ..64 step 4, then step 16 (the measured bundles' token axis)."""
    pts = list(range(1, min(hi, 16) + 1))
    pts += list(range(20, min(hi, 64) + 1, 4))
    pts += list(range(80, hi + 1, 16))
    if pts[-1] != hi:
        pts.append(hi)
    return sorted(set(pts))


def _describe(values: Sequence[int]) -> str:
    vals = sorted(values)
    zero = [0] if vals and vals[0] == 0 else []
    rest = vals[len(zero):]
    if len(rest) >= 3 and all(b == 2 * a for a, b in itertools.pairwise(rest)):
        return ", ".join([*(str(z) for z in zero), f"{rest[0]}-{rest[-1]} x2"])
    return ", ".join(str(v) for v in vals)


@dataclass(frozen=True)
class ProfileGrid:
    """The points a profile measures. ``0`` in ``chunks`` / ``n_decode`` means "no
    prefill" / "no decode"; ``kv`` lists both the prefill cached-KV values (0 allowed)
    and the decode KV lengths (0 skipped). ``moe_experts`` None means multiples of
    top-k, doubling, up to ``num_experts``."""

    tokens: tuple[int, ...] = field(default_factory=lambda: tuple(_token_grid(2048)))
    sequences: tuple[int, ...] = field(default_factory=lambda: tuple(_token_grid(256)))
    chunks: tuple[int, ...] = field(default_factory=lambda: (0, *_geometric(16, 2048)))
    n_decode: tuple[int, ...] = field(default_factory=lambda: (0, *_geometric(1, 256)))
    kv: tuple[int, ...] = field(default_factory=lambda: (0, *_geometric(16, 16384)))
    moe_tokens: tuple[int, ...] = field(default_factory=lambda: tuple(_geometric(1, 2048)))
    moe_experts: tuple[int, ...] | None = None

    @classmethod
    def tiny(cls) -> ProfileGrid:
        """A few points per axis: seconds on a CPU, for tests and smoke runs."""
        return cls(tokens=(1, 2, 4, 8, 16, 32, 64), sequences=(1, 2, 4, 8),
                   chunks=(0, 16, 32), n_decode=(0, 1, 4), kv=(0, 16, 64),
                   moe_tokens=(1, 4, 16))

    def validate(self) -> None:
        for name in ("tokens", "sequences", "chunks", "n_decode", "kv", "moe_tokens"):
            vals = getattr(self, name)
            if not vals or any((not isinstance(v, int)) or v < 0 for v in vals):
                raise InputError(f"profile grid {name} must be a non-empty list of "
                                 f"non-negative integers, got {list(vals)}")
        for name in ("tokens", "sequences", "moe_tokens"):
            if min(getattr(self, name)) < 1:
                raise InputError(f"profile grid {name} values must be >= 1")
        if not any(c > 0 for c in self.chunks) and not any(n > 0 for n in self.n_decode):
            raise InputError("profile grid needs a positive chunk or n_decode value")
        if not any(k > 0 for k in self.kv) and any(n > 0 for n in self.n_decode):
            raise InputError("profile grid kv needs a positive value for decode points")

    def attention_points(self) -> list[tuple[int, int, int, int]]:
        """(prefill_chunk, kv_prefill, n_decode, kv_decode) in the bundle's layout."""
        chunks = sorted(set(self.chunks))
        nds = sorted(set(self.n_decode))
        kvs = sorted(set(self.kv))
        kd_vals = [k for k in kvs if k > 0]
        pts = []
        for pc in chunks:
            kps = kvs if pc > 0 else [0]
            for kp in kps:
                for nd in nds:
                    if pc == 0 and nd == 0:
                        continue
                    for kd in (kd_vals if nd > 0 else [0]):
                        pts.append((pc, kp, nd, kd))
        return pts

    def moe_points(self, model: ModelSpec) -> list[tuple[int, int]]:
        """(tokens, activated experts): experts from top-k doubling up to all experts,
        at most ``tokens * top_k`` (the most a batch can activate)."""
        e, k = model.num_experts, max(1, model.num_experts_per_tok)
        if self.moe_experts is not None:
            experts = sorted({min(e, a) for a in self.moe_experts if a >= 1})
        else:
            experts = _geometric(min(k, e), e)
        pts = []
        for t in sorted(set(self.moe_tokens)):
            cap = min(e, t * k)
            pts += [(t, a) for a in experts if a <= cap] or [(t, min(experts[0], cap))]
        return sorted(set(pts))

    def meta(self) -> dict:
        kvs = sorted(set(self.kv))
        chunks = sorted(set(self.chunks))
        return {
            "max_kv": max(kvs),
            "chunk_factor": 2.0,
            "kv_factor": 2.0,
            "chunks": _describe(chunks),
            "n_decode": _describe(sorted(set(self.n_decode))),
            "kv": _describe(kvs),
            "tokens": f"{min(self.tokens)}-{max(self.tokens)} ({len(set(self.tokens))} points)",
            "sequences": f"{min(self.sequences)}-{max(self.sequences)} "
                         f"({len(set(self.sequences))} points)",
            "moe_tokens": _describe(sorted(set(self.moe_tokens))),
        }


# ---------------------------------------------------------------------------- torch
def _import_torch():
    try:
        import torch
    except ImportError:
        raise InputError(TORCH_MISSING) from None
    return torch


#: (CUDA) each timed sample runs a call this many times in one CUDA graph, at most, so that
#: the sample spans about ``GRAPH_SPAN_US`` of GPU time
MAX_GRAPH_REPEATS = 50
GRAPH_SPAN_US = 2000.0


class _Timer:
    """Median time (us) of ``fn()``. On CUDA each sample replays a CUDA graph of ``fn``
    repeated back to back (as vLLM replays a step's kernels from a graph, and as a busy
    eager step keeps the GPU fed): the GPU's own time per call, without the host's launch
    latency, which a call timed alone between two events includes (1.3-3.2x vLLM's own
    per-step time on an H200 for Llama-3.1-8B, `experiments/profiler_vs_vllm.py`). A call
    that cannot be captured runs the same repeats eagerly between the events. On CPU,
    ``time.perf_counter`` around each call."""

    def __init__(self, torch, device, iterations: int, warmup: int) -> None:
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.iterations = iterations
        self.warmup = warmup
        #: (CUDA) calls timed eagerly because they could not be captured in a graph
        self.uncaptured = 0

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        if self.cuda:
            return self._cuda_us(fn)
        samples = []
        for _ in range(self.iterations):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return max(float(statistics.median(samples)), 1e-3)

    def _cuda_us(self, fn: Callable[[], object]) -> float:
        once = self._events_us(fn, 1)
        repeats = max(1, min(MAX_GRAPH_REPEATS, math.ceil(GRAPH_SPAN_US / max(once, 1.0))))
        graph = self._capture(fn, repeats)
        if graph is not None:
            run = graph.replay
        else:
            def run():
                for _ in range(repeats):
                    fn()
        samples = [self._events_us(run, repeats) for _ in range(self.iterations)]
        del graph
        return max(float(statistics.median(samples)), 1e-3)

    def _events_us(self, run: Callable[[], object], repeats: int) -> float:
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / repeats

    def _capture(self, fn: Callable[[], object], repeats: int):
        """A CUDA graph of ``repeats`` calls of ``fn``, or None where it cannot be
        captured (a host synchronisation inside, say)."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (capture wants a warm-up off the default stream)
                fn()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                for _ in range(repeats):
                    fn()
        except RuntimeError:
            torch.cuda.synchronize()
            self.uncaptured += 1
            return None
        return graph


@dataclass(frozen=True)
class _RankDims:
    """One tensor-parallel rank's shapes."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    full_vocab: int
    experts: int
    topk: int
    moe_inter: int

    @classmethod
    def of(cls, m: ModelSpec, tp: int) -> _RankDims:
        return cls(hidden=m.hidden_size, heads=m.num_attention_heads // tp,
                   kv_heads=max(1, m.num_key_value_heads // tp), head_dim=m.head_dim,
                   inter=-(-m.intermediate_size // tp), vocab=-(-m.vocab_size // tp),
                   full_vocab=m.vocab_size, experts=m.num_experts,
                   topk=m.num_experts_per_tok,
                   moe_inter=-(-m.moe_intermediate_size // tp) if m.is_moe else 0)


class _Block:
    """Random weights of one decoder block (plus embedding / lm_head) on one rank."""

    def __init__(self, torch, model: ModelSpec, tp: int, device, dtype,
                 max_tokens: int) -> None:
        self.torch, self.model, self.device, self.dtype = torch, model, device, dtype
        d = self.d = _RankDims.of(model, tp)
        g = torch.Generator(device="cpu").manual_seed(1234 + tp)

        def rnd(*shape):
            return (torch.randn(*shape, generator=g, dtype=torch.float32) * 0.02).to(
                device=device, dtype=dtype)

        q_out = d.heads * d.head_dim
        kv_out = d.kv_heads * d.head_dim
        self.embed = rnd(d.vocab, d.hidden)
        self.norm_w = torch.ones(d.hidden, device=device, dtype=dtype)
        self.head_norm_w = torch.ones(d.head_dim, device=device, dtype=dtype)
        self.w_qkv = rnd(q_out + 2 * kv_out, d.hidden)
        self.w_o = rnd(d.hidden, q_out)
        if model.is_moe:
            self.w_router = rnd(d.experts, d.hidden)
            self.w13 = rnd(d.experts, d.hidden, 2 * d.moe_inter)
            self.w2 = rnd(d.experts, d.moe_inter, d.hidden)
        else:
            self.w_gate_up = rnd(2 * d.inter, d.hidden)
            self.w_down = rnd(d.hidden, d.inter)
        self.w_lm = rnd(d.vocab, d.hidden)
        self.max_tokens = max_tokens
        # Activations reused by every measurement (sliced, never reallocated).
        self.x = rnd(max_tokens, d.hidden)
        self.qkv = rnd(max_tokens, q_out + 2 * kv_out)
        self.gate_up = rnd(max_tokens, 2 * max(d.inter, 1))
        self.ids = torch.randint(0, d.vocab, (max_tokens,), generator=g).to(device)
        half = d.head_dim // 2
        pos = torch.arange(max_tokens, dtype=torch.float32)
        inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = torch.outer(pos, inv)
        self.cos = ang.cos().to(device=device, dtype=dtype)
        self.sin = ang.sin().to(device=device, dtype=dtype)
        self._kv_buf: tuple | None = None
        self.flash = _flash_varlen(torch, device, dtype, d)

    # ---- elementwise / GEMM layers ----------------------------------------------
    def _rms(self, x, w):
        torch = self.torch
        if hasattr(torch.nn.functional, "rms_norm"):
            return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def dense_fn(self, name: str, t: int) -> Callable[[], object]:
        torch, d = self.torch, self.d
        F = torch.nn.functional
        x = self.x[:t]
        q_out, kv_out = d.heads * d.head_dim, d.kv_heads * d.head_dim
        if name == "embedding":
            ids = self.ids[:t]
            return lambda: F.embedding(ids, self.embed)
        if name in ("layernorm", "final_layernorm"):
            return lambda: self._rms(x, self.norm_w)
        if name == "qkv_proj":
            return lambda: F.linear(x, self.w_qkv)
        if name == "qk_norm":
            qk = self.qkv[:t, :q_out + kv_out].reshape(t, d.heads + d.kv_heads, d.head_dim)
            return lambda: self._rms(qk, self.head_norm_w)
        if name == "rotary_emb":
            qk = self.qkv[:t, :q_out + kv_out].reshape(t, d.heads + d.kv_heads, d.head_dim)
            cos, sin = self.cos[:t, None, :], self.sin[:t, None, :]
            half = d.head_dim // 2

            def rope():
                a, b = qk[..., :half], qk[..., half:]
                return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
            return rope
        if name == "o_proj":
            a = self.qkv[:t, :q_out]
            return lambda: F.linear(a, self.w_o)
        if name == "gate_up_proj":
            return lambda: F.linear(x, self.w_gate_up)
        if name == "act_fn":
            gu = self.gate_up[:t, :2 * d.inter]

            def act():
                g, u = gu.chunk(2, dim=-1)
                return F.silu(g) * u
            return act
        if name == "down_proj":
            a = self.gate_up[:t, :d.inter]
            return lambda: F.linear(a, self.w_down)
        raise InputError(f"the profiler has no kernel for layer {name!r}")

    def per_sequence_fn(self, name: str, s: int) -> Callable[[], object]:
        torch, d = self.torch, self.d
        F = torch.nn.functional
        x = self.x[:s]
        if name == "lm_head":
            return lambda: F.linear(x, self.w_lm)
        if name == "sampler":
            # Logits over the full vocabulary (gathered across ranks), float32
            # softmax with temperature, top-k filter and greedy/argmax pick.
            logits = torch.randn(s, d.full_vocab, device=self.device, dtype=self.dtype)
            k = min(50, d.full_vocab)

            def sample():
                probs = torch.softmax(logits.float() / 0.8, dim=-1)
                top = torch.topk(probs, k, dim=-1)
                return top.indices.gather(-1, top.values.argmax(-1, keepdim=True))
            return sample
        raise InputError(f"the profiler has no kernel for layer {name!r}")

    # ---- attention ----------------------------------------------------------------
    def _kv(self, elements: int):
        """Flat K and V buffers of at least ``elements`` entries (grown on demand)."""
        torch = self.torch
        if self._kv_buf is None or self._kv_buf[0].numel() < elements:
            self._kv_buf = None
            k = torch.randn(elements, device=self.device, dtype=self.dtype) * 0.02
            v = torch.randn(elements, device=self.device, dtype=self.dtype) * 0.02
            self._kv_buf = (k, v)
        return self._kv_buf

    def attention_fn(self, pc: int, kp: int, nd: int, kd: int) -> Callable[[], object]:
        if self.flash is not None:
            return self._flash_fn(pc, kp, nd, kd)
        torch, d = self.torch, self.d
        F = torch.nn.functional
        hd, h, hkv = d.head_dim, d.heads, d.kv_heads
        group = h // hkv
        scale = 1.0 / math.sqrt(hd)
        pre_kv = (pc + kp) * hkv * hd if pc else 0
        dec_kv = nd * kd * hkv * hd
        kbuf, vbuf = self._kv(max(pre_kv, dec_kv, 1))
        parts: list[Callable[[], object]] = []
        if pc:
            q = torch.randn(1, h, pc, hd, device=self.device, dtype=self.dtype)
            k = kbuf[:pre_kv].view(1, hkv, pc + kp, hd)
            v = vbuf[:pre_kv].view(1, hkv, pc + kp, hd)
            mask = _causal_offset_mask(torch, pc, pc + kp, self.device)
            gqa = _sdpa_supports_gqa(torch)
            if not gqa and group > 1:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
            kw = {"enable_gqa": True} if gqa and group > 1 else {}
            if kp == 0:
                parts.append(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                    scale=scale, **kw))
            else:
                parts.append(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                    scale=scale, **kw))
        if nd:
            # Decode: one query per request, a batched GEMV over its KV, per KV head
            # group (GQA: the ``group`` query heads of a KV head share its K/V).
            qd = torch.randn(nd, hkv, group, hd, device=self.device, dtype=self.dtype)
            kd_t = kbuf[:dec_kv].view(nd, hkv, kd, hd)
            vd_t = vbuf[:dec_kv].view(nd, hkv, kd, hd)

            def decode():
                s = torch.matmul(qd, kd_t.transpose(-1, -2)) * scale
                p = torch.softmax(s.float(), dim=-1).to(qd.dtype)
                return torch.matmul(p, vd_t)
            parts.append(decode)
        if len(parts) == 1:
            return parts[0]
        return lambda: [f() for f in parts]

    def _flash_fn(self, pc: int, kp: int, nd: int, kd: int) -> Callable[[], object]:
        """One FlashAttention-2 varlen forward over the prompt chunk and every decode (the
        kernel vLLM 0.19 runs for a whole step on CUDA; here each request's KV is
        contiguous rather than paged)."""
        torch, d = self.torch, self.d
        q_lens = ([pc] if pc else []) + [1] * nd
        k_lens = ([pc + kp] if pc else []) + [kd] * nd
        n_k = sum(k_lens)
        size = n_k * d.kv_heads * d.head_dim
        kbuf, vbuf = self._kv(size)
        k = kbuf[:size].view(n_k, d.kv_heads, d.head_dim)
        v = vbuf[:size].view(n_k, d.kv_heads, d.head_dim)
        q = torch.randn(sum(q_lens), d.heads, d.head_dim, device=self.device, dtype=self.dtype)
        cu_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32,
                            device=self.device)
        cu_k = torch.tensor([0, *itertools.accumulate(k_lens)], dtype=torch.int32,
                            device=self.device)
        max_q, max_k, scale, flash = max(q_lens), max(k_lens), d.head_dim ** -0.5, self.flash
        return lambda: flash(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, scale=scale)

    # ---- MoE ----------------------------------------------------------------------
    def moe_fn(self, tokens: int, activated: int) -> Callable[[], object]:
        """Router GEMM + top-k, then ``tokens * top_k`` assignments spread evenly over
        ``activated`` experts (round robin), run as a padded batched GEMM."""
        torch, d = self.torch, self.d
        F = torch.nn.functional
        k = d.topk
        x = self.x[:tokens]
        assignments = tokens * k
        cap = -(-assignments // activated)
        flat = torch.arange(assignments, device=self.device)
        tok_of = flat // k
        expert_of = flat % activated
        slot_of = flat // activated
        # [activated, cap] token index per slot; padding slots point at token 0 with
        # weight 0 so the scatter is a no-op for them.
        idx = torch.zeros(activated, cap, dtype=torch.long, device=self.device)
        wmask = torch.zeros(activated, cap, device=self.device, dtype=self.dtype)
        idx[expert_of, slot_of] = tok_of
        wmask[expert_of, slot_of] = 1.0
        w13, w2 = self.w13[:activated], self.w2[:activated]
        flat_idx = idx.reshape(-1)

        def moe():
            logits = F.linear(x, self.w_router)
            weights = torch.softmax(logits.float(), dim=-1)
            topw, _ = torch.topk(weights, k, dim=-1)
            xe = x.index_select(0, flat_idx).view(activated, cap, d.hidden)
            h13 = torch.bmm(xe, w13)
            g, u = h13.chunk(2, dim=-1)
            h2 = torch.bmm(F.silu(g) * u, w2)
            gate = topw[:, 0].to(x.dtype).index_select(0, flat_idx).view(activated, cap)
            h2 = h2 * (gate * wmask).unsqueeze(-1)
            out = torch.zeros_like(x)
            out.index_add_(0, flat_idx, h2.view(-1, d.hidden))
            return out
        return moe


def _flash_varlen(torch, device, dtype, d: _RankDims):
    """PyTorch's FlashAttention-2 varlen forward where it runs for these shapes (CUDA,
    fp16/bf16), else None (the SDPA and batched-GEMV kernels are used)."""
    flash = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or flash is None:
        return None
    q = torch.zeros(2, d.heads, d.head_dim, device=device, dtype=dtype)
    kv = torch.zeros(2, d.kv_heads, d.head_dim, device=device, dtype=dtype)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    try:
        flash(q, kv, kv, cu, cu, 1, 1, 0.0, True, False, scale=1.0)
    except (RuntimeError, TypeError):
        return None
    return flash


def _causal_offset_mask(torch, q_len: int, kv_len: int, device):
    """Causal mask aligned to the end of the KV (query i sees KV 0..kv_len-q_len+i)."""
    try:
        from torch.nn.attention.bias import causal_lower_right
        return causal_lower_right(q_len, kv_len)
    except ImportError:
        off = kv_len - q_len
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=off)


def _sdpa_supports_gqa(torch) -> bool:
    import inspect
    try:
        return "enable_gqa" in inspect.signature(
            torch.nn.functional.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):
        # Builtins without a signature: torch >= 2.5 has the argument.
        major, minor = (int(p) for p in torch.__version__.split(".")[:2])
        return (major, minor) >= (2, 5)


# ---------------------------------------------------------------------------- driver
def _fmt(us: float) -> str:
    return f"{us:.6g}"


def _write_csv(path: Path, header: Sequence[str], rows: list[tuple]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            w.writerow([_fmt(v) if isinstance(v, float) else v for v in r])


def check_hardware_name(hardware: str, what: str = "hardware name") -> None:
    """The name a bundle is filed under is one folder name: 1-255 bytes, no '/'."""
    if not hardware or "/" in hardware or hardware in (".", "..") \
            or len(hardware.encode()) > 255:
        shown = f"{hardware[:40]!r}{'...' if len(hardware) > 40 else ''}"
        raise InputError(f"{what} {shown}: the bundle's folder name, so 1-255 bytes "
                         "without '/' (the catalogue's names: `llmsim profiles list`)")


def _check_inputs(model: ModelSpec, hardware: str, tp_degrees, iterations: int,
                  warmup: int, device: str) -> str:
    check_hardware_name(hardware)
    if model.architecture not in ("llama", "qwen3", "qwen3_moe", "mixtral"):
        raise InputError(f"the profiler does not know architecture {model.architecture!r}")
    if not tp_degrees:
        raise InputError("tp_degrees must name at least one tensor-parallel degree")
    for tp in tp_degrees:
        model.check_tp(int(tp))
    if iterations < 1 or warmup < 0:
        raise InputError("iterations must be >= 1 and warmup >= 0")
    variant = VARIANT_BY_DTYPE.get(model.dtype)
    if variant is None:
        raise InputError(f"the profiler measures bf16/fp16/fp32 models, not dtype {model.dtype!r}")
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise InputError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return variant


def profile_bundle(model: ModelSpec, hardware: str, out_dir: Path,
                   tp_degrees: Sequence[int] = (1,), device: str = "cuda",
                   grid: ProfileGrid | None = None, iterations: int = 3, warmup: int = 1,
                   tiny: bool = False,
                   progress: Callable[[str], None] | None = None) -> Path:
    """Measure a bundle for ``model`` on this machine's ``device``; return its folder.

    ``tiny`` uses :meth:`ProfileGrid.tiny` when no grid is given and marks the bundle
    ``tiny_shapes: true``; a CPU run is marked ``device: cpu``. Existing CSVs in the
    target folder are overwritten.
    """
    variant = _check_inputs(model, hardware, tp_degrees, iterations, warmup, device)
    grid = grid or (ProfileGrid.tiny() if tiny else ProfileGrid())
    grid.validate()
    torch = _import_torch()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError("device 'cuda' requested but PyTorch sees no CUDA device; "
                         "use --device cpu for a (tiny) smoke profile")
    dev = torch.device(device)
    dtype = getattr(torch, _TORCH_DTYPE[variant])
    say = progress or (lambda _msg: None)

    root = Path(out_dir) / hardware / model.name / variant
    root.mkdir(parents=True, exist_ok=True)
    timer = _Timer(torch, dev, iterations, warmup)
    dense_layers = list(dict.fromkeys(
        [*PROLOGUE, *(n for n in model.block_sequence if n not in ("attention", "moe")),
         *HEAD_DENSE]))
    tokens = sorted(set(grid.tokens))
    seqs = sorted(set(grid.sequences))
    attn_pts = grid.attention_points()
    moe_pts = grid.moe_points(model) if model.is_moe else []
    max_tokens = max(tokens + seqs + [p[0] for p in moe_pts] + [1])
    skipped: dict[int, int] = {}
    started = time.perf_counter()

    for tp in sorted({int(t) for t in tp_degrees}):
        tp_dir = root / f"tp{tp}"
        tp_dir.mkdir(exist_ok=True)
        block = _Block(torch, model, tp, dev, dtype, max_tokens)
        attention_kernel = ("flash_attention_2 varlen" if block.flash is not None
                            else "scaled_dot_product_attention + batched GEMV")
        with torch.inference_mode():
            say(f"tp{tp}: dense layers over {len(tokens)} token counts")
            rows = [(name, t, timer(block.dense_fn(name, t)))
                    for name in dense_layers for t in tokens]
            _write_csv(tp_dir / "dense.csv", ("layer", "tokens", "time_us"), rows)

            say(f"tp{tp}: lm_head and sampler over {len(seqs)} sequence counts")
            rows = [(name, s, timer(block.per_sequence_fn(name, s)))
                    for name in HEAD_PER_SEQUENCE for s in seqs]
            _write_csv(tp_dir / "per_sequence.csv", ("layer", "sequences", "time_us"), rows)

            say(f"tp{tp}: attention over {len(attn_pts)} grid points")
            rows = _attention_rows(torch, block, timer, attn_pts)
            if len(rows) < len(attn_pts):  # pragma: no cover - device dependent
                skipped[tp] = len(attn_pts) - len(rows)
            _write_csv(tp_dir / "attention.csv",
                       ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"), rows)

            if model.is_moe:
                say(f"tp{tp}: MoE over {len(moe_pts)} (tokens, experts) points")
                rows = [(t, a, timer(block.moe_fn(t, a))) for t, a in moe_pts]
                _write_csv(tp_dir / "moe.csv", ("tokens", "activated_experts", "time_us"), rows)
        del block
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    meta = _meta(model, hardware, variant, tp_degrees, torch, dev, grid, iterations, warmup,
                 tiny, skipped, time.perf_counter() - started)
    meta["attention_kernel"] = attention_kernel
    if timer.uncaptured:
        meta["timed_without_cuda_graph"] = timer.uncaptured
    (root / "meta.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    say(f"wrote {root}")
    return root


def _attention_rows(torch, block: _Block, timer: _Timer, points) -> list[tuple]:
    """Each attention point's time; a point the device has no memory for is left out."""
    rows = []
    oom = getattr(torch, "OutOfMemoryError", RuntimeError)
    for pc, kp, nd, kd in points:
        try:
            us = timer(block.attention_fn(pc, kp, nd, kd))
        except oom:  # pragma: no cover - device dependent
            block._kv_buf = None
            if block.device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        rows.append((pc, kp, nd, kd, us))
    return rows


def _meta(model: ModelSpec, hardware: str, variant: str, tp_degrees, torch, dev, grid,
          iterations: int, warmup: int, tiny: bool, skipped: dict[int, int],
          elapsed_s: float) -> dict:
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
    else:
        gpu = platform.processor() or platform.machine() or "cpu"
    meta: dict = {
        "profiler_version": PROFILER_VERSION,
        "profiler": "llmsim profile (PyTorch reference kernels, not vLLM)",
        "torch_version": str(torch.__version__),
        "cuda_version": torch.version.cuda if dev.type == "cuda" else None,
        "gpu": gpu,
        "hardware": hardware,
        "profiled_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "architecture": model.architecture,
        "model": model.name,
        "variant": variant,
        "tp_degrees": sorted({int(t) for t in tp_degrees}),
        "model_dims": {
            "hidden_size": model.hidden_size, "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.num_key_value_heads, "head_dim": model.head_dim,
            "intermediate_size": model.intermediate_size, "vocab_size": model.vocab_size,
            "num_experts": model.num_experts, "num_experts_per_tok": model.num_experts_per_tok,
            "moe_intermediate_size": model.moe_intermediate_size,
        },
        "measurement_iterations": iterations,
        "warmup_iterations": warmup,
        "timer": ("cuda_graph_replay" if dev.type == "cuda" else "perf_counter"),
        "statistic": "median",
        "attention_grid": grid.meta(),
        "elapsed_s": round(elapsed_s, 2),
    }
    if skipped:
        meta["attention_points_skipped_oom"] = {int(k): int(v) for k, v in skipped.items()}
    if dev.type == "cpu":
        meta["device"] = "cpu"
    if tiny or dev.type == "cpu":
        meta["tiny_shapes"] = True
        meta["note"] = ("smoke-test profile (CPU and/or reduced grid); not a measurement "
                        "of the named hardware")
    return meta
