"""ASTRA-Sim input files: network.yml, system.json, memory json."""

from __future__ import annotations

import json
import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import ConfigError, Engine, MemoryConfig, Network, SystemConfig

# shapes of upstream ASTRA-Sim example inputs
UPSTREAM_NETWORK = """topology: [ FullyConnected ]
npus_count: [ 8 ]
bandwidth: [ 50.0 ]  # GB/s
latency: [ 500.0 ]  # ns
"""
UPSTREAM_SYSTEM = {
    "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware",
    "local-mem-bw": 1600, "boost-mode": 0, "roofline-enabled": 1, "peak-perf": 900,
}


def test_upstream_files_load(tmp_path):
    (tmp_path / "n.yml").write_text(UPSTREAM_NETWORK)
    (tmp_path / "s.json").write_text(json.dumps(UPSTREAM_SYSTEM))
    (tmp_path / "m.json").write_text('{"memory-type": "NO_MEMORY_EXPANSION"}')
    e = Engine.from_files(tmp_path / "n.yml", tmp_path / "s.json", tmp_path / "m.json")
    assert e.network.num_npus == 8
    assert e.network.dims[0].topology == "FullyConnected"
    assert e.system.preferred_dataset_splits == 4 and e.system.roofline_enabled
    assert e.memory.memory_type == "NO_MEMORY_EXPANSION"


def test_multi_dim_coords():
    net = Network.build(["Ring", "Switch", "FullyConnected"], [2, 3, 4], [1, 1, 1], [1, 1, 1])
    assert net.num_npus == 24
    assert net.coords(0) == (0, 0, 0)
    assert net.coords(1) == (1, 0, 0)  # dimension 0 varies fastest
    assert net.coords(2) == (0, 1, 0)
    assert net.coords(23) == (1, 2, 3)
    assert all(net.npu_id(net.coords(i)) == i for i in range(24))


@pytest.mark.parametrize("text, field", [
    ("topology: [Ring, Switch]\nnpus_count: [4]\nbandwidth: [50, 50]\nlatency: [1, 1]\n",
     "npus_count"),
    ("topology: [Torus]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [1]\n", "topology"),
    ("topology: [Ring]\nnpus_count: [0]\nbandwidth: [50]\nlatency: [1]\n", "npus_count"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [-5]\nlatency: [1]\n", "bandwidth"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\n", "latency"),
    ("topology: [Ring]\nnpus_count: [2.5]\nbandwidth: [50]\nlatency: [1]\n", "npus_count"),
    ("topology: [Ring\n", "YAML"),
])
def test_bad_network_files(tmp_path, text, field):
    p = tmp_path / "net.yml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        Network.load(p)
    assert str(p) in str(ei.value) and field in str(ei.value)


@pytest.mark.parametrize("d, field", [
    ({"endpoint-delay": "ten"}, "endpoint-delay"),
    ({"preferred-dataset-splits": 0}, "preferred-dataset-splits"),
    ({"all-reduce-implementation": ["ringo"]}, "all-reduce-implementation"),
    ({"collective-optimization": "fast"}, "collective-optimization"),
    ({"scheduling-policy": "RANDOM"}, "scheduling-policy"),
    ({"local-mem-bw": 0}, "local-mem-bw"),
])
def test_bad_system_files(tmp_path, d, field):
    p = tmp_path / "sys.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as ei:
        SystemConfig.load(p)
    assert str(p) in str(ei.value) and field in str(ei.value)


def test_implementation_list_must_match_dims(tmp_path):
    p = tmp_path / "sys.json"
    p.write_text(json.dumps({"all-gather-implementation": ["ring", "direct", "ring"]}))
    net = Network.build(["Ring", "Switch"], [4, 2], [50, 50], [1, 1])
    with pytest.raises(ConfigError, match="all-gather-implementation.*3 entries.*2 dim"):
        Engine(net, SystemConfig.load(p))
    # a shorter list covers the first dimensions only (upstream's GeneralComplexTopology
    # builds one logical dimension per entry): the collective runs on dimension 0 alone
    short = Engine(net, SystemConfig.from_dict({"all-gather-implementation": ["direct"]}))
    alone = Engine(net, SystemConfig.from_dict({"all-gather-implementation": ["direct", "ring"]}))
    assert short.collective_time(CT.ALL_GATHER, 1 << 20, [True, True]) == \
        alone.collective_time(CT.ALL_GATHER, 1 << 20, [True, False]) > 0
    # the key absent: ring on every dimension
    assert Engine(net, SystemConfig()).coll.impls["all_gather"] == ("ring", "ring")


def test_bad_json_and_memory(tmp_path):
    p = tmp_path / "m.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="m.json.*JSON"):
        MemoryConfig.load(p)
    p.write_text(json.dumps({"memory-type": "MAGIC"}))
    with pytest.raises(ConfigError, match="memory-type"):
        MemoryConfig.load(p)
    p.write_text(json.dumps({"memory-type": "PER_NPU_MEMORY_EXPANSION"}))
    with pytest.raises(ConfigError, match="remote-mem-bw"):
        MemoryConfig.load(p)
    with pytest.raises(ConfigError, match="missing.json"):
        MemoryConfig.load(tmp_path / "missing.json")
