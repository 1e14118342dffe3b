"""experiments/validate_vllm.py replays a run with the engine settings the run used.

Every scheduling, cache, parallelism and graph setting vLLM records for a run (its
resolved config, else its engine arguments) reaches the replay; a run whose meta.json and
cluster file describe different deployments, or which used a feature the simulator does
not model, is refused with the field named (exit 2, one line). Before, only the batching
limits, block size, prefix caching, max_model_len, async scheduling and the MoE exchange
were read: a run with a prefill cap, chunked prefill off, the priority policy, an FP8 KV
cache or eager mode was replayed as the default engine.
"""

from __future__ import annotations

import json
import shutil

import pytest

import sim
from tests.sim.test_cli_malformed_inputs import SHARED, _no_simulation, assert_one_line

RTX4090 = SHARED / "validation" / "RTX4090-Llama-3.1-8B"
MOE = SHARED / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"


def _case(tmp_path, src, edit):
    if not src.is_dir():
        pytest.skip("needs ../shared/data/validation")
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    meta = json.loads((dst / "vllm" / "meta.json").read_text())
    edit(meta)
    (dst / "vllm" / "meta.json").write_text(json.dumps(meta))
    return dst


def _replayed_options(tmp_path, monkeypatch, src, edit):
    from experiments.validate_vllm import run_validation

    seen = []
    monkeypatch.setattr(sim, "simulate",
                        lambda cluster, wl, opts: seen.append((cluster, opts)) or "result")
    run_validation(_case(tmp_path, src, edit))
    return seen[0]


def test_resolved_scheduler_cache_and_graph_settings_reach_the_replay(tmp_path, monkeypatch):
    def edit(meta):
        rc = meta["resolved_config"]
        rc["scheduler_config"].update(long_prefill_token_threshold=256,
                                      enable_chunked_prefill=False, policy="priority",
                                      scheduler_reserve_full_isl=False, async_scheduling=False)
        rc["cache_config"].update(cache_dtype="fp8", enable_prefix_caching=False,
                                  block_size=32, num_gpu_blocks_override=1000)
        rc["model_config"]["enforce_eager"] = True
        rc["parallel_config"]["disable_custom_all_reduce"] = True

    cluster, opts = _replayed_options(tmp_path, monkeypatch, RTX4090, edit)
    assert opts.long_prefill_token_threshold == 256
    assert opts.enable_chunked_prefill is False
    assert opts.scheduling_policy == "priority"
    assert opts.reserve_full_isl is False and opts.async_scheduling is False
    assert opts.kv_cache_dtype == "fp8" and opts.enable_prefix_caching is False
    assert opts.block_size == 32
    assert opts.max_cudagraph_capture_size == 0  # eager: no CUDA graphs
    assert opts.disable_custom_all_reduce is True
    assert {i.num_gpu_blocks_override for i in cluster.instances} == {1000}
    assert {i.npu_mem.mem_util for i in cluster.instances} == {0.9}


def test_kv_cache_memory_bytes_reaches_the_cluster(tmp_path, monkeypatch):
    def edit(meta):
        meta["resolved_config"]["cache_config"]["kv_cache_memory_bytes"] = 8 << 30

    cluster, _ = _replayed_options(tmp_path, monkeypatch, RTX4090, edit)
    assert {i.kv_cache_memory_bytes for i in cluster.instances} == {8 << 30}


def test_engine_arguments_serve_where_no_resolved_config(tmp_path, monkeypatch):
    def edit(meta):
        del meta["resolved_config"]
        meta["engine_kwargs"].update(long_prefill_token_threshold=512, kv_cache_dtype="fp8",
                                     enforce_eager=True, scheduling_policy="priority")

    _, opts = _replayed_options(tmp_path, monkeypatch, RTX4090, edit)
    assert (opts.long_prefill_token_threshold, opts.kv_cache_dtype,
            opts.max_cudagraph_capture_size, opts.scheduling_policy) == (512, "fp8", 0,
                                                                         "priority")


def test_the_shared_runs_replay_with_their_own_settings(tmp_path, monkeypatch):
    """The two shared cases pass the parallelism check and keep their settings."""
    cluster, opts = _replayed_options(tmp_path, monkeypatch, RTX4090, lambda m: None)
    assert (opts.max_num_seqs, opts.max_num_batched_tokens, opts.max_model_len) == (
        256, 2048, 32768)
    assert opts.async_scheduling is True and opts.max_cudagraph_capture_size == 512
    cluster, opts = _replayed_options(tmp_path / "moe", monkeypatch, MOE, lambda m: None)
    assert (opts.max_num_seqs, opts.max_num_batched_tokens) == (128, 2048)
    assert opts.max_cudagraph_capture_size is None  # left to vLLM's default


def _refused(tmp_path, monkeypatch, capsys, src, edit, needles):
    from experiments.validate_vllm import main as validate_main

    monkeypatch.setattr(sim, "simulate", _no_simulation)
    folder = _case(tmp_path, src, edit)
    assert_one_line(capsys, validate_main([str(folder)]), "validate_vllm", needles)


@pytest.mark.parametrize("edit,needles", [
    (lambda m: m["engine_kwargs"].update(tensor_parallel_size=2) or m.pop("resolved_config"),
     ["tensor_parallel_size is 2", "instance 0", "has 1", "cluster.json"]),
    (lambda m: m["resolved_config"]["parallel_config"].update(pipeline_parallel_size=2),
     ["pipeline_parallel_size is 2", "different deployments"]),
    (lambda m: m["resolved_config"].update(speculative_config={"method": "ngram"}),
     ["resolved_config.speculative_config", "does not model"]),
    (lambda m: m["resolved_config"]["parallel_config"].update(enable_eplb=True),
     ["resolved_config.parallel_config.enable_eplb", "does not model"]),
    (lambda m: m["resolved_config"]["scheduler_config"].update(policy="lifo"),
     ["meta.json", "lifo", "fcfs"]),
], ids=["tp-differs", "pp-differs", "speculative", "eplb", "bad-policy"])
def test_runs_that_cannot_be_replayed_like_for_like_are_refused(tmp_path, monkeypatch, capsys,
                                                                edit, needles):
    _refused(tmp_path, monkeypatch, capsys, RTX4090, edit, needles)


def test_moe_run_without_expert_parallel_in_its_cluster_is_refused(tmp_path, monkeypatch,
                                                                   capsys):
    """The DP2 x EP2 run against a cluster file whose instances have no expert
    parallelism (ep_size 1): the run's ep is dp x tp = 2."""
    def edit_cluster(folder):
        raw = json.loads((folder / "cluster.json").read_text())
        for ins in raw["nodes"][0]["instances"]:
            ins["ep_size"] = 1
        (folder / "cluster.json").write_text(json.dumps(raw))

    from experiments.validate_vllm import main as validate_main

    monkeypatch.setattr(sim, "simulate", _no_simulation)
    folder = _case(tmp_path, MOE, lambda m: None)
    edit_cluster(folder)
    assert_one_line(capsys, validate_main([str(folder)]), "validate_vllm",
                    ["ep_size", "is 2", "has 1"])
