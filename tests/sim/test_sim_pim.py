"""PIM devices and attention offloading."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sim
from sim.engine import Simulator, pim_iteration_ns
from sim.latency.base import BatchShape
from sim.paths import shared_data_root
from sim.pim import load_pim, parse_pim_ini

# Internal bandwidth by hand: channels x chips/rank x banks x (device_width x BL / 8 B) /
# (tCCD_L x tCK ns).
EXPECTED_GBps = {
    "DDR4_8GB_3200_pim": 1 * (64 // 16) * (2 * 4) * (16 * 8 / 8) / (8 * 0.63),
    "HBM2_1GB_2000_pim": 1 * (128 // 128) * (4 * 4) * (128 * 4 / 8) / (2 * 1.0),
    "LPDDR4X_2GB_4266_pim": 1 * (16 // 16) * (4 * 4) * (16 * 16 / 8) / (8 * 0.468),
    "LPDDR5_2GB_6400_pim": 1 * (16 // 16) * (4 * 4) * (16 * 16 / 8) / (8 * 0.3125),
    "NeuPIMs-32GB-1TBps": 8 * 1 * (2 * 4) * (128 * 4 / 8) / (4 * 1.0),
}
EXPECTED_GiB = {"DDR4_8GB_3200_pim": 8, "HBM2_1GB_2000_pim": 1, "LPDDR4X_2GB_4266_pim": 2,
                "LPDDR5_2GB_6400_pim": 2, "NeuPIMs-32GB-1TBps": 32}


@pytest.mark.parametrize("name", sorted(EXPECTED_GBps))
def test_bandwidth_and_capacity_follow_from_the_ini(name):
    if name != "NeuPIMs-32GB-1TBps" and not (shared_data_root() / "llmservingsim-configs").is_dir():
        pytest.skip("../shared/data is not present")
    dev = load_pim(name)
    assert dev.internal_bw_GBps == pytest.approx(EXPECTED_GBps[name])
    assert dev.capacity_GiB == pytest.approx(EXPECTED_GiB[name])
    assert dev.internal_bw_GBps > dev.external_bw_GBps  # the point of PIM


def test_paper_device_is_32GB_at_about_1TBps():
    dev = load_pim("NeuPIMs-32GB-1TBps")
    assert dev.capacity_GiB == 32 and dev.tCK_ns == 1.0
    assert 0.95e3 < dev.internal_bw_GBps < 1.1e3


def _cluster(pim="NeuPIMs-32GB-1TBps", pp=1, mem=256, link_latency=100):
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": link_latency,
                              "nodes": [{
        "num_instances": 1,
        "cpu_mem": {"mem_size": mem, "mem_bw": 256, "mem_latency": 100, "pim_config": pim},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "NPU",
                       "npu_mem": {"mem_size": 24, "mem_bw": 936, "mem_latency": 0},
                       "num_npus": pp, "pp_size": pp, "tp_size": 1}]}]})


def test_offloading_helps_long_context_decode_and_not_short_prefill_heavy_batches():
    # A PIM pool reached over links with 20 us latency (the link_latency of LLMServingSim's
    # PIM example cluster): every layer pays the hop.
    opts = sim.SimOptions(latency_provider="roofline", enable_attn_offloading=True,
                          pim_mode="pool")
    simulator = Simulator(_cluster(link_latency=20000), opts)
    inst, backend = simulator.instances[0], simulator.backend

    def gain(shape):
        return backend.iteration_ns(inst, shape) / pim_iteration_ns(backend, inst, shape, False)

    long_decode = BatchShape(64, 64, 0, 0, 64, 64 * 8192, 8192, 8192)
    short_prefill = BatchShape(2048 + 4, 5, 2048, 0, 4, 4 * 64, 64, 64)
    assert gain(long_decode) > 1.3
    assert gain(short_prefill) < 1.01  # no meaningful benefit
    # the crossover: as decode contexts grow, offloading goes from costing to helping
    gains = [gain(BatchShape(32, 32, 0, 0, 32, 32 * kv, kv, kv)) for kv in (16, 256, 4096, 16384)]
    assert gains == sorted(gains) and gains[0] < 1.0 < gains[-1]


def test_interleaving_overlaps_when_npu_and_pim_work_balance():
    opts = sim.SimOptions(latency_provider="roofline", enable_attn_offloading=True)
    simulator = Simulator(_cluster(), opts)
    inst, backend = simulator.instances[0], simulator.backend
    # Compute-bound NPU work and long-context PIM attention of similar size.
    big = BatchShape(256, 256, 0, 0, 256, 256 * 16384, 16384, 16384)
    serial = pim_iteration_ns(backend, inst, big, False)
    overlapped = pim_iteration_ns(backend, inst, big, True)
    assert overlapped < serial


def test_offloading_end_to_end_and_kv_lives_in_pim():
    wl = sim.generate(sim.WorkloadSpec(num_requests=30, rate=5.0,
                                       input=sim.LengthDist("uniform", low=500, high=3000),
                                       output=sim.LengthDist("uniform", low=50, high=300), seed=2))
    base = sim.simulate(_cluster(), wl, sim.SimOptions(latency_provider="roofline"))
    pim = sim.simulate(_cluster(), wl, sim.SimOptions(latency_provider="roofline",
                                                     enable_attn_offloading=True))
    assert pim.summary["num_finished"] == 30
    assert pim.summary["kv_blocks"]["0"] > base.summary["kv_blocks"]["0"]


def test_bad_pim_inputs_exit_2(tmp_path):
    bad_ini = tmp_path / "broken.ini"
    bad_ini.write_text("[dram_structure]\nbankgroups = two\n")
    with pytest.raises(sim.InputError, match="broken.ini"):
        parse_pim_ini(bad_ini)
    with pytest.raises(sim.InputError, match="pim_config"):
        sim.validate_cluster(_cluster(pim=None), sim.SimOptions(
            latency_provider="roofline", enable_attn_offloading=True))
    with pytest.raises(sim.InputError, match="pp_size"):
        sim.validate_cluster(_cluster(pp=2), sim.SimOptions(
            latency_provider="roofline", enable_attn_offloading=True,
            enable_sub_batch_interleaving=True))
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_cluster(pim=str(bad_ini)).raw))
    ds = tmp_path / "w.jsonl"
    ds.write_text('{"input_toks": 10, "output_toks": 2, "arrival_time_ns": 0}\n')
    for extra in ([], ["--enable-sub-batch-interleaving"]):
        proc = subprocess.run([sys.executable, "-m", "sim", "run", "--cluster", str(cfg),
                               "--dataset", str(ds), "--output", str(tmp_path / "o.csv"),
                               "--latency-provider", "roofline", "--enable-attn-offloading",
                               *extra], capture_output=True, text=True, check=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("interleave", [False, True])
def test_two_layer_extrapolation_equals_the_full_pim_graph(interleave):
    from sim.engine import _pim_layers_graph
    from sim.topology import transfer_topology

    opts = sim.SimOptions(latency_provider="roofline", enable_attn_offloading=True)
    simulator = Simulator(_cluster(), opts)
    inst, backend = simulator.instances[0], simulator.backend
    pim = inst.pim
    net = transfer_topology(pim.link)
    subs = [(30_000, 12_000, 50_000, 4096), (30_000, 9_000, 50_000, 4096)][: 2 if interleave else 1]
    t1 = backend.run_graphs(net, _pim_layers_graph(1, subs))
    t2 = backend.run_graphs(net, _pim_layers_graph(2, subs))
    full = backend.run_graphs(net, _pim_layers_graph(32, subs))
    assert full == t1 + 31 * (t2 - t1)


def test_pim_links_follow_sim_topology():
    # pool: the node's link as sim.topology reads it: the file's values as LLMServingSim
    # gives them to ASTRA-Sim (FullyConnected, 2^30 B/s unchanged, ns per message) ...
    from sim.topology import transfer_topology
    pool = sim.SimOptions(latency_provider="roofline", enable_attn_offloading=True,
                          pim_mode="pool")
    s = Simulator(_cluster(link_latency=20000), pool)
    assert transfer_topology(s.instances[0].pim.link).network() == {
        "topology": ["FullyConnected"], "npus_count": [2], "bandwidth": [64.0],
        "latency": [20000.0]}
    s.close()
    # ... else the catalogue's physical link (the NPU's own link: a ring, decimal GB/s)
    raw = {k: v for k, v in _cluster().raw.items() if k not in ("link_bw", "link_latency")}
    s = Simulator(sim.parse_cluster(raw), pool)
    link = s.instances[0].pim.link
    assert (link.topology, link.bw_GBps, link.unit, link.latency_ns) == ("Ring", 64, "GB/s", 100)
    s.close()
    # local: host memory's bus, given to ASTRA-Sim unchanged as before
    s = Simulator(_cluster(), sim.SimOptions(latency_provider="roofline",
                                             enable_attn_offloading=True))
    assert transfer_topology(s.instances[0].pim.link).network() == {
        "topology": ["FullyConnected"], "npus_count": [2], "bandwidth": [256.0],
        "latency": [100.0]}
    s.close()
