"""A second search into the same --out with a changed space is refused with a message that
says which space the folder holds and which one was given. Before, it named only the
stored path: after editing the same file, "holds a study of a different search space
(/path/space.yaml, ...)" named the very file the user had just given."""

from __future__ import annotations

import yaml
from dse_testkit import BASE_SPACE

from dse.cli import main

WORKLOAD = {"generate": {"num_requests": 10, "arrival": "poisson", "rate": 20,
                         "input": {"kind": "uniform", "low": 64, "high": 128},
                         "output": {"kind": "uniform", "low": 8, "high": 16}, "seed": 0}}


def _write(p, **over):
    p.write_text(yaml.safe_dump({**BASE_SPACE, "workload": WORKLOAD,
                                 "knobs": {"tp": [1, 2]},
                                 "search": {"sampler": "grid", "n_trials": 1, "seed": 0},
                                 **over}, sort_keys=False))


def test_edited_space_into_the_same_out(tmp_path, capsys):
    space, out = tmp_path / "space.yaml", tmp_path / "out"
    _write(space)
    assert main(["search", str(space), "--out", str(out), "--workers", "0",
                 "--no-progress"]) == 0
    capsys.readouterr()
    _write(space, slo={"p99_ttft_ms": 100, "p99_tpot_ms": 30})
    assert main(["search", str(space), "--out", str(out), "--workers", "0",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "changed since" in err and str(space.resolve()) in err, err
    assert str(out / "space.yaml") in err and "--fresh" in err, err
    other = tmp_path / "other.yaml"
    _write(other, knobs={"tp": [1]})
    assert main(["search", str(other), "--out", str(out), "--workers", "0",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"holds the study of {space.resolve()}" in err and f"not of {other}" in err, err
