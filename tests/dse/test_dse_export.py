"""Exports deploy what was simulated: the servers, their roles, the proxy, the benchmark."""

from __future__ import annotations

import json
import shlex

from dse_testkit import write_space

from dse.config import make_trial_config
from dse.export import bench_command, deploy_script, entry_lines, export_config, servers
from dse.space import load_space


def _space(tmp_path, **over):
    base = {"budget": {"total_devices": 8, "devices_per_node": 8}}
    return load_space(write_space(tmp_path, **{**base, **over}))


def _serve_commands(script: str) -> list[list[str]]:
    return [shlex.split(line.split(" > ")[0]) for line in script.splitlines()
            if "vllm serve" in line]


def test_pd_export_pairs_producers_and_consumers_behind_the_proxy(tmp_path):
    space = _space(tmp_path, knobs={"tp": [1, 2], "replicas": [4], "pd": [False, True],
                                    "pd_ratio": ["1:1", "3:1"]})
    cfg = make_trial_config(space, 7, {"tp": 2, "replicas": 4, "pd": True, "pd_ratio": "3:1"})
    script = deploy_script(space, cfg, {"throughput_per_device": 1.0, "p99_ttft": 2.0})
    cmds = _serve_commands(script)
    assert len(cmds) == 4
    roles = []
    for c in cmds:
        assert c[c.index("serve") + 1] == space.model
        kv = json.loads(c[c.index("--kv-transfer-config") + 1])
        assert kv["kv_connector"] == "NixlConnector"
        roles.append(kv["kv_role"])
        assert c[c.index("--tensor-parallel-size") + 1] == "2"
    assert roles == ["kv_producer"] * 3 + ["kv_consumer"]
    gpus = [c[0].split("=")[1] for c in cmds]
    assert gpus == ["0,1", "2,3", "4,5", "6,7"]  # no GPU shared between servers
    sides = {c[1] for c in cmds if c[1].startswith("VLLM_NIXL_SIDE_CHANNEL_PORT")}
    assert len(sides) == 4
    proxy = next(line for line in script.splitlines() if "toy_proxy_server.py" in line)
    args = proxy.split()
    pre = args[args.index("--prefiller-ports") + 1: args.index("--decoder-hosts")]
    dec = args[args.index("--decoder-ports") + 1:]
    dec = [a for a in dec if a.isdigit()]
    ports = [c[c.index("--port") + 1] for c in cmds]
    assert pre == ports[:3] and dec == ports[3:]


def test_moe_dp_group_is_one_server_with_dp_and_ep_flags(tmp_path):
    space = _space(tmp_path, model="Qwen/Qwen3-30B-A3B",
                   knobs={"tp": [1, 2], "replicas": [4], "dp": [1, 2], "ep": [1, 4]})
    cfg = make_trial_config(space, 3, {"tp": 2, "replicas": 4, "dp": 2, "ep": 4})
    assert [s.dp for s in servers(space, cfg)] == [2, 2]
    cmds = _serve_commands(deploy_script(space, cfg, {"throughput_per_device": 1.0}))
    assert len(cmds) == 2
    for c in cmds:
        assert c[c.index("serve") + 1] == "Qwen/Qwen3-30B-A3B"
        assert c[c.index("--data-parallel-size") + 1] == "2"
        assert "--enable-expert-parallel" in c
        assert len(c[0].split("=")[1].split(",")) == 4  # tp 2 x dp 2 GPUs


def test_aggregated_replicas_and_bench_reproduce_the_workload(tmp_path):
    space = _space(tmp_path)
    cfg = make_trial_config(space, 1, {"tp": 1, "replicas": 2})
    files = export_config(space, cfg, {"throughput_per_device": 1.0, "p99_ttft": 2.0}, tmp_path)
    assert len(_serve_commands(files["serve"])) == 2
    _, url = entry_lines(space, cfg)
    bench = shlex.split(bench_command(space, url)[-1])
    spec = space.workload["spec"]
    assert bench[:3] == ["vllm", "bench", "serve"]
    assert bench[bench.index("--num-prompts") + 1] == str(spec["num_requests"])
    assert float(bench[bench.index("--request-rate") + 1]) == spec["rate"]
    assert bench[bench.index("--burstiness") + 1] == "1"  # Poisson arrivals
    n_in, r = int(bench[bench.index("--random-input-len") + 1]), \
        float(bench[bench.index("--random-range-ratio") + 1])
    lo, hi = n_in * (1 - r), n_in * (1 + r)
    assert abs(lo - spec["input"]["low"]) <= 8 and abs(hi - spec["input"]["high"]) <= 8
    assert (tmp_path / "trial_0001.cluster.json").exists()
