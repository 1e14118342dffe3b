"""How close `llmsim profile`'s PyTorch kernels come to vLLM's own on the same GPU.

Two steps:

    python experiments/profiler_vs_vllm.py measure OUT [--models M ...]   # on a CUDA GPU
    PYTHONPATH=.:astra-sim python experiments/profiler_vs_vllm.py compare OUT

``measure`` profiles each model at TP 1 with the project's profiler (``sim.profiler``:
cuBLAS GEMMs, one FlashAttention-2 varlen forward per attention point, a padded
batched-GEMM MoE, each timed as a CUDA graph replay) on a reduced attention grid and files
the bundle under ``OUT/bundle/<the card's catalogue name>``.

``compare`` reads it back and prints, per layer, the simulator's time from the profiled
bundle (the ``measured`` provider) over the time from aiconfigurator's database of vLLM's
kernels measured on the same card (the ``aic`` provider; its current vLLM database, 0.24.0
in aiconfigurator-core 0.12.0), for prefill and decode steps: the
ratio a bundle made with `llmsim profile` carries into a replay. The same comparison for
LLMServingSim's vLLM-measured RTX PRO 6000 bundles (../shared/data/profiles) reads 0.93-1.07
per step (median 1.01 for Llama-3.1-8B and 1.02 for Qwen3-32B): vLLM's own kernels timed
inside vLLM, against aiconfigurator's, agree.

Measured 2026-11-26 on an H200 SXM (PyTorch 2.11.0+cu130), step ratio profiled / vLLM for
prefill 16, 64, 256, 1024, 2048 tokens and decode 1x1024, 16x1024, 64x1024, 256x1024,
64x4096, 16x16384 (decodes x KV):

    Llama-3.1-8B    0.92 0.95 1.11 1.27 1.29 | 1.06 1.06 1.22 1.45 1.35 0.98   median 1.11
    Qwen3-30B-A3B   1.12 1.05 1.05 1.35 1.58 | 1.42 1.38 1.23 1.28 1.32 1.25   median 1.28

and on an H100 SXM (80 GB HBM3), the same day:

    Llama-3.1-8B    0.94 0.94 1.04 1.25 1.30 | 1.10 1.05 1.04 1.19 1.13 1.00   median 1.05
    Qwen3-30B-A3B   1.20 1.03 1.09 1.33 1.56 | 1.34 1.43 1.15 1.20 1.15 1.27   median 1.20

Left: act_fn (SiLU and the product as two PyTorch kernels over a strided half, vLLM's one
fused kernel: 1.6-3.2x), prompt attention at 1-2k tokens (FlashAttention-2 here, vLLM
runs FlashAttention-3 on Hopper: 1.5-1.9x), decode attention (1.1-1.6x) and the MoE (a
padded batched GEMM against vLLM's fused Triton MoE: 1.1-1.6x). Before (profiler 1.0.0:
each call timed alone between two CUDA events, decode attention a batched GEMV) the same
table read 2.37 2.25 2.12 1.39 1.27 | 3.21 2.74 2.14 1.72 1.71 1.76 (median 2.12) and 2.14
1.73 1.50 1.60 1.62 | 5.74 2.76 1.92 1.65 1.87 2.21 (median 1.87): the host's launch latency
counted in every small kernel (layernorm up to 14x, act_fn 9x, decode attention 10x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "astra-sim")]

from sim.model import load_model  # noqa: E402
from sim.profiler import ProfileGrid, profile_bundle  # noqa: E402

#: the catalogue's name for a CUDA device name (what the bundle is filed under)
CATALOGUE_NAME = {"H100": "H100-SXM", "H200": "H200-SXM", "B200": "B200", "A100": "A100-80G-SXM",
                  "L40S": "L40S", "RTX PRO 6000": "RTXPRO6000", "RTX 4090": "RTX4090"}
MODELS = ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B")
#: the attention grid measured: every prompt chunk, 4x steps of cached KV, decodes
GRID = ProfileGrid(chunks=(0, 16, 64, 256, 1024, 2048), kv=(0, 16, 64, 256, 1024, 4096, 16384),
                   n_decode=(0, 1, 4, 16, 64, 256))
#: (prompt tokens) of the prefill steps and (decodes, KV each) of the decode steps compared
PREFILL_STEPS = (16, 64, 256, 1024, 2048)
DECODE_STEPS = ((1, 1024), (16, 1024), (64, 1024), (256, 1024), (64, 4096), (16, 16384))


def measure(out: Path, models) -> None:
    import torch

    device = torch.cuda.get_device_name()
    hardware = next((v for k, v in CATALOGUE_NAME.items() if k in device), None)
    if hardware is None:
        raise SystemExit(f"{device}: not a card of the catalogue ({', '.join(CATALOGUE_NAME)})")
    for name in models:
        print(f"{name}: profiling on {device} as {hardware}", flush=True)
        profile_bundle(load_model(name), hardware, out / "bundle", (1,), "cuda", GRID,
                       iterations=5, warmup=2, progress=lambda m: print("  " + m, flush=True))


def _steps():
    from sim.latency.base import BatchShape

    for t in PREFILL_STEPS:
        yield f"prefill {t}", BatchShape(t, 1, prefill_tokens=t)
    for n, kv in DECODE_STEPS:
        yield f"decode {n} x {kv}", BatchShape(n, n, num_decode=n, decode_kv_sum=n * kv,
                                               decode_kv_max=kv, decode_kv_min=kv,
                                               decode_kv_sq_sum=n * kv * kv)


def compare(out: Path, models) -> None:
    from sim.latency.aic import AicProvider
    from sim.latency.measured import MeasuredProvider

    for name in models:
        model = load_model(name)
        found = sorted((out / "bundle").glob(f"*/{model.name}/*"))
        if not found:
            print(f"{name}: no bundle under {out / 'bundle'}")
            continue
        bundle = found[0]
        hardware = bundle.parents[len(Path(model.name).parts)].name
        aic = AicProvider(model, hardware, 1)
        prof = MeasuredProvider(model, hardware, 1, bundle=bundle)
        print(f"\n{name} on {hardware}, TP 1: profiled / vLLM (aic), per layer")
        steps = list(_steps())
        print(f"{'layer':16s}" + "".join(f"{label:>17s}" for label, _ in steps))
        a_rows = {label: aic.layer_times(s) for label, s in steps}
        p_rows = {label: prof.layer_times(s) for label, s in steps}
        a_ns = {label: _per_layer(t) for label, t in a_rows.items()}
        p_ns = {label: _per_layer(t) for label, t in p_rows.items()}
        first = a_ns[steps[0][0]]
        for layer in [k for k in first if first[k] > 1]:  # (1 ns: not an aic op)
            print(f"{layer:16s}" + "".join(
                f"{p_ns[label][layer] / a_ns[label][layer]:17.2f}" for label, _ in steps))
        ratios = [p_rows[lab].total_ns() / a_rows[lab].total_ns() for lab, _ in steps]
        print(f"{'step':16s}" + "".join(f"{r:17.2f}" for r in ratios)
              + f"   median {statistics.median(ratios):.2f}")


def _per_layer(times) -> dict[str, int]:
    """A step's time per layer name (a block's repeated layers summed)."""
    out: dict[str, int] = {}
    for name, t in (*times.prologue, *times.block, *times.head):
        out[name] = out.get(name, 0) + t
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("measure", "compare"))
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.mode == "measure":
        out.mkdir(parents=True, exist_ok=True)
        measure(out, a.models)
    else:
        compare(out, a.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
