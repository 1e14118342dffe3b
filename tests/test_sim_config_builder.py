"""Cluster config -> ASTRA-Sim input files, readable by the astra-sim backend."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from astrasim import Network, SystemConfig

import sim
from sim.config_builder import build_layout


def _cluster(nodes=2, per_node=4, bw=(400, 25), lat=(500, 5000)):
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
            "num_npus": 2, "tp_size": 2}
    return {"num_nodes": nodes, "link_bw": list(bw), "link_latency": list(lat), "nodes": [
        {"num_instances": per_node // 2, "instances": [dict(inst)] * (per_node // 2)}
        for _ in range(nodes)]}


def test_two_node_layout_honours_per_dimension_links_and_numbers_npus():
    layout = build_layout(sim.parse_cluster(_cluster()))
    assert layout.network["npus_count"] == [4, 2]
    assert layout.network["bandwidth"] == [400, 25] and layout.network["latency"] == [500, 5000]
    assert layout.npus == {0: (0, 1), 1: (2, 3), 2: (4, 5), 3: (6, 7)}
    assert layout.num_npus == 8


def test_mismatched_per_dimension_list_is_refused():
    with pytest.raises(sim.InputError, match="link_bw"):
        build_layout(sim.parse_cluster(_cluster(bw=(1, 2, 3))))


def test_cli_writes_files_astra_sim_reads(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_cluster()))
    out = tmp_path / "astra"
    proc = subprocess.run([sys.executable, "-m", "sim", "astra-config", "--cluster", str(cfg),
                           "--out", str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    net = Network.load(out / "network.yml")
    assert net.num_npus == 8 and net.ndims == 2
    assert [d.bandwidth for d in net.dims] == [400, 25]
    assert SystemConfig.load(out / "system.json").all_reduce_impl == ("ring", "ring")
    assert json.loads((out / "npus.json").read_text())["3"] == [6, 7]
    for f in out.iterdir():  # the message names every file it wrote
        assert str(f) in proc.stdout, f.name
