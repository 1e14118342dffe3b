"""Audit sim/memory.py's KV-capacity terms against vLLM 0.19's code paths and real logs.

    python experiments/vllm_memory_audit.py

vLLM 0.19 (vllm/v1/worker/gpu_worker.py determine_available_memory, vllm/utils/mem_utils.py
memory_profiling) sizes the KV cache as

    ceil(total x gpu_memory_utilization) - weights - torch peak increase - non-torch increase
    [- CUDA-graph estimate, only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; default 0]

and prints, for each case, every term as sim/memory.py computes it from vLLM 0.19's code
paths and as vLLM logged it (where a log exists):

- weights: the parameters in the model dtype plus the rotary cos/sin table (the loader's
  DeviceMemoryProfiler, "Model loading took").
- torch peak increase of the profile run (profile_run: a forward pass over
  max_num_batched_tokens, then _dummy_sampler_run over R = min(max_num_seqs,
  max_num_batched_tokens) rows with top-k and top-p on). In 0.19 the sampler goes through
  the Triton top-k/top-p kernel (topk_topp_triton.py, for R >= 8), not the sort: the live set
  at its peak is the forward pass's hidden states [T, h], the sampled rows and their random
  copy [R, h] x 2, the logits [R, V] in the model dtype, their float32 copy, the softmax
  probabilities and the exponential noise q (float32 each), plus the kernel's per-program
  scratch of min(next_pow2(min(SMs, R)), SMs) rows x V float32. The first GEMM of the profile
  run also allocates PyTorch's cuBLAS workspace through the caching allocator
  (CublasHandlePool.cpp parseChosenWorkspaceSize: 32 MiB on compute capability 9.x/10.x/12.x,
  4096 KiB x 2 + 16 KiB x 8 otherwise), which the peak counts.
- non-torch increase: device memory outside PyTorch's allocator that appeared between the
  worker's first snapshot (after the CUDA context and NCCL) and the end of profiling
  (kernel images loaded on first use, cuBLAS handles, and in 0.19 whatever the CUDA-graph
  memory profiling leaves behind, since profile_cudagraph_memory runs inside the window).
  No code path determines it; only a log does. What vLLM 0.19's code does leave in it:
  profile_cudagraph_memory captures two graphs per mode (descs[:2]) into a temporary pool
  and then clears them (clear_all_graphs, _cleanup_profiling_kv_cache, then
  memory_profiling's gc.collect + empty_cache), so the graphs' pool is torch memory released
  before the closing snapshot, and the "Estimated CUDA graph memory" is not subtracted
  (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 0). The torch peak is read before
  the graph profiling. What is left is driver-side: kernel images, and the local-memory
  (stack) reservation, which CUDA grows to the largest per-thread local memory of any
  kernel launched, for every resident thread (SMs x max threads per SM), and never
  shrinks. The latter fits the published H100 numbers in kind (TP1 workers 0.24-0.46 GiB
  by model, PP2 workers 0.07 GiB: their NCCL warm-up launched kernels before the first
  snapshot) but its size is a property of the compiled kernels (FlashAttention 2 on the
  4090, FlashAttention 3 on H100, cuBLAS, the inductor/Triton kernels of the model), not
  of vLLM's Python code or the config: sim/memory.py takes it per device from the hardware
  catalogue (``vllm_non_torch_GiB``: H100's as logged, the RTX 4090's as its run's block
  count implies). The audit prints the per-thread size each logged or implied term would
  mean, and MEASUREMENT_NEEDED says how to measure the 4090's directly.
- CUDA graphs: estimated by profile_cudagraph_memory but not subtracted in 0.19 by default.

The H100 cases are vLLM 0.19.0 DEBUG start-up logs published by llm-d-incubation/llm-d-planner
(accuracy/results/v0.19.0/logs/, accuracy/results/v0.19.0/accuracy_report.md). The RTX 4090
case is the validation run (../shared/data/validation/RTX4090-Llama-3.1-8B/vllm/meta.json),
which logged only its block count: the non-torch term it implies is printed as an interval.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from sim.cluster import GiB
from sim.hardware import load_hardware
from sim.memory import (cublas_workspace_bytes, device_traits, forward_peak_bytes,
                        request_memory, sampler_peak_bytes, weight_bytes)
from sim.model import ModelSpec, load_model
from sim.paths import shared_data_root

MiB = 1 << 20
SWEEP = "llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/"


@dataclass
class Derived:
    """vLLM 0.19's terms for one worker, from its code paths."""

    weights: int
    forward: int
    sampler: int
    cublas: int

    @property
    def torch_peak(self) -> int:
        return max(self.forward, self.sampler) + self.cublas


def derive(model: ModelSpec, hardware: str, tokens: int, rows: int) -> Derived:
    """The terms of one single-GPU worker as sim/memory.py computes them."""
    dev = device_traits(hardware)
    if dev.num_sms is None or dev.compute_capability is None:
        raise ValueError(f"hardware {hardware!r} needs num_sms and compute_capability")
    return Derived(weights=weight_bytes(model, 1, 1, 1),
                   forward=forward_peak_bytes(model, tokens, 1, 1),
                   sampler=sampler_peak_bytes(model, tokens, rows, dev.num_sms),
                   cublas=cublas_workspace_bytes(dev.compute_capability))


@dataclass
class Case:
    name: str
    model: ModelSpec
    hardware: str
    tokens: int                 # max_num_batched_tokens
    max_num_seqs: int
    mem_util: float
    #: vLLM's logged terms in GiB as it prints them (format_gib), by term name
    logged: dict = field(default_factory=dict)
    total_bytes: int | None = None      # torch.cuda.mem_get_info()[1], where recorded
    logged_blocks: int | None = None
    block_size: int = 16
    source: str = ""

    @property
    def rows(self) -> int:
        return min(self.max_num_seqs, self.tokens)


def _qwen(base: ModelSpec, **dims) -> ModelSpec:
    """A dense model of the sweep outside the catalogue: its HF config.json dimensions."""
    return replace(base, **dims)


def h100_cases() -> list[Case]:
    """The dense TP1 runs of the published vLLM 0.19.0 sweep (H100 80GB, gpu_memory_
    utilization 0.95, vllm serve defaults max_num_batched_tokens 8192 / max_num_seqs 1024)."""
    llama = load_model("meta-llama/Llama-3.1-8B")
    qwen3 = load_model("Qwen/Qwen3-32B")
    # Qwen2 (q/k/v biases) is not a catalogue architecture: its weights row is a sketch;
    # the sampler terms need only hidden_size, vocab_size and the dtype.
    qwen25 = _qwen(llama, name="Qwen/Qwen2.5-7B-Instruct", hidden_size=3584,
                   num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                   intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768)
    qwen3_8b = _qwen(qwen3, name="Qwen/Qwen3-8B", hidden_size=4096, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=12288,
                     vocab_size=151936, max_position_embeddings=40960)
    common = dict(hardware="H100-SXM", tokens=8192, max_num_seqs=1024, mem_util=0.95)
    return [
        Case("H100 Llama-3.1-8B-Instruct (vLLM 0.19.0 DEBUG log)", llama,
             logged={"weights": 14.99, "torch_peak": 1.89, "non_torch": 0.25,
                     "requested": 75.23, "kv": 58.11, "init_non_torch": 0.51,
                     "cudagraph_estimate": 0.84, "kv_tokens": 476_016},
             source=SWEEP + "logs/meta-llama-llama-3-1-8b--h100-80gb--tp1pp1dp1--16384.log",
             **common),
        Case("H100 Qwen2.5-7B-Instruct (vLLM 0.19.0 sweep)", qwen25,
             logged={"weights": 14.25, "torch_peak": 2.21, "non_torch": 0.24},
             source=SWEEP + "accuracy_report.md (TP sensitivity table, TP 1)", **common),
        Case("H100 Qwen3-8B (vLLM 0.19.0 sweep)", qwen3_8b,
             logged={"torch_peak": 2.21, "non_torch": 0.25},
             source=SWEEP + "accuracy_report.md (observed Qwen3 activation 2.21 GiB; non-torch "
             "0.25 GiB = the 0.15 GiB constant at -40%)", **common),
    ]


def rtx4090_case(root: Path | None = None) -> Case | None:
    """The validation run: its meta.json records the device total and vLLM's block count."""
    meta_path = (root or shared_data_root()) / "validation/RTX4090-Llama-3.1-8B/vllm/meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    kw, kv = meta["engine_kwargs"], meta["kv_cache"]
    return Case("RTX 4090 Llama-3.1-8B (validation run, vLLM 0.19.0)", load_model(meta["model"]),
                "RTX4090", kw["max_num_batched_tokens"], kw["max_num_seqs"],
                kv["gpu_memory_utilization"],
                total_bytes=meta["hardware"]["device_total_memory_bytes"],
                logged_blocks=kv["num_gpu_blocks"], block_size=kv["block_size"],
                source=str(meta_path))


# Maximum resident threads per SM by compute capability (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability").
MAX_THREADS_PER_SM = {"8.0": 2048, "8.6": 1536, "8.9": 1536, "9.0": 2048, "10.0": 2048,
                      "12.0": 1536}


def resident_threads(hardware: str) -> int:
    """Threads the device can hold at once: the count CUDA sizes its local-memory
    (stack) reservation for."""
    hw = load_hardware(hardware)
    return hw.num_sms * MAX_THREADS_PER_SM[str(hw.compute_capability)]


def block_bytes(model: ModelSpec, block_size: int) -> int:
    return model.kv_bytes_per_token(1, 1) * block_size


def implied_non_torch(case: Case, d: Derived) -> tuple[int, int]:
    """The non-torch bytes (lo, hi] that give exactly the logged block count, given the
    requested memory and the code-derived weights and torch peak."""
    free = request_memory(case.total_bytes, case.mem_util) - d.weights - d.torch_peak
    per_block = block_bytes(case.model, case.block_size)
    return free - (case.logged_blocks + 1) * per_block, free - case.logged_blocks * per_block


def blocks_with(case: Case, weights: int, peak: int, non_torch: int) -> int:
    kv = request_memory(case.total_bytes, case.mem_util) - weights - peak - non_torch
    return max(0, kv) // block_bytes(case.model, case.block_size)


def _gib(b: float) -> str:
    return f"{b / GiB:.3f} GiB"


def _row(term: str, derived: str, ours: str, logged: str) -> str:
    return f"  {term:30s}{derived:>26s}{ours:>18s}{logged:>16s}"


def report(case: Case) -> list[str]:
    d = derive(case.model, case.hardware, case.tokens, case.rows)
    non_torch = device_traits(case.hardware).non_torch_bytes
    lg = case.logged
    logged = lambda k: f"{lg[k]:.2f} GiB" if k in lg else "-"  # noqa: E731
    hw = load_hardware(case.hardware)
    out = [f"{case.name}: {case.hardware} (cc {hw.compute_capability}, {hw.num_sms} SMs), "
           f"max_num_batched_tokens {case.tokens}, max_num_seqs {case.max_num_seqs}, "
           f"gpu_memory_utilization {case.mem_util}",
           f"  source: {case.source}",
           _row("term", "sim/memory.py", "", "vLLM logged"),
           _row("weights", _gib(d.weights), "", logged("weights")),
           _row("torch peak increase", _gib(d.torch_peak), "", logged("torch_peak")),
           _row("  forward pass", _gib(d.forward), "", ""),
           _row(f"  sampler run ({case.rows} rows)", _gib(d.sampler), "", ""),
           _row("  cuBLAS workspace", f"{d.cublas / MiB:.3f} MiB", "", ""),
           _row("non-torch increase", _gib(non_torch), "(catalogue)", logged("non_torch")),
           _row("CUDA graphs (subtracted)", "0 (env default off)", "", "-")]
    if "cudagraph_estimate" in lg:
        out.append(_row("  CUDA-graph estimate", "(not subtracted)", "",
                        f"{lg['cudagraph_estimate']:.2f} GiB"))
    if "torch_peak" in lg:
        off = d.torch_peak / GiB - lg["torch_peak"]
        out.append(f"  torch peak: sim {d.torch_peak / GiB:.4f} GiB vs logged "
                   f"{lg['torch_peak']:.2f} (format_gib, +-0.005): {off:+.4f} GiB")
    if "non_torch" in lg:
        out.append(_lmem_line(case.hardware, lg["non_torch"] * GiB, "logged"))
    if case.logged_blocks is not None and case.total_bytes:
        out += _block_lines(case, d, non_torch)
    return out


def _lmem_line(hardware: str, non_torch: float, what: str) -> str:
    n = resident_threads(hardware)
    return (f"  as a local-memory reservation grown in the window, the {what} non-torch term "
            f"is {non_torch / n:,.0f} B per thread over {n:,} resident threads")


def _block_lines(case: Case, d: Derived, non_torch: int) -> list[str]:
    lo, hi = implied_non_torch(case, d)
    ours = blocks_with(case, d.weights, d.torch_peak, non_torch)
    return [
        f"  KV blocks: vLLM logged {case.logged_blocks}; sim/memory.py {ours} "
        f"({100 * (ours - case.logged_blocks) / case.logged_blocks:+.2f}%)",
        f"  non-torch that {case.logged_blocks} blocks imply: {(lo + 1) / GiB:.4f}.."
        f"{hi / GiB:.4f} GiB (the catalogue's {case.hardware}: {non_torch / GiB:.4f} GiB; "
        "H100 vLLM 0.19 logs: 0.24-0.25 GiB)",
        _lmem_line(case.hardware, (lo + 1 + hi) / 2, "implied"),
    ]


MEASUREMENT_NEEDED = """\
The RTX 4090's catalogued non-torch term is implied by its run's logged block count, not
logged. What would measure it (no code path determines it): one
start-up of the validation run's engine (vLLM 0.19.0, torch 2.10.0+cu128, the same
engine_kwargs) with VLLM_LOGGING_LEVEL=DEBUG, keeping from its log
  "worker init memory snapshot: ... non_torch_memory=..."        (before the window)
  "Model loading took ... GiB memory"                            (weights)
  "Estimated PIECEWISE/FULL CUDA graph memory: ..."              (graph profiling)
  "Memory profiling takes ... torch peak memory increase: ...; non-torch forward increase
   memory: ...; weights memory: ..."                             (the two profiled terms)
  "Available KV cache memory: ..." and "num_gpu_blocks is: ..."
  "Directly load the compiled graph(s) ... from the cache" or "Compiling a graph for
   compile range ..."                                            (inductor's autotuning
   loads extra kernel images inside the window only on a cold compile cache)
and a second start-up with --enforce-eager (profile_cudagraph_memory skipped), whose
non-torch increase, against the first, splits the term into what the profile run leaves
and what the CUDA-graph memory profiling leaves. To test the local-memory reading, log in
the worker cudaDeviceGetLimit(cudaLimitStackSize) (cuda.bindings.runtime) right after the
init snapshot and right after determine_available_memory: if the non-torch increase is
the stack growth x 196,608 resident threads (128 SMs x 1,536), the term follows from the
compiled kernels' local memory (cuobjdump --dump-resource-usage on the FlashAttention 2
library, the inductor cache's cubins), per GPU architecture, and can be modelled from
them; the same two numbers from an H100 start-up check the 270,336-thread case."""


def main(argv=None) -> int:
    cases = h100_cases()
    rtx = rtx4090_case()
    if rtx is not None:
        cases.insert(0, rtx)
    for case in cases:
        print("\n".join(report(case)) + "\n")
    print(MEASUREMENT_NEEDED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
