"""QA: ``--astra-sim-bin`` is checked before anything runs, and a binary that is not an
astra-sim speaking the interactive protocol is a one-line error (exit 2), not a
RuntimeError traceback (exit 1)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import sim
from sim.cli import main
from sim.paths import shared_data_root

REPO = Path(__file__).resolve().parents[2]
DATA = shared_data_root()
TP1 = DATA / "llmservingsim-configs/cluster/single_node_single_instance.json"
TP2 = DATA / "llmservingsim-configs/cluster/single_node_4_instance_2TP.json"
WL = DATA / "workloads/example_trace.jsonl"

pytestmark = pytest.mark.skipif(not WL.exists(), reason="shared data not present")


def _script(tmp_path: Path, name: str, body: str, mode: int = 0o755) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(mode)
    return str(p)


def _run(tmp_path, cluster, *extra):
    return main(["run", "--cluster", str(cluster), "--dataset", str(WL), "--num-reqs", "3",
                 "--output", str(tmp_path / "o.csv"), *extra])


@pytest.mark.parametrize("make,needles", [
    # exits at once without a word (as /bin/true does)
    (lambda t: _script(t, "quiet", "exit 0"), ["--astra-sim-bin", "quiet", "exited",
                                               "interactive protocol"]),
    # refuses its arguments, as /bin/cat does
    (lambda t: _script(t, "refuses", "echo 'unrecognized option' >&2; exit 1"),
     ["--astra-sim-bin", "refuses", "unrecognized option"]),
])
def test_binary_that_is_not_astra_sim_is_an_input_error(tmp_path, capsys, make, needles):
    binary = make(tmp_path)
    assert _run(tmp_path, TP2, "--backend", "subprocess", "--astra-sim-bin", binary) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)


@pytest.mark.parametrize("make,needles", [
    (lambda t: str(t / "missing"), ["--astra-sim-bin", "missing", "no such"]),
    (lambda t: str(t), ["--astra-sim-bin", "is a folder"]),
    (lambda t: _script(t, "not-exec", "exit 0", mode=0o644), ["--astra-sim-bin", "not-exec",
                                                               "not executable"]),
])
def test_binary_checked_before_simulating_even_without_collectives(tmp_path, capsys, make,
                                                                   needles):
    # one NPU per instance: no collective, so the process would never be started and the
    # flag was silently accepted
    assert _run(tmp_path, TP1, "--backend", "subprocess", "--astra-sim-bin", make(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert not (tmp_path / "o.csv").exists()


def test_binary_without_subprocess_backend_is_refused(tmp_path, capsys):
    binary = _script(tmp_path, "astra", "exit 0")
    assert _run(tmp_path, TP1, "--astra-sim-bin", binary) == 2
    err = capsys.readouterr().err
    assert "--astra-sim-bin" in err and "--backend subprocess" in err


def test_library_refuses_the_same():
    with pytest.raises(sim.InputError, match="astra_sim_bin"):
        sim.SimOptions(astra_sim_bin="/bin/sh").validate()  # backend inproc


def test_a_real_astra_sim_binary_still_runs(tmp_path, capsys):
    # the project's own astra-sim, behind a wrapper script given as --astra-sim-bin
    import sys

    path = os.pathsep.join([str(REPO), str(REPO / "astra-sim")])
    binary = _script(tmp_path, "astra-sim", f'PYTHONPATH="{path}" exec "{sys.executable}" '
                     '-m astrasim "$@" --interactive')
    os.chmod(binary, os.stat(binary).st_mode | stat.S_IXUSR)
    assert _run(tmp_path, TP2, "--backend", "subprocess", "--astra-sim-bin", binary) == 0
    s = json.loads((tmp_path / "o.summary.json").read_text())
    assert s["backend"] == "subprocess" and s["num_finished"] == 3
