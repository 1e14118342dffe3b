"""Model architecture specs: what the simulator needs to know about a transformer.

Specs come from the project's own YAML files under ``profiles/models/`` (looked up by
name or alias) or from a Hugging Face ``config.json`` given by path. From a spec follow
the weight bytes, the KV-cache bytes per token and the per-block layer sequence that the
latency providers walk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path

from sim.errors import InputError, unique_keys, unknown_name
from sim.paths import is_dir, is_file, profiles_root
from sim.yamlio import load_yaml_files

DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4,
               "fp32": 4, "fp8": 1, "float8": 1, "int8": 1}

# The per-decoder-block layer sequence of each architecture family, in execution order.
# Names match the profile bundles' layer names (vLLM module names). "attention" is looked
# up in attention.csv, "moe" in moe.csv, the rest in dense.csv. Tensor-parallel
# all-reduces follow o_proj and down_proj/moe.
BLOCK_SEQUENCES: dict[str, tuple[str, ...]] = {
    "llama": ("layernorm", "qkv_proj", "rotary_emb", "attention", "o_proj", "layernorm",
              "gate_up_proj", "act_fn", "down_proj"),
    "qwen3": ("layernorm", "qkv_proj", "qk_norm", "rotary_emb", "attention", "o_proj",
              "layernorm", "gate_up_proj", "act_fn", "down_proj"),
    "qwen3_moe": ("layernorm", "qkv_proj", "qk_norm", "rotary_emb", "attention", "o_proj",
                  "layernorm", "moe"),
    "mixtral": ("layernorm", "qkv_proj", "rotary_emb", "attention", "o_proj", "layernorm",
                "moe"),
}
PROLOGUE = ("embedding",)
HEAD_DENSE = ("final_layernorm",)
HEAD_PER_SEQUENCE = ("lm_head", "sampler")
# Layers after which a TP all-reduce runs (row-parallel outputs).
TP_ALLREDUCE_AFTER = frozenset({"o_proj", "down_proj", "moe"})

#: weight quantizations the simulator models -> bytes per weight of the linear layers.
#: "fp8" is W8A8 FP8 as vLLM serves FP8 checkpoints (and ``--quantization fp8``): the
#: attention, MLP and expert linears hold FP8 weights and run FP8 GEMMs on dynamically
#: quantized activations; embedding, lm_head, the MoE router and norms stay in the model
#: dtype, and activations between layers (so the TP all-reduce) stay bf16.
QUANTIZATIONS = {"fp8": 1}
#: vLLM's --kv-cache-dtype values we model -> bytes per element ("auto" = the model dtype)
KV_CACHE_DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1,
                   "fp8_e5m2": 1}
_UNSET = object()

_HF_ARCH_TO_FAMILY = {"llama": "llama", "mistral": "llama", "qwen3": "qwen3",
                      "qwen3_moe": "qwen3_moe", "mixtral": "mixtral"}


def check_precision(quantization: str | None, kv_cache_dtype: str, *,
                    quant_label: str = "quantization", kv_label: str = "kv_cache_dtype",
                    source: str | None = None) -> None:
    """Refuse a quantization or KV-cache dtype that is not modelled, naming the field or
    flag it came from (``quant_label`` / ``kv_label``) and what is allowed."""
    if quantization not in (None, *QUANTIZATIONS):
        raise InputError(f"{quant_label}: {quantization!r} is not modelled; allowed: "
                         f"{', '.join(QUANTIZATIONS)} (or none)", source=source)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(f"{kv_label}: {kv_cache_dtype!r} is not modelled; allowed: "
                         f"{', '.join(KV_CACHE_DTYPES)}", source=source)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    #: longest position the rotary table covers (HF max_position_embeddings; 0 = unknown)
    max_position_embeddings: int = 0
    aliases: tuple[str, ...] = field(default=())
    #: weight quantization of the checkpoint or as served (None = weights in ``dtype``)
    quantization: str | None = None
    #: KV-cache element type as vLLM's --kv-cache-dtype ("auto" = ``dtype``)
    kv_cache_dtype: str = "auto"
    #: an FP8 checkpoint's weight-scale blocks (HF quantization_config.weight_block_size,
    #: e.g. (128, 128) for Qwen's and DeepSeek's FP8 releases); None: per-tensor or
    #: per-channel scales (compressed-tensors, ModelOpt, vLLM's online --quantization fp8).
    #: vLLM runs block-scaled checkpoints through other GEMM and fused-MoE kernels.
    weight_block_size: tuple[int, int] | None = None

    # ---- derived quantities -------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def weight_dtype_bytes(self, quant=_UNSET) -> int:
        """Bytes per weight of the quantized linear layers (``quant`` defaults to the spec's)."""
        q = self.quantization if quant is _UNSET else quant
        return QUANTIZATIONS[q] if q else self.dtype_bytes

    def kv_dtype_bytes(self, kv_dtype=_UNSET) -> int:
        """Bytes per KV-cache element (``kv_dtype`` defaults to the spec's)."""
        k = self.kv_cache_dtype if kv_dtype is _UNSET else kv_dtype
        return KV_CACHE_DTYPES.get(k or "auto") or self.dtype_bytes

    @property
    def is_fp8(self) -> bool:
        """FP8 GEMMs (W8A8) run in this spec's precision."""
        return self.quantization == "fp8"

    @property
    def kv_is_fp8(self) -> bool:
        """The KV cache is stored in FP8 (--kv-cache-dtype fp8*)."""
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def precision(self) -> str:
        """Short label of the served precision: "bf16", "fp8", "fp8+kv-fp8", "bf16+kv-fp8"."""
        base = self.quantization or {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(
            self.dtype, self.dtype)
        return base + ("+kv-fp8" if self.kv_is_fp8 else "")

    def with_precision(self, quantization=_UNSET, kv_cache_dtype=_UNSET,
                       source: str | None = None) -> ModelSpec:
        """This spec served at another precision (vLLM's --quantization / --kv-cache-dtype).

        ``quantization`` None keeps the checkpoint's (vLLM infers it from the config)."""
        q = self.quantization if quantization is _UNSET or quantization is None else quantization
        kv = self.kv_cache_dtype if kv_cache_dtype is _UNSET or kv_cache_dtype is None \
            else kv_cache_dtype
        check_precision(q, kv, source=source)
        if q == self.quantization and kv == self.kv_cache_dtype:
            return self
        # online quantization of a checkpoint in another precision scales per tensor
        blocks = self.weight_block_size if q == self.quantization else None
        return replace(self, quantization=q, kv_cache_dtype=kv, weight_block_size=blocks)

    def expected_active_experts(self, tokens: int) -> int:
        """Distinct experts hit by ``tokens`` tokens each picking k of E uniformly (the
        expectation every provider uses for an MoE layer of a local batch)."""
        e, k = self.num_experts, self.num_experts_per_tok
        if not e:
            return 0
        return max(1, min(e, round(e * (1.0 - (1.0 - k / e) ** max(0, tokens)))))

    @property
    def block_sequence(self) -> tuple[str, ...]:
        return BLOCK_SEQUENCES[self.architecture]

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def attention_params(self) -> int:
        h = self.hidden_size
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h

    def mlp_params(self) -> int:
        """Parameters of one block's MLP: the dense MLP or all experts plus the router."""
        h = self.hidden_size
        if self.is_moe:
            return self.num_experts * 3 * h * self.moe_intermediate_size + h * self.num_experts
        return 3 * h * self.intermediate_size

    def active_mlp_params(self) -> int:
        """Parameters one token touches in one block's MLP."""
        h = self.hidden_size
        if self.is_moe:
            return self.num_experts_per_tok * 3 * h * self.moe_intermediate_size + h * self.num_experts
        return 3 * h * self.intermediate_size

    def param_count(self) -> int:
        h = self.hidden_size
        per_block = self.attention_params() + self.mlp_params() + 2 * h
        if self.architecture in ("qwen3", "qwen3_moe"):
            per_block += 2 * self.head_dim
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.num_hidden_layers * per_block + embed + lm_head + h

    def weight_bytes(self, tp: int = 1, pp: int = 1, ep: int = 1, quant=_UNSET) -> int:
        """Weight bytes held by one NPU of a (tp, pp, ep) instance.

        Attention and dense MLP weights shard over tp; experts shard over the ep ranks
        (or over tp when ep is 1); the embedding and lm_head shard over tp and live on the first
        and last pipeline stage. Norms are replicated (the last stage holds the final one).
        Under ``quant`` (default: the spec's quantization) the linear layers take its bytes
        per weight; embedding, lm_head, router and norms keep the model dtype (vLLM leaves
        them unquantized).
        """
        layers_per_stage = -(-self.num_hidden_layers // pp)
        if pp == 1:
            return self.stage_weight_bytes(tp, layers_per_stage, True, True, ep, quant)
        # the largest stage: the most layers and one of the vocabulary-sized ends
        return self.stage_weight_bytes(tp, layers_per_stage, True, False, ep, quant)

    def stage_weight_bytes(self, tp: int, layers: int, embed: bool, head: bool, ep: int = 1,
                           quant=_UNSET) -> int:
        """Weight bytes of one NPU of a pipeline stage holding ``layers`` decoder blocks,
        the embedding (the first stage) and/or the lm_head (the last; it holds its own copy
        of tied embeddings when the embedding lives on another stage)."""
        h = self.hidden_size
        wb, db = self.weight_dtype_bytes(quant), self.dtype_bytes
        layers_per_stage = layers
        attn = self.attention_params() / tp * wb
        if self.is_moe:
            # Experts shard over the EP ranks (whole experts), or over tp when ep is 1.
            experts = self.num_experts * 3 * h * self.moe_intermediate_size / max(ep, tp)
            mlp = experts * wb + h * self.num_experts * db
        else:
            mlp = self.mlp_params() / tp * wb
        norms = 2 * h + (2 * self.head_dim if self.architecture in ("qwen3", "qwen3_moe") else 0)
        blocks = layers_per_stage * (attn + mlp + norms * db)
        vocab = self.vocab_size * h / tp
        ends = (vocab if embed else 0) + (vocab if head else 0)
        if embed and head and self.tie_word_embeddings:
            ends = vocab
        # the final RMSNorm (replicated, model dtype) lives beside the lm_head
        final_norm = h * db if head else 0
        return int(blocks + ends * db) + final_norm

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1, kv_dtype=_UNSET) -> int:
        """KV-cache bytes per token on one NPU (K and V, every layer of its stage), in
        ``kv_dtype`` (default: the spec's kv_cache_dtype)."""
        kv_heads_per_rank = max(1, self.num_key_value_heads // tp)
        layers_per_stage = -(-self.num_hidden_layers // pp)
        return (2 * layers_per_stage * kv_heads_per_rank * self.head_dim
                * self.kv_dtype_bytes(kv_dtype))

    def check_tp(self, tp: int, source: str | None = None, label: str = "tp_size") -> None:
        if tp < 1 or self.num_attention_heads % tp:
            allowed = [d for d in range(1, self.num_attention_heads + 1)
                       if self.num_attention_heads % d == 0]
            raise InputError(
                f"{label}={tp} does not divide num_attention_heads={self.num_attention_heads} "
                f"of {self.name} (allowed: {', '.join(map(str, allowed))})", source=source)

    def check_weight_blocks(self, tp: int, moe_tp: int, source: str | None = None) -> None:
        """Block-scaled FP8 weights shard only into whole scale blocks: vLLM refuses to
        load a column-parallel linear (qkv, gate_up, the experts' gate_up) whose output
        shard is not a multiple of block_n, or a row-parallel one (o_proj, down, the
        experts' down) whose input shard is not a multiple of block_k. ``moe_tp`` is how
        many ranks share each expert (tp, dp x tp for a DP group without expert
        parallelism, 1 with it)."""
        if not (self.is_fp8 and self.weight_block_size):
            return
        bn, bk = self.weight_block_size
        d = self.head_dim
        q = self.num_attention_heads * d
        # (layer, which of its dimensions, its width, the ranks sharing it, the block each
        # share must fill); KV heads replicate when tp exceeds them (one a rank)
        kv = max(1, self.num_key_value_heads // tp) * d * tp
        shards = [("qkv_proj", "query output", q, tp, bn),
                  ("qkv_proj", "key/value output", kv, tp, bn),
                  ("o_proj", "input", q, tp, bk)]
        if "gate_up_proj" in self.block_sequence:
            shards += [("gate_up_proj", "output", self.intermediate_size, tp, bn),
                       ("down_proj", "input", self.intermediate_size, tp, bk)]
        experts = [("the experts' gate_up", "output", self.moe_intermediate_size, moe_tp, bn),
                   ("the experts' down", "input", self.moe_intermediate_size, moe_tp, bk)]
        for layer, dim, width, ranks, block in shards + (experts if self.is_moe else []):
            per_rank = width / ranks
            if per_rank % block:
                hint = ("; with expert parallelism (ep_size) each rank holds whole experts"
                        if (layer, dim, width, ranks, block) in experts else "")
                raise InputError(
                    f"{self.name}'s FP8 weights are scaled in {bn} x {bk} blocks, but "
                    f"{layer}'s {dim} over {ranks} ranks is {per_rank:g} a rank, not a whole "
                    f"number of {block}-wide blocks (vLLM refuses to load it){hint}",
                    source=source)

    def check_pp(self, pp: int, source: str | None = None, label: str = "pp_size") -> None:
        """Every pipeline stage holds at least one decoder layer (vLLM's get_pp_indices
        splits num_hidden_layers over the stages; a stage without one would do nothing)."""
        if not 1 <= pp <= self.num_hidden_layers:
            raise InputError(
                f"{label}={pp} is more pipeline stages than {self.name} has layers "
                f"(num_hidden_layers={self.num_hidden_layers}); allowed: "
                f"1..{self.num_hidden_layers}", source=source)


def expert_shard_ranks(tp: int, ep: int, dp: int = 1) -> int:
    """How many ranks share each expert of an MoE layer (its intermediate width sharded
    over them), as vLLM 0.19's FusedMoEParallelConfig lays experts out: none with expert
    parallelism (each rank holds whole experts), else the tp ranks, or all dp x tp ranks
    of a DP group (flatten_tp_across_dp)."""
    return 1 if ep > 1 else tp * dp


_DIM_MAX = 2**31 - 1  # torch's int32 shape limits in the kernels vLLM runs


def _spec_int(d: dict, key: str, source: str, low: int, default: int | None = None) -> int:
    """Field ``key`` of a model spec: an integer in [low, 2**31); absent or null gives
    ``default`` (None: required)."""
    v = d.get(key)
    if v is None:
        if default is None:
            raise InputError(f"model spec field {key!r} is missing (an integer >= {low})",
                             source=source)
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _DIM_MAX:
        raise InputError(f"model spec field {key!r} must be an integer in "
                         f"{low}..{_DIM_MAX}, got {v!r}", source=source)
    return v


def _spec_fields(d: dict, source: str) -> dict:
    """The integer and flag fields of a model spec, checked (what the memory and latency
    formulas divide by and multiply with)."""
    heads = _spec_int(d, "num_attention_heads", source, 1)
    hidden = _spec_int(d, "hidden_size", source, 1)
    out = {"hidden_size": hidden, "num_attention_heads": heads,
           "num_hidden_layers": _spec_int(d, "num_hidden_layers", source, 1),
           "intermediate_size": _spec_int(d, "intermediate_size", source, 1),
           "vocab_size": _spec_int(d, "vocab_size", source, 1),
           "num_key_value_heads": _spec_int(d, "num_key_value_heads", source, 1, heads),
           "head_dim": _spec_int(d, "head_dim", source, 1, max(1, hidden // heads))}
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "max_position_embeddings"):
        out[key] = _spec_int(d, key, source, 0, 0)
    if heads % out["num_key_value_heads"]:
        raise InputError(f"num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={out['num_key_value_heads']}", source=source)
    if out["num_experts_per_tok"] > out["num_experts"]:
        raise InputError(f"num_experts_per_tok={out['num_experts_per_tok']} exceeds "
                         f"num_experts={out['num_experts']}", source=source)
    tie = d.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise InputError(f"model spec field 'tie_word_embeddings' must be true or false, "
                         f"got {tie!r}", source=source)
    out["tie_word_embeddings"] = tie
    return out


def _spec_text(d: dict, key: str, source: str, default: str | None) -> str | None:
    v = d.get(key)
    if v is None or v == "":
        return default
    if not isinstance(v, str):
        raise InputError(f"model spec field {key!r} must be a string, got {v!r}",
                         source=source)
    return v


def _spec_blocks(d: dict, source: str) -> tuple[int, int] | None:
    """Field ``weight_block_size``: two positive integers (an FP8 checkpoint's scale
    blocks), or absent."""
    v = d.get("weight_block_size")
    if v is None:
        return None
    if (not isinstance(v, list | tuple) or len(v) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= _DIM_MAX
                       for x in v)):
        raise InputError(f"model spec field 'weight_block_size' must be two positive integers "
                         f"(e.g. [128, 128]), got {v!r}", source=source)
    if d.get("quantization") != "fp8":
        raise InputError("model spec field 'weight_block_size' is for FP8 weights "
                         "(quantization: fp8)", source=source)
    return int(v[0]), int(v[1])


#: every field a model spec may give: ModelSpec's (a misspelt optional one was ignored)
_SPEC_FIELDS = tuple(f.name for f in fields(ModelSpec))


def _from_mapping(d: dict, source: str) -> ModelSpec:
    if not isinstance(d, dict):
        raise InputError(f"a model spec is a mapping of fields, got {type(d).__name__}",
                         source=source)
    unknown = sorted(str(k) for k in d if k not in _SPEC_FIELDS)
    if unknown:
        raise InputError(f"model spec has an unknown field {unknown[0]!r}; allowed: "
                         f"{', '.join(_SPEC_FIELDS)}", source=source)
    required = ("name", "architecture", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in d]
    if missing:
        raise InputError(f"model spec is missing field(s) {missing}", source=source)
    arch = d["architecture"]
    if not isinstance(arch, str) or arch not in BLOCK_SEQUENCES:
        raise unknown_name("architecture", arch, BLOCK_SEQUENCES, source)
    aliases = () if d.get("aliases") is None else d["aliases"]
    if not isinstance(aliases, list | tuple) or not all(isinstance(a, str) for a in aliases):
        raise InputError(f"model spec field 'aliases' must be a list of names, got {aliases!r}",
                         source=source)
    spec = ModelSpec(
        name=str(d["name"]),
        architecture=arch,
        dtype=_spec_text(d, "dtype", source, "bfloat16"),
        aliases=tuple(aliases),
        quantization=_spec_text(d, "quantization", source, None),
        kv_cache_dtype=_spec_text(d, "kv_cache_dtype", source, "auto"),
        weight_block_size=_spec_blocks(d, source),
        **_spec_fields(d, source),
    )
    check_precision(spec.quantization, spec.kv_cache_dtype, quant_label="field 'quantization'",
                    kv_label="field 'kv_cache_dtype'", source=source)
    if spec.dtype not in DTYPE_BYTES:
        raise unknown_name("dtype", spec.dtype, DTYPE_BYTES, source)
    if spec.is_moe and not (spec.num_experts_per_tok and spec.moe_intermediate_size):
        raise InputError("an MoE model needs num_experts_per_tok and moe_intermediate_size",
                         source=source)
    return spec


def from_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """Build a spec from a Hugging Face ``config.json``."""
    from sim.errors import read_text_input

    path = Path(path)
    text = read_text_input(path, "a model config", "a JSON")
    try:
        cfg = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON ({exc.msg}: line {exc.lineno} column {exc.colno})",
                         source=str(path)) from None
    except ValueError as exc:  # a key given twice
        raise InputError(str(exc), source=str(path)) from None
    except RecursionError:
        raise InputError("malformed JSON (nested too deeply)", source=str(path)) from None
    if not isinstance(cfg, dict):
        raise InputError(f"a model config.json is a JSON object, got {type(cfg).__name__}",
                         source=str(path))
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in _HF_ARCH_TO_FAMILY:
        raise unknown_name("model_type", model_type, _HF_ARCH_TO_FAMILY, str(path))
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    moe_inter = cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0)
    mapping = {
        "name": name or cfg.get("_name_or_path") or path.stem,
        "architecture": _HF_ARCH_TO_FAMILY[model_type],
        "hidden_size": cfg.get("hidden_size"),
        "num_hidden_layers": cfg.get("num_hidden_layers"),
        "num_attention_heads": cfg.get("num_attention_heads"),
        "num_key_value_heads": cfg.get("num_key_value_heads"),
        "head_dim": cfg.get("head_dim"),
        "intermediate_size": cfg.get("intermediate_size"),
        "vocab_size": cfg.get("vocab_size"),
        "dtype": cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16",
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "num_experts": experts,
        "num_experts_per_tok": cfg.get("num_experts_per_tok") or 0,
        "moe_intermediate_size": moe_inter,
        "max_position_embeddings": cfg.get("max_position_embeddings") or 0,
        "quantization": hf_quantization(cfg.get("quantization_config"), str(path)),
    }
    qcfg = cfg.get("quantization_config")
    if mapping["quantization"] == "fp8" and isinstance(qcfg, dict):
        mapping["weight_block_size"] = qcfg.get("weight_block_size")
    return _from_mapping(mapping, str(path))


def hf_quantization(qcfg: dict | None, source: str) -> str | None:
    """The weight quantization a HF ``quantization_config`` declares, in our names.

    FP8 checkpoints come as ``quant_method: fp8`` (e.g. Qwen's, block-wise scales),
    ``compressed-tensors`` with 8-bit float weights (RedHat/NeuralMagic's) or ModelOpt's
    ``quant_algo: FP8``; all run as W8A8 FP8 in vLLM. Anything else is not modelled."""
    if not qcfg:
        return None
    if not isinstance(qcfg, dict):
        raise InputError("quantization_config must be a mapping", source=source)
    method = str(qcfg.get("quant_method") or "").lower()
    if method == "fp8":
        return "fp8"
    inner = qcfg.get("quantization")
    algo = qcfg.get("quant_algo") or (inner.get("quant_algo") if isinstance(inner, dict)
                                      else None)
    if method in ("modelopt", "modelopt_fp8") and str(algo or "").upper() == "FP8":
        return "fp8"
    if method == "compressed-tensors":
        groups = qcfg.get("config_groups")
        groups = groups.values() if isinstance(groups, dict) else ()
        weights = [g.get("weights") or {} for g in groups if isinstance(g, dict)]
        if weights and all(isinstance(w, dict) and w.get("num_bits") == 8
                           and w.get("type") == "float" for w in weights):
            return "fp8"
    raise InputError(f"quantization_config (quant_method={method or None!r}) is not modelled; "
                     "supported: FP8 checkpoints (quant_method fp8, compressed-tensors 8-bit "
                     "float, modelopt FP8)", source=source)


@cache
def _catalogue() -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    files = sorted((profiles_root() / "models").glob("*.yaml"))
    for f, data in zip(files, load_yaml_files("models", files), strict=True):
        spec = _from_mapping(data or {}, str(f))
        for key in (spec.name, spec.name.split("/")[-1], f.stem, *spec.aliases):
            out[key] = spec
    return out


def known_models() -> list[str]:
    return sorted({s.name for s in _catalogue().values()})


def load_model(name_or_path: str, source: str | None = None) -> ModelSpec:
    """Resolve a model by catalogue name/alias, or by path to a HF config.json."""
    cat = _catalogue()
    if name_or_path in cat:
        return cat[name_or_path]
    p = Path(name_or_path)
    if p.suffix == ".json" and is_file(p):
        return from_hf_config(p)
    if is_dir(p) and is_file(p / "config.json"):
        return from_hf_config(p / "config.json", name=p.name)
    raise unknown_name("model", name_or_path, known_models(), source)


def check_fp8_hardware(model: ModelSpec, hardware: str, source: str | None = None) -> None:
    """FP8 weights or KV cache need FP8 tensor cores: the hardware entry's fp8 peak."""
    if not (model.is_fp8 or model.kv_is_fp8):
        return
    from sim.hardware import load_hardware

    hw = load_hardware(hardware, source=source)
    if "fp8" not in hw.peak_tflops:
        what = "quantization=fp8" if model.is_fp8 else f"kv_cache_dtype={model.kv_cache_dtype}"
        raise InputError(f"{what} for {model.name} needs FP8 support but hardware {hw.name!r} "
                         f"has no fp8 entry in peak_tflops (has {sorted(hw.peak_tflops)})",
                         source=source)


def served_model(name_or_path: str, hardware: str, quantization: str | None = None,
                 kv_cache_dtype: str | None = None, source: str | None = None) -> ModelSpec:
    """The model as one instance serves it: the checkpoint's spec at the requested
    precision (``quantization`` None keeps the checkpoint's), checked against the hardware."""
    model = load_model(name_or_path, source=f"{source}: model_name" if source else None)
    model = model.with_precision(quantization, kv_cache_dtype, source=source)
    check_fp8_hardware(model, hardware, source)
    return model
