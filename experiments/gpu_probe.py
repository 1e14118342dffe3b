"""What a GPU sustains, measured with PyTorch: the numbers behind the catalogue's
``measured_*`` fields and the FA2 mixed-batch table.

Usage (on a machine with a CUDA GPU and PyTorch; prints JSON or writes a CSV):

    python experiments/gpu_probe.py peaks            # one-call medians, device facts
    python experiments/gpu_probe.py stream           # back-to-back GEMMs (the catalogue's)
    python experiments/gpu_probe.py stream-fp8       # the same GEMMs in FP8 (W8A8)
    python experiments/gpu_probe.py varlen OUT.csv   # FA2 varlen: a chunk beside decodes

The files under ``experiments/data/gpu-2026-11-26/`` came from these on an H100 SXM
(80 GB HBM3) and an H200 SXM (141 GB HBM3e), PyTorch 2.11.0+cu130, driver 580.159.04.

``peaks`` times each call on its own between two CUDA events (median of 20 after 5
warm-ups): for calls under ~0.2 ms that includes the CPU's launch latency, so its GEMV rows
read low. ``stream`` times 200 calls back to back between two events (as a CUDA graph or a
busy serving loop runs them) and is the one the catalogue uses:

- ``measured_gemm_tflops``: the best sustained rate among the GEMMs (2048-token layer GEMMs
  and an 8192^3 product); FP8 the same from ``stream-fp8``;
- ``measured_mem_bw_GBps``: the weight-streaming rate of a 1-token GEMM over the largest
  weight (Llama-3.1-8B's gate_up_proj, 235 MB, far above the L2);
- ``mem_reported_bytes``: ``torch.cuda.mem_get_info()[1]`` (what vLLM's
  gpu_memory_utilization is a fraction of).

``varlen`` runs PyTorch's FlashAttention-2 varlen forward (the kernel family vLLM 0.19
runs for a mixed step) on one prefill chunk plus n decodes whose KV lengths are uniform,
evenly spread, exponential or two-point at the same mean.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

#: (output features, input features) of the streamed GEMMs: Llama-3.1-8B's gate_up,
#: down and qkv projections and Qwen3-32B's gate_up
STREAM_SHAPES = {"gate_up_8b": (28672, 4096), "down_8b": (4096, 14336),
                 "qkv_8b": (6144, 4096), "gate_up_32b": (51200, 5120)}
STREAM_TOKENS = (1, 16, 64, 256, 2048)


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("gpu_probe needs PyTorch with CUDA")
    if not torch.cuda.is_available():
        sys.exit("gpu_probe needs a CUDA GPU")
    return torch


def one_call_us(torch, fn, iters: int = 20, warm: int = 5) -> float:
    """Median of ``iters`` calls, each between its own pair of CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    samples.sort()
    return samples[len(samples) // 2]


def back_to_back_us(torch, fn, n: int = 200, warm: int = 10) -> float:
    """Mean of ``n`` calls issued back to back between one pair of CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def _device_facts(torch) -> dict:
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
             "total_memory_bytes": props.total_memory, "mem_get_info_total": total,
             "sms": props.multi_processor_count}
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,"
             "power.limit,driver_version", "--format=csv"],
            capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        facts["nvidia_smi"] = repr(exc)
    return facts


def peaks(torch) -> dict:
    bf16 = torch.bfloat16
    res = _device_facts(torch)
    gemm = {}
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=bf16)
        b = torch.randn(n, n, device="cuda", dtype=bf16)
        us = one_call_us(torch, lambda: a @ b)
        gemm[f"bf16_{n}"] = {"us": us, "tflops": 2 * n**3 / us / 1e6}
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()     # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device="cuda")
        us = one_call_us(torch, lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                         out_dtype=bf16))
        gemm[f"fp8_{n}"] = {"us": us, "tflops": 2 * n**3 / us / 1e6}
    res["gemm"] = gemm
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = one_call_us(torch, lambda: y.copy_(x), iters=10, warm=3)
    res["copy_GBps_read_plus_write"] = 2 * x.numel() / us / 1e3
    x = y = None                                            # free the 4 GiB
    w = torch.randn(*STREAM_SHAPES["gate_up_8b"], device="cuda", dtype=bf16)
    gemv = {}
    for m in (1, 8, 32, 128):
        xm = torch.randn(m, w.shape[1], device="cuda", dtype=bf16)
        us = one_call_us(torch, lambda: torch.nn.functional.linear(xm, w))
        gemv[str(m)] = {"us": us, "weight_GBps": w.numel() * 2 / us / 1e3}
    res["gemv_gate_up_llama8b"] = gemv
    return res


def stream(torch) -> dict:
    linear = torch.nn.functional.linear
    props = torch.cuda.get_device_properties(0)
    res = {"gpu": props.name, "mem_get_info_total": torch.cuda.mem_get_info()[1],
           "props_total": props.total_memory}
    for name, (n_out, k) in STREAM_SHAPES.items():
        w = torch.randn(n_out, k, device="cuda", dtype=torch.bfloat16)
        for m in STREAM_TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            us = back_to_back_us(torch, lambda: linear(x, w))
            res[f"{name}@{m}"] = {"us": round(us, 2),
                                  "weight_GBps": round(w.numel() * 2 / us / 1e3),
                                  "tflops": round(2 * m * n_out * k / us / 1e6, 1)}
        w = None                                            # free it before the next
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    res["copy_GBps_rw"] = round(2 * x.numel() / back_to_back_us(torch, lambda: y.copy_(x), 20) / 1e3)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    res["bf16_8192_tflops_stream"] = round(2 * 8192**3 / back_to_back_us(torch, lambda: a @ a, 50)
                                           / 1e6)
    return res


def stream_fp8(torch) -> dict:
    """The ``stream`` GEMMs in FP8 (W8A8, per-tensor scales, bf16 out: what vLLM runs for
    an FP8 checkpoint's linear layers through ``torch._scaled_mm``), back to back."""
    props = torch.cuda.get_device_properties(0)
    res = {"gpu": props.name}
    one = torch.tensor(1.0, device="cuda")
    for name, (n_out, k) in STREAM_SHAPES.items():
        # column-major weight, as cuBLASLt's FP8 kernels want it
        w = torch.randn(n_out, k, device="cuda").to(torch.float8_e4m3fn).t()
        for m in STREAM_TOKENS:
            m_padded = max(16, m)        # _scaled_mm needs rows in multiples of 16
            x = torch.randn(m_padded, k, device="cuda").to(torch.float8_e4m3fn)
            us = back_to_back_us(torch, lambda: torch._scaled_mm(
                x, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            res[f"{name}@{m}"] = {"us": round(us, 2), "weight_GBps": round(n_out * k / us / 1e3),
                                  "tflops": round(2 * m_padded * n_out * k / us / 1e6, 1)}
        w = None
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    us = back_to_back_us(torch, lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                         out_dtype=torch.bfloat16), 50)
    res["fp8_8192_tflops_stream"] = round(2 * 8192**3 / us / 1e6)
    return res


def kv_lengths(kind: str, n: int, mean: int) -> list[int]:
    """n decode KV lengths with (about) this mean."""
    if kind == "uniform":
        return [mean] * n
    if kind == "linspace":      # evenly spread over [1, 2 * mean - 1]
        return [max(1, round(1 + (2 * mean - 2) * (i + 0.5) / n)) for i in range(n)]
    if kind == "exponential":   # the quantiles of an exponential with this mean
        return [max(1, round(-mean * math.log(1 - (i + 0.5) / n))) for i in range(n)]
    if kind == "two_point":     # a quarter at three times the mean, the rest below
        high = [3 * mean] * (n // 4)
        low = max(1, round((mean * n - 3 * mean * len(high)) / (n - len(high))))
        return high + [low] * (n - len(high))
    raise ValueError(f"unknown KV spread {kind!r}")


def _cumulative(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _varlen_case(torch, heads: int, kv_heads: int, chunk: int, decode_kv: list[int]) -> float:
    """One FA2 varlen forward: a ``chunk``-token prompt (no cached KV) and one query per
    decode over its KV (causal, aligned to the end of each KV)."""
    bf16, hd = torch.bfloat16, 128
    q_lens = ([chunk] if chunk else []) + [1] * len(decode_kv)
    k_lens = ([chunk] if chunk else []) + decode_kv
    cu_q = torch.tensor(_cumulative(q_lens), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor(_cumulative(k_lens), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(q_lens), heads, hd, device="cuda", dtype=bf16)
    k = torch.randn(sum(k_lens), kv_heads, hd, device="cuda", dtype=bf16)
    v = torch.randn(sum(k_lens), kv_heads, hd, device="cuda", dtype=bf16)
    fa = torch.ops.aten._flash_attention_forward
    return one_call_us(torch, lambda: fa(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), 0.0,
                                         True, False, scale=1 / math.sqrt(hd)))


def varlen(torch, out_path: str) -> None:
    rows = []
    for model, heads, kv_heads in (("qwen3-30b-a3b", 32, 4), ("llama-3.1-8b", 32, 8)):
        for chunk in (0, 128, 512, 2048):
            for n in (0, 16, 64, 128, 256):
                if chunk == 0 and n == 0:
                    continue
                for mean in ((1024,) if n == 0 else (256, 1024, 4096)):
                    kinds = ("uniform",) if n == 0 else ("uniform", "linspace", "exponential",
                                                         "two_point")
                    for kind in kinds:
                        dec = kv_lengths(kind, n, mean) if n else []
                        us = _varlen_case(torch, heads, kv_heads, chunk, dec)
                        rows.append((model, heads, kv_heads, chunk, n, mean, kind, sum(dec),
                                     max(dec, default=0), f"{us:.2f}"))
    with open(out_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "heads", "kv_heads", "chunk", "n_decode", "kv_mean", "kv_kind",
                    "kv_sum", "kv_max", "time_us"])
        w.writerows(rows)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("peaks", "stream", "stream-fp8", "varlen") or (
            argv[0] == "varlen" and len(argv) != 2):
        sys.exit(__doc__)
    torch = _torch()
    if argv[0] == "varlen":
        varlen(torch, argv[1])
    else:
        probe = {"peaks": peaks, "stream": stream, "stream-fp8": stream_fp8}[argv[0]]
        print(json.dumps(probe(torch), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
