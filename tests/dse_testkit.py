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


def assert_one_line(capsys, rc, needles) -> str:
    """The command refused its input as dse should: exit 2 and one line on stderr,
    ``dse: error: ...``, holding each of ``needles``; returns that line."""
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dse: error: "), err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def runnable_tasks(space, n: int) -> list[dict]:
    """The first ``n`` configurations of ``space``'s grid that pass the pre-simulation
    check, as pool tasks (number, cluster, options)."""
    from dse.config import make_trial_config, precheck

    out = []
    for params in space.grid():
        cfg = make_trial_config(space, len(out), params)
        if precheck(space, cfg) is None:
            out.append({"number": cfg.number, "cluster": cfg.cluster, "options": cfg.options})
        if len(out) == n:
            return out
    raise AssertionError("not enough configurations")


#: ten short requests: a search whose trials take milliseconds
TINY_WORKLOAD = {"generate": {"num_requests": 10, "arrival": "poisson", "rate": 20,
                              "input": {"kind": "uniform", "low": 64, "high": 128},
                              "output": {"kind": "uniform", "low": 8, "high": 16}, "seed": 0}}
