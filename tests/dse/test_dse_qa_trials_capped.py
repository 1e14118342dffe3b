"""Asking for more trials than the space has distinct configurations: the summary says the
budget was capped. Before, ``--n-trials 100`` on a space of one configuration printed
"1 trials simulated" and nothing about the other 99."""

from __future__ import annotations

import yaml
from dse_testkit import BASE_SPACE, TINY_WORKLOAD

from dse.cli import main


def test_summary_says_n_trials_was_capped(tmp_path, capsys):
    space, out = tmp_path / "space.yaml", tmp_path / "out"
    space.write_text(yaml.safe_dump({**BASE_SPACE, "workload": TINY_WORKLOAD,
                                     "knobs": {"tp": [1, 2], "replicas": [1]},
                                     "search": {"sampler": "tpe", "n_trials": 4, "seed": 0}}))
    args = ["search", str(space), "--out", str(out), "--workers", "0", "--no-progress"]
    assert main([*args, "--n-trials", "100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("2 trials simulated"), first
    assert "n_trials 100 capped at the 2 distinct configuration(s) of the space" in first, first
    args[3] = str(tmp_path / "out2")
    assert main([*args, "--n-trials", "2"]) == 0
    assert "capped" not in capsys.readouterr().out.splitlines()[0]
