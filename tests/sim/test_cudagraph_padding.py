"""vLLM 0.19 runs a step of at most max_cudagraph_capture_size tokens as the CUDA graph
captured for the next capture size (CudagraphDispatcher._bs_to_padded_graph_size; FULL for
uniform decode, PIECEWISE for mixed batches): the token-wise layers and the TP all-reduces
run over the padded rows, attention over the real requests, lm_head and the sampler over
the rows that produce logits. The measured bundles are eager (enforce_eager: true), keyed
on the real token count, so the simulator pads the lookups."""

from __future__ import annotations

from dataclasses import replace

import pytest

import sim
from sim.backend import _act_bytes
from sim.engine import build_instances, cudagraph_padding
from sim.latency.base import BatchShape, load_providers
from sim.model import load_model
from sim.paths import shared_data_root

BUNDLE = shared_data_root() / "profiles" / "RTX4090"


def _decode(n: int, kv: int = 1000) -> BatchShape:
    return BatchShape(n, n, 0, 0, n, n * kv, kv, kv, 0, n * kv * kv)


def test_padding_table_is_vllms_capture_sizes():
    pad = cudagraph_padding(sim.SimOptions(max_num_seqs=256))
    assert len(pad) == 513  # min(2 x 256, 512) + 1
    assert [pad[t] for t in (1, 2, 3, 4, 5, 8, 9, 129, 255, 256, 257, 272, 273, 512)] == \
        [1, 2, 4, 4, 8, 8, 16, 136, 256, 256, 272, 272, 288, 512]
    assert len(cudagraph_padding(sim.SimOptions(max_num_seqs=64))) == 129
    assert cudagraph_padding(sim.SimOptions(max_cudagraph_capture_size=0)) is None  # eager


@pytest.fixture(scope="module")
def providers():
    if not BUNDLE.is_dir():
        pytest.skip("needs ../shared/data/profiles")
    model = load_model("meta-llama/Llama-3.1-8B")
    reg = load_providers()
    eager = reg.create("measured", model, "RTX4090", 1)
    graphs = reg.create("measured", model, "RTX4090", 1)
    graphs.set_cudagraph_padding(cudagraph_padding(sim.SimOptions(max_num_seqs=256)))
    return eager, graphs


def test_a_step_costs_its_token_wise_layers_at_the_capture_size(providers):
    eager, graphs = providers
    shape = _decode(129)
    # the dense layers at 136 rows, attention and the logits rows (129) as they are
    want = eager.iteration_ns(shape) - eager._dense_total[129] + eager._dense_total[136]
    assert graphs.iteration_ns(shape) == want != eager.iteration_ns(shape)
    assert graphs.layer_times(shape).total_ns() == want
    lt_e, lt_g = eager.layer_times(shape), graphs.layer_times(shape)
    assert dict(lt_g.block)["attention"] == dict(lt_e.block)["attention"]
    assert dict(lt_g.head)["sampler"] == dict(lt_e.head)["sampler"]
    assert dict(lt_g.head)["lm_head"] == dict(lt_e.head)["lm_head"]
    # a capture size is not padded; a step above the largest runs at its own count
    assert graphs.iteration_ns(_decode(136)) == eager.iteration_ns(_decode(136))
    mixed = BatchShape(1000, 3, 1000, 0, 0, 0, 0, 0)
    assert graphs.iteration_ns(mixed) == eager.iteration_ns(mixed)


def test_decode_stretches_equal_the_padded_steps(providers):
    _, graphs = providers
    shape = _decode(129)
    stretch = graphs.decode_stretch(shape, 8)
    assert stretch is not None
    steps = [graphs.iteration_ns(replace(shape, decode_kv_sum=shape.decode_kv_sum + 129 * j,
                                         decode_kv_max=1000 + j, decode_kv_min=1000 + j,
                                         decode_kv_sq_sum=129 * (1000 + j) ** 2))
             for j in range(8)]
    assert stretch.durations == steps


def test_tp_all_reduce_moves_the_padded_rows():
    c = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "RTXPRO6000",
                       "npu_mem": {"mem_size": 96, "mem_bw": 1597, "mem_latency": 0},
                       "num_npus": 2, "tp_size": 2}]}]})
    graphs = build_instances(c, sim.SimOptions(latency_provider="roofline"))[0]
    eager = build_instances(c, sim.SimOptions(latency_provider="roofline",
                                              max_cudagraph_capture_size=0))[0]
    assert _act_bytes(graphs, _decode(100)) == 104 * 4096 * 2
    assert _act_bytes(eager, _decode(100)) == 100 * 4096 * 2
    assert _act_bytes(graphs, BatchShape(600, 1, 600)) == 600 * 4096 * 2
