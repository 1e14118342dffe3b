"""Ctrl-C (or a failure) while the workers start (Ray's start-up, the actors, their
warm-up: up to 20 s on a busy machine) ends the search as an interruption in the loop
does: the pool is shut down, the MLflow parent run closed (KILLED), and the same command
resumes. Before, the pool start was outside the clean-up: the parent run stayed RUNNING,
the Ray actors were left to Ray's exit handlers, and one such exit in eight segfaulted
(exit 139)."""

from __future__ import annotations

import sqlite3

import pytest
from dse_testkit import write_space

from dse.space import load_space
from dse.study import Driver


class _StartFails:
    """A pool whose start is interrupted (or fails) after it began starting workers."""

    kind = "ray"
    size = 0

    def __init__(self, exc):
        self.exc = exc
        self.shut = False

    def start(self):
        raise self.exc

    def shutdown(self):
        self.shut = True


@pytest.mark.parametrize("exc,status", [(KeyboardInterrupt(), "KILLED"),
                                        (RuntimeError("2 of 2 Ray workers did not start"),
                                         "FAILED")])
def test_pool_start_interrupted_cleans_up(tmp_path, exc, status):
    space = load_space(write_space(tmp_path, knobs={"tp": [1, 2]},
                                   search={"sampler": "grid", "n_trials": 2, "seed": 0}))
    pool = _StartFails(exc)
    with pytest.raises(type(exc)):
        Driver(space, tmp_path / "out", pool=pool, progress=False).run()
    assert pool.shut
    runs = sqlite3.connect(tmp_path / "out" / "mlflow.db").execute(
        "select status from runs").fetchall()
    assert runs == [(status,)]


def test_interrupted_command_line_skips_the_interpreter_clean_up(monkeypatch, capsys):
    """After the study is closed, an interrupted ``dse`` process ends with os._exit(130):
    Ray's C++ side, interrupted in one of its own calls, could crash in the interpreter's
    final clean-up (exit 139). Only for the command line (argv None), never in-process."""
    import os
    import sys

    import ray  # noqa: F401 - the condition: Ray is in this process

    import dse.cli as cli

    def _interrupted(a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_check", _interrupted)
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    monkeypatch.setattr(sys, "argv", ["dse", "check", "x.yaml"])
    assert cli.main() == 130 and exits == [130]
    assert cli.main(["check", "x.yaml"]) == 130 and exits == [130]  # in-process: returns
    assert "interrupted" in capsys.readouterr().err
