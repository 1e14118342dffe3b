"""The ``aic`` provider: per-layer latency from aiconfigurator's per-op database.

`aiconfigurator-core <https://pypi.org/project/aiconfigurator-core/>`_ (Apache-2.0, an
optional dependency: ``pip install '.[aic]'``) ships per-op latencies measured on H100,
H200, B200, A100, L40S, RTX PRO 6000 (and more) for vLLM, SGLang and TensorRT-LLM, and a
compiled engine that evaluates a model's op list against them. This provider compiles
that engine once per (hardware, model, tp, backend, version) from a Hugging Face style
config synthesised from our :class:`~sim.model.ModelSpec`, and maps one iteration's
:class:`~sim.latency.base.BatchShape` onto its ops:

============== ==================================================================
our layer      aiconfigurator op (per layer: the op's value / its layer count)
============== ==================================================================
embedding      ``*_embedding`` at m = num_tokens
layernorm      ``*_add_norm_1`` (first occurrence), ``*_add_norm_2`` (second)
qkv_proj       ``*_qkv_gemm``            o_proj        ``*_proj_gemm``
gate_up_proj   ``*_gate_ffn1_gemm``      down_proj     ``*_ffn2_gemm``
act_fn         ``*_act_gate``
moe            ``*_router_gemm`` + ``*_moe`` (aiconfigurator's own routing model)
attention      ``context_attention`` (batch 1, s = prefill tokens, prefix = their
               cached KV) + ``generation_attention`` (batch = decodes, s = mean KV)
lm_head        ``generation_logits_gemm`` at m = num_seqs
qk_norm, rotary_emb, final_layernorm, sampler
               not separate ops in aiconfigurator (folded into its attention /
               norm ops, or not modelled): 1 ns, so totals match its estimates
============== ==================================================================

Communication ops (TP all-reduce, PP send/recv, MoE dispatch) are left out: the
simulator's system backend models the network. Token-indexed ops are tabulated at
construction (exactly up to 1024 tokens, every 8 tokens above, linear in between);
attention values are evaluated by the compiled engine on first use and memoised, so a
per-iteration call is a few list indexings and dictionary hits.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from sim.errors import InputError, unknown_name
from sim.latency.base import LATENCY_PROVIDERS, BatchShape, LatencyProvider, LayerTimes
from sim.model import HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec

AIC_MISSING = ("the aic latency provider needs aiconfigurator-core: pip install '.[aic]' "
               "(or pip install aiconfigurator-core)")

#: our hardware names -> aiconfigurator system names
HARDWARE_TO_SYSTEM = {
    "H100-SXM": "h100_sxm",
    "H200-SXM": "h200_sxm",
    "B200": "b200_sxm",
    "A100-80G-SXM": "a100_sxm",
    "L40S": "l40s",
    "RTXPRO6000": "rtx_pro_6000_server",
}
BACKENDS = ("vllm", "sglang", "trtllm")
SLOT_ALIASES = ("current", "previous", "next")

_HF_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
            "mixtral": ("MixtralForCausalLM", "mixtral")}
_FOLDED = frozenset({"qk_norm", "rotary_emb", "final_layernorm", "sampler"})
_COMM_TYPES = frozenset({"CustomAllReduce", "P2P", "NCCL", "MoEDispatch", "MoEAllToAll"})
#: aiconfigurator op-name suffix -> our layer name (token-indexed ops)
_SUFFIX_TO_LAYER = {
    "embedding": "embedding", "add_norm_1": "layernorm#1", "add_norm_2": "layernorm#2",
    "qkv_gemm": "qkv_proj", "proj_gemm": "o_proj", "gate_ffn1_gemm": "gate_up_proj",
    "act_gate": "act_fn", "ffn2_gemm": "down_proj", "router_gemm": "moe_router",
}
_EXACT_UPTO = 1024
_COARSE_STEP = 8
_MEMO_LIMIT = 500_000


def _import_aic():
    try:
        import aiconfigurator_core  # noqa: F401
        from aiconfigurator_core.sdk import perf_database
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError:
        raise InputError(AIC_MISSING) from None
    return perf_database, EngineHandle


def aic_version() -> str | None:
    """The installed aiconfigurator-core version, or None when it is absent."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return None


def aic_system_data(hardware: str) -> Path | None:
    """aiconfigurator-core's data folder for ``hardware``'s system (our name or an alias;
    its measured per-op and communication tables lie under it), or None where the package
    is not installed or has no system for the card. Nothing is imported from it."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        return None
    system = HARDWARE_TO_SYSTEM.get(hardware)
    if system is None:
        from sim.hardware import load_hardware
        try:
            system = HARDWARE_TO_SYSTEM.get(load_hardware(hardware).name)
        except InputError:
            return None
        if system is None:
            return None
    folder = Path(spec.origin).parent / "systems" / "data" / system
    return folder if folder.is_dir() else None


@contextmanager
def _quiet():
    """aiconfigurator logs a warning per fallback table it loads; keep the CLI clean."""
    log = logging.getLogger("aiconfigurator_core")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


def available_databases() -> dict[str, dict[str, list[str]]]:
    """system -> backend -> queryable versions, from the installed package (read once per
    process: the package parses hundreds of YAML files to answer)."""
    return {s: {b: list(v) for b, v in bs.items()} for s, bs in _databases().items()}


@cache
def _databases() -> dict[str, dict[str, tuple[str, ...]]]:
    """Read once per process, and kept in the user cache (:mod:`sim.cache`) keyed by the
    installed package's RECORD (every file it installed, with its hash) and version: the
    package parses ~230 YAML files to answer (~0.6 s, in every Ray actor and every
    ``llmsim run`` that asks aic)."""
    from sim.cache import cached

    perf_database, _ = _import_aic()

    def build() -> dict[str, dict[str, tuple[str, ...]]]:
        with _quiet():
            return {s: {b: tuple(v) for b, v in bs.items() if v}
                    for s, bs in perf_database.get_supported_databases().items()}

    record = _installed_record()
    if record is None:  # not installed from a wheel (no RECORD): nothing to key it on
        return build()
    return cached("aic-databases", [record], build,
                  params=(aic_version(), tuple(map(str, perf_database.get_systems_paths()))))


def _installed_record():
    """The RECORD file of the installed aiconfigurator-core, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        files = distribution("aiconfigurator-core").files or []
    except (PackageNotFoundError, OSError):
        return None
    rec = next((f for f in files if f.name == "RECORD"), None)
    return None if rec is None else rec.locate()


def resolve_system(hardware: str, databases: dict | None = None) -> str:
    """Our hardware name (or an aiconfigurator system name) -> aiconfigurator system."""
    dbs = databases if databases is not None else available_databases()
    system = HARDWARE_TO_SYSTEM.get(hardware, hardware)
    if system not in dbs:
        from sim.hardware import load_hardware
        try:
            system = HARDWARE_TO_SYSTEM.get(load_hardware(hardware).name, system)
        except InputError:
            pass
    if system not in dbs:
        known = sorted({*(h for h, s in HARDWARE_TO_SYSTEM.items() if s in dbs), *dbs})
        raise unknown_name("hardware for the aic provider", hardware, known)
    return system


def resolve_version(system: str, backend: str, backend_version: str | None) -> str:
    """A literal database version for (system, backend); aliases and None allowed."""
    perf_database, _ = _import_aic()
    with _quiet():
        slots = perf_database.get_version_slots(system, backend) or {}
        versions = available_databases().get(system, {}).get(backend, [])
    requested = backend_version or "current"
    if requested in SLOT_ALIASES:
        if requested in slots:
            return slots[requested]
        if requested == "current" and versions:
            return versions[-1]
    elif requested in versions or requested in slots.values():
        return requested
    labels = {v: k for k, v in slots.items()}
    avail = ", ".join(f"{v} ({labels[v]})" if v in labels else v for v in versions) or "(none)"
    aliases = ", ".join(a for a in SLOT_ALIASES if a in slots)
    raise InputError(f"unknown {backend} version {requested!r} for {system} in "
                     f"aiconfigurator-core {aic_version()}; available: {avail}"
                     + (f" (or the alias {aliases})" if aliases else ""))


def hf_config(model: ModelSpec) -> dict:
    """A Hugging Face ``config.json`` mapping for ``model`` (what aiconfigurator parses)."""
    if model.architecture not in _HF_ARCH:
        raise unknown_name("architecture for the aic provider", model.architecture, _HF_ARCH)
    arch, model_type = _HF_ARCH[model.architecture]
    cfg = {
        "architectures": [arch], "model_type": model_type,
        "hidden_size": model.hidden_size, "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads, "head_dim": model.head_dim,
        "vocab_size": model.vocab_size, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
        "tie_word_embeddings": model.tie_word_embeddings,
        "torch_dtype": {"float16": "float16", "fp16": "float16"}.get(model.dtype, "bfloat16"),
    }
    if model.architecture == "qwen3_moe":
        cfg.update(num_experts=model.num_experts, num_experts_per_tok=model.num_experts_per_tok,
                   moe_intermediate_size=model.moe_intermediate_size, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=[])
    elif model.architecture == "mixtral":
        cfg.update(num_local_experts=model.num_experts,
                   num_experts_per_tok=model.num_experts_per_tok,
                   intermediate_size=model.moe_intermediate_size or model.intermediate_size)
    return cfg


def _ms_to_ns(ms: float) -> float:
    return ms * 1e6


def quant_modes(model: ModelSpec) -> dict[str, str]:
    """aiconfigurator's quant-mode arguments for the served precision.

    W8A8 FP8 (``quantization: fp8``) selects its ``fp8`` GEMM and MoE modes (FP8 tensor-core
    GEMMs, 1-byte weights), or its ``fp8_block`` ones for a checkpoint with block-wise weight
    scales (``weight_block_size``: vLLM runs those through its block-scaled GEMM and
    fused-MoE kernels, which the database measures apart); an FP8 KV cache selects its
    ``fp8`` KV-cache mode. The FMHA
    mode stays at its default (bf16 compute): the vLLM databases hold FP8-KV attention
    measured that way and no context attention for an FP8 FMHA. Empty for bf16.
    """
    modes: dict[str, str] = {}
    if model.is_fp8:
        mode = "fp8_block" if model.weight_block_size else "fp8"
        modes["gemm_quant_mode"] = mode
        if model.is_moe:
            modes["moe_quant_mode"] = mode
    if model.kv_is_fp8:
        modes["kvcache_quant_mode"] = "fp8"
    return modes


#: built providers by (model, hardware, tp, backend, version, sizes): compiling the engine
#: and tabulating its ops takes seconds, and dse evaluates the same case many times
_BUILT: dict[tuple, AicProvider] = {}


def moe_parallelism(model: ModelSpec, tp: int, ep: int) -> dict[str, int]:
    """aiconfigurator's MoE layout for one rank: without expert parallelism the experts
    are sharded over the tp ranks; with it (vLLM's EP group is the dp x tp ranks, each
    holding num_experts / ep whole experts) ep // tp attention-DP ranks gather their
    tokens into the experts, so its MoE op at x tokens is one EP rank's work for x tokens
    a DP rank: top_k x x assignments on average, as the simulator asks."""
    if not model.is_moe:
        return {}
    if ep <= 1:
        return {"moe_tp_size": tp, "moe_ep_size": 1}
    if ep % tp:
        raise InputError(f"the aic provider models an EP group of dp x tp ranks; ep_size={ep} "
                         f"is not a multiple of tp={tp}")
    return {"moe_tp_size": 1, "moe_ep_size": ep, "attention_dp_size": ep // tp}


class AicProvider(LatencyProvider):
    """Per-layer latency from aiconfigurator-core's database (see the module docstring)."""

    kind = "aic"
    exact_coverage = False   # covers() cannot tell without compiling the engine

    def __init__(self, model: ModelSpec, hardware: str, tp: int = 1, *, backend: str = "vllm",
                 backend_version: str | None = None, max_tokens: int = 16384,
                 max_seqs: int = 1024, ep_size: int = 1, **_ignored) -> None:
        ep = ep_size if model.is_moe else 1
        key = (model, hardware, tp, backend, backend_version, max_tokens, max_seqs, ep)
        built = _BUILT.get(key)
        if built is not None:   # share the tables and memos; fresh extrapolation counts
            self.__dict__.update(built.__dict__)
            self._extrap = {}
            self.note = ""
            return
        self._build(model, hardware, tp, backend, backend_version, max_tokens, max_seqs, ep)
        _BUILT[key] = self

    def _build(self, model: ModelSpec, hardware: str, tp: int, backend: str,
               backend_version: str | None, max_tokens: int, max_seqs: int, ep: int) -> None:
        _, EngineHandle = _import_aic()
        model.check_tp(tp)
        dbs = available_databases()
        self.model, self.hardware, self.tp = model, hardware, tp
        self.system = resolve_system(hardware, dbs)
        if backend not in dbs[self.system]:
            raise unknown_name(f"backend for the aic provider on {hardware}", backend,
                               dbs[self.system])
        self.backend = backend
        self.backend_version = resolve_version(self.system, backend, backend_version)
        self._modes = quant_modes(model)
        prec = "" if not self._modes else f", {model.precision}"
        self.source = (f"aiconfigurator-core {aic_version()} ({self.system}, {backend} "
                       f"{self.backend_version}, tp{tp}{f', ep{ep}' if ep > 1 else ''}{prec})")
        self._extrap: dict[str, int] = {}
        moe_kw = moe_parallelism(model, tp, ep)
        #: aiconfigurator's MoE op with EP takes the tokens of one attention-DP rank, of
        #: which an EP rank runs top_k / tp assignments each: ``moe_ns``'s tokens (an EP
        #: rank's assignments / top_k) are tp times fewer
        self._moe_tokens_per_query = tp if ep > 1 else 1
        with tempfile.TemporaryDirectory(prefix="llmsim-aic-") as tmp, _quiet():
            path = Path(tmp) / model.name.replace("/", "--")
            path.mkdir()
            (path / "config.json").write_text(json.dumps(hf_config(model)))
            try:
                self.engine = EngineHandle.compile(str(path), self.system, backend,
                                                   backend_version=self.backend_version,
                                                   tp_size=tp, **moe_kw, **self._modes)
                self._ctx_ops, self._gen_ops = self._op_lists(str(path), moe_kw)
                self._build_tables(max_tokens, max_seqs)
                # attention is evaluated lazily: fail here, not mid-run, if data is missing
                self.engine.evaluate_context_ops([self._ctx_attn], batch_size=1, s=16, prefix=16)
                self.engine.evaluate_generation_ops([self._gen_attn], batch_size=1, s=16)
            except InputError:
                raise
            except Exception as exc:  # noqa: BLE001 - aiconfigurator raises many types
                blocks = ", block-scaled" if model.weight_block_size else ""
                raise InputError(f"aiconfigurator cannot model {model.name} on {self.system} "
                                 f"({backend} {self.backend_version}, tp={tp}, "
                                 f"{model.precision}{blocks}): {exc}") from None
        self._prefill_memo: dict[tuple[int, int], float] = {}
        self._decode_memo: dict[tuple[int, int], float] = {}
        self._dense_memo: dict[int, tuple] = {}
        #: tokens -> (prologue sum, block sum without attention/moe, attention and moe
        #: layers per block): ``iteration_ns`` without building the layer list
        self._sum_memo: dict[int, tuple[int, int, int, int]] = {}

    # ------------------------------------------------------------------ construction
    def _op_lists(self, path: str, moe_kw: dict):
        """(name, scale_factor, is_comm) of the compiled context / generation op lists."""
        from aiconfigurator_core.sdk.config_builders import build_model_config
        from aiconfigurator_core.sdk.models import get_model

        cfg = build_model_config(tp_size=self.tp, pp_size=1,
                                 attention_dp_size=moe_kw.get("attention_dp_size", 1),
                                 moe_tp_size=moe_kw.get("moe_tp_size", 1),
                                 moe_ep_size=moe_kw.get("moe_ep_size", 1), **self._modes)
        m = get_model(path, cfg, self.backend)

        def describe(ops):
            return [(op._name, float(op._scale_factor), type(op).__name__ in _COMM_TYPES)
                    for op in ops]
        return describe(m.context_ops), describe(m.generation_ops)

    def _index(self, ops, suffix: str) -> int | None:
        for i, (name, _, comm) in enumerate(ops):
            if not comm and name.split("_", 1)[1] == suffix:
                return i
        return None

    def _build_tables(self, max_tokens: int, max_seqs: int) -> None:
        import numpy as np

        ctx = self._ctx_ops
        self._token_ops: list[tuple[int, str, float]] = []
        for i, (name, scale, comm) in enumerate(ctx):
            suffix = name.split("_", 1)[1]
            if comm or suffix not in _SUFFIX_TO_LAYER or scale <= 0:
                continue
            self._token_ops.append((i, _SUFFIX_TO_LAYER[suffix], scale))
        have = {layer for _, layer, _ in self._token_ops}
        needed = {"embedding", "layernorm#1", "layernorm#2", "qkv_proj", "o_proj"}
        if not self.model.is_moe:
            needed |= {"gate_up_proj", "act_fn", "down_proj"}
        if needed - have:
            raise InputError(f"aiconfigurator's {self.model.architecture} model lacks ops for "
                             f"{sorted(needed - have)}; has {[n for n, _, _ in ctx]}")
        self._ctx_attn = self._index(ctx, "attention")
        self._gen_attn = self._index(self._gen_ops, "attention")
        self._ctx_moe = self._index(ctx, "moe") if self.model.is_moe else None
        self._gen_logits = self._index(self._gen_ops, "logits_gemm")
        if self._ctx_attn is None or self._gen_attn is None or self._gen_logits is None or (
                self.model.is_moe and self._ctx_moe is None):
            raise InputError(f"aiconfigurator's model of {self.model.name} lacks an attention, "
                             "logits or MoE op")
        self._attn_scale = ctx[self._ctx_attn][1]
        self._gen_attn_scale = self._gen_ops[self._gen_attn][1]

        # Token-indexed ops: exact values at 1.._EXACT_UPTO, every _COARSE_STEP above.
        grid = list(range(1, min(max_tokens, _EXACT_UPTO) + 1))
        grid += list(range(_EXACT_UPTO + _COARSE_STEP, max_tokens + 1, _COARSE_STEP))
        if grid[-1] != max_tokens:
            grid.append(max_tokens)
        idx = [i for i, _, _ in self._token_ops]
        vals = np.zeros((len(grid), len(idx)))
        for r, t in enumerate(grid):
            res = self.engine.evaluate_context_ops(idx, batch_size=1, s=t, x=t)
            vals[r] = [v for _, v, _, _ in res]
        xs = np.arange(max_tokens + 1, dtype=np.float64)
        self._tables: dict[str, list[float]] = {}
        for c, (_, layer, scale) in enumerate(self._token_ops):
            col = np.interp(xs, [0, *grid], [vals[0, c], *vals[:, c]]) * 1e6 / scale
            self._tables[layer] = col.tolist()
        self._max_tokens = max_tokens

        seqs = list(range(1, max_seqs + 1))
        scale = self._gen_ops[self._gen_logits][1]
        lm = [self.engine.evaluate_generation_ops([self._gen_logits], batch_size=s, s=1)[0][1]
              for s in seqs]
        self._lm_head = [lm[0] * 1e6 / scale, *(v * 1e6 / scale for v in lm)]
        self._max_seqs = max_seqs

        if self.model.is_moe:
            moe_grid = sorted({*range(1, 17), *(round(2 ** (k / 2)) for k in range(8, 60))})
            moe_grid = [t for t in moe_grid if t <= max_tokens] + [max_tokens]
            moe_grid = sorted(set(moe_grid))
            mscale = ctx[self._ctx_moe][1]
            mv = [self.engine.evaluate_context_ops([self._ctx_moe], batch_size=1, s=t, x=t)[0][1]
                  * 1e6 / mscale for t in moe_grid]
            self._moe_grid, self._moe_vals = moe_grid, mv

    # ------------------------------------------------------------------ lookups
    def _note(self, axis: str) -> None:
        self._extrap[axis] = self._extrap.get(axis, 0) + 1

    def _tok(self, layer: str, t: int) -> float:
        table = self._tables[layer]
        if t < len(table):
            return table[t]
        self._note("tokens")
        return table[-1] + (table[-1] - table[-2]) * (t - len(table) + 1)

    def prefill_attention_ns(self, chunk: int, cached: int) -> float:
        key = (chunk, cached)
        v = self._prefill_memo.get(key)
        if v is None:
            if len(self._prefill_memo) > _MEMO_LIMIT:
                self._prefill_memo.clear()
            ms = self.engine.evaluate_context_ops([self._ctx_attn], batch_size=1, s=chunk,
                                                  prefix=cached)[0][1]
            v = self._prefill_memo[key] = _ms_to_ns(ms) / self._attn_scale
        return v

    def decode_attention_ns(self, n_decode: int, kv_mean: int) -> float:
        key = (n_decode, kv_mean)
        v = self._decode_memo.get(key)
        if v is None:
            if len(self._decode_memo) > _MEMO_LIMIT:
                self._decode_memo.clear()
            ms = self.engine.evaluate_generation_ops([self._gen_attn], batch_size=n_decode,
                                                     s=max(1, kv_mean))[0][1]
            v = self._decode_memo[key] = _ms_to_ns(ms) / self._gen_attn_scale
        return v

    def attention_ns(self, shape: BatchShape) -> float:
        ns = 0.0
        pc, two_w = shape.prefill_tokens, shape.prefill_work
        if pc and two_w:
            # several prompts: one varlen kernel doing their own work, read as the one
            # prompt of all their tokens with the same work over a cached prefix (as the
            # measured provider); fresh prompts doing less than that: the fresh prompt
            # whose causal work is theirs
            excess = two_w - pc * pc
            ns += (self.prefill_attention_ns(pc, excess // (2 * pc)) if excess >= 0
                   else self.prefill_attention_ns(math.isqrt(two_w), 0))
        elif pc:
            ns += self.prefill_attention_ns(pc, shape.prefill_kv)
        if shape.num_decode:
            ns += self.decode_attention_ns(shape.num_decode, shape.decode_kv_mean)
        return ns

    def moe_ns(self, tokens: int, activated_experts: int = 0) -> int:
        """One MoE layer (router GEMM + experts) for ``tokens`` tokens on one rank.

        aiconfigurator models expert routing itself (a power-law token distribution),
        so ``activated_experts`` does not enter.
        """
        if not self.model.is_moe:
            raise InputError(f"{self.model.name} is not an MoE model")
        tokens = max(1, tokens) * self._moe_tokens_per_query
        if tokens > self._moe_grid[-1]:
            self._note("moe_tokens")
        import numpy as np

        v = float(np.interp(tokens, self._moe_grid, self._moe_vals))
        if tokens > self._moe_grid[-1]:
            g, mv = self._moe_grid, self._moe_vals
            v = mv[-1] + (mv[-1] - mv[-2]) / (g[-1] - g[-2]) * (tokens - g[-1])
        return max(1, int(v + self._tok("moe_router", tokens)))

    def _lm(self, s: int) -> float:
        if s < len(self._lm_head):
            return self._lm_head[s]
        self._note("sequences")
        lm = self._lm_head
        return lm[-1] + (lm[-1] - lm[-2]) * (s - len(lm) + 1)

    def _dense_parts(self, t: int) -> tuple:
        """(prologue, block-with-None-for-attention/moe) for ``t`` tokens (memoised)."""
        parts = self._dense_memo.get(t)
        if parts is not None:
            return parts
        norms = 0
        block = []
        for name in self.model.block_sequence:
            if name in ("attention", "moe"):
                block.append((name, None))
            elif name in _FOLDED:
                block.append((name, 1))
            elif name == "layernorm":
                norms += 1
                block.append((name, max(1, int(self._tok(f"layernorm#{min(norms, 2)}", t)))))
            else:
                block.append((name, max(1, int(self._tok(name, t)))))
        prologue = tuple((n, max(1, int(self._tok(n, t)))) for n in PROLOGUE)
        parts = (prologue, tuple(block))
        if t <= self._max_tokens:
            self._dense_memo[t] = parts
        return parts

    def layer_times(self, shape: BatchShape) -> LayerTimes:
        t = self.dense_tokens(shape.num_tokens)
        prologue, block = self._dense_parts(t)
        attn = max(1, int(self.attention_ns(shape)))
        moe = self.moe_ns(t) if self.model.is_moe else 0
        block = tuple((n, attn if n == "attention" else moe if n == "moe" else ns)
                      for n, ns in block)
        head = tuple((n, 1) for n in HEAD_DENSE) + tuple(
            (n, max(1, int(self._lm(shape.num_seqs))) if n == "lm_head" else 1)
            for n in HEAD_PER_SEQUENCE)
        return LayerTimes(prologue, block, head, self.model.num_hidden_layers)

    def _dense_sums(self, t: int) -> tuple[int, int, int, int]:
        """``_dense_parts(t)`` summed: (prologue, the block's fixed layers, its attention
        layers, its moe layers); memoised as ``_dense_parts`` is (same lookups noted)."""
        sums = self._sum_memo.get(t)
        if sums is None:
            prologue, block = self._dense_parts(t)
            sums = (sum(ns for _, ns in prologue),
                    sum(ns for _, ns in block if ns is not None),
                    sum(1 for n, _ in block if n == "attention"),
                    sum(1 for n, _ in block if n == "moe"))
            if t <= self._max_tokens:
                self._sum_memo[t] = sums
        return sums

    def iteration_ns(self, shape: BatchShape) -> int:
        """Whole-iteration compute time on one NPU: ``layer_times(shape).total_ns()``,
        summed from memoised per-token-count sums (integers, so the same total)."""
        t = self.dense_tokens(shape.num_tokens)
        pro, fixed, n_attn, n_moe = self._dense_sums(t)
        attn = max(1, int(self.attention_ns(shape)))
        moe = self.moe_ns(t) if self.model.is_moe else 0
        head = len(HEAD_DENSE) + sum(max(1, int(self._lm(shape.num_seqs))) if n == "lm_head"
                                     else 1 for n in HEAD_PER_SEQUENCE)
        return pro + self.model.num_hidden_layers * (fixed + n_attn * attn + n_moe * moe) + head

    def extrapolations(self) -> dict[str, int]:
        return dict(self._extrap)


    @classmethod
    def covers(cls, model: ModelSpec, hardware: str, tp: int, profiles_dirs=()) -> str | None:
        """Cheap checks only (no engine compile): the package imports, the hardware has a
        vLLM database, the architecture is one we map, and FP8 has an fp8 peak."""
        try:
            dbs = available_databases()
        except InputError:
            return "aiconfigurator-core is not installed"
        try:
            system = resolve_system(hardware, dbs)
        except InputError:
            return f"no aiconfigurator database for {hardware}"
        if "vllm" not in dbs[system]:
            return f"no aiconfigurator vLLM database for {hardware}"
        if model.architecture not in _HF_ARCH:
            return f"architecture {model.architecture} is not mapped"
        if model.num_attention_heads % tp:
            return f"tp={tp} does not divide the heads"
        if model.is_fp8 or model.kv_is_fp8:
            from sim.model import check_fp8_hardware
            try:
                check_fp8_hardware(model, hardware)
            except InputError:
                return f"{hardware} has no FP8"
        return None


LATENCY_PROVIDERS.register("aic", AicProvider)
