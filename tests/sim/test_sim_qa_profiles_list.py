"""QA: ``llmsim profiles list`` refuses what it cannot answer, before printing anything:
a tp below 1 (``--tp 0`` listed every tp, ``--tp -2`` printed rows for tp -2), a
``--profiles`` folder that does not exist (``llmsim run`` refuses it; here it was ignored),
and an unknown ``--model`` (the bundle lines were printed, then the error)."""

from __future__ import annotations

import pytest

from sim.cli import main


@pytest.mark.parametrize("argv,needles", [
    (["--tp", "0"], ["--tp", ">= 1", "got 0"]),
    (["--tp", "-2"], ["--tp", ">= 1", "got -2"]),
    (["--profiles", "/nonexistent/profiles"], ["--profiles", "no such folder"]),
    (["--hardware", "RTX4090", "--model", "Llama"], ["--model", "unknown model 'Llama'"]),
])
def test_profiles_list_refuses(argv, needles, capsys):
    assert main(["profiles", "list", *argv]) == 2
    cap = capsys.readouterr()
    assert cap.out == "", cap.out  # nothing listed before the refusal
    err = cap.err.strip()
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)


def test_profiles_list_one_tp_still_works(capsys):
    assert main(["profiles", "list", "--hardware", "RTX4090", "--model",
                 "meta-llama/Llama-3.1-8B", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("meta-llama/Llama-3.1-8B ")]
    assert rows and all(ln.split()[2] == "2" for ln in rows), out
