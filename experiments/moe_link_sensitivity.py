"""How the MoE validation replay's errors follow the one input no visible data pins: the
link that carries the DP group's exchange.

    python experiments/moe_link_sensitivity.py [VALIDATION_DIR] [--bw GBPS ...]
        [--latency-ns NS ...]

The RTX PRO 6000 DP2 x EP2 run's cluster file gives its pair of cards 16 GB/s and 20,000 ns
(``link_bw`` / ``link_latency``, LLMServingSim's semantics: GB/s of 2^30 B and ns per
message, as ASTRA-Sim reads them), and a replay takes the file's values. LLMServingSim's
own measurements of NCCL between two RTX PRO 6000 Server cards (the hardware catalogue's
``measured_link_*`` and the comment above them) read 15.92 GB/s in a first campaign and
28.73 GB/s in a refresh with ACS and IOMMU off, 6,600 ns per message in both; the run's
own machine is not described further. Every MoE layer's all-gather and reduce-scatter
cross that link, so the decode step and, more, each prompt token's cost follow it, and
the queue that forms once max_num_seqs requests run on each rank amplifies that into TTFT
(a request's wait is the time until a running one finishes, which moves with every
earlier step).

This replays the case over a grid of link values (default: 16-28.73 GB/s by 20,000 and
6,600 ns) and prints each statistic's error against the real run, and whether all of them
meet the case's targets. It is a sensitivity study: the replay itself keeps the cluster
file's link, and nothing here is fitted to the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim  # noqa: E402
from sim.paths import shared_data_root  # noqa: E402
from validate_vllm import (CASES, METRICS, STATS, cluster_file, error_table,  # noqa: E402
                           measured_stats, run_validation, simulated_stats)

CASE = "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
#: the cluster file's 16, LLMServingSim's two measured campaigns (15.92, 28.73), between
DEFAULT_BW = (15.92, 16.0, 18.0, 20.0, 22.0, 24.0, 28.73)
DEFAULT_LATENCY_NS = (20000, 6600)


def replay_stats(folder: Path, link_bw: float, link_latency_ns: float) -> dict:
    """The replay's statistics (``simulated_stats``) with the cluster file's link replaced."""
    data = json.loads(cluster_file(folder).read_text())
    data["link_bw"], data["link_latency"] = link_bw, link_latency_ns
    cluster = sim.parse_cluster(data, source=f"{cluster_file(folder)} (link {link_bw} GB/s, "
                                f"{link_latency_ns:g} ns)")
    result, _ = run_validation(folder, cluster=cluster)
    return simulated_stats(result.summary)


def replay_errors(folder: Path, link_bw: float, link_latency_ns: float,
                  measured: dict) -> dict[str, dict[str, float]]:
    """Percent error of each statistic of the replay with the cluster file's link replaced."""
    errors: dict[str, dict[str, float]] = {}
    for m, st, _, _, err in error_table(measured, replay_stats(folder, link_bw,
                                                               link_latency_ns)):
        errors.setdefault(m, {})[st] = err
    return errors


def within(errors: dict, targets: tuple[float, float]) -> bool:
    """Whether every mean is within the first target and every percentile the second."""
    mean_t, pct_t = targets
    return all(abs(e) <= (mean_t if st == "mean" else pct_t)
               for by_stat in errors.values() for st, e in by_stat.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path,
                    default=shared_data_root() / "validation" / CASE)
    ap.add_argument("--bw", type=float, nargs="+", default=list(DEFAULT_BW),
                    help="link_bw values to replay (GB/s)")
    ap.add_argument("--latency-ns", type=float, nargs="+", default=list(DEFAULT_LATENCY_NS),
                    help="link_latency values to replay (ns)")
    args = ap.parse_args(argv)
    folder = args.folder
    measured = measured_stats(folder / "vllm" / "requests.jsonl")
    targets = CASES.get(folder.name, (5.0, 10.0))
    file_link = json.loads(cluster_file(folder).read_text())
    print(f"{folder.name}: error (%) of the replay against the real run, by the DP group's link "
          f"(the cluster file gives {file_link.get('link_bw')} GB/s, "
          f"{file_link.get('link_latency')} ns); targets: means {targets[0]:g}%, "
          f"percentiles {targets[1]:g}%\n")
    head = [f"{m} {st}" for m in METRICS for st in STATS]
    print("| link GB/s | latency ns | " + " | ".join(head) + " | all within |")
    print("|---|---|" + "---|" * len(head) + "---|")
    for lat in args.latency_ns:
        for bw in args.bw:
            errors = replay_errors(folder, bw, lat, measured)
            cells = " | ".join(f"{errors[m][st]:+.1f}" for m in METRICS for st in STATS)
            print(f"| {bw:g} | {lat:g} | {cells} | {'yes' if within(errors, targets) else 'no'} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
