"""The summary line of a resumed search says how many of its trials this run simulated.
Before, rerunning a finished study printed "80 trials simulated (...) in 3.9s on
in-process" (--workers 2 asked for): nothing had been simulated, and no worker started."""

from __future__ import annotations

import yaml
from dse_testkit import BASE_SPACE, TINY_WORKLOAD

from dse.cli import main


def test_resumed_summary_counts_this_run(tmp_path, capsys):
    space, out = tmp_path / "space.yaml", tmp_path / "out"
    space.write_text(yaml.safe_dump({**BASE_SPACE, "workload": TINY_WORKLOAD,
                                     "knobs": {"tp": [1, 2, 4]},
                                     "search": {"sampler": "grid", "n_trials": 3, "seed": 0}}))
    args = ["search", str(space), "--out", str(out), "--workers", "0", "--no-progress"]
    assert main([*args, "--n-trials", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("2 trials simulated") and "this run" not in first, first
    assert main(args) == 0
    second = capsys.readouterr().out.splitlines()[0]
    assert second.startswith("3 trials simulated") and "1 of them in this run" in second, second
    assert main(args) == 0
    third = capsys.readouterr().out.splitlines()[0]
    assert "0 of them in this run" in third and "nothing left to run" in third, third
    assert "in-process" not in third, third
