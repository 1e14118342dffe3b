"""The hardware catalogue: every file loads, names resolve, bad files are named."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from sim.errors import InputError
from sim.hardware import REQUIRED_FIELDS, clear_cache, hardware_dir, known_hardware, load_hardware

EXPECTED = {"A100-80G-SXM", "H100-SXM", "H200-SXM", "B200", "L40S", "RTX4090", "RTXPRO6000",
            "NPU", "PIM"}


def test_catalogue_has_every_device_and_sane_numbers():
    names = set(known_hardware())
    assert EXPECTED <= names
    for name in names:
        hw = load_hardware(name)
        assert hw.peak_flops("bfloat16") > 0
        assert hw.mem_bw_GBps > 0 and hw.mem_size_GiB > 0
        assert hw.power_tdp_W >= hw.power_idle_W > 0
        assert hw.link_bw_GBps > 0 and hw.link_latency_ns > 0


def test_datasheet_orderings():
    h100, h200, a100 = load_hardware("H100-SXM"), load_hardware("H200-SXM"), load_hardware("A100")
    assert h200.mem_bw_GBps > h100.mem_bw_GBps > a100.mem_bw_GBps
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=0.01)
    # The paper NPU: 128x128 systolic array at 1 GHz
    assert load_hardware("NPU").peak_flops("fp16") == pytest.approx(2 * 128 * 128 * 1e9, rel=1e-3)


def test_aliases_and_case_resolve_to_canonical_names():
    assert load_hardware("H100").name == "H100-SXM"
    assert load_hardware("a100").name == "A100-80G-SXM"
    assert load_hardware("rtx4090").name == "RTX4090"
    assert load_hardware("RTXPRO6000").name == "RTXPRO6000"


def test_unknown_name_lists_known_ones():
    with pytest.raises(InputError) as exc:
        load_hardware("TPU-v9", source="cluster.json")
    msg = str(exc.value)
    assert "cluster.json" in msg and "TPU-v9" in msg
    assert "H100-SXM" in msg and "RTX4090" in msg


@pytest.mark.parametrize("missing", ["mem_bw_GBps", "peak_tflops", "power_tdp_W"])
def test_missing_field_names_file_and_field(tmp_path, monkeypatch, missing):
    hw = tmp_path / "hardware"
    hw.mkdir()
    data = yaml.safe_load((hardware_dir() / "H100-SXM.yaml").read_text())
    del data[missing]
    (hw / "Broken.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("LLMSIM_PROFILES_ROOT", str(tmp_path))
    clear_cache()
    try:
        with pytest.raises(InputError) as exc:
            load_hardware("H100-SXM")
    finally:
        clear_cache()
    assert "Broken.yaml" in str(exc.value) and missing in str(exc.value)


def test_loader_takes_a_directory(tmp_path):
    shutil.copy(hardware_dir() / "L40S.yaml", tmp_path / "L40S.yaml")
    assert known_hardware(tmp_path) == ["L40S"]
    assert load_hardware("L40S", directory=tmp_path).mem_size_GiB == 48
    with pytest.raises(InputError, match="known: L40S"):
        load_hardware("H100", directory=tmp_path)


def test_required_fields_present_in_every_file():
    for f in hardware_dir().glob("*.yaml"):
        data = yaml.safe_load(f.read_text())
        assert all(k in data for k in REQUIRED_FIELDS), f


def test_gpus_carry_their_sm_count():
    """num_sms (CUDA's multi_processor_count): vLLM sizes per-SM scratch by it (the Triton
    top-k/top-p sampler's rows); every NVIDIA GPU in the catalogue has it."""
    expected = {"RTX4090": 128, "H100-SXM": 132, "H200-SXM": 132, "A100-80G-SXM": 108,
                "B200": 148, "L40S": 142, "RTXPRO6000": 188}
    for name, sms in expected.items():
        assert load_hardware(name).num_sms == sms
    assert load_hardware("NPU").num_sms is None


def _load_with(tmp_path, monkeypatch, field: str, value) -> str:
    """The error loading the H100's catalogue entry with ``field`` set to ``value`` (written
    as Broken.yaml in a profiles root of its own)."""
    hw = tmp_path / "hardware"
    hw.mkdir()
    data = yaml.safe_load((hardware_dir() / "H100-SXM.yaml").read_text())
    data[field] = value
    (hw / "Broken.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("LLMSIM_PROFILES_ROOT", str(tmp_path))
    clear_cache()
    try:
        with pytest.raises(InputError) as exc:
            load_hardware("H100-SXM")
    finally:
        clear_cache()
    assert "Broken.yaml" in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize("bad", [0, -4, 1.5, "many", True])
def test_bad_num_sms_names_the_field(tmp_path, monkeypatch, bad):
    assert re.search("num_sms.*positive integer", _load_with(tmp_path, monkeypatch, "num_sms", bad))


@pytest.mark.parametrize("bad", [
    [[256, 4.2]],                                  # not a mapping by TP degree
    {1: [[256, 4.2], [512, 4.3]]},                 # a TP degree below 2
    {2: [[256, 4.2]]},                             # one point
    {2: [[512, 4.2], [256, 4.3]]},                 # sizes not increasing
    {2: [[256, -1.0], [512, 4.3]]},                # a time not positive
    {2: [[256, "fast"], [512, 4.3]]},
])
def test_bad_all_reduce_curve_names_the_field(tmp_path, monkeypatch, bad):
    assert "vllm_all_reduce_us" in _load_with(tmp_path, monkeypatch, "vllm_all_reduce_us", bad)


@pytest.mark.parametrize("bad", [
    [[512, 5.3]],                                              # not a mapping by collective
    {"all_to_all": {2: [[512, 5.3], [1024, 5.4]]}},            # a collective not allowed
    {"all_gather": [[512, 5.3], [1024, 5.4]]},                 # not a mapping by GPU count
    {"all_gather": {1: [[512, 5.3], [1024, 5.4]]}},            # fewer than 2 GPUs
    {"all_gather": {2: [[1024, 5.3], [512, 5.4]]}},            # sizes not increasing
    {"reduce_scatter": {2: [[512, 0], [1024, 5.4]]}},          # a time not positive
])
def test_bad_nccl_curve_names_the_field(tmp_path, monkeypatch, bad):
    assert "nccl_us" in _load_with(tmp_path, monkeypatch, "nccl_us", bad)


def test_nccl_curves_are_aiconfigurators_measured_ones():
    """The catalogue's ``nccl_us`` is aiconfigurator's NCCL all-gather / reduce-scatter as
    ``moe_exchange_vs_nccl.py --catalogue`` prints it: every card the experiment covers,
    every GPU count it does not leave out, every point."""
    pytest.importorskip("aiconfigurator_core", reason="needs the aic extra")
    from experiments.moe_exchange_vs_nccl import HARDWARE, LEFT_OUT, OPS, curve_points, nccl_table

    for name in HARDWARE:
        _, table = nccl_table(name)
        measured = {op: {n: curve_points(table, op, n) for o, n in table
                         if o == op and n not in LEFT_OUT.get(name, ())} for op in OPS}
        assert load_hardware(name).nccl_us == measured, name


def test_all_reduce_curves_are_vllms_measured_ones():
    """The catalogue's ``vllm_all_reduce_us`` is aiconfigurator's measured vLLM 0.19
    all-reduce in a CUDA graph, as ``tp_allreduce_vs_vllm.py --catalogue`` prints it: every
    card the experiment covers, every TP degree measured, every point (3 decimals of us)."""
    pytest.importorskip("aiconfigurator_core", reason="needs the aic extra")
    from experiments.tp_allreduce_vs_vllm import HARDWARE, graph_points, vllm_table

    for name in HARDWARE:
        table = vllm_table(name)
        measured = {tp: graph_points(table, tp) for kind, tp in table
                    if kind == "vLLM_custom_graph"}
        assert load_hardware(name).vllm_all_reduce_us == measured, name
