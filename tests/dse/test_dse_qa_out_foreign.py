"""``--out`` pointing at a folder that holds no study but has files of the names a study
writes (a user's own space.yaml, report.html, an MLflow store) is refused, with or without
--fresh: nothing of the user's is overwritten or deleted. Before, ``dse search mine.yaml
--out DIR`` silently replaced DIR/space.yaml with a copy of mine.yaml, and --fresh would
have deleted DIR/best/ and DIR/mlflow.db."""

from __future__ import annotations

import yaml
from dse_testkit import BASE_SPACE

from dse.cli import main

WORKLOAD = {"generate": {"num_requests": 10, "arrival": "poisson", "rate": 20,
                         "input": {"kind": "uniform", "low": 64, "high": 128},
                         "output": {"kind": "uniform", "low": 8, "high": 16}, "seed": 0}}


def test_out_with_user_files_is_refused(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({**BASE_SPACE, "workload": WORKLOAD,
                                    "knobs": {"tp": [1]},
                                    "search": {"sampler": "grid", "n_trials": 1, "seed": 0}}))
    (tmp_path / "space.yaml").write_text("# my notes\n")
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "keep.txt").write_text("keep")
    for extra in ([], ["--fresh"]):
        rc = main(["search", str(mine), "--out", str(tmp_path), "--workers", "0",
                   "--no-progress", *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2, err
        assert err.splitlines() == [err] and "space.yaml" in err and "best" in err, err
        assert (tmp_path / "space.yaml").read_text() == "# my notes\n"
        assert (tmp_path / "best" / "keep.txt").exists()


def test_out_with_unrelated_files_is_fine(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({**BASE_SPACE, "workload": WORKLOAD,
                                    "knobs": {"tp": [1]},
                                    "search": {"sampler": "grid", "n_trials": 1, "seed": 0}}))
    args = ["search", str(mine), "--out", str(tmp_path), "--workers", "0", "--no-progress"]
    assert main(args) == 0
    assert main(args) == 0  # its own study: resumed
    assert "resumed" in capsys.readouterr().out


def test_out_holding_the_space_file_itself(tmp_path, capsys):
    """``dse search DIR/space.yaml --out DIR``: the space file is the study's own copy."""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({**BASE_SPACE, "workload": WORKLOAD,
                                     "knobs": {"tp": [1]},
                                     "search": {"sampler": "grid", "n_trials": 1, "seed": 0}}))
    text = space.read_text()
    assert main(["search", str(space), "--out", str(tmp_path), "--workers", "0",
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert space.read_text() == text
