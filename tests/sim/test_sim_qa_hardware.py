"""QA: a hardware catalogue entry (profiles/hardware/*.yaml, which users add and edit) is
checked as the cluster file is: every number finite and in range, the sizes and
bandwidths the simulator divides by above 0, aliases a list of names. Before, a YAML
``.nan`` or ``.inf``, a zero bandwidth or a number given as aliases passed the loader and
failed later as a ValueError, OverflowError, ZeroDivisionError or TypeError traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from sim_testkit import edited_hardware_catalogue

import sim
from sim.cli import main
from sim.hardware import _from_mapping

REPO = Path(__file__).resolve().parents[2]
GOOD = yaml.safe_load((REPO / "profiles/hardware/RTXPRO6000.yaml").read_text())


def _spec(**change):
    d = json.loads(json.dumps(GOOD))
    for k, v in change.items():
        if "." in k:
            outer, inner = k.split(".")
            d[outer][inner] = v
        else:
            d[k] = v
    return d


@pytest.mark.parametrize("field,value,needles", [
    ("mem_size_GiB", math.nan, ["'mem_size_GiB'", "finite", "> 0"]),
    ("mem_size_GiB", 0, ["'mem_size_GiB'", "> 0", "got 0"]),
    ("mem_bw_GBps", 0, ["'mem_bw_GBps'", "> 0", "got 0"]),
    ("mem_bw_GBps", math.nan, ["'mem_bw_GBps'", "nan"]),
    ("mem_bw_GBps", math.inf, ["'mem_bw_GBps'", "inf"]),
    ("link_bw_GBps", 0, ["'link_bw_GBps'", "> 0"]),
    ("link_latency_ns", math.nan, ["'link_latency_ns'", ">= 0"]),
    ("power_tdp_W", 1e300, ["'power_tdp_W'", "1e+15"]),
    ("scale_out_bw_GBps", 0, ["'scale_out_bw_GBps'", "> 0"]),
    ("mem_reported_bytes", math.nan, ["'mem_reported_bytes'", "integer"]),
    ("mem_reported_bytes", math.inf, ["'mem_reported_bytes'", "integer"]),
    ("mem_reported_bytes", 1.5, ["'mem_reported_bytes'", "integer"]),
    ("clock_GHz", math.nan, ["'clock_GHz'"]),
    ("price_per_hour_usd", math.inf, ["'price_per_hour_usd'"]),
    ("peak_tflops.bf16", math.nan, ["'peak_tflops.bf16'", "positive"]),
    ("peak_tflops.bf16", math.inf, ["'peak_tflops.bf16'", "positive"]),
    ("aliases", -1, ["'aliases'", "list of names", "-1"]),
    ("aliases", True, ["'aliases'", "list of names"]),
    ("aliases", [1, None], ["'aliases'", "list of names"]),
    ("name", None, ["'name'", "a name"]),
    ("name", "", ["'name'", "a name"]),
    ("pim_mem_GiB", math.nan, ["'pim_mem_GiB'"]),
    ("measured_link_bw_GiBps", 0, ["'measured_link_bw_GiBps'", "> 0"]),
    ("measured_link_latency_ns", -1, ["'measured_link_latency_ns'", ">= 0"]),
    ("measured_link_latency_ns", None, ["'measured_link_bw_GiBps'", "needs its pair"]),
    # a misspelt optional field was ignored (the default taken silently), and the text
    # fields took any value (a mapping read as the text "{}")
    ("devices_per_nod", 4, ["unknown field 'devices_per_nod'", "devices_per_node",
                            "vllm_all_reduce_us"]),
    ("measured_mem_bw_GBPs", 1500, ["unknown field 'measured_mem_bw_GBPs'"]),
    ("kind", {}, ["'kind'", "a string", "{}"]),
    ("vendor", [1], ["'vendor'", "a string"]),
    ("link_type", 5, ["'link_type'", "a string"]),
    ("scale_out_type", True, ["'scale_out_type'", "a string"]),
    ("compute_capability", [9, 0], ["'compute_capability'", "'12.0'"]),
])
def test_catalogue_entry_refused(field, value, needles):
    with pytest.raises(sim.InputError) as exc:
        _from_mapping(_spec(**{field: value}), "hw.yaml")
    msg = str(exc.value)
    assert msg.startswith("hw.yaml: "), msg
    for n in needles:
        assert n in msg, (n, msg)


def test_good_entries_still_load():
    for f in sorted((REPO / "profiles/hardware").glob("*.yaml")):
        _from_mapping(yaml.safe_load(f.read_text()), str(f))


def test_llmsim_run_with_a_broken_catalogue_is_one_line(tmp_path, capsys, monkeypatch):
    # the whole profiles folder, with the RTX PRO 6000 entry's bandwidth as YAML .nan
    with edited_hardware_catalogue(tmp_path, monkeypatch, "RTXPRO6000.yaml",
                                   "\nmem_bw_GBps: ", "\nmem_bw_GBps: .nan #"):
        rc = main(["run", "--cluster", str(REPO / "../shared/data/llmservingsim-configs/"
                                           "cluster/single_node_single_instance.json"),
                   "--dataset", str(REPO / "../shared/data/workloads/example_trace.jsonl"),
                   "--output", str(tmp_path / "o.csv"), "--latency-provider", "roofline"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "RTXPRO6000.yaml" in err and "mem_bw_GBps" in err, err
