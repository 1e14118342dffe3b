"""Device memory and KV-cache capacity, accounted the way vLLM 0.19 accounts it.

vLLM (``Worker.determine_available_memory``) gives the KV cache what is left of the
*requested* memory once the model has run a profiling step:

    requested   = total device memory (as CUDA reports it) x gpu_memory_utilization
    KV memory   = requested - (weights + peak activation of the profile run + non-torch memory)
    num_blocks  = KV memory // (bytes of one block across the worker's attention layers)

per worker (one TP/PP shard: a pipeline stage's worker counts its own layers' weights and
KV, the embedding on the first stage, the lm_head and sampler on the last); the engine
keeps the smallest count across workers. The
profile run is one forward pass over ``max_num_batched_tokens`` tokens spread over
``min(max_num_seqs, max_num_batched_tokens)`` dummy requests, followed on the last
pipeline stage by a dummy sampler run over one row of logits per request with top-k and
top-p switched on. CUDA-graph memory is not subtracted (vLLM 0.19 only estimates it when
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``, off by default), nor is memory other
processes hold (the budget is a fraction of the device total, not of the free memory).

The profile run's terms follow from the model's dimensions, the engine limits and vLLM
0.19's code (its Triton top-k/top-p sampler, PyTorch's cuBLAS workspace; the code-derived
peak reproduces three vLLM 0.19.0 H100 start-up logs within 0.006 GiB,
experiments/vllm_memory_audit.py). The non-torch term is the device's, from the hardware
catalogue (no code path sizes it). Sizes are bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.cluster import GiB, InstanceConfig
from sim.errors import InputError
from sim.model import ModelSpec
from sim.options import SimOptions

MiB = 1 << 20

# Bytes per logit held at the peak of vLLM's PyTorch top-k/top-p sampler, the path vLLM 0.19
# takes for fewer than 8 rows (the dummy sampler run sets both top-k and top-p), beyond the
# logits in the model dtype: the float32 copy (4), the sorted values (4) and their int64
# indices (8), the top-k mask (1), softmax of the sorted values (4) and its cumulative sum
# (4), the top-p mask (1), and the scattered-back result (4). All are alive together when
# the scatter runs.
SORT_SAMPLER_BYTES_PER_LOGIT = 4 + 4 + 8 + 1 + 4 + 4 + 1 + 4
#: rows from which vLLM 0.19 runs its Triton top-k/top-p kernel instead of the sort
TRITON_SAMPLER_MIN_ROWS = 8

# Memory a worker holds outside PyTorch's allocator once it has run the profile step:
# vLLM's "non-torch forward increase memory" (kernel images loaded on first use, cuBLAS
# handles, and the CUDA local-memory reservation that grows to the largest per-thread local
# memory of any kernel launched, for every resident thread). No code path sizes it: it is
# a property of the device and the compiled kernels, so the hardware catalogue gives it per
# device (``vllm_non_torch_GiB``: logged, or implied by a logged block count). A device
# without one gets this: what vLLM 0.19.0 logs for single-GPU workers on H100 (0.24-0.25
# GiB over three models; experiments/vllm_memory_audit.py).
NON_TORCH_DEFAULT_BYTES = int(0.25 * GiB)
# A worker in a multi-GPU group also holds NCCL's channel buffers and vLLM's custom
# all-reduce IPC buffers: H100 reports show 0.42 GiB more for a TP2 worker than for a
# single-GPU one.
NON_TORCH_COMM_BYTES = int(0.42 * GiB)


def format_gib(num_bytes: int) -> str:
    """A byte count in GiB as vLLM's log lines write it (vllm.utils.mem_utils.format_gib:
    rounded to two decimals, no trailing zeros: 15.0, 14.99)."""
    return f"{round(num_bytes / GiB, 2)}"


def blocks_per_request(max_model_len: int, block_size: int) -> int:
    """Blocks one request of ``max_model_len`` tokens holds: whole blocks, rounded up
    (vLLM's FullAttentionSpec.max_memory_usage_bytes, cdiv(max_model_len, block_size))."""
    return -(-max_model_len // block_size)


def effective_max_model_len(opts: SimOptions, model: ModelSpec) -> int:
    """vLLM's max_model_len: ``--max-model-len`` where given, else the model's
    max_position_embeddings (what vLLM derives from the model's config)."""
    return int(getattr(opts, "max_model_len", 0) or model.max_position_embeddings)


@dataclass(frozen=True)
class MemoryBudget:
    """One worker's memory accounting and the KV blocks it leaves (vLLM's numbers)."""

    total_bytes: int
    mem_util: float
    requested_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_bytes: int
    #: bytes of one KV block across the worker's layers
    block_bytes: int
    block_size: int
    num_blocks: int
    #: the count the memory gives when num_gpu_blocks_override replaced it (else None)
    profiled_blocks: int | None = None
    #: the KV memory is vLLM's kv_cache_memory_bytes, not what profiling left
    kv_reserved: bool = False

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def max_concurrency(self, max_model_len: int) -> float:
        """vLLM's "Maximum concurrency for N tokens per request": the blocks over the whole
        blocks one request of N tokens needs (get_max_concurrency_for_kv_cache_config)."""
        if max_model_len <= 0:
            return 0.0
        return self.num_blocks / blocks_per_request(max_model_len, self.block_size)

    def as_dict(self, max_model_len: int = 0) -> dict:
        d = {k: getattr(self, k) for k in (
            "total_bytes", "mem_util", "requested_bytes", "weight_bytes", "activation_bytes",
            "non_torch_bytes", "kv_bytes", "block_bytes", "block_size", "num_blocks")}
        d["kv_tokens"] = self.kv_tokens
        if max_model_len > 0:
            d["max_model_len"] = max_model_len
            d["max_concurrency"] = round(self.max_concurrency(max_model_len), 2)
        return d

    def start_refusal(self, max_model_len: int) -> str:
        """Why vLLM would refuse to start (its ``check_enough_kv_cache_memory``: the cache
        profiling left, also under num_gpu_blocks_override, must hold one request of
        max_model_len tokens), or "" when it starts. The simulation goes on either way
        (studies of small caches stay possible)."""
        blocks = self.profiled_blocks if self.profiled_blocks is not None else self.num_blocks
        needed = blocks_per_request(max_model_len, self.block_size) if max_model_len > 0 else 0
        if blocks >= needed:
            return ""
        return (f"vLLM would refuse to start: one request of max_model_len={max_model_len:,} "
                f"tokens needs {needed:,} KV blocks, {blocks:,} fit (the longest that fits is "
                f"{blocks * self.block_size:,} tokens); pass --max-model-len at most that to "
                "serve it as simulated")

    def log_lines(self, max_model_len: int = 0) -> list[str]:
        """The lines vLLM 0.19 logs at start-up (gpu_model_runner, gpu_worker,
        kv_cache_utils, metrics/loggers), worded as vLLM words them, with this worker's
        numbers (vLLM's profiling time is not simulated and left out)."""
        non_kv = self.weight_bytes + self.activation_bytes + self.non_torch_bytes
        lines = [f"Model loading took {format_gib(self.weight_bytes)} GiB memory"]
        if self.kv_reserved:
            lines.append(f"Reserved {format_gib(self.kv_bytes)} GiB for KV cache as specified by "
                         "kv_cache_memory_bytes config and skipped memory profiling")
        else:
            lines += [
                f"worker requested memory: {format_gib(self.requested_bytes)}GiB",
                f"Total non KV cache memory: {format_gib(non_kv)}GiB; torch peak memory "
                f"increase: {format_gib(self.activation_bytes)}GiB; non-torch forward increase "
                f"memory: {format_gib(self.non_torch_bytes)}GiB; weights memory: "
                f"{format_gib(self.weight_bytes)}GiB.",
                f"Available KV cache memory: {format_gib(self.kv_bytes)} GiB",
            ]
        if self.profiled_blocks is not None:
            lines.append(f"Overriding num_gpu_blocks={self.profiled_blocks} with "
                         f"num_gpu_blocks_override={self.num_blocks}")
        refusal = self.start_refusal(max_model_len)
        if refusal:
            lines.append(refusal)
        lines.append(f"GPU KV cache size: {self.kv_tokens:,} tokens")
        if max_model_len > 0:
            lines.append(f"Maximum concurrency for {max_model_len:,} tokens per request: "
                         f"{self.max_concurrency(max_model_len):.2f}x")
        lines.append("vllm cache_config_info with initialization after num_gpu_blocks is: "
                     f"{self.num_blocks}")
        return lines


def device_total_bytes(inst: InstanceConfig) -> int:
    """The device's total memory as CUDA reports it: the cluster's mem_size (GiB) scaled by
    the share of nominal memory the hardware profile says CUDA exposes."""
    from sim.hardware import load_hardware

    fraction = 1.0
    try:
        fraction = load_hardware(inst.hardware).mem_visible_fraction
    except InputError:
        pass  # a device outside the catalogue: its nominal size
    return int(inst.npu_mem.mem_size_gib * GiB * fraction)


def request_memory(total: int, mem_util: float) -> int:
    """vLLM's requested memory (vllm/v1/worker/utils.py request_memory): the device total
    times gpu_memory_utilization, rounded up to a whole byte."""
    return math.ceil(total * mem_util)


def weight_bytes(model: ModelSpec, tp: int, pp: int, ep: int) -> int:
    """Bytes vLLM's loader reports for one worker: the parameters plus the rotary cos/sin
    table (one per model, max_position_embeddings x head_dim in the model dtype)."""
    rotary = model.max_position_embeddings * model.head_dim * model.dtype_bytes
    return model.weight_bytes(tp, pp, ep) + rotary


def forward_peak_bytes(model: ModelSpec, tokens: int, tp: int, ep: int) -> int:
    """Peak activation memory of one forward pass over ``tokens`` tokens on one worker:
    residual and hidden states plus the largest block-internal intermediates (the MLP's
    gate/up output and its activation, or the fused-MoE kernel's three caches)."""
    dt = model.dtype_bytes
    h = model.hidden_size
    states = 2 * tokens * h * dt
    qkv = tokens * (model.q_size + 2 * model.kv_size) // tp * dt
    if model.is_moe:
        # Expert parallelism gathers the tokens of the EP group before the experts run.
        moe_tokens = tokens * max(1, ep // tp)
        k, inter = model.num_experts_per_tok, model.moe_intermediate_size
        caches = moe_tokens * k * (2 * inter + inter + h) * dt
        router = moe_tokens * model.num_experts * 4
        mlp = caches + router
    else:
        mlp = tokens * 3 * model.intermediate_size // tp * dt
    return states + max(qkv, mlp)


@dataclass(frozen=True)
class DeviceTraits:
    """What vLLM's profile run sizes by the device: streaming multiprocessors (the Triton
    sampler's scratch rows), compute capability (PyTorch's cuBLAS workspace) and the
    non-torch memory a worker holds (``NON_TORCH_DEFAULT_BYTES`` where not catalogued)."""

    num_sms: int | None = None
    compute_capability: str | None = None
    non_torch_bytes: int = NON_TORCH_DEFAULT_BYTES


def device_traits(hardware: str) -> DeviceTraits:
    """The catalogue's traits of ``hardware`` (defaults for a device outside it)."""
    from sim.hardware import load_hardware

    try:
        hw = load_hardware(hardware)
    except InputError:
        return DeviceTraits()
    non_torch = (NON_TORCH_DEFAULT_BYTES if hw.vllm_non_torch_GiB is None
                 else int(hw.vllm_non_torch_GiB * GiB))
    return DeviceTraits(hw.num_sms, hw.compute_capability, non_torch)


def cublas_workspace_bytes(compute_capability: str | None) -> int:
    """PyTorch's default cuBLAS workspace for one (handle, stream), which the first GEMM of
    the profile run allocates through the caching allocator (CublasHandlePool.cpp,
    parseChosenWorkspaceSize): 32 MiB on compute capability 9.x, 10.x and 12.x, else 4096
    KiB x 2 + 16 KiB x 8. Unknown capability: the smaller."""
    major = int(str(compute_capability).split(".")[0]) if compute_capability else 0
    return 4096 * 8 * 1024 if major in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8


def triton_scratch_rows(num_sms: int | None, rows: int) -> int:
    """Rows of the Triton top-k/top-p kernel's cached scratch buffer (vLLM 0.19's
    apply_top_k_top_p_triton: one program per row up to the SM count, the buffer rounded
    up to a power of two and capped at the SM count). Unknown SM count: one per row."""
    sms = num_sms or rows
    programs = min(sms, rows)
    return min(1 << (programs - 1).bit_length(), sms)


def sampler_peak_bytes(model: ModelSpec, tokens: int, rows: int,
                       num_sms: int | None = None) -> int:
    """Live bytes at the peak of vLLM 0.19's dummy sampler run over ``rows`` rows of logits
    (top-k and top-p on), the forward pass's hidden states over ``tokens`` still held.
    From 8 rows the Triton kernel: the sampled rows and their random copy (2 x [rows, h]),
    the logits in the model dtype, their float32 copy, the softmax probabilities and the
    exponential noise (float32 each), and the kernel's scratch rows of the vocabulary in
    float32. Below 8 rows the PyTorch sort path (SORT_SAMPLER_BYTES_PER_LOGIT)."""
    h, v, dt = model.hidden_size, model.vocab_size, model.dtype_bytes
    hidden = tokens * h * dt
    if rows < TRITON_SAMPLER_MIN_ROWS:
        return hidden + rows * v * (dt + SORT_SAMPLER_BYTES_PER_LOGIT)
    logits = rows * v * (dt + 4 + 4 + 4)
    scratch = triton_scratch_rows(num_sms, rows) * v * 4
    return hidden + 2 * rows * h * dt + logits + scratch


def profile_tokens(max_num_batched_tokens: int, max_num_seqs: int) -> tuple[int, int]:
    """(tokens, requests) of vLLM's profile run. A budget of 0 (LLMServingSim's decode
    instances: no token budget) runs at most one token per sequence."""
    tokens = max_num_batched_tokens if max_num_batched_tokens > 0 else max_num_seqs
    return tokens, min(max_num_seqs, tokens)


def activation_peak_bytes(model: ModelSpec, tp: int, ep: int, max_num_batched_tokens: int,
                          max_num_seqs: int, device: DeviceTraits = DeviceTraits(),
                          last_stage: bool = True) -> int:
    """vLLM's "torch peak memory increase" of the profile run on one worker: the forward
    pass or, on the last pipeline stage, the sampler run while the forward pass's hidden
    states are still held, whichever is larger, plus the cuBLAS workspace its first GEMM
    allocates."""
    tokens, reqs = profile_tokens(max_num_batched_tokens, max_num_seqs)
    peak = forward_peak_bytes(model, tokens, tp, ep)
    if last_stage:
        peak = max(peak, sampler_peak_bytes(model, tokens, reqs, device.num_sms))
    return peak + cublas_workspace_bytes(device.compute_capability)


def non_torch_bytes(inst: InstanceConfig, dp: int = 1,
                    device: DeviceTraits | None = None) -> int:
    """Non-torch memory of one of ``inst``'s workers: the device's, plus the
    communicators' buffers in any multi-GPU group (TP, PP, EP, or the DP group's)."""
    device = device or device_traits(inst.hardware)
    grouped = inst.tp_size > 1 or inst.pp_size > 1 or inst.ep_size > 1 or dp > 1
    return device.non_torch_bytes + (NON_TORCH_COMM_BYTES if grouped else 0)


def pp_stage_layers(num_layers: int, pp: int) -> list[int]:
    """Decoder layers of each pipeline stage as vLLM splits them (get_pp_indices without
    VLLM_PP_LAYER_PARTITION): num_layers // pp each, the remainder one apiece to the
    stages before the last, from the second-to-last backwards (the last stage also holds
    the final norm and the lm_head)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def memory_budget(inst: InstanceConfig, model: ModelSpec, block_size: int,
                  max_num_batched_tokens: int, max_num_seqs: int, dp: int = 1,
                  device: DeviceTraits | None = None) -> MemoryBudget:
    """vLLM's memory accounting for ``inst``: each pipeline stage's worker profiles its
    own memory (its layers' weights, the embedding on the first stage, the lm_head and
    the dummy sampler run on the last) and sizes its cache for its own layers; the engine
    keeps the smallest block count across workers. Returns the binding stage's accounting;
    raises InputError (naming the instance and the shortfall) when no KV block fits.

    ``dp`` is the size of the instance's DP group. An MoE model's experts in a DP group
    without expert parallelism are sharded over all dp x tp ranks (vLLM's
    flatten_tp_across_dp), which holds the same bytes per rank as dp x tp expert-parallel
    ranks, and the profile run's MoE layers see the tokens of the whole group either way.
    ``device``: the traits to account with (default: the catalogue's for inst.hardware)."""
    total = device_total_bytes(inst)
    util = inst.npu_mem.mem_util
    requested = request_memory(total, util)
    tp, pp, ep = inst.tp_size, inst.pp_size, inst.ep_size
    if model.is_moe and ep == 1 and dp > 1:
        ep = dp * tp
    device = device or device_traits(inst.hardware)
    other = non_torch_bytes(inst, dp, device)
    rotary = model.max_position_embeddings * model.head_dim * model.dtype_bytes
    kv_per_layer = model.kv_bytes_per_token(tp, 1) // model.num_hidden_layers * block_size
    budgets = []
    for stage, layers in enumerate(pp_stage_layers(model.num_hidden_layers, pp)):
        last = stage == pp - 1
        weights = model.stage_weight_bytes(tp, layers, stage == 0, last, ep) + rotary
        act = activation_peak_bytes(model, tp, ep, max_num_batched_tokens, max_num_seqs,
                                    device, last_stage=last)
        budgets.append((weights, act, kv_per_layer * max(1, layers)))
    where = f"instance {inst.instance_id} ({inst.model_name} on {inst.hardware})"
    if inst.kv_cache_memory_bytes:
        return _reserved_budget(inst, budgets, other, total, requested, block_size, where)
    weights = max(w for w, _, _ in budgets)
    if weights >= requested:
        raise InputError(
            f"{where}: {model.precision} weights need {weights / GiB:.2f} GiB per NPU but only "
            f"{requested / GiB:.2f} GiB is requested (npu_mem.mem_size={inst.npu_mem.mem_size_gib}"
            f" GiB, {total / GiB:.2f} GiB as CUDA reports it, x mem_util={util}); raise "
            "tp_size/pp_size or use a larger device")
    # the binding worker: the fewest blocks (the first such stage)
    stage = min(range(pp), key=lambda i: (max(0, requested - budgets[i][0] - budgets[i][1]
                                                 - other) // budgets[i][2], i))
    weights, act, block = budgets[stage]
    kv = requested - weights - act - other
    blocks = max(0, kv) // block
    if blocks < 2:
        raise InputError(
            f"{where}: no room for KV cache: requested {requested / GiB:.2f} GiB - weights "
            f"{weights / GiB:.2f} - peak activation {act / GiB:.2f} (max_num_batched_tokens="
            f"{max_num_batched_tokens}, max_num_seqs={max_num_seqs}) - non-torch "
            f"{other / GiB:.2f} leaves {kv / GiB:.3f} GiB; raise npu_mem.mem_util or tp_size, "
            "or lower max_num_batched_tokens/max_num_seqs")
    profiled = None
    if inst.num_gpu_blocks_override:
        # as vLLM: logged, memory left as profiled
        profiled, blocks = int(blocks), inst.num_gpu_blocks_override
    return MemoryBudget(total, util, requested, weights, act, other, kv, block, block_size,
                        int(blocks), profiled)


def _reserved_budget(inst: InstanceConfig, budgets: list[tuple[int, int, int]], other: int,
                     total: int, requested: int, block_size: int, where: str) -> MemoryBudget:
    """vLLM's kv_cache_memory_bytes: every worker's KV cache is that many bytes, whatever
    gpu_memory_utilization and the profile run say; the stage with the most layers has the
    fewest blocks. Refused where the weights, the profile run's peak, non-torch memory and
    the cache together exceed the device (vLLM runs out of memory allocating the cache)."""
    reserved = inst.kv_cache_memory_bytes
    stage = max(range(len(budgets)), key=lambda i: (budgets[i][2], -i))
    weights, act, block = budgets[stage]
    need = max(w + a for w, a, _ in budgets) + other + reserved
    if need > total:
        raise InputError(
            f"{where}: kv_cache_memory_bytes={reserved:,} does not fit beside the weights, the "
            f"profile run's peak and non-torch memory: {need / GiB:.2f} GiB against the "
            f"device's {total / GiB:.2f} GiB as CUDA reports it (vLLM would run out of memory "
            "allocating the cache); lower it or raise tp_size/pp_size")
    blocks = reserved // block
    if blocks < 2:
        raise InputError(f"{where}: kv_cache_memory_bytes={reserved:,} holds {blocks} KV blocks "
                         f"of {block:,} bytes; at least 2 are needed")
    profiled = None
    if inst.num_gpu_blocks_override:
        profiled, blocks = int(blocks), inst.num_gpu_blocks_override
    return MemoryBudget(total, inst.npu_mem.mem_util, requested, weights, act, other, reserved,
                        block, block_size, int(blocks), profiled, kv_reserved=True)


def kv_capacity_blocks(inst: InstanceConfig, model: ModelSpec, block_size: int,
                       max_num_batched_tokens: int = SimOptions.max_num_batched_tokens,
                       max_num_seqs: int = SimOptions.max_num_seqs) -> int:
    """KV blocks per worker of ``inst`` as vLLM 0.19 derives them."""
    return memory_budget(inst, model, block_size, max_num_batched_tokens, max_num_seqs).num_blocks
