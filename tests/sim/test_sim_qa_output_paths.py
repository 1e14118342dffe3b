"""QA: `llmsim run` (and `llmsim bench --save-result`) refuse an output path that is an
input or another output, before anything runs. Before: --output equal to --dataset
overwrote the workload with the per-request CSV; --summary equal to --cluster replaced
the cluster file with the summary; --summary equal to --output silently lost the
per-request table (and printed the same path twice)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sim.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "../shared/data"
CLUSTER = DATA / "llmservingsim-configs/cluster/single_node_single_instance.json"
WL = DATA / "workloads/example_trace.jsonl"

pytestmark = pytest.mark.skipif(not WL.exists(), reason="shared data not present")


@pytest.fixture
def d(tmp_path):
    shutil.copy(CLUSTER, tmp_path / "c.json")
    shutil.copy(WL, tmp_path / "w.jsonl")
    return tmp_path


@pytest.mark.parametrize("flags,needles", [
    (lambda d: ["--output", str(d / "w.jsonl")], ["--output", "--dataset", "same file"]),
    (lambda d: ["--output", str(d / "o.csv"), "--summary", str(d / "c.json")],
     ["--summary", "--cluster", "same file"]),
    (lambda d: ["--output", str(d / "o.csv"), "--summary", str(d / "o.csv")],
     ["--summary", "--output", "same file"]),
    (lambda d: ["--output", str(d / "o.csv"), "--timeseries", str(d / "sub/../o.csv")],
     ["--timeseries", "--output", "same file"]),
    # the default summary path (<output>.summary.json) given as the time series
    (lambda d: ["--output", str(d / "o.csv"), "--timeseries", str(d / "o.summary.json")],
     ["--timeseries", "--summary", "same file"]),
    # a link to the workload
    (lambda d: (d / "link.csv").symlink_to(d / "w.jsonl") or ["--output", str(d / "link.csv")],
     ["--output", "--dataset", "same file"]),
])
def test_output_that_is_an_input_or_another_output_is_refused(d, capsys, flags, needles):
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    (d / "sub").mkdir()
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
               *flags(d)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    for name, data in before.items():  # no input touched
        assert (d / name).read_bytes() == data, name


@pytest.mark.parametrize("flags,needles", [
    # a path with no file name: ValueError("PosixPath('.') has an empty name") tracebacks
    # from deriving the summary's default name
    (["--output", ""], ["--output ''", "give a file path"]),
    (["--output", "."], ["--output '.'", "give a file path"]),
    (["--output", "/"], ["--output '/'", "give a file path"]),
    # an empty --summary / --timeseries was taken as not given
    (["--output", "o.csv", "--summary", ""], ["--summary ''", "give a file path"]),
    (["--output", "o.csv", "--timeseries", ""], ["--timeseries ''", "give a file path"]),
], ids=["output-empty", "output-dot", "output-root", "summary-empty", "timeseries-empty"])
def test_output_path_without_a_file_name_is_refused(d, capsys, monkeypatch, flags, needles):
    monkeypatch.chdir(d)
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)


def test_bench_result_over_its_dataset_is_refused(d, capsys):
    rc = main(["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "RTXPRO6000",
               "--latency-provider", "roofline", "--dataset-name", "custom",
               "--dataset-path", str(d / "w.jsonl"), "--num-prompts", "3", "--save-result",
               "--result-filename", str(d / "w.jsonl")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--dataset-path" in err and "same file" in err, err
    assert (d / "w.jsonl").read_bytes() == WL.read_bytes()


def test_distinct_paths_still_run(d, capsys):
    assert main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
                 "--output", str(d / "o.csv"), "--summary", str(d / "s.json"),
                 "--timeseries", str(d / "t.csv")]) == 0
    assert (d / "o.csv").read_text().startswith("request_id,")


def _interrupted(*a, **k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_ctrl_c_is_one_line_and_exit_130(d, capsys, monkeypatch, cmd):
    # Ctrl-C in a long `llmsim run` printed a KeyboardInterrupt traceback
    import sim

    monkeypatch.setattr(sim, "simulate", _interrupted)
    argv = (["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
             "--output", str(d / "o.csv")] if cmd == "run" else
            ["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "RTXPRO6000",
             "--latency-provider", "roofline", "--num-prompts", "2"])
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"llmsim: interrupted during `llmsim {cmd}`", err
    assert not (d / "o.csv").exists()


def test_stdout_closed_early_is_not_an_error(d):
    # `llmsim run ... | head -1`: the reader leaves after the first line; the run printed
    # 'llmsim: error: Broken pipe' and exited 2, though every file was written
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "astra-sim")]))
    cmd = [sys.executable, "-m", "sim", "run", "--cluster", str(d / "c.json"), "--dataset",
           str(d / "w.jsonl"), "--output", str(d / "o.csv")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # a reader that is gone before the first line
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert "error" not in err, err
    assert rc == 141, (rc, err)
    assert (d / "o.csv").read_text().startswith("request_id,")
    assert (d / "o.summary.json").is_file()
