"""The cluster file's pydantic models (sim/cluster_schema.py): every shared cluster file
parses to what the hand-written loader gave, every kind of bad input is one line naming
the file, the field path and what is allowed (exit 2), and the validated form of a file is
cached so a warm ``llmsim run`` imports no pydantic."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sim_testkit import POWER, cluster_dict

import sim
from sim.cli import main
from sim.paths import shared_data_root

SHARED = shared_data_root()
#: sha256 of :func:`_canon` of every shared cluster file as the hand-written loader (before
#: sim/cluster_schema.py) parsed it, recorded with that loader
RECORDED = json.loads((Path(__file__).parent / "data" / "cluster_files_parsed.json").read_text())
#: ClusterConfig and InstanceConfig fields added since the recording
ADDED = {"collective_algorithm", "kv_cache_memory_bytes"}
#: not parsed: the path the caller gave
NOT_PARSED = {"source"}
GOOD = cluster_dict(300, hardware="H100-SXM")


def _canon(o):
    """Every field value with its type (24 and 24.0 differ; True and 1 too)."""
    if dataclasses.is_dataclass(o):
        return (type(o).__name__, tuple((f.name, _canon(getattr(o, f.name)))
                                        for f in dataclasses.fields(o)
                                        if f.repr and f.name not in ADDED | NOT_PARSED))
    if isinstance(o, dict):
        return ("dict", tuple(sorted((k, _canon(v)) for k, v in o.items())))
    if isinstance(o, (list, tuple)):
        return (type(o).__name__, tuple(_canon(v) for v in o))
    return (type(o).__name__, repr(o))


def _digest(cluster) -> str:
    return hashlib.sha256(repr(_canon(cluster)).encode()).hexdigest()


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED / "llmservingsim-configs").is_dir(), reason="no ../shared/data")
def test_every_shared_cluster_file_parses_as_the_old_loader_did(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(tmp_path / "cache"))
    assert len(RECORDED) == 29
    for rel, want in RECORDED.items():
        path = SHARED / rel
        cold = sim.load_cluster(path)       # validated, then cached
        warm = sim.load_cluster(path)       # from the cache
        parsed = sim.parse_cluster(json.loads(path.read_text()), source=str(path))
        for c in (cold, warm, parsed):
            assert _digest(c) == want, rel
            assert c.raw == json.loads(path.read_text())
        assert warm.collective_algorithm is None  # none of them sets one


# ---------------------------------------------------------------- bad input
def _set(*where, value):
    """A mutation setting the field at ``where`` (keys and indexes) of GOOD to ``value``."""
    def mutate(c):
        obj = c
        for k in where[:-1]:
            obj = obj[k]
        obj[where[-1]] = value
    return mutate


def _del(*where):
    def mutate(c):
        obj = c
        for k in where[:-1]:
            obj = obj[k]
        del obj[where[-1]]
    return mutate


I = ("nodes", 0, "instances", 0)  # noqa: E741 - the first instance


def _with_power(*where, value=None, drop=False):
    def mutate(c):
        p = copy.deepcopy(POWER)
        obj = p
        for k in where[:-1]:
            obj = obj[k]
        if drop:
            del obj[where[-1]]
        else:
            obj[where[-1]] = value
        c["nodes"][0]["power"] = p
    return mutate


CXL = {"mem_size": 512, "mem_bw": 64, "mem_latency": 250, "num_devices": 1}

# (id, mutation of GOOD, the path the message names, what it says is allowed)
CASES = [
    # unknown fields, at every level
    ("unknown-top", _set("bogus", value=1), "", "unknown field 'bogus'; allowed: num_nodes"),
    ("unknown-node", _set("nodes", 0, "gpus", value=1), "nodes[0]",
     "unknown field 'gpus'; allowed: num_instances, cpu_mem, instances, power"),
    ("unknown-cpu-mem", _set("nodes", 0, "cpu_mem", "size", value=1), "nodes[0].cpu_mem",
     "unknown field 'size'; allowed: mem_size, mem_bw, mem_latency, pim_config"),
    ("unknown-instance", _set(*I, "routing_policy", value="RR"), "nodes[0].instances[0]",
     "unknown field 'routing_policy'; allowed: model_name, hardware"),
    ("unknown-npu-mem", _set(*I, "npu_mem", "mem_utl", value=0.5),
     "nodes[0].instances[0].npu_mem", "unknown field 'mem_utl'; allowed: mem_size, mem_bw, "
     "mem_latency, mem_util"),
    ("unknown-cxl", _set("cxl_mem", value={**CXL, "ports": 2}), "cxl_mem",
     "unknown field 'ports'; allowed: mem_size, mem_bw, mem_latency, num_devices"),
    ("unknown-power", _with_power("gpu", value={}), "nodes[0].power",
     "unknown field 'gpu'; allowed: base_node_power, npu, cpu, dram, link, nic, storage"),
    ("unknown-power-npu", _with_power("npu", "H100-SXM", "peak_power", value=1),
     "nodes[0].power.npu.H100-SXM", "unknown field 'peak_power'; allowed: idle_power"),
    ("unknown-power-dram", _with_power("dram", "channels", value=8), "nodes[0].power.dram",
     "unknown field 'channels'; allowed: dimm_size, idle_power, energy_per_bit"),
    # wrong types
    ("nodes-not-list", _set("nodes", value="n0"), "nodes", "must be a list"),
    ("nodes-empty", _set("nodes", value=[]), "nodes", "must be a non-empty list"),
    ("instance-not-mapping", _set("nodes", 0, "instances", 0, value=5),
     "nodes[0].instances[0]", "must be a mapping with fields model_name, hardware"),
    ("npu-mem-not-mapping", _set(*I, "npu_mem", value=80), "nodes[0].instances[0].npu_mem",
     "must be a mapping with fields mem_size, mem_bw, mem_latency, mem_util"),
    ("tp-string", _set(*I, "tp_size", value="2"), "nodes[0].instances[0].tp_size",
     "must be an integer, got '2'"),
    ("tp-fraction", _set(*I, "tp_size", value=1.5), "nodes[0].instances[0].tp_size",
     "must be an integer, got 1.5"),
    ("model-number", _set(*I, "model_name", value=8), "nodes[0].instances[0].model_name",
     "must be a non-empty string, got 8"),
    ("prefix-caching-yes", _set(*I, "enable_prefix_caching", value="yes"),
     "nodes[0].instances[0].enable_prefix_caching", "must be true or false, got 'yes'"),
    ("link-bw-word", _set("link_bw", value="fast"), "link_bw", "must be a number, got 'fast'"),
    ("dp-group-bool", _set(*I, "dp_group", value=True), "nodes[0].instances[0].dp_group",
     "must be a name (a string or an integer), got True"),
    ("placement-list", _set(*I, "placement", value=["npu"]), "nodes[0].instances[0].placement",
     "must be a mapping"),
    ("power-number-word", _with_power("cpu", "util", value="high"), "nodes[0].power.cpu.util",
     "must be a number, got 'high'"),
    ("power-npu-not-mapping", _with_power("npu", value=[1]), "nodes[0].power.npu",
     "must be a mapping"),
    # out of range
    ("mem-util-1.5", _set(*I, "npu_mem", "mem_util", value=1.5),
     "nodes[0].instances[0].npu_mem.mem_util", "must be <= 1, got 1.5"),
    ("mem-util-0", _set(*I, "npu_mem", "mem_util", value=0),
     "nodes[0].instances[0].npu_mem.mem_util", "must be > 0, got 0"),
    ("mem-size-1e40", _set(*I, "npu_mem", "mem_size", value=1e40),
     "nodes[0].instances[0].npu_mem.mem_size", "must be <= 1048576, got 1e+40"),
    ("tp-0", _set(*I, "tp_size", value=0), "nodes[0].instances[0].tp_size", "must be >= 1"),
    ("max-num-seqs-0", _set(*I, "max_num_seqs", value=0), "nodes[0].instances[0].max_num_seqs",
     "must be >= 1, got 0"),
    ("budget-negative", _set(*I, "max_num_batched_tokens", value=-1),
     "nodes[0].instances[0].max_num_batched_tokens", "must be >= 0, got -1"),
    ("link-latency-negative", _set("link_latency", value=-1), "link_latency",
     "must be >= 0, got -1"),
    ("link-bw-three-dims", _set("link_bw", value=[1, 2, 3]), "link_bw",
     "must be a number or a list of one per network dimension"),
    ("cxl-devices-0", _set("cxl_mem", value={**CXL, "num_devices": 0}), "cxl_mem.num_devices",
     "must be >= 1, got 0"),
    ("dimm-size-0", _with_power("dram", "dimm_size", value=0), "nodes[0].power.dram.dimm_size",
     "must be > 0, got 0"),
    ("blocks-override-0", _set(*I, "num_gpu_blocks_override", value=0),
     "nodes[0].instances[0].num_gpu_blocks_override", "must be >= 1, got 0"),
    # bad enums
    ("pd-type", _set(*I, "pd_type", value="both"), "nodes[0].instances[0].pd_type",
     "must be one of prefill, decode, got 'both'"),
    ("all2all", _set(*I, "all2all_backend", value="pplx"), "nodes[0].instances[0].all2all_backend",
     "must be one of allgather_reducescatter, naive"),
    ("kv-dtype", _set(*I, "kv_cache_dtype", value="int4"), "nodes[0].instances[0].kv_cache_dtype",
     "must be one of auto, bfloat16"),
    ("quantization", _set(*I, "quantization", value="awq"), "nodes[0].instances[0].quantization",
     "must be one of fp8, got 'awq'"),
    ("algorithm", _set("collective_algorithm", value=["ring", "butterfly"]),
     "collective_algorithm", "unknown algorithm 'butterfly'; known: ring, direct"),
    # missing and inconsistent
    ("no-model", _del(*I, "model_name"), "nodes[0].instances[0].model_name", "required"),
    ("null-model", _set(*I, "model_name", value=None), "nodes[0].instances[0].model_name",
     "required"),
    ("no-mem-size-unknown-hw",
     lambda c: (_del(*I, "npu_mem", "mem_size")(c), _set(*I, "hardware", value="TPU-v9")(c)),
     "nodes[0].instances[0].npu_mem.mem_size",
     "not given, and hardware 'TPU-v9' is not in the catalogue to take it from; give "
     "npu_mem.mem_size or one of: A100-80G-SXM"),
    ("no-power-section", _with_power("dram", drop=True), "nodes[0].power.dram", "required"),
    ("num-nodes", _set("num_nodes", value=2), "", "num_nodes=2 but 1 node(s) are listed"),
    ("num-instances", _set("nodes", 0, "num_instances", value=3), "nodes[0]",
     "num_instances=3 but 1 instance(s) are listed"),
    ("num-npus", _set(*I, "num_npus", value=2), "nodes[0].instances[0]",
     "num_npus=2 must equal tp_size*pp_size=1"),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster_schema")
    (d / "w.jsonl").write_text(json.dumps({"input_toks": 20, "output_toks": 3}) + "\n")
    return d


@pytest.mark.parametrize("mutate,path,allowed", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_cluster_is_one_line_with_the_field_path(d, capsys, monkeypatch, mutate, path,
                                                     allowed):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(d / "cache"))
    c = copy.deepcopy(GOOD)
    mutate(c)
    p = d / "c.json"
    p.write_text(json.dumps(c))
    rc = main(["run", "--cluster", str(p), "--dataset", str(d / "w.jsonl"),
               "--output", str(d / "o.csv")])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    want = f"{p}: {path}: {allowed}" if path else f"{p}: {allowed}"
    assert want in lines[0], (want, lines[0])
    # a mapping in memory (llmsim bench, dse) is checked the same way, without the file
    with pytest.raises(sim.InputError) as exc:
        sim.parse_cluster(c, source="mem")
    assert (f"mem: {path}: {allowed}" if path else f"mem: {allowed}") in str(exc.value)


def test_a_yaml_cluster_is_checked_as_json(d, capsys):
    import yaml

    c = copy.deepcopy(GOOD)
    c["link_bw"] = [16, float("nan")]
    p = d / "c.yaml"
    p.write_text(yaml.safe_dump(c))
    with pytest.raises(sim.InputError, match=r"c\.yaml: link_bw: must be a number, got nan"):
        sim.load_cluster(p)


# ---------------------------------------------------------------- the cache
_LOAD = r"""
import json, sys
import sim
c = sim.load_cluster(sys.argv[1])
print(json.dumps({"pydantic": any(m.split(".")[0] in ("pydantic", "pydantic_core")
                                  for m in sys.modules), "tp": c.instances[0].tp_size}))
"""


def _load_in_process(path: Path, cache: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _LOAD, str(path)], check=True, text=True,
                         capture_output=True, timeout=120,
                         env={**os.environ, "LLMSIM_CACHE_DIR": str(cache)}).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_warm_load_imports_no_pydantic_and_an_edit_is_validated_again(tmp_path, monkeypatch):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(GOOD))
    cache = tmp_path / "cache"
    assert _load_in_process(p, cache) == {"pydantic": True, "tp": 1}    # cold: validated
    assert _load_in_process(p, cache) == {"pydantic": False, "tp": 1}   # warm: cached
    bad = copy.deepcopy(GOOD)
    bad["nodes"][0]["instances"][0]["tp_size"] = 0
    p.write_text(json.dumps(bad))
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(cache))
    with pytest.raises(sim.InputError, match=r"instances\[0\]\.tp_size: must be >= 1"):
        sim.load_cluster(p)  # a new key: never the cached success
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    p.write_text(json.dumps(GOOD))
    assert sim.load_cluster(p).instances[0].tp_size == 1


def test_the_cache_key_covers_the_schema_sources():
    from sim.cluster import _schema_sources

    names = {s.name for s in _schema_sources()}
    assert {"cluster_schema.py", "schema.py", "options.py", "cluster.py"} <= names
    assert all(s.is_file() for s in _schema_sources())


def test_parse_cluster_always_validates(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(tmp_path / "cache"))
    p = tmp_path / "c.json"
    p.write_text(json.dumps(GOOD))
    sim.load_cluster(p)  # fills the cache
    bad = copy.deepcopy(GOOD)
    bad["nodes"][0]["instances"][0]["npu_mem"]["mem_util"] = 2
    with pytest.raises(sim.InputError, match=r"npu_mem\.mem_util: must be <= 1"):
        sim.parse_cluster(bad)


def _only_mem_util(hardware: str, tp: int = 1) -> dict:
    """An instance block as LLMServingSim's bench/examples clusters give it: npu_mem holds
    only mem_util (its size and bandwidth come from the hardware profile)."""
    return {"num_nodes": 1, "nodes": [{"num_instances": 1,
            "cpu_mem": {"mem_size": 512, "mem_bw": 256, "mem_latency": 0},
            "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": hardware,
                           "npu_mem": {"mem_util": 0.9}, "num_npus": tp, "tp_size": tp,
                           "pd_type": None}]}]}


def test_npu_memory_left_out_is_the_hardware_catalogues():
    """A cluster file that gives npu_mem.mem_util alone (LLMServingSim's current example
    configs) takes the device's memory size and bandwidth from the hardware catalogue; it
    was refused as 'npu_mem.mem_size: required'."""
    from sim.hardware import load_hardware

    for hw_name in ("RTXPRO6000", "RTX4090", "H100-SXM"):
        hw = load_hardware(hw_name)
        mem = sim.parse_cluster(_only_mem_util(hw_name)).instances[0].npu_mem
        assert (mem.mem_size_gib, mem.mem_bw_GBps, mem.mem_latency_ns, mem.mem_util) == \
            (hw.mem_size_GiB, hw.mem_bw_GBps, 0.0, 0.9)
    # without any npu_mem block: every field's default
    c = _only_mem_util("RTXPRO6000")
    del c["nodes"][0]["instances"][0]["npu_mem"]
    mem = sim.parse_cluster(c).instances[0].npu_mem
    assert (mem.mem_size_gib, mem.mem_util) == (96, 0.9)
    # a value the file gives still wins
    c = _only_mem_util("RTXPRO6000")
    c["nodes"][0]["instances"][0]["npu_mem"]["mem_bw"] = 1000
    assert sim.parse_cluster(c).instances[0].npu_mem.mem_bw_GBps == 1000


def test_the_4090_run_derives_the_same_kv_blocks_from_the_catalogues_memory():
    """The shared RTX 4090 validation cluster with its npu_mem reduced to mem_util: the
    same KV block count as with the file's size and bandwidth (24 GiB, 1,008 GB/s are the
    catalogue's)."""
    from sim.capacity import kv_capacity

    raw = json.loads((SHARED / "validation/RTX4090-Llama-3.1-8B/cluster.json").read_text())
    full = sim.parse_cluster(raw).with_mem_util(0.9)
    for ins in raw["nodes"][0]["instances"]:
        ins["npu_mem"] = {"mem_util": 0.9}
    reduced = sim.parse_cluster(raw)
    opts = sim.SimOptions(max_num_seqs=256, max_num_batched_tokens=2048)
    blocks = [c.budget.num_blocks for c in kv_capacity(reduced, opts)]
    assert blocks == [c.budget.num_blocks for c in kv_capacity(full, opts)] and blocks[0] > 0
