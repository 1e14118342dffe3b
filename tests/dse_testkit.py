"""Helpers for the dse tests: a small search space and a writer for variants of it."""

from __future__ import annotations

from pathlib import Path

import yaml

BASE_SPACE = {
    "name": "t",
    "model": "meta-llama/Llama-3.1-8B",
    "hardware": "H100-SXM",
    "budget": {"total_devices": 4, "devices_per_node": 4},
    "workload": {"generate": {"num_requests": 60, "arrival": "poisson", "rate": 30,
                              "input": {"kind": "uniform", "low": 64, "high": 512},
                              "output": {"kind": "uniform", "low": 16, "high": 64},
                              "seed": 0}},
    "slo": {"p99_ttft_ms": 400, "p99_tpot_ms": 30},
    "objectives": [{"name": "throughput_per_device", "direction": "maximize"},
                   {"name": "p99_ttft", "direction": "minimize"}],
    "knobs": {"tp": [1, 2, 4], "replicas": [1, 2, 4], "max_num_seqs": [16, 128]},
    "simulator": {"latency_provider": "roofline"},
    "search": {"sampler": "grid", "n_trials": 18, "seed": 0},
}


def write_space(tmp: Path, name: str = "space.yaml", **overrides) -> Path:
    data = {**BASE_SPACE, **overrides}
    data = {k: v for k, v in data.items() if v is not None}
    p = tmp / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p
