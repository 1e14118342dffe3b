"""The latency providers against GEMMs measured on an H100 SXM and an H200 SXM.

The readings are ``experiments/gpu_probe.py stream``'s (200 calls back to back, as a CUDA
graph runs them), stored in ``experiments/data/gpu-2026-11-26/``: Llama-3.1-8B's qkv,
gate_up and down projections and Qwen3-32B's gate_up (tp 1) at 1 to 2048 tokens, in bf16
through cuBLAS, which is what vLLM 0.19 runs for an unquantized linear layer, and
Llama-3.1-8B's in FP8 (``stream-fp8``, against the FP8 checkpoint's model). There
``torch._scaled_mm`` takes ~27 us (H100) / ~18 us (H200) for the 25 MB qkv weight at any
batch up to 256 tokens (about 10 us of weight streaming), a fixed cost of that path; vLLM
runs FP8 linears through its own CUTLASS kernels, and aiconfigurator's vLLM data has
13-15 us there, so those rows say little about the model. For each,
the table gives the roofline provider on the datasheet alone and with the catalogue's
measured rates and overlap exponent (``measured_gemm_tflops``, ``measured_mem_bw_GBps``,
``gemm_overlap_p``), and the aic provider (aiconfigurator's own H100/H200 data) where it is
installed; errors are predicted / measured - 1. A scan of the exponent over both cards'
readings ends it: the catalogue's ``gemm_overlap_p`` is its best.

    .venv/bin/python experiments/roofline_hopper.py
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.errors import InputError
from sim.hardware import load_hardware
from sim.latency.roofline import RooflineProvider
from sim.model import load_model

DATA = Path(__file__).resolve().parent / "data" / "gpu-2026-11-26"
#: the probe's shape names -> (model, layer)
SHAPES = {"qkv_8b": ("meta-llama/Llama-3.1-8B", "qkv_proj"),
          "gate_up_8b": ("meta-llama/Llama-3.1-8B", "gate_up_proj"),
          "down_8b": ("meta-llama/Llama-3.1-8B", "down_proj"),
          "gate_up_32b": ("Qwen/Qwen3-32B", "gate_up_proj")}


def _aic(model, hardware: str):
    try:
        from sim.latency.aic import AicProvider
        return AicProvider(model, hardware, 1)
    except (ImportError, InputError):
        return None


def _datasheet_only(hw):
    return dataclasses.replace(hw, measured_gemm_tflops={}, measured_mem_bw_GBps=None,
                               gemm_overlap_p=None)


#: the FP8 checkpoint of each shape's model (the FP8 readings: W8A8, per-tensor scales)
FP8_MODELS = {"meta-llama/Llama-3.1-8B": "Llama-3.1-8B-Instruct-FP8"}


def readings(hardware: str, precision: str = "") -> list[tuple[str, int, float]]:
    """(shape, tokens, measured us) of the stream readings (``precision`` "fp8": the
    ``stream-fp8`` ones)."""
    data = json.loads((DATA / f"stream{'_' + precision if precision else ''}_{hardware}.json")
                      .read_text())
    return [(key.split("@")[0], int(key.split("@")[1]), r["us"]) for key, r in data.items()
            if "@" in key]


def rows(hardware: str, precision: str = "") -> list[tuple]:
    hw = load_hardware(hardware)
    out = []
    for shape, (model_name, layer) in SHAPES.items():
        if precision == "fp8":
            if model_name not in FP8_MODELS:
                continue
            model_name = FP8_MODELS[model_name]
        model = load_model(model_name)
        before = RooflineProvider(model, _datasheet_only(hw), 1)
        after = RooflineProvider(model, hw, 1)
        aic = _aic(model, hardware)
        for name, tokens, meas in readings(hardware, precision):
            if name != shape:
                continue
            aic_us = aic._tok(layer, tokens) / 1e3 if aic is not None else None
            out.append((shape, tokens, meas, before.dense_ns(layer, tokens) / 1e3,
                        after.dense_ns(layer, tokens) / 1e3, aic_us))
    return out


def roofline_errors(hw) -> dict[tuple[str, int], float]:
    """The roofline on ``hw`` (a catalogue entry, possibly edited) against that card's bf16
    readings: (shape, tokens) -> predicted / measured - 1."""
    providers = {shape: (RooflineProvider(load_model(model_name), hw, 1), layer)
                 for shape, (model_name, layer) in SHAPES.items()}
    out = {}
    for shape, tokens, meas in readings(hw.name):
        prov, layer = providers[shape]
        out[(shape, tokens)] = prov.dense_ns(layer, tokens) / 1e3 / meas - 1
    return out


def _pct(pred: float | None, meas: float) -> str:
    return "      -" if pred is None else f"{(pred / meas - 1) * 100:+6.1f}%"


def exponent_scan(values=(1.068, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 8.0)) -> None:
    """Median and max |error| over both cards' readings with the measured rates and each
    overlap exponent."""
    print("\nGEMM overlap exponent p, both cards' readings (median / max |error|):")
    for p in values:
        errors = [abs(e) * 100 for hardware in ("H100-SXM", "H200-SXM") for e in
                  roofline_errors(dataclasses.replace(load_hardware(hardware),
                                                      gemm_overlap_p=p)).values()]
        print(f"  p = {p:<5}  {statistics.median(errors):5.1f}% / {max(errors):5.1f}%")


def main() -> None:
    for hardware, precision in (("H100-SXM", ""), ("H200-SXM", ""), ("H100-SXM", "fp8"),
                                ("H200-SXM", "fp8")):
        table = rows(hardware, precision)
        print(f"\n{hardware}: {precision or 'bf16'} GEMMs, us (error vs measured)")
        print(f"{'GEMM':<12} {'tokens':>6} {'measured':>9} {'roofline datasheet':>19} "
              f"{'roofline measured':>27} {'aic':>16}")
        for shape, tokens, meas, before, after, aic in table:
            aic_txt = "-" if aic is None else f"{aic:7.1f} {_pct(aic, meas)}"
            print(f"{shape:<12} {tokens:>6} {meas:>9.1f} {before:>10.1f} {_pct(before, meas)} "
                  f"{after:>18.1f} {_pct(after, meas)} {aic_txt:>16}")
        for label, col in (("roofline datasheet", 3), ("roofline measured", 4),
                           ("aic", 5)):
            errs = [abs(r[col] / r[2] - 1) * 100 for r in table if r[col] is not None]
            if errs:
                print(f"  {label}: median |error| {statistics.median(errs):.1f}%, "
                      f"max {max(errs):.1f}%")
    exponent_scan()


if __name__ == "__main__":
    main()
