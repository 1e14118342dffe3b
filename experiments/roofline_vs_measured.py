"""How far the calibrated roofline provider is from the measured vLLM profiles.

For every measured bundle (RTX 4090 and RTX PRO 6000, every model and tp folder) the
roofline provider, built exactly as the simulator builds it, predicts each measured row;
the table gives, per layer class, the mean absolute % error and the signed median %
error (positive = roofline slower than measured).

    .venv/bin/python experiments/roofline_vs_measured.py [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.latency.base import BatchShape
from sim.latency.roofline import LAYER_CLASS, RooflineProvider
from sim.model import load_model
from sim.paths import shared_data_root

COLUMNS = ("dense GEMM", "elementwise", "attn prefill", "attn decode", "attn mixed", "MoE",
           "per-sequence")


def bundle_errors(tp_dir: Path, hardware: str, model_name: str, tp: int) -> dict[str, np.ndarray]:
    """Relative error (pred/meas - 1) of every measured row, grouped by layer class."""
    model = load_model(model_name)
    prov = RooflineProvider(model, hardware, tp)
    out: dict[str, list[float]] = {c: [] for c in COLUMNS}
    dense = pd.read_csv(tp_dir / "dense.csv")
    for name, tokens, us in dense.itertuples(index=False):
        col = "dense GEMM" if LAYER_CLASS[name] == "gemm" else "elementwise"
        out[col].append(prov.dense_ns(name, int(tokens)) / (us * 1e3) - 1)
    seq = pd.read_csv(tp_dir / "per_sequence.csv")
    for name, seqs, us in seq.itertuples(index=False):
        out["per-sequence"].append(prov.per_sequence_ns(name, int(seqs)) / (us * 1e3) - 1)
    att = pd.read_csv(tp_dir / "attention.csv")
    for pc, kp, nd, kd, us in att.itertuples(index=False):
        if us <= 0 or (pc == 0 and nd == 0):
            continue
        shape = BatchShape(num_tokens=int(pc + nd), num_seqs=int(nd + (pc > 0)),
                           prefill_tokens=int(pc), prefill_kv=int(kp), num_decode=int(nd),
                           decode_kv_sum=int(nd * kd), decode_kv_max=int(kd), decode_kv_min=int(kd))
        col = "attn mixed" if pc and nd else ("attn prefill" if pc else "attn decode")
        out[col].append(prov.attention_ns(shape) / (us * 1e3) - 1)
    moe_path = tp_dir / "moe.csv"
    if model.is_moe and moe_path.is_file():
        for tokens, ae, us in pd.read_csv(moe_path).itertuples(index=False):
            out["MoE"].append(prov.moe_ns(int(tokens), int(ae)) / (us * 1e3) - 1)
    return {c: np.asarray(v) for c, v in out.items()}


def summarise(rel: np.ndarray) -> tuple[float, float] | None:
    if not len(rel):
        return None
    return float(np.mean(np.abs(rel)) * 100), float(np.median(rel) * 100)


def run(root: Path) -> list[tuple[str, dict[str, tuple[float, float] | None]]]:
    rows = []
    for meta_path in sorted(root.glob("*/*/*/*/meta.yaml")):
        meta = yaml.safe_load(meta_path.read_text()) or {}
        hw = meta.get("hardware") or meta_path.parents[3].name
        for tp_dir in sorted(meta_path.parent.glob("tp*")):
            tp = int(tp_dir.name[2:])
            errs = bundle_errors(tp_dir, hw, meta["model"], tp)
            label = f"{hw} {meta['model'].split('/')[-1]} tp{tp}"
            rows.append((label, {c: summarise(v) for c, v in errs.items()}))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=shared_data_root() / "profiles")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"no profile bundles at {args.data}", file=sys.stderr)
        return 2
    rows = run(args.data)
    print("Roofline vs measured: mean |error| % / signed median % "
          "(+ = roofline slower than measured)")
    w = max(len(r[0]) for r in rows)
    print(f"{'bundle':{w}s} | " + " | ".join(f"{c:>13s}" for c in COLUMNS))
    print("-" * (w + 16 * len(COLUMNS)))
    for label, cells in rows:
        txt = []
        for c in COLUMNS:
            v = cells[c]
            txt.append(f"{'-':>13s}" if v is None else f"{v[0]:5.1f} / {v[1]:+5.1f}")
        print(f"{label:{w}s} | " + " | ".join(txt))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
