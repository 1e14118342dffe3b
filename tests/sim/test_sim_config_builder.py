"""Cluster config -> ASTRA-Sim input files, readable by the astra-sim backend."""

from __future__ import annotations

import json
import re
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
    # the file's links as LLMServingSim writes them: FullyConnected per dimension, link_bw
    # unchanged (ASTRA-Sim's GB/s, 2^30 B/s), link_latency per message
    assert layout.network["topology"] == ["FullyConnected", "FullyConnected"]
    assert layout.network["bandwidth"] == [400, 25]
    assert layout.network["latency"] == [500, 5000]
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
    assert [d.topology for d in net.dims] == ["FullyConnected", "FullyConnected"]
    assert SystemConfig.load(out / "system.json").all_reduce_impl == ("ring", "ring")
    assert json.loads((out / "npus.json").read_text())["3"] == [6, 7]
    for f in out.iterdir():  # the message names every file it wrote
        assert str(f) in proc.stdout, f.name


def _h100_cluster(tp=4, pp=1, **top):
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
            "num_npus": tp * pp, "tp_size": tp, "pp_size": pp}
    return {"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [inst]}], **top}


@pytest.mark.parametrize("algo", [None, "direct", "halvingDoubling"])
def test_exported_instance_files_time_like_the_inprocess_backend(tmp_path, algo):
    """What `llmsim astra-config` writes for an instance, run by the one-shot astra-sim,
    gives the cycles the in-process backend gives for that instance's network."""
    from astrasim import CollectiveCommType as CT
    from astrasim import GraphBuilder, write_workload

    from sim.backend import AstraInprocBackend
    from sim.topology import instance_topology

    top = {"collective_algorithm": algo} if algo else {}
    cluster_file = tmp_path / "c.json"
    cluster_file.write_text(json.dumps(_h100_cluster(tp=4, pp=2, **top)))
    out = tmp_path / "astra"
    proc = subprocess.run([sys.executable, "-m", "sim", "astra-config", "--cluster",
                           str(cluster_file), "--out", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    b = GraphBuilder()
    b.coll(CT.ALL_REDUCE, 6 << 20, involved_dim=[True, False])
    g = b.build()
    graphs = {i: g.copy_for(i) for i in range(8)}
    write_workload(tmp_path / "wl" / "ar", graphs)
    d = out / "instance0"
    p = subprocess.run([sys.executable, "-m", "astrasim",
                        f"--workload-configuration={tmp_path / 'wl' / 'ar'}",
                        f"--system-configuration={d / 'system.json'}",
                        f"--network-configuration={d / 'network.yml'}",
                        f"--remote-memory-configuration={d / 'memory.json'}"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    one_shot = max(int(x) for x in re.findall(r"finished, (\d+) cycles", p.stdout))
    cluster = sim.parse_cluster(json.loads(cluster_file.read_text()))
    topo = instance_topology(cluster, cluster.instances[0])
    inproc = AstraInprocBackend().run_graphs(topo, graphs)
    assert one_shot == inproc > 0
    # the instance's network is the H100's: NVSwitch, 450 GB/s per direction, 300 ns per hop
    net = Network.load(d / "network.yml")
    assert [x.topology for x in net.dims] == ["Switch", "Switch"]
    assert net.dims[0].bandwidth == pytest.approx(450 * 1e9 / 2**30)
    assert SystemConfig.load(d / "system.json").local_mem_bw == 3350
    if algo:
        assert SystemConfig.load(d / "system.json").all_reduce_impl == (algo, algo)
