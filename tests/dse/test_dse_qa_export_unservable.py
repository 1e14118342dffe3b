"""``best/*.serve.sh`` of a configuration vLLM cannot run as simulated says so. Before, an
NPU+PIM configuration with pim_mode pool and sub-batch interleaving was exported as plain
``CUDA_VISIBLE_DEVICES=... vllm serve`` lines (the PIM settings silently dropped), as if
running it reproduced the simulated numbers."""

from __future__ import annotations

from pathlib import Path

from dse.config import make_trial_config
from dse.export import deploy_script
from dse.space import load_space

ROOT = Path(__file__).resolve().parents[2]


def _script(space_file, params):
    space = load_space(ROOT / "search_spaces" / space_file)
    cfg = make_trial_config(space, 3, params)
    return deploy_script(space, cfg, {"throughput_per_device": 1.0})


def test_pim_configuration_says_what_vllm_cannot_run():
    text = _script("pim.yaml", {"hardware": "NPU+PIM", "tp": 4, "pim_mode": "pool",
                                "sub_batch_interleaving": True, "max_num_seqs": 64})
    head = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any("NPU+PIM is a modelled device" in ln and "not one vLLM runs on" in ln
               for ln in head), head
    assert any("pim_mode pool" in ln and "sub-batch interleaving" in ln
               and "no vLLM flag" in ln for ln in head), head


def test_npu_without_pim_says_only_the_device():
    text = _script("pim.yaml", {"hardware": "NPU", "tp": 2, "max_num_seqs": 64})
    assert "NPU is a modelled device" in text and "pim_mode" not in text


def test_gpu_configuration_has_no_such_note():
    text = _script("quickstart.yaml", {"tp": 2, "replicas": 2})
    assert "modelled device" not in text and "no vLLM flag" not in text
