"""Bad input to ``llmsim run``: exit status 2, one line on stderr naming the file, line or
field, and no traceback. The issue's cases run the real CLI in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from sim_testkit import cluster_dict, make_bundle

from sim.cli import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    make_bundle(d / "profiles")
    (d / "cluster.json").write_text(json.dumps(cluster_dict(300)))
    (d / "w.jsonl").write_text("\n".join(json.dumps({"input_toks": 20 + i, "output_toks": 3,
                                                     "arrival_time_ns": i * 1000})
                                         for i in range(5)) + "\n")
    return d


def run_cli(files, *args, cluster=None, dataset=None, profiles=None):
    cmd = [sys.executable, "-m", "sim", "run",
           "--cluster", str(cluster or files / "cluster.json"),
           "--dataset", str(dataset or files / "w.jsonl"),
           "--output", str(files / "out" / "o.csv"),
           "--profiles", str(profiles or files / "profiles"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def assert_clean_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("llmsim: error: ")
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def write_cluster(files, name, mutate):
    d = cluster_dict(300)
    mutate(d["nodes"][0]["instances"][0])
    p = files / name
    p.write_text(json.dumps(d))
    return p


def test_good_input_runs(files):
    proc = run_cli(files)
    assert proc.returncode == 0, proc.stderr
    assert "5/5 requests" in proc.stdout
    t = pd.read_csv(files / "out" / "o.csv")
    assert list(t.request_id) == [0, 1, 2, 3, 4]
    assert json.loads((files / "out" / "o.summary.json").read_text())["num_finished"] == 5
    assert (files / "out" / "o.timeseries.csv").is_file()


def test_malformed_jsonl_line(files):
    p = files / "malformed.jsonl"
    p.write_text('{"input_toks": 10, "output_toks": 3}\n{"input_toks": 10, "output_toks"\n')
    assert_clean_error(run_cli(files, dataset=p), f"{p}:2", "malformed JSON")


def test_unknown_model(files):
    p = write_cluster(files, "model.json", lambda i: i.update(model_name="acme/NoSuchModel-1B"))
    line = assert_clean_error(run_cli(files, cluster=p), str(p), "model_name",
                              "'acme/NoSuchModel-1B'")
    assert "meta-llama/Llama-3.1-8B" in line  # lists the known models


def test_unknown_hardware(files):
    p = write_cluster(files, "hw.json", lambda i: i.update(hardware="NoSuchGPU"))
    line = assert_clean_error(run_cli(files, cluster=p), "hardware", "'NoSuchGPU'")
    assert "H100-SXM" in line  # lists the known hardware


def test_unknown_hardware_names_cluster_file_and_instance(files):
    p = write_cluster(files, "hw2.json", lambda i: i.update(hardware="NoSuchGPU"))
    assert_clean_error(run_cli(files, cluster=p), str(p), "instance 0")


def test_unknown_hardware_with_measured_provider(files):
    p = write_cluster(files, "hw3.json", lambda i: i.update(hardware="NoSuchGPU"))
    assert_clean_error(run_cli(files, "--latency-provider", "measured", cluster=p),
                       "hardware='NoSuchGPU'", str(files / "profiles"))


def test_missing_profile_layer(files):
    root = files / "broken_profiles"
    variant = make_bundle(root, omit_dense_layer="gate_up_proj")
    assert_clean_error(run_cli(files, profiles=root), "missing layer 'gate_up_proj'",
                       str(variant / "tp1" / "dense.csv"))


@pytest.mark.parametrize("field", ["input_toks", "output_toks"])
def test_negative_token_count(files, field):
    p = files / f"neg_{field}.jsonl"
    bad = {"input_toks": 10, "output_toks": 3, field: -4}
    p.write_text(json.dumps({"input_toks": 10, "output_toks": 3}) + "\n" + json.dumps(bad) + "\n")
    assert_clean_error(run_cli(files, dataset=p), f"{p}:2", f"'{field}'", "-4")


def test_instance_cannot_hold_its_weights(files):
    p = write_cluster(files, "small.json",
                      lambda i: i["npu_mem"].update(mem_size=8, mem_util=0.9))
    assert_clean_error(run_cli(files, cluster=p), "instance 0", "weights need",
                       "npu_mem.mem_size=8")


# ----------------------------------------------------------------- more cases, in-process
def in_process(capsys, files, *args, cluster=None, dataset=None):
    argv = ["run", "--cluster", str(cluster or files / "cluster.json"),
            "--dataset", str(dataset or files / "w.jsonl"), "--output", str(files / "o2" / "o.csv"),
            "--profiles", str(files / "profiles"), *args]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmsim: error: ")
    return lines[0]


def test_unknown_cluster_field(capsys, files):
    p = write_cluster(files, "unk.json", lambda i: i.update(gpu_count=3))
    line = in_process(capsys, files, cluster=p)
    assert str(p) in line and "instances[0]" in line and "gpu_count" in line


def test_malformed_cluster_json(capsys, files):
    p = files / "broken.json"
    p.write_text('{"nodes": [')
    assert str(p) in in_process(capsys, files, cluster=p)


def test_missing_dataset_file(capsys, files):
    p = files / "does_not_exist.jsonl"
    line = in_process(capsys, files, dataset=p)
    assert str(p) in line and "cannot read workload" in line


def test_unknown_routing_policy(capsys, files):
    line = in_process(capsys, files, "--request-routing-policy", "FASTEST")
    assert "--request-routing-policy" in line and "FASTEST" in line and "LOAD" in line


@pytest.mark.parametrize("policy", ["FASTEST", ""])
def test_unknown_pd_decode_policy_without_pd(capsys, files, policy):
    """The cluster has no prefill/decode instances: the policy was never looked up, and any
    name (or none) ran with exit 0."""
    line = in_process(capsys, files, "--pd-decode-policy", policy)
    assert "pd_decode_policy" in line and repr(policy) in line and "LEAST_KV" in line


@pytest.mark.parametrize("args, needle", [
    (["--num-reqs", "0"], "--num-reqs"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--block-size", "-16"], "block_size"),
    (["--long-prefill-token-threshold", "-1"], "long_prefill_token_threshold"),
])
def test_bad_option_values(capsys, files, args, needle):
    assert needle in in_process(capsys, files, *args)


def test_request_too_big_for_kv(capsys, files):
    p = files / "huge.jsonl"
    p.write_text(json.dumps({"input_toks": 300 * 16, "output_toks": 3}) + "\n")
    line = in_process(capsys, files, dataset=p)
    assert "request 0" in line and "KV" in line
