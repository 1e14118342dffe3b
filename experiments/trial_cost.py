"""Time (and optionally profile) single dse trials in-process, as a search actor runs them.

Each configuration of search_spaces/quickstart.yaml below is simulated through
``dse.worker.evaluate`` with the actor's default backend (one astra-sim subprocess per
instance network, kept across trials by the worker). ``--dump DIR`` writes each trial's
per-request table and summary as JSON, so two checkouts' outputs can be compared byte for
byte (``cmp``); ``--profile N`` prints the top N cProfile entries of one run of each.

    PYTHONPATH=.:astra-sim python experiments/trial_cost.py --repeat 5 --dump /tmp/out

Measured 2026-11-23 (2 shared cores, load 2-3; aic; median of 5 after a warm-up trial, two
alternating rounds), before -> after the lazily built free-block queue, the dict-held
block hashes and aic's pre-summed iteration time: tp1x8 367-559 -> 261-300 ms, tp8x1
305-382 -> 187-199 ms, tp2x4 (8192 batched tokens) 305-393 -> 176-209 ms, tp4x2 407-528
-> 257-282 ms. The outputs (per-request table, summary without its wall-clock fields,
SLO verdict) are byte-identical for these four and 24 configurations drawn from the grid
(aic and roofline).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "astra-sim")]

from dse.config import make_trial_config  # noqa: E402
from dse.space import load_space  # noqa: E402
from dse import worker  # noqa: E402
from dse.worker import _Workloads, evaluate  # noqa: E402

#: representative trials: name -> knob values (the rest: the space's first value)
CONFIGS = {
    "tp1x8": {"tp": 1, "replicas": 8, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
              "enable_prefix_caching": True, "routing_policy": "LOAD"},
    "tp8x1": {"tp": 8, "replicas": 1, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
              "enable_prefix_caching": True, "routing_policy": "LOAD"},
    "tp2x4_mbt8192": {"tp": 2, "replicas": 4, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
                      "enable_prefix_caching": False, "routing_policy": "RR"},
    "tp4x2": {"tp": 4, "replicas": 2, "max_num_seqs": 32, "max_num_batched_tokens": 512,
              "enable_prefix_caching": True, "routing_policy": "LOAD"},
}

#: summary fields that measure the host's wall clock, not the simulation
WALL_CLOCK = ("wall_s", "speedup_vs_real_time")


def fresh_backends() -> None:
    """Close the worker's backends: the next trial starts astra-sim processes and reuse
    caches afresh (an actor's first trial)."""
    for backend in worker._BACKENDS.values():
        backend.close()
    worker._BACKENDS.clear()


def run_one(space, params: dict, workloads, number: int, fresh: bool = False):
    if fresh:
        fresh_backends()
    cfg = make_trial_config(space, number, params)
    task = {"number": number, "cluster": cfg.cluster, "options": cfg.options,
            "default_backend": "subprocess"}
    t0 = time.perf_counter()
    res = evaluate(space, task, workloads)
    wall = time.perf_counter() - t0
    if res.error or res.rejected:
        raise SystemExit(f"trial failed: {res.error or res.rejected}\n{res.traceback or ''}")
    return res, wall


def sample_grid(space, n: int, seed: int) -> dict:
    """``n`` configurations of the grid that pass the pre-simulation check, at random."""
    import random

    from dse.config import precheck

    grid = list(space.grid())
    random.Random(seed).shuffle(grid)
    out = {}
    for params in grid:
        if precheck(space, make_trial_config(space, 0, params)) is None:
            out["-".join(f"{k}{v}" for k, v in sorted(params.items()))] = params
            if len(out) == n:
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", default=str(ROOT / "search_spaces/quickstart.yaml"))
    ap.add_argument("--provider", default=None, help="override simulator.latency_provider")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--sample", type=int, default=0,
                    help="instead: this many configurations drawn from the grid (--seed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--fresh-backend", action="store_true",
                    help="a new backend (astra-sim processes, reuse caches) for every trial")
    args = ap.parse_args()
    space = load_space(Path(args.space))
    if args.provider:
        space.simulator["latency_provider"] = args.provider
    workloads = _Workloads()
    configs = sample_grid(space, args.sample, args.seed) if args.sample else CONFIGS
    names = args.only or list(configs)
    run_one(space, configs[names[0]], workloads, 0)  # warm: workload, processes, imports
    for name in names:
        params = configs[name]
        walls = []
        for i in range(args.repeat):
            res, wall = run_one(space, params, workloads, i + 1, args.fresh_backend)
            walls.append(wall)
        print(f"{name:16s} median {statistics.median(walls) * 1e3:8.1f} ms  "
              f"min {min(walls) * 1e3:8.1f} ms  (n={len(walls)})", flush=True)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            summary = {k: v for k, v in res.summary.items() if k not in WALL_CLOCK}
            # column -> values: a DataFrame (older checkouts) and dse.table.Columns alike
            requests = {c: res.requests[c].tolist() for c in res.requests}
            out = {"summary": summary, "requests": requests, "slo": res.slo}
            (args.dump / f"{name}.json").write_text(json.dumps(out, sort_keys=True, default=str))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            run_one(space, params, workloads, 99, args.fresh_backend)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
