"""Per-step time breakdown of an MoE DP wave replay (attention, other compute, experts,
MoE exchange, waiting for the slowest rank), next to the real run's TPOT.

    python experiments/moe_step_breakdown.py [VALIDATION_DIR] [--all2all-backend NAME]

Replays the validation case (default: the RTX PRO 6000 Qwen3-30B-A3B DP2 x EP2 run) with
the measured profiles, records every wave, and prints a few representative ones: full
decode waves early and late (short and long KV), a half-full decode wave, a wave with a
prefill chunk beside decodes, and one with an idle (dummy) rank. Times are per step, in
ms, per DP rank. Before them, the full decode step and the cost of a prompt token in the
run's saturated window (max_num_seqs running on every rank), fitted the same way to the
real and the simulated per-second time series. Then the same cost of a prompt token while
the run fills up (before saturation), net of a decode-only step line fitted to the drain
(the seconds without prompt tokens after the saturated window), and for the waves with a
prefill chunk beside decodes, how much of the chunk rank's attention is the bundle's
mixed-batch penalty: the measured mixed varlen batch minus the same decodes alone plus the
same chunk alone (FlashAttention 2 packs a decode's GQA query heads into one tile only
when every query has length 1, vLLM 0.19's flash_attn.py FA2 note; a mixed batch runs every
decode unpacked).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

import sim
from sim.latency.base import BatchShape
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


def split_mixed_attention(provider, shape: BatchShape) -> tuple[float, float, float]:
    """(the batch's attention, its decodes alone, its prefill chunk alone), ns per layer, as
    the provider gives them: the first minus the other two is the cost the bundle measures
    for running the decodes in one varlen call beside the chunk."""
    nd = shape.num_decode
    dec = replace(shape, num_tokens=nd, num_seqs=nd, prefill_tokens=0, prefill_kv=0,
                  prefill_work=0)
    pre = replace(shape, num_tokens=shape.prefill_tokens, num_seqs=max(1, shape.num_seqs - nd),
                  num_decode=0, decode_kv_sum=0, decode_kv_max=0, decode_kv_min=0,
                  decode_kv_sq_sum=0)
    return (provider.attention_ns(shape), provider.attention_ns(dec) if nd else 0.0,
            provider.attention_ns(pre))


def per_second_rows(prompt, gen, running) -> list[tuple[int, float, float, float]]:
    """(second, prompt tokens, generated tokens, running sequences averaged over the
    second's two ends) for every second after the first."""
    return [(i, prompt[i], gen[i], (running[i - 1] + running[i]) / 2)
            for i in range(1, len(running))]


def decode_step_line(rows, min_running: float = 15.0) -> tuple[float, float]:
    """(a, b) of ms per decode-only step = a + b x running, least squares over the seconds
    with no prompt tokens and at least ``min_running`` sequences (steps = generated tokens /
    running)."""
    pts = [(r, 1000.0 * r / g) for _, p, g, r in rows if p == 0 and g > 0 and r >= min_running]
    if len(pts) < 2:
        raise ValueError("needs two decode-only seconds to fit a step line")
    b, a = np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)
    return float(a), float(b)


def prompt_token_cost(rows, line: tuple[float, float]) -> float:
    """us per prompt token over ``rows``: each second's time beyond its decode steps (at the
    decode-only step ``line`` for its running count), summed, over the prompt tokens."""
    a, b = line
    beyond = sum(1000.0 - (g / r) * (a + b * r) for _, p, g, r in rows if r > 0)
    tokens = sum(p for _, p, _, _ in rows)
    return 1e3 * beyond / tokens if tokens else float("nan")


def filling_and_drain(rows, seqs: int) -> tuple[list, list]:
    """(the seconds from the third to the first with ``seqs`` running, the decode-only
    seconds after the last with ``seqs`` running)."""
    full = [i for i, (_, _, _, r) in enumerate(rows) if r >= 0.98 * seqs]
    if not full:
        return [], []
    filling = rows[2:full[0]]
    drain = [x for x in rows[full[-1] + 1:] if x[1] == 0]
    return filling, drain


def real_vs_sim_filling(folder: Path, result, seqs: int, dp: int) -> None:
    """Print the cost of a prompt token while the run fills up, real and replayed."""
    import csv
    real = list(csv.DictReader((folder / "vllm" / "timeseries.csv").open()))
    rrows = per_second_rows([float(r["prompt_throughput"]) for r in real],
                            [float(r["gen_throughput"]) for r in real],
                            [float(r["running"]) for r in real])
    cols = result.timeseries.columns()
    # the replay's series counts running per instance (the last to record): one DP rank
    srows = per_second_rows(cols["prompt_tps"], cols["gen_tps"],
                            [dp * r for r in cols["running"]])
    out = []
    for rows in (rrows, srows):
        filling, drain = filling_and_drain(rows, seqs)
        line = decode_step_line(drain)
        out.append((line, prompt_token_cost(filling, line), len(filling)))
    (rl, rc, rn), (sl, sc, sn) = out
    print(f"filling up ({rn} s real / {sn} s sim), net of a decode-only step line fitted to the "
          "drain:")
    print(f"  decode-only step   real {rl[0]:5.2f} + {rl[1]:.4f} x running ms   "
          f"sim {sl[0]:5.2f} + {sl[1]:.4f} x running ms")
    print(f"  per prompt token   real {rc:6.1f} us   sim {sc:6.1f} us ({100 * (sc - rc) / rc:+.1f}%)")


def admitted_when_full(rows: list[dict], requests, min_wait_s: float = 0.5,
                       max_prompt: int = 1920) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt tokens, real ms, replay ms from scheduled to first token) of the requests
    that waited ``min_wait_s`` or more for a slot in the real run (they enter a full rank:
    their prefill runs beside max_num_seqs - 1 decodes) and whose prompt fits one chunk.
    Real rows and replayed requests are paired by position (the workload's order)."""
    by_rid = {r.rid: r for r in requests}
    x, real, rep = [], [], []
    for i, row in enumerate(rows):
        req = by_rid.get(i)
        if (req is None or row["scheduled_ts"] - row["queued_ts"] < min_wait_s
                or row["input_toks"] > max_prompt or req.first_token_ns < 0):
            continue
        x.append(row["input_toks"])
        real.append(1e3 * (row["first_token_ts"] - row["scheduled_ts"]))
        rep.append((req.first_token_ns - req.first_scheduled_ns) / 1e6)
    return np.array(x, float), np.array(real), np.array(rep)


def real_vs_sim_admitted(rows: list[dict], result) -> None:
    """Print the median time from scheduled to first token (one decode step in flight, then
    the prompt's mixed step) of prompts admitted into full ranks, by prompt length, real
    and replayed."""
    x, real, rep = admitted_when_full(rows, result.requests)
    if not len(x):
        return
    print("prompts admitted into full ranks, scheduled -> first token (median):")
    for lo, hi in ((0, 500), (500, 1000), (1000, 1921)):
        sel = (x > lo) & (x <= hi)
        if sel.any():
            r, m = float(np.median(real[sel])), float(np.median(rep[sel]))
            print(f"  prompt {lo:4d}-{hi - 1 if hi == 1921 else hi:4d} tokens ({int(sel.sum()):2d})   "
                  f"real {r:6.1f} ms   sim {m:6.1f} ms ({m - r:+.1f} ms)")


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
    dp = len(steps[0].ranks) if steps else 1
    real_vs_sim_steps(folder, result, 2 * kw["max_num_seqs"])
    real_vs_sim_filling(folder, result, dp * kw["max_num_seqs"], dp)
    real_vs_sim_admitted(rows, result)
    print()
    prov = _provider(simulator)
    _print_waves(steps, prov, prov.model.num_hidden_layers)
    return 0


def _provider(simulator):
    """The latency provider of the DP group's first member."""
    return simulator.instances[0].provider


def _mixed_ms(provider, shape, layers: int) -> float:
    """The bundle's mixed-batch attention penalty of one rank's batch over all layers, ms."""
    if shape is None or not (shape.prefill_tokens and shape.num_decode):
        return 0.0
    mixed, dec, pre = split_mixed_attention(provider, shape)
    return layers * (mixed - dec - pre) / 1e6


def _print_waves(steps, provider, layers: int) -> None:
    print(f"{'wave':32s}{'rank':>5s}{'tokens':>7s}{'step':>8s}{'attn':>8s}{'(mixed)':>8s}"
          f"{'other':>8s}{'experts':>9s}{'exch':>8s}{'wait':>8s}")
    for label, w in _pick(steps):
        for i, r in enumerate(w.ranks):
            name = label if i == 0 else ""
            tokens = f"{r.tokens}{'' if r.real else '*'}"
            mixed = _mixed_ms(provider, w.shapes[i] if w.shapes else None, layers)
            print(f"{name:32s}{i:5d}{tokens:>7s}{w.wave_ns / 1e6:8.2f}{r.attention_ns / 1e6:8.2f}"
                  f"{mixed:8.2f}{r.dense_ns / 1e6:8.2f}{r.moe_ns / 1e6:9.2f}"
                  f"{r.comm_ns / 1e6:8.2f}{r.wait_ns / 1e6:8.2f}")
    mixed_waves = [w for w in steps if w.shapes and any(
        s is not None and s.prefill_tokens and s.num_decode for s in w.shapes)]
    if mixed_waves:
        pen = [max(_mixed_ms(provider, s, layers) for s in w.shapes) for w in mixed_waves]
        print(f"\n{len(mixed_waves)} waves with a prefill chunk beside decodes; the mixed-batch "
              f"penalty of their slowest rank: mean {np.mean(pen):.2f} ms, "
              f"{sum(pen) / 1e3:.2f} s in all")
    print("\n* dummy batch (idle rank). tokens: after DP padding. (mixed): the part of attn that "
          "the bundle measures for decodes beside a prefill chunk in one varlen call, over "
          "the decodes and the chunk run alone. other: embedding, norms, projections, lm_head, "
          f"sampler. exch: the MoE exchange of all {layers} layers.")


if __name__ == "__main__":
    sys.exit(main())
