"""sim/topology.py: the one description of an instance's network."""

from __future__ import annotations

import logging

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import GraphBuilder

import sim
from sim.backend import AstraInprocBackend
from sim.topology import ASTRA_GBPS, check_links, instance_topology, link_between


def _cluster(hw="H100-SXM", tp=8, nodes=1, mem_bw=3350, **top):
    inst = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": hw,
            "npu_mem": {"mem_size": 80, "mem_bw": mem_bw, "mem_latency": 0},
            "num_npus": tp, "tp_size": tp}
    return sim.parse_cluster({"num_nodes": nodes, "nodes": [
        {"num_instances": 1, "instances": [dict(inst)]} for _ in range(nodes)], **top})


def _all_reduce_ns(topo, size):
    b = GraphBuilder()
    b.coll(CT.ALL_REDUCE, size, involved_dim=[True] + [False] * (len(topo.dims) - 1))
    g = b.build()
    return AstraInprocBackend().run_graphs(topo, {i: g.copy_for(i) for i in range(topo.npus)})


def test_h100_instance_is_an_nvswitch_with_per_direction_links():
    c = _cluster()
    topo = instance_topology(c, c.instances[0])
    net, system = topo.network(), topo.system()
    assert net["topology"] == ["Switch"] and net["npus_count"] == [8]
    assert net["bandwidth"] == [pytest.approx(450 * ASTRA_GBPS)]
    assert net["latency"] == [300]
    assert system["local-mem-bw"] == 3350           # the NPU's memory bandwidth
    assert system["all-reduce-implementation"] == ["ring"]


def test_cluster_links_override_the_catalogue_and_pick_the_inter_node_entry():
    # the file's values are LLMServingSim's: FullyConnected, link_bw in ASTRA-Sim's unit
    # unchanged, link_latency per message; a list is one per dimension
    c = _cluster(nodes=2, link_bw=[400, 25], link_latency=[500, 5000])
    a, b = c.instances
    net = instance_topology(c, a).network()
    assert net == {"topology": ["FullyConnected"], "npus_count": [8], "bandwidth": [400.0],
                   "latency": [500.0]}
    link = link_between(c, a, b)
    assert (link.topology, link.bw_GBps, link.latency_ns, link.unit) == \
        ("FullyConnected", 25, 5000, "GiB/s")
    assert link.kind == "IB-NDR"
    # without cluster links, between nodes: the catalogue's scale-out NIC (InfiniBand NDR)
    c2 = _cluster(nodes=2)
    link2 = link_between(c2, *c2.instances)
    assert (link2.kind, link2.bw_GBps, link2.latency_ns) == ("IB-NDR", 50, 1350)


def test_local_mem_bw_is_the_npus_memory_bandwidth():
    slow = _cluster(tp=2, mem_bw=800)
    fast = _cluster(tp=2, mem_bw=3350)
    t_slow = _all_reduce_ns(instance_topology(slow, slow.instances[0]), 64 << 20)
    t_fast = _all_reduce_ns(instance_topology(fast, fast.instances[0]), 64 << 20)
    assert t_slow > t_fast


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_bus_bandwidth_never_exceeds_the_per_gpu_link(tp):
    c = _cluster(tp=tp)
    topo = instance_topology(c, c.instances[0])
    size = 1 << 30
    t = _all_reduce_ns(topo, size)
    busbw = size / t * 2 * (tp - 1) / tp   # bytes/ns = GB/s
    assert busbw <= 450


def test_bidirectional_looking_link_and_zero_latency_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="sim.topology"):
        assert "bidirectional" in check_links(_cluster(link_bw=900, link_latency=500))[0]
        assert "latency 0" in check_links(_cluster(link_bw=450, link_latency=0))[0]
        assert "direct on a switch" in check_links(_cluster(collective_algorithm="direct"))[0]
    assert len(caplog.records) == 3
    assert check_links(_cluster(link_bw=450, link_latency=300)) == []
    assert check_links(_cluster()) == []


def _llmsim_run(tmp_path, **top):
    """``llmsim run`` (a subprocess) of one short request on a TP2 H100 instance, with the
    cluster file's top-level fields ``top``."""
    import json
    import subprocess
    import sys

    cluster = {"num_nodes": 1, **top, "nodes": [{"num_instances": 1, "instances": [{
        "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
        "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
        "num_npus": 2, "tp_size": 2}]}]}
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "w.jsonl").write_text(json.dumps({"input_toks": 64, "output_toks": 4,
                                                  "arrival_time_ns": 0}) + "\n")
    return subprocess.run([sys.executable, "-m", "sim", "run", "--cluster",
                           str(tmp_path / "c.json"), "--dataset", str(tmp_path / "w.jsonl"),
                           "--latency-provider", "roofline", "--output", str(tmp_path / "o.csv")],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_cli_prints_the_link_warning_and_still_runs(tmp_path):
    p = _llmsim_run(tmp_path, link_bw=900, link_latency=0)
    assert p.returncode == 0, p.stderr
    assert "bidirectional" in p.stderr and "latency 0" in p.stderr
    assert "Traceback" not in p.stderr


def test_collective_algorithm_from_the_cluster_file():
    c = _cluster(tp=4, collective_algorithm="halvingDoubling")
    assert instance_topology(c, c.instances[0]).system()["all-reduce-implementation"] == \
        ["halvingDoubling"]
    with pytest.raises(sim.InputError, match="collective_algorithm.*known: ring"):
        _cluster(tp=4, collective_algorithm="butterfly")  # refused by the cluster schema


def test_unknown_hardware_needs_the_cluster_links():
    c = _cluster(hw="MYCHIP", link_bw=100, link_latency=200)
    link = instance_topology(c, c.instances[0]).dims[0].link
    assert (link.topology, link.astra_bw, link.latency_ns) == ("FullyConnected", 100, 200)
    bare = _cluster(hw="MYCHIP")
    with pytest.raises(sim.InputError, match="link_bw.*MYCHIP"):
        instance_topology(bare, bare.instances[0])


@pytest.mark.parametrize("top,fragment", [
    ({"collective_algorithm": "butterfly"}, "collective_algorithm: unknown algorithm 'butterfly'"),
    ({"link_bw": [1, 2, 3]}, "link_bw: must be"),
])
def test_bad_network_fields_exit_2_with_one_line(tmp_path, top, fragment):
    p = _llmsim_run(tmp_path, **top)
    assert p.returncode == 2
    assert fragment in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_group_topology_of_an_moe_exchange_follows_where_the_members_are():
    from sim.topology import group_topology
    c = _cluster(tp=1, nodes=2, link_bw=[400, 25], link_latency=[500, 5000],
                 collective_algorithm=["ring", "direct"])
    a, b = c.instances
    # members on two nodes: the scale-out link and the cluster's inter-node algorithm
    apart = group_topology(c, [a, b], 2)
    assert apart.npus == 2 and apart.dims[0].algorithm == "direct"
    assert apart.network()["bandwidth"] == [25] and apart.network()["latency"] == [5000]
    assert apart.system()["local-mem-bw"] == 3350
    # on one node: the intra-node entry (ASTRA-Sim's unit, as given) and algorithm
    together = group_topology(c, [a, a], 4)
    assert together.npus == 4 and together.dims[0].algorithm == "ring"
    assert together.network() == {"topology": ["FullyConnected"], "npus_count": [4],
                                  "bandwidth": [400.0], "latency": [500.0]}
    # without file links: the catalogue's NVSwitch, decimal GB/s converted, per hop
    bare = _cluster(tp=1, nodes=2)
    assert group_topology(bare, list(bare.instances[:1]) * 2, 2).network() == {
        "topology": ["Switch"], "npus_count": [2], "bandwidth": [pytest.approx(450 * ASTRA_GBPS)],
        "latency": [300]}


def _all_gather_ns(topo, size):
    b = GraphBuilder()
    b.all_gather(size, involved_dim=[True] * len(topo.dims))
    g = b.build()
    return AstraInprocBackend().run_graphs(topo, {i: g.copy_for(i) for i in range(topo.npus)})


# a 2-NPU ring all-gather is one step (a message of each NPU's contribution) plus one
# endpoint delay per bundle (two): astra-sim/astrasim/collectives.py
_ED = 2 * 10


def test_file_links_are_one_hop_of_the_given_latency_in_astra_sims_unit():
    # LLMServingSim's RTX PRO 6000 pair: 16 "GB/s" and 20 us, which it gives ASTRA-Sim as a
    # FullyConnected network: one hop of 20 us per message, 16 x 2^30 B/s on the wire. The
    # hardware's own link (PCIe through the host) is a switch, two hops per message; that
    # must not double the file's per-message latency, nor 16 be read as decimal GB/s.
    c = _cluster(hw="RTXPRO6000", tp=2, mem_bw=1597, link_bw=16, link_latency=20000)
    topo = instance_topology(c, c.instances[0])
    size = 1 << 20
    assert _all_gather_ns(topo, size) == int(20000 + size / (16 * (1 << 30) / 1e9)) + _ED
    # and what llmsim astra-config writes is that network, the file's numbers unchanged
    from sim.config_builder import build_layout
    layout = build_layout(c)
    assert layout.network == {"topology": ["FullyConnected"], "npus_count": [2],
                              "bandwidth": [16.0], "latency": [20000.0]}
    assert layout.instances[0] == topo


def test_catalogue_links_keep_their_switch_hops_and_decimal_gbps():
    # no link fields, a card without a measured link: the catalogue's PCIe 4 x16 through
    # the host (31.5 GB/s decimal per direction, 500 ns a hop), GPU -> switch -> GPU
    c = _cluster(hw="RTX4090", tp=2, mem_bw=1008)
    topo = instance_topology(c, c.instances[0])
    link = topo.dims[0].link
    assert (link.topology, link.bw_GBps, link.unit, link.latency_ns) == \
        ("Switch", 31.5, "GB/s", 500)
    size = 1 << 20
    assert _all_gather_ns(topo, size) == int(2 * 500 + size / 31.5) + _ED


def test_a_measured_catalogue_link_stands_in_for_missing_file_values():
    """The RTX PRO 6000's link as NCCL between two of the cards measured it (LLMServingSim's
    hardware.yaml: 28.73 x 2^30 B/s, 6.6 us a message, one hop): what LLMServingSim gives a
    cluster file without link values. The pair's all-gather of 557,056 B a rank (vLLM's
    MoE dispatch of 128 tokens) took 27.1 us; the physical PCIe 5 link gave 9.8 us."""
    c = _cluster(hw="RTXPRO6000", tp=2, mem_bw=1597)
    topo = instance_topology(c, c.instances[0])
    assert topo.network() == {"topology": ["FullyConnected"], "npus_count": [2],
                              "bandwidth": [28.73], "latency": [6600.0]}
    ns = _all_gather_ns(topo, 557_056)
    assert ns == int(6600 + 557_056 / (28.73 / ASTRA_GBPS)) + _ED
    assert 0.85 < ns / 27_107 < 1.15
    # a value the file gives still replaces only itself
    bw_only = _cluster(hw="RTXPRO6000", tp=2, mem_bw=1597, link_bw=16)
    assert instance_topology(bw_only, bw_only.instances[0]).network()["latency"] == [6600.0]
    # and the link warning still compares a file's value with the physical figure
    assert check_links(_cluster(hw="RTXPRO6000", tp=2, mem_bw=1597, link_bw=117,
                                link_latency=500)) != []


def test_a_file_value_replaces_only_itself():
    # link_bw alone: the file's bandwidth (2^30 B/s) on the catalogue's switch and per-hop
    # latency; link_latency alone: one hop of it, with the catalogue's decimal bandwidth
    bw_only = _cluster(hw="RTX4090", tp=2, mem_bw=1008, link_bw=16)
    lat_only = _cluster(hw="RTX4090", tp=2, mem_bw=1008, link_latency=20000)
    assert instance_topology(bw_only, bw_only.instances[0]).network() == {
        "topology": ["Switch"], "npus_count": [2], "bandwidth": [16.0], "latency": [500]}
    assert instance_topology(lat_only, lat_only.instances[0]).network() == {
        "topology": ["FullyConnected"], "npus_count": [2],
        "bandwidth": [pytest.approx(31.5 * ASTRA_GBPS)], "latency": [20000.0]}
    # per dimension: each entry of a list is a file value for its own dimension
    two = _cluster(nodes=2, tp=1, link_bw=[419, 25], link_latency=[1000, 5000])
    a, b = two.instances
    assert (link_between(two, a, a).topology, link_between(two, a, b).topology) == \
        ("FullyConnected", "FullyConnected")
    assert link_between(two, a, b).astra_bw == 25


def test_bidirectional_warning_compares_in_one_unit():
    # 900 (2^30 B/s) is 966 decimal GB/s: within 10% of twice H100's 450 decimal GB/s
    msg = check_links(_cluster(link_bw=900, link_latency=500))[0]
    assert "2^30 B/s" in msg and "966.4 decimal GB/s" in msg and "450 decimal GB/s" in msg
    # 419 (2^30 B/s) is 450 decimal GB/s: the per-direction figure, no warning
    assert check_links(_cluster(link_bw=419, link_latency=500)) == []


def test_direct_on_a_file_described_switch_still_warns():
    # the file's FullyConnected description does not make the PCIe/NVSwitch fabric one
    c = _cluster(tp=4, link_bw=419, link_latency=1000, collective_algorithm="direct")
    assert instance_topology(c, c.instances[0]).dims[0].link.topology == "FullyConnected"
    assert any("direct on a switched fabric" in m for m in check_links(c))
