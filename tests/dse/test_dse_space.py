"""Search-space validation: every user mistake exits 2 naming the field and what is allowed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from dse_testkit import BASE_SPACE, write_space

from dse.cli import main
from dse.metrics import pareto_mask
from dse.space import load_space, parse_space, pd_split


def run_cli(capsys, path, *extra):
    rc = main(["search", str(path), "--out", str(path.parent / "out"), "--no-progress", *extra])
    err = capsys.readouterr().err
    return rc, err


BAD_CASES = [
    # (overrides, fragments the message must contain)
    ({"knobs": {"tp": [1, 2], "tensor_par": [1]}}, ["knobs", "tensor_par", "max_num_seqs", "tp"]),
    ({"knobs": {"tp": {"low": 4, "high": 1}}}, ["knobs.tp", "high", "low"]),
    ({"knobs": {"tp": {"low": 1, "high": 8, "stride": 2}}}, ["knobs.tp", "stride", "low, high"]),
    ({"knobs": {"enable_prefix_caching": ["yes"]}}, ["knobs.enable_prefix_caching", "true or false"]),
    ({"knobs": {"tp": []}}, ["knobs.tp", "empty"]),
    ({"knobs": {"routing_policy": ["LOAD", "FASTEST"]}}, ["knobs.routing_policy", "FASTEST", "RR"]),
    ({"knobs": {"collective_algorithm": ["ring", "tree"]}},
     ["knobs.collective_algorithm", "tree", "ring, direct, halvingDoubling"]),
    ({"model": "llama-9000"}, ["model", "llama-9000", "meta-llama/Llama-3.1-8B"]),
    ({"hardware": "TPU-v9"}, ["hardware", "TPU-v9", "H100-SXM"]),
    ({"objectives": ["throughput_per_device", "happiness"]},
     ["objectives[1]", "happiness", "p99_ttft", "cost_per_million_tokens"]),
    ({"objectives": [{"name": "p99_ttft", "direction": "down"}]},
     ["objectives[0].direction", "minimize, maximize"]),
    ({"slo": {"p99_latency_ms": 100}}, ["slo", "p99_latency_ms", "p99_ttft_ms", "p50_e2e_ms"]),
    ({"slo": {"p99_ttft_ms": -5}}, ["slo.p99_ttft_ms", "> 0"]),
    ({"search": {"sampler": "bayes"}}, ["search.sampler", "bayes", "auto, nsga2, tpe, random, grid"]),
    ({"knobs": {"ep": [1, 2]}}, ["knobs.ep", "MoE", "dense"]),
    ({"knobs": {"all2all_backend": ["naive", "pplx"]}},
     ["knobs.all2all_backend", "pplx", "allgather_reducescatter, naive"]),
    ({"knobs": {"pd_ratio": ["1:1"]}}, ["knobs.pd_ratio", "pd"]),
    ({"knobs": {"pd": [False, True], "pd_ratio": ["1-1"]}}, ["knobs.pd_ratio", "P:D"]),
    ({"knobs": {"pim_mode": ["off", "local"]}}, ["knobs.pim_mode", "no PIM"]),
    ({"knobs": {"pim_mode": ["off", "attention"]}}, ["knobs.pim_mode", "off, local, pool"]),
    ({"budget": {"devices_per_node": 4}}, ["budget.total_devices", "required"]),
    ({"workload": {"generate": {"arrival": "uniform"}}},
     ["workload.generate.arrival", "poisson, gamma"]),
    ({"workload": {"file": "nope.jsonl"}}, ["workload.file", "nope.jsonl"]),
    ({"bogus": 1}, ["bogus", "knobs", "objectives"]),
    ({"search": {"sampler": "grid"}, "knobs": {"max_num_seqs": {"low": 1, "high": 9, "log": True}}},
     ["grid", "knobs.max_num_seqs"]),
    ({"objectives": ["goodput_per_device"]}, ["goodput_per_device", "slo.attainment"]),
]


@pytest.mark.parametrize("overrides,fragments", BAD_CASES,
                         ids=[str(i) for i in range(len(BAD_CASES))])
def test_dse_bad_space_exits_2_with_field_and_allowed(tmp_path, capsys, overrides, fragments):
    path = write_space(tmp_path, **overrides)
    rc, err = run_cli(capsys, path)
    assert rc == 2, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, err  # one line
    for frag in fragments:
        assert frag in err, f"{frag!r} not in {err!r}"


def test_dse_yaml_syntax_error_names_line(tmp_path, capsys):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nknobs:\n  tp: [1, 2\n  pp: 1\n")
    rc, err = run_cli(capsys, p)
    assert rc == 2 and "YAML syntax error" in err and "line" in err and "broken.yaml" in err


def test_dse_cli_subprocess_bad_input_has_no_traceback(tmp_path):
    path = write_space(tmp_path, knobs={"warp_speed": [1]})
    proc = subprocess.run([sys.executable, "-m", "dse.cli", "search", str(path), "--out",
                           str(tmp_path / "o")], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "warp_speed" in proc.stderr and "allowed" in proc.stderr


def test_dse_bad_flag_values(tmp_path, capsys):
    path = write_space(tmp_path)
    rc, err = run_cli(capsys, path, "--n-trials", "0")
    assert rc == 2 and "--n-trials" in err


def test_dse_moe_and_pd_spaces_follow_sim_capabilities():
    import sim

    for name, feature_probe in (("moe", "expert parallelism"), ("pd", "disaggregation")):
        probe_text = " ".join(sim.unsupported_features(sim.parse_cluster(
            _probe_cluster(name), source="probe")))
        try:
            load_space(f"search_spaces/{name}.yaml")
            loaded = True
        except sim.InputError as exc:
            loaded = False
            assert "not modelled yet" in str(exc)
        # refused exactly when sim says it cannot model the feature
        assert loaded == (feature_probe not in probe_text)


def _probe_cluster(kind: str) -> dict:
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350}, "tp_size": 1}
    if kind == "moe":
        inst = {**inst, "model_name": "Qwen/Qwen3-30B-A3B", "tp_size": 2, "num_npus": 2,
                "ep_size": 2}
        return {"nodes": [{"instances": [inst]}]}
    return {"nodes": [{"instances": [{**inst, "pd_type": "prefill"},
                                     {**inst, "pd_type": "decode"}]}]}


def test_dse_quickstart_space_loads():
    s = load_space("search_spaces/quickstart.yaml")
    assert s.simulator["latency_provider"] == "auto"   # the best data available (#17)
    assert s.search.n_trials >= 40


def test_dse_grid_collapses_conditional_knobs():
    data = {**BASE_SPACE, "knobs": {"tp": [1, 2], "replicas": [2]}}
    s = parse_space(yaml.safe_load(yaml.safe_dump(data)), "x.yaml")
    assert len(s.grid()) == 2
    assert all(set(p) == {"tp"} for p in s.grid())


def test_dse_pd_split_keeps_one_of_each():
    assert pd_split("1:1", 4) == (2, 2)
    assert pd_split("1:3", 4) == (1, 3)
    assert pd_split("3:1", 2) == (1, 1)
    assert pd_split("1:7", 8) == (1, 7)


def test_dse_pareto_mask():
    v = [[10, 5], [8, 3], [10, 6], [7, 7], [8, 3]]
    # maximize first, minimize second: [10,6] dominated by [10,5]; [7,7] dominated
    m = pareto_mask(v, ["maximize", "minimize"])
    assert m.tolist() == [True, True, False, False, True]


def test_dse_collective_algorithm_knob_reaches_the_cluster_file():
    from dse.config import build_cluster

    data = {**BASE_SPACE, "knobs": {"tp": [2], "collective_algorithm": ["ring", "direct"]}}
    s = parse_space(yaml.safe_load(yaml.safe_dump(data)), "x.yaml")
    by_algo = {p["collective_algorithm"]: build_cluster(s, s.complete(p)) for p in s.grid()}
    assert by_algo["direct"]["collective_algorithm"] == "direct"
    assert "collective_algorithm" not in by_algo["ring"]  # ring is the cluster default
def test_dse_all2all_backend_applies_to_moe_dp_groups_only():
    from dse.config import make_trial_config, vllm_command

    space = load_space("search_spaces/moe.yaml")
    assert "all2all_backend" in space.searched_knobs
    assert not space.active("all2all_backend", {"dp": 1})
    assert space.active("all2all_backend", {"dp": 2})
    one = space.complete({"dp": 1, "all2all_backend": "naive"})
    assert one["all2all_backend"] == "allgather_reducescatter"
    params = {"tp": 1, "ep": 2, "dp": 2, "replicas": 2, "all2all_backend": "naive"}
    cfg = make_trial_config(space, 0, params)
    assert cfg.options["all2all_backend"] == "naive"
    assert {i["dp_group"] for n in cfg.cluster["nodes"] for i in n["instances"]} == {"dp0"}
    assert "--all2all-backend naive" in vllm_command(space, params)
    dense = parse_space(yaml.safe_load(yaml.safe_dump(BASE_SPACE)), "x.yaml")
    assert dense.complete({"dp": 2})["all2all_backend"] == "allgather_reducescatter"
