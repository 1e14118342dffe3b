"""The exported ``vllm serve`` lines: flags generated from the declarations of the options
(sim/options.py) and the cluster fields (sim/cluster_schema.py), spelled as vLLM 0.19
spells them, each once."""

from __future__ import annotations

import shlex

import pytest
from dse_testkit import write_space
from sim_testkit import cluster_dict

from dse.config import make_trial_config, vllm_command
from dse.export import deploy_script, servers
from dse.space import load_space
from sim.cluster_schema import Instance, NpuMem, _InstanceFields, vllm_arg, vllm_serve_args
from sim.options import SimOptions, declarations, markdown_reference

#: engine flags of vLLM 0.19's ``vllm serve`` (vllm/engine/arg_utils.py) the simulator models
VLLM_019_FLAGS = {
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
    "--enable-expert-parallel", "--all2all-backend", "--max-num-seqs",
    "--max-num-batched-tokens", "--long-prefill-token-threshold", "--block-size",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--async-scheduling", "--no-async-scheduling",
    "--scheduling-policy", "--max-model-len", "--max-cudagraph-capture-size",
    "--enforce-eager", "--quantization", "--kv-cache-dtype", "--gpu-memory-utilization",
    "--num-gpu-blocks-override", "--disable-custom-all-reduce", "--kv-cache-memory-bytes",
}


def _space(tmp_path, **over):
    base = {"budget": {"total_devices": 8, "devices_per_node": 8}}
    return load_space(write_space(tmp_path, **{**base, **over}))


def _flags(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--")]


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _serve_commands(script: str) -> list[list[str]]:
    return [shlex.split(line.split(" > ")[0]) for line in script.splitlines()
            if "vllm serve" in line]


def test_every_declared_flag_is_a_vllm_019_flag():
    options = [(o.vllm, kind == "bool") for _, kind, _, o in declarations() if o.vllm]
    fields = [(vllm_arg(f), False) for f in _InstanceFields.model_fields.values() if vllm_arg(f)]
    declared = options + fields + [(vllm_arg(NpuMem.model_fields["mem_util"]), False)]
    spelled = set()
    for spec, boolean in declared:
        spelled.add(spec.flag)
        if boolean and spec.negatable:
            spelled.add("--no-" + spec.flag[2:])
        spelled |= {a for _, args in spec.special for a in args}
    assert spelled <= VLLM_019_FLAGS, spelled - VLLM_019_FLAGS
    assert len({s.flag for s, _ in declared}) == len(declared)  # one declaration per flag


def test_a_dense_configuration_gives_the_flags_it_was_simulated_with(tmp_path):
    space = _space(tmp_path, knobs={"tp": [1, 2], "pp": [1, 2], "max_num_seqs": [64, 128],
                                    "enable_prefix_caching": [True, False],
                                    "enable_chunked_prefill": [True, False],
                                    "long_prefill_token_threshold": [0, 512],
                                    "quantization": ["none", "fp8"],
                                    "kv_cache_dtype": ["auto", "fp8"]})
    params = {"tp": 2, "pp": 2, "max_num_seqs": 64, "enable_prefix_caching": False,
              "enable_chunked_prefill": False, "long_prefill_token_threshold": 512,
              "quantization": "fp8", "kv_cache_dtype": "fp8"}
    args = shlex.split(vllm_command(space, params))
    assert args[:3] == ["vllm", "serve", space.model]
    p = space.complete(params)
    want = {"--tensor-parallel-size": "2", "--pipeline-parallel-size": "2",
            "--max-num-seqs": "64", "--max-num-batched-tokens": str(p["max_num_batched_tokens"]),
            "--block-size": str(p["block_size"]), "--long-prefill-token-threshold": "512",
            "--quantization": "fp8", "--kv-cache-dtype": "fp8",
            "--gpu-memory-utilization": "0.9"}
    assert {f: _value(args, f) for f in want} == want
    assert "--no-enable-prefix-caching" in args and "--no-enable-chunked-prefill" in args
    # a dense model: no expert or data parallelism, no all2all backend
    assert not {"--enable-expert-parallel", "--data-parallel-size", "--all2all-backend"} & \
        set(args)
    assert len(_flags(args)) == len(set(_flags(args)))


def test_defaults_leave_out_what_vllm_defaults_to(tmp_path):
    space = _space(tmp_path)
    args = shlex.split(vllm_command(space, {}))
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    for absent in ("--quantization", "--kv-cache-dtype", "--long-prefill-token-threshold",
                   "--max-model-len", "--async-scheduling", "--scheduling-policy",
                   "--enforce-eager", "--num-gpu-blocks-override"):
        assert absent not in args, absent


def test_data_parallel_size_appears_once_with_the_servers_own_size(tmp_path):
    """The bug: vllm_command gave --data-parallel-size from the dp knob and the export added
    the server's own, so each DP server had the flag twice, and a DP group cut short by
    the replica count (3 replicas, dp 2: groups of 2 and 1) claimed 2 ranks."""
    space = _space(tmp_path, model="Qwen/Qwen3-30B-A3B",
                   knobs={"tp": [1, 2], "replicas": [3, 4], "dp": [1, 2], "ep": [1, 4]})
    for replicas, want in ((4, [2, 2]), (3, [2, 1])):
        cfg = make_trial_config(space, 3, {"tp": 2, "replicas": replicas, "dp": 2, "ep": 4})
        assert [s.dp for s in servers(space, cfg)] == want
        cmds = _serve_commands(deploy_script(space, cfg, {"throughput_per_device": 1.0}))
        assert len(cmds) == len(want)
        for c, dp in zip(cmds, want):
            assert len(_flags(c)) == len(set(_flags(c))), c
            if dp > 1:
                assert _value(c, "--data-parallel-size") == str(dp)
                assert _value(c, "--all2all-backend") == "allgather_reducescatter"
            else:  # one rank: neither the flag nor the DP exchange's backend
                assert "--data-parallel-size" not in c and "--all2all-backend" not in c
            assert "--enable-expert-parallel" in c


def _instance(**kw) -> dict:
    inst = dict(cluster_dict()["nodes"][0]["instances"][0])
    inst.update(kw)
    return inst


def test_instance_fields_and_overrides_render_as_vllm_flags():
    args = vllm_serve_args(_instance(max_num_seqs=7, num_gpu_blocks_override=300),
                           SimOptions(max_num_seqs=99, max_model_len=4096))
    assert _value(args, "--max-num-seqs") == "7"  # the instance's own value
    assert _value(args, "--max-model-len") == "4096"
    assert _value(args, "--num-gpu-blocks-override") == "300"
    assert "--data-parallel-size" not in args and "--enable-expert-parallel" not in args


@pytest.mark.parametrize("value,want", [(None, []), (True, ["--async-scheduling"]),
                                        (False, ["--no-async-scheduling"])])
def test_async_scheduling_is_spelled_only_when_set(value, want):
    args = vllm_serve_args(_instance(), SimOptions(async_scheduling=value))
    assert [a for a in args if "async-scheduling" in a] == want


@pytest.mark.parametrize("value,want", [(None, []), (0, ["--enforce-eager"]),
                                        (64, ["--max-cudagraph-capture-size", "64"])])
def test_cudagraph_capture_size_zero_is_eager_mode(value, want):
    args = vllm_serve_args(_instance(), SimOptions(max_cudagraph_capture_size=value))
    got = [a for a in args if a in ("--enforce-eager", "--max-cudagraph-capture-size")]
    assert got == want[:1]
    if value:
        assert _value(args, "--max-cudagraph-capture-size") == "64"


def test_all2all_backend_needs_both_dp_and_ep():
    inst = _instance(ep_size=2, dp_group="A", all2all_backend="naive")
    assert _value(vllm_serve_args(inst, dp_size=2), "--all2all-backend") == "naive"
    assert "--all2all-backend" not in vllm_serve_args(inst, dp_size=1)
    assert "--all2all-backend" not in vllm_serve_args(_instance(dp_group="A"), dp_size=2)


def test_a_bad_instance_is_an_input_error():
    from sim.errors import InputError

    with pytest.raises(InputError, match=r"instance.tp_size: must be >= 1"):
        vllm_serve_args(_instance(tp_size=0))


def test_the_options_reference_has_a_vllm_serve_column():
    rows = markdown_reference().splitlines()
    assert "`vllm serve`" in rows[0]
    row = next(r for r in rows if r.startswith("| `max_cudagraph_capture_size` |"))
    assert "--max-cudagraph-capture-size" in row and "--enforce-eager" in row
    row = next(r for r in rows if r.startswith("| `seed` |"))
    assert "--" not in row.split("|")[5]  # the simulator's seed is not vLLM's
    assert Instance.model_fields["kv_cache_dtype"]  # instance overrides are generated
