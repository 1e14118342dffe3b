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


@pytest.mark.parametrize("version", ["-1.2", "0.-19", "+0.19", " 0.19"])
def test_vllm_version_with_a_sign_or_space_is_refused(version, capsys):
    # int() read "-1" and "+0" as numbers: --vllm-version -1.2 ran as vLLM "(-1, 2)"
    import sim

    with pytest.raises(sim.InputError, match="vllm_version must look like 0.19.0"):
        sim.SimOptions(vllm_version=version).validate()


def test_vllm_version_forms_still_accepted():
    import sim

    for v in ("0.19.0", "0.10", "1", "0.19.0.dev1"):
        sim.SimOptions(vllm_version=v).validate()
