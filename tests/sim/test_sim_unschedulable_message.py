"""The refusal for a request that can never be scheduled again says what it must
recompute. Without chunked prefill, a request preempted after generating tokens must
recompute its prompt and those tokens in one step; when that passes the token budget it
can never run again (vLLM would wait for ever; the simulator stops with an error). The
message used to call the whole recompute a prompt ("request 1 has a 17-token prompt"),
which the user's workload contradicts (its prompt has 8 tokens)."""

from __future__ import annotations

import pytest
from sim_testkit import cluster_dict, flat_workload, mem_size_for_blocks

import sim
from sim.errors import InputError


def _tiny_cluster(num_blocks: int, budget: int):
    cd = cluster_dict(num_blocks, 1, 16)
    cd["nodes"][0]["instances"][0]["npu_mem"]["mem_size"] = mem_size_for_blocks(
        num_blocks, 16, max_num_batched_tokens=budget, max_num_seqs=2)
    return sim.parse_cluster(cd)


def test_preempted_request_past_the_budget_is_described_as_prompt_plus_outputs(sim_opts):
    opts = sim_opts(enable_chunked_prefill=False, max_num_batched_tokens=10, max_num_seqs=2,
                    async_scheduling=False)
    with pytest.raises(InputError) as e:
        sim.simulate(_tiny_cluster(4, 10), flat_workload([(0, 8, 30), (0, 8, 30)]), opts)
    msg = str(e.value)
    assert "request 1" in msg and "8-token prompt" in msg, msg
    assert "9 generated tokens" in msg and "17 tokens in one step" in msg, msg
    assert "17-token prompt" not in msg, msg
    assert "max_num_batched_tokens=10" in msg and "chunked prefill" in msg, msg


def test_prompt_alone_past_the_budget_keeps_the_prompt_wording(sim_opts):
    opts = sim_opts(enable_chunked_prefill=False, max_num_batched_tokens=10, max_num_seqs=2,
                    async_scheduling=False)
    with pytest.raises(InputError) as e:
        sim.simulate(_tiny_cluster(16, 10), flat_workload([(0, 12, 4)]), opts)
    msg = str(e.value)
    assert "request 0 has a 12-token prompt" in msg and "generated" not in msg, msg
