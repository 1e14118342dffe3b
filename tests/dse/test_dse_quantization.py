"""dse knobs for vLLM's --quantization and --kv-cache-dtype (#17)."""

from __future__ import annotations

import pytest
from dse_testkit import write_space

from sim.errors import InputError
from dse.config import sim_options, vllm_command
from dse.space import load_space


def test_quantization_knobs_reach_sim_options_and_the_vllm_command(tmp_path):
    space = load_space(write_space(tmp_path, knobs={"tp": [1, 2], "quantization": ["none", "fp8"],
                                                    "kv_cache_dtype": ["auto", "fp8"]}))
    assert {"quantization", "kv_cache_dtype"} <= set(space.searched_knobs)
    p = space.complete({"tp": 1, "quantization": "fp8", "kv_cache_dtype": "fp8"})
    opts = sim_options(space, p)
    assert opts["quantization"] == "fp8" and opts["kv_cache_dtype"] == "fp8"
    cmd = vllm_command(space, p)
    assert "--quantization fp8" in cmd and "--kv-cache-dtype fp8" in cmd
    plain = space.complete({"tp": 1})
    assert "quantization" not in sim_options(space, plain)
    assert "--quantization" not in vllm_command(space, plain)


@pytest.mark.parametrize("knobs,needle", [({"quantization": ["awq"]}, "awq"),
                                          ({"kv_cache_dtype": ["int4"]}, "int4")])
def test_bad_quantization_knob(tmp_path, knobs, needle):
    with pytest.raises(InputError, match=needle):
        load_space(write_space(tmp_path, knobs=knobs))
