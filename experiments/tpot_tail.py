"""How well a validation replay resolves each latency statistic, request by request.

    python experiments/tpot_tail.py [VALIDATION_DIR] [--metric tpot] [--sync-too]

validate_vllm.py compares one number per statistic. Where a percentile sits in a sparse
part of the measured distribution (the TPOT tail of a replay with preemptions: a few
requests, each preempted several times), a shift of one or two requests in rank moves the
value by more than the 1% target although the simulated distribution is right. This
script prints, for each statistic:

- the value error (as validate_vllm.py does);
- the share of simulated requests above the measured percentile next to the share
  expected (10% above the p90): the error in rank, in requests;
- the 90% bootstrap interval of the measured statistic itself (the requests resampled):
  how finely 300 requests pin that statistic down at all;

and the per-request error grouped by how many times the simulator preempted the request.
With --sync-too it repeats everything with async scheduling off. --blocks-sweep K also
replays with the KV block count vLLM logged -K..+K (every other statistic's error, one
line per count): how much a capacity error of a few blocks moves each statistic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_vllm import run_validation  # noqa: E402

from sim.paths import shared_data_root  # noqa: E402

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90, 99)


def measured_per_request(requests_jsonl: Path) -> dict[str, np.ndarray]:
    """Per-request TTFT/TPOT/E2E (ms) in the order of the file, as validate_vllm.py defines them."""
    rows = [json.loads(line) for line in requests_jsonl.read_text().splitlines() if line.strip()]
    ttft = [r["first_token_ts"] - r["queued_ts"] for r in rows]
    tpot = [(r["last_token_ts"] - r["first_token_ts"]) / max(1, r["output_toks"] - 1) for r in rows]
    e2e = [r["last_token_ts"] - r["queued_ts"] for r in rows]
    return {m: np.asarray(v) * 1e3 for m, v in zip(METRICS, (ttft, tpot, e2e))}


def simulated_per_request(requests) -> dict[str, np.ndarray]:
    """The same quantities from the simulator's requests (ordered by request id)."""
    reqs = sorted(requests, key=lambda r: r.rid)
    ttft = [r.first_token_ns - r.arrival_ns for r in reqs]
    tpot = [(r.last_token_ns - r.first_token_ns) / max(1, r.output_len - 1) for r in reqs]
    e2e = [r.last_token_ns - r.arrival_ns for r in reqs]
    return {m: np.asarray(v, dtype=float) / 1e6 for m, v in zip(METRICS, (ttft, tpot, e2e))}


def share_above(values: np.ndarray, threshold: float) -> float:
    """Fraction of ``values`` strictly above ``threshold``."""
    return float(np.count_nonzero(values > threshold)) / len(values)


def bootstrap_interval(values: np.ndarray, q: float, n: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """90% interval of the q-th percentile of ``values`` over resamples of its entries."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    stats = np.percentile(values[idx], q, axis=1)
    lo, hi = np.percentile(stats, [5, 95])
    return float(lo), float(hi)


def resolution_table(meas: np.ndarray, simv: np.ndarray) -> list[tuple]:
    """Per percentile: measured, simulated, value error %, share of simulated requests above
    the measured percentile, the share expected, and the bootstrap interval (% of measured)."""
    out = []
    for q in QUANTILES:
        a, b = float(np.percentile(meas, q)), float(np.percentile(simv, q))
        lo, hi = bootstrap_interval(meas, q)
        out.append((q, a, b, 100 * (b - a) / a, 100 * share_above(simv, a), 100 - q,
                    100 * (lo - a) / a, 100 * (hi - a) / a))
    return out


def _report(label: str, meas: dict, result, metric: str) -> None:
    simd = simulated_per_request(result.requests)
    n = len(meas[metric])
    print(f"\n{label}: {metric}, {n} requests, {result.summary['preemptions']} preemptions")
    print(f"{'stat':6s}{'vLLM':>9s}{'sim':>9s}{'error':>8s}{'sim above':>11s}{'expected':>10s}"
          f"{'rank off':>10s}{'vLLM 90% bootstrap':>22s}")
    for q, a, b, err, above, exp, lo, hi in resolution_table(meas[metric], simd[metric]):
        off = round((above - exp) * n / 100)
        print(f"p{q:<5d}{a:9.2f}{b:9.2f}{err:+7.2f}%{above:10.1f}%{exp:9.0f}%"
              f"{off:+7d} req{lo:+10.2f}% .. {hi:+.2f}%")
    pre = np.array([r.preemptions for r in sorted(result.requests, key=lambda r: r.rid)])
    print(f"{'preempted':>10s}{'requests':>10s}{'vLLM mean':>11s}{'sim mean':>10s}{'error':>8s}")
    for k in sorted(set(pre.tolist())):
        m = pre == k
        a, b = meas[metric][m].mean(), simd[metric][m].mean()
        print(f"{k:10d}{int(m.sum()):10d}{a:11.2f}{b:10.2f}{100 * (b - a) / a:+7.2f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path,
                    default=shared_data_root() / "validation" / "RTX4090-Llama-3.1-8B")
    ap.add_argument("--metric", default="tpot", choices=METRICS)
    ap.add_argument("--latency-provider", default="measured")
    ap.add_argument("--sync-too", action="store_true",
                    help="repeat with async scheduling off")
    ap.add_argument("--blocks-sweep", type=int, default=0, metavar="K",
                    help="also replay with vLLM's logged block count -K..+K")
    args = ap.parse_args(argv)
    if args.blocks_sweep < 0:
        print(f"--blocks-sweep must be >= 0, got {args.blocks_sweep}", file=sys.stderr)
        return 2
    jsonl = args.folder / "vllm" / "requests.jsonl"
    if not jsonl.is_file():
        print(f"{jsonl}: not found (a validation folder holds vllm/requests.jsonl)",
              file=sys.stderr)
        return 2
    meas = measured_per_request(jsonl)
    modes = [("as run", None)] + ([("async off", False)] if args.sync_too else [])
    for label, async_sched in modes:
        result, meta = run_validation(args.folder, args.latency_provider, async_sched)
        if len(result.requests) != len(meas[args.metric]):
            print(f"{jsonl}: {len(meas[args.metric])} requests but the replay has "
                  f"{len(result.requests)}", file=sys.stderr)
            return 2
        _report(f"{args.folder.name} ({label})", meas, result, args.metric)
        if args.blocks_sweep:
            _sweep(args, meas, meta, async_sched)
    return 0


def _sweep(args, meas: dict, meta: dict, async_sched: bool | None) -> None:
    logged = meta.get("kv_cache", {}).get("num_gpu_blocks")
    if not logged:
        print("(no kv_cache.num_gpu_blocks in meta.json: no block sweep)")
        return
    print(f"\nKV blocks (vLLM logged {logged}): error % of mean/p50/p90/p99")
    print(f"{'blocks':>7s}{'preempt':>8s}  " + "  ".join(f"{m:^27s}" for m in METRICS))
    for nb in range(logged - args.blocks_sweep, logged + args.blocks_sweep + 1):
        result, _ = run_validation(args.folder, args.latency_provider, async_sched,
                                   kv_blocks=nb)
        simd = simulated_per_request(result.requests)
        cells = []
        for m in METRICS:
            a, b = meas[m], simd[m]
            errs = [100 * (b.mean() / a.mean() - 1)] + [
                100 * (np.percentile(b, q) / np.percentile(a, q) - 1) for q in QUANTILES]
            cells.append(" ".join(f"{e:+6.2f}" for e in errs))
        print(f"{nb:7d}{result.summary['preemptions']:8d}  " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
