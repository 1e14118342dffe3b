"""Shared helpers for the simulator tests: a tiny synthetic profile bundle with simple
linear times, clusters sized to an exact number of KV blocks, and small workloads.

Plain functions and constants; ``tests/conftest.py`` wraps them in fixtures. ``tests`` is on
pytest's ``pythonpath``, so test files import them as ``from sim_testkit import ...``.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import yaml

import sim
from sim.cluster import GiB
from sim.hardware import load_hardware
from sim.memory import (NON_TORCH_COMM_BYTES, activation_peak_bytes, device_traits,
                        weight_bytes)
from sim.model import HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec, load_model
from sim.request import Request

MODEL = "meta-llama/Llama-3.1-8B"
HW = "TESTHW"

# The synthetic bundle's grids.
DENSE_TOKENS = (1, 16, 64, 256, 1024, 2048)
SEQS = (1, 4, 16, 64, 256)
ATTN_PC = (0, 256, 2048)
ATTN_KP = (0, 1024, 8192)
ATTN_ND = (0, 16, 256)
ATTN_KD = (0, 1024, 8192)


#: a node power block (LLMServingSim's format) for H100-SXM nodes
POWER = {"base_node_power": 60,
         "npu": {"H100-SXM": {"idle_power": 70, "standby_power": 300, "active_power": 700,
                              "standby_duration": 18}},
         "cpu": {"idle_power": 10, "active_power": 200, "util": 0.15},
         "dram": {"dimm_size": 32, "idle_power": 2.0, "energy_per_bit": 6.0},
         "link": {"num_links": 1, "idle_power": 5, "energy_per_bit": 4.0},
         "nic": {"num_nics": 1, "idle_power": 20},
         "storage": {"num_devices": 2, "idle_power": 5}}


def dense_us(tokens: float) -> float:
    """Time (us) of every dense layer of the synthetic bundle."""
    return 1.0 + 0.001 * tokens


def per_seq_us(seqs: float) -> float:
    return 2.0 + 0.01 * seqs


def attn_us(pc: float, kp: float, nd: float, kd: float) -> float:
    """Multilinear in the four axes, so multilinear interpolation reproduces it exactly."""
    return 2.0 + 0.002 * pc + 0.0001 * kp + 0.01 * nd + 0.0001 * nd * kd


def make_bundle(root: Path, hardware: str = HW, model: ModelSpec | str = MODEL, tp: int = 1,
                *, omit_dense_layer: str | None = None, omit_seq_layer: str | None = None,
                dense_tokens=DENSE_TOKENS, dense_fn=None, seq_fn=None, attn_fn=None) -> Path:
    """Write a synthetic profile bundle under ``root`` and return its variant folder
    (``root/<hardware>/<model name>/bf16``). Pass ``root`` as a ``profiles_dirs`` entry.
    ``dense_fn``/``seq_fn``/``attn_fn`` replace the default time functions (microseconds)."""
    dense_fn = dense_fn or dense_us
    seq_fn = seq_fn or per_seq_us
    attn_fn = attn_fn or attn_us
    spec = load_model(model) if isinstance(model, str) else model
    variant = root / hardware / spec.name / "bf16"
    tp_dir = variant / f"tp{tp}"
    tp_dir.mkdir(parents=True, exist_ok=True)
    (variant / "meta.yaml").write_text(yaml.safe_dump({
        "hardware": hardware, "model": spec.name, "variant": "bf16", "tp_degrees": [tp],
        "architecture": spec.architecture, "synthetic": True}))
    dense_layers = sorted({*PROLOGUE, *HEAD_DENSE,
                           *(n for n in spec.block_sequence if n not in ("attention", "moe"))})
    lines = ["layer,tokens,time_us"]
    for layer in dense_layers:
        if layer == omit_dense_layer:
            continue
        lines += [f"{layer},{t},{dense_fn(t)}" for t in dense_tokens]
    (tp_dir / "dense.csv").write_text("\n".join(lines) + "\n")
    lines = ["layer,sequences,time_us"]
    for layer in HEAD_PER_SEQUENCE:
        if layer == omit_seq_layer:
            continue
        lines += [f"{layer},{s},{seq_fn(s)}" for s in SEQS]
    (tp_dir / "per_sequence.csv").write_text("\n".join(lines) + "\n")
    lines = ["prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"]
    for pc in ATTN_PC:
        for nd in ATTN_ND:
            for kp in ATTN_KP:
                for kd in ATTN_KD:
                    lines.append(f"{pc},{kp},{nd},{kd},{attn_fn(pc, kp, nd, kd)}")
    (tp_dir / "attention.csv").write_text("\n".join(lines) + "\n")
    return variant


def mem_size_for_blocks(num_blocks: int, block_size: int = 16, model: str = MODEL,
                        tp: int = 1, max_num_batched_tokens: int = 2048,
                        max_num_seqs: int = 256, hardware: str = HW) -> float:
    """npu_mem.mem_size (GiB, with mem_util 1.0) that yields exactly ``num_blocks`` KV blocks
    under vLLM's accounting (sim/memory.py) at these engine limits, on a device outside the
    catalogue (``hardware``: no share of the memory hidden from CUDA)."""
    spec = load_model(model)
    device = device_traits(hardware)
    fixed = (weight_bytes(spec, tp, 1, 1)
             + activation_peak_bytes(spec, tp, 1, max_num_batched_tokens, max_num_seqs, device)
             + device.non_torch_bytes + (NON_TORCH_COMM_BYTES if tp > 1 else 0))
    block_bytes = spec.kv_bytes_per_token(tp, 1) * block_size
    return (fixed + (num_blocks + 0.5) * block_bytes) / GiB


def util_with_overhead(util: float, mem_size_gib: float, model: str = MODEL, *,
                       hardware: str) -> float:
    """The gpu_memory_utilization that leaves the KV pool ``util x mem_size_gib`` less the
    parameters: vLLM's accounting also takes the rotary table, the profile-run activation
    peak at the default limits and non-torch memory, and its fraction is of what CUDA
    reports (the hardware's share of the nominal size). A tight-memory test keeps the KV
    pool it was written for."""
    spec = load_model(model)
    device = device_traits(hardware)
    extra = (weight_bytes(spec, 1, 1, 1) - spec.weight_bytes(1, 1, 1)
             + activation_peak_bytes(spec, 1, 1, 2048, 256, device) + device.non_torch_bytes)
    visible = load_hardware(hardware).mem_visible_fraction
    return (util + extra / (mem_size_gib * GiB)) / visible


def cluster_dict(num_blocks: int = 400, instances: int = 1, block_size: int = 16,
                 hardware: str = HW, model: str = MODEL, **inst_extra) -> dict:
    inst = {"model_name": model, "hardware": hardware,
            "npu_mem": {"mem_size": mem_size_for_blocks(num_blocks, block_size, model),
                        "mem_bw": 1000, "mem_latency": 0, "mem_util": 1.0},
            # The memory above holds these blocks at the default engine limits; the override
            # keeps the count when a test changes max_num_seqs/max_num_batched_tokens (which
            # move vLLM's profile-run activation peak).
            "num_gpu_blocks_override": num_blocks,
            "num_npus": 1, "tp_size": 1, **inst_extra}
    return {"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": instances, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [json.loads(json.dumps(inst)) for _ in range(instances)]}]}


def make_cluster(num_blocks: int = 400, instances: int = 1, block_size: int = 16,
                 **kw) -> sim.ClusterConfig:
    return sim.parse_cluster(cluster_dict(num_blocks, instances, block_size, **kw))


def opts_for(profiles_root: Path, **kw) -> sim.SimOptions:
    return sim.SimOptions(profiles_dirs=(str(profiles_root),), latency_provider="measured", **kw)


def flat_workload(specs, ids=None) -> sim.Workload:
    """``specs``: list of (arrival_ns, input_len, output_len); ``ids``: optional list of
    input token-id lists (same length)."""
    reqs = []
    for i, (arr, n_in, n_out) in enumerate(specs):
        reqs.append(Request(i, arr, n_in, n_out,
                            input_ids=None if ids is None else list(ids[i])))
    return sim.Workload(reqs, source="<test>")


@contextmanager
def edited_hardware_catalogue(tmp_path: Path, monkeypatch, name: str, old: str, new: str):
    """Inside: the project's profiles folder, copied under ``tmp_path`` with ``old``
    replaced by ``new`` in ``hardware/<name>``, is the one the simulator reads (no bundle
    cache); the catalogue is reloaded on entry and on exit."""
    root = tmp_path / "profiles"
    shutil.copytree(Path(__file__).resolve().parent.parent / "profiles", root)
    f = root / "hardware" / name
    f.write_text(f.read_text().replace(old, new))
    monkeypatch.setenv("LLMSIM_PROFILES_ROOT", str(root))
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    sim.hardware.clear_cache()
    try:
        yield f
    finally:
        sim.hardware.clear_cache()
