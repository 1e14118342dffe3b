"""Per-step time breakdown of an MoE DP wave replay (attention, other compute, experts,
MoE exchange, waiting for the slowest rank), next to the real run's TPOT.

    python experiments/moe_step_breakdown.py [VALIDATION_DIR] [--all2all-backend NAME]

Replays the validation case (default: the RTX PRO 6000 Qwen3-30B-A3B DP2 x EP2 run) with
the measured profiles, records every wave, and prints a few representative ones: full
decode waves early and late (short and long KV), a half-full decode wave, a wave with a
prefill chunk beside decodes, and one with an idle (dummy) rank. Times are per step, in
ms, per DP rank. Before them, the full decode step and the cost of a prompt token in the
run's saturated window (max_num_seqs running on every rank), fitted the same way to the
real and the simulated per-second time series.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import sim
from sim.engine import Simulator
from sim.paths import shared_data_root

CASE = "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"


def _pick(steps):
    """(label, wave) for a few representative waves."""
    out = []
    full = [w for w in steps if all(r.real and r.tokens >= 120 and r.tokens <= 128
                                    for r in w.ranks)]
    if full:
        out.append(("decode, full (first)", full[0]))
        out.append(("decode, full (median)", sorted(full, key=lambda w: w.wave_ns)[len(full) // 2]))
        out.append(("decode, full (slowest)", max(full, key=lambda w: w.wave_ns)))
    half = [w for w in steps if all(r.real and 56 <= r.tokens <= 72 for r in w.ranks)]
    if half:
        out.append(("decode, ~64 per rank", half[len(half) // 2]))
    mixed = [w for w in steps if all(r.real for r in w.ranks)
             and max(r.tokens for r in w.ranks) > 512]
    if mixed:
        out.append(("prefill chunk beside decodes", mixed[len(mixed) // 2]))
    dummy = [w for w in steps if any(not r.real for r in w.ranks)]
    if dummy:
        out.append(("one rank idle (dummy batch)", dummy[len(dummy) // 2]))
    return out


def saturated_step_fit(rows, seqs: int) -> tuple[float, float]:
    """(ms per full decode step, us per prompt token) from per-second (prompt tokens, generated
    tokens) samples of a window where ``seqs`` sequences run: least squares of 1 s = steps x
    t_step + prompt tokens x t_prompt, with steps = generated tokens / seqs."""
    x = np.array([[g / seqs, p] for p, g in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(x, np.full(len(rows), 1000.0), rcond=None)
    return float(coef[0]), float(coef[1]) * 1e3


def _saturated_rows(prompt, gen, running, seqs: int) -> list[tuple[float, float]]:
    """The per-second samples inside the longest run of seconds with ``seqs`` running (within
    2%; the first and last such second are left out: they straddle the window's edges)."""
    best, cur = [], []
    for i, r in enumerate(running):
        if r >= 0.98 * seqs:
            cur.append(i)
        else:
            best, cur = max(best, cur, key=len), []
    best = max(best, cur, key=len)[1:-1]
    return [(prompt[i], gen[i]) for i in best]


def real_vs_sim_steps(folder: Path, result, seqs: int) -> None:
    """Print the full decode step and the cost of a prompt token in the saturated window,
    fitted the same way to the real run's and the replay's per-second time series."""
    import csv
    real = list(csv.DictReader((folder / "vllm" / "timeseries.csv").open()))
    rows = _saturated_rows([float(r["prompt_throughput"]) for r in real],
                           [float(r["gen_throughput"]) for r in real],
                           [int(r["running"]) for r in real], seqs)
    cols = result.timeseries.columns()
    # the replay's series counts running per instance (the last to record): one DP rank
    per_rank = seqs // 2
    srows = _saturated_rows(cols["prompt_tps"], cols["gen_tps"], cols["running"], per_rank)
    rs, rp = saturated_step_fit(rows, seqs)
    ss, sp = saturated_step_fit(srows, seqs)
    print(f"saturated window ({seqs} running, {len(rows)} s real / {len(srows)} s sim), "
          "1 s = steps x full decode step + prompt tokens x cost per prompt token:")
    print(f"  full decode step   real {rs:6.2f} ms   sim {ss:6.2f} ms ({100 * (ss - rs) / rs:+.1f}%)")
    print(f"  per prompt token   real {rp:6.1f} us   sim {sp:6.1f} us ({100 * (sp - rp) / rp:+.1f}%)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path,
                    default=shared_data_root() / "validation" / CASE)
    ap.add_argument("--all2all-backend", default=None)
    args = ap.parse_args(argv)
    folder = args.folder
    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    kw = meta["engine_kwargs"]
    opts = sim.SimOptions(max_num_seqs=kw["max_num_seqs"],
                          max_num_batched_tokens=kw["max_num_batched_tokens"],
                          latency_provider="measured")
    if args.all2all_backend:
        opts = opts.replace(all2all_backend=args.all2all_backend)
    simulator = Simulator(sim.load_cluster(folder / "cluster.json"), opts)
    simulator.moe_wave.record = []
    try:
        result = simulator.run(sim.load_jsonl(shared_data_root() / meta["dataset_path"]))
    finally:
        simulator.close()
    steps = simulator.moe_wave.record
    rows = [json.loads(x) for x in (folder / "vllm" / "requests.jsonl").read_text().splitlines()
            if x.strip()]
    tpot = np.array([(r["last_token_ts"] - r["first_token_ts"]) / max(1, r["output_toks"] - 1)
                     for r in rows]) * 1e3
    print(f"{folder.name}: {len(steps)} waves; all2all_backend {opts.all2all_backend}")
    print(f"TPOT mean  real {tpot.mean():.2f} ms   sim {result.summary['tpot_ms']['mean']:.2f} ms")
    print(f"TPOT p50   real {np.percentile(tpot, 50):.2f} ms   "
          f"sim {result.summary['tpot_ms']['p50']:.2f} ms")
    real_vs_sim_steps(folder, result, 2 * kw["max_num_seqs"])
    print()
    print(f"{'wave':32s}{'rank':>5s}{'tokens':>7s}{'step':>8s}{'attn':>8s}{'other':>8s}"
          f"{'experts':>9s}{'exch':>8s}{'wait':>8s}")
    for label, w in _pick(steps):
        for i, r in enumerate(w.ranks):
            name = label if i == 0 else ""
            tokens = f"{r.tokens}{'' if r.real else '*'}"
            print(f"{name:32s}{i:5d}{tokens:>7s}{w.wave_ns / 1e6:8.2f}{r.attention_ns / 1e6:8.2f}"
                  f"{r.dense_ns / 1e6:8.2f}{r.moe_ns / 1e6:9.2f}{r.comm_ns / 1e6:8.2f}"
                  f"{r.wait_ns / 1e6:8.2f}")
    print("\n* dummy batch (idle rank). tokens: after DP padding. other: embedding, norms, "
          "projections, lm_head, sampler. exch: the MoE exchange of all 48 layers.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
