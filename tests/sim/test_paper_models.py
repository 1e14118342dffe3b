"""The GPT-3 family specs used by the LLMServingSim paper experiments (profiles/models/GPT3-*)."""

from __future__ import annotations

import pytest

from sim.model import load_model

# name -> nominal parameter count (GPT-3 paper sizes; the 30B is the paper's "GPT-3 30B")
NOMINAL = {"GPT3-7B": 6.7e9, "GPT3-13B": 13e9, "GPT3-30B": 30e9, "GPT3-175B": 175e9}


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_gpt3_spec_loads_and_has_its_nominal_size(name):
    m = load_model(name)
    assert m.architecture == "llama"
    assert m.vocab_size == 50257
    assert m.num_key_value_heads == m.num_attention_heads  # multi-head attention
    assert m.head_dim == 128
    assert m.intermediate_size % 256 == 0
    # the 3-matrix MLP stands in for GPT-3's 2-matrix 4*d MLP: about 8*d^2 parameters
    assert m.mlp_params() == pytest.approx(8 * m.hidden_size ** 2, rel=0.02)
    assert m.param_count() == pytest.approx(NOMINAL[name], rel=0.10)


def test_aliases_resolve_to_the_same_spec():
    assert load_model("gpt3-7b") is load_model("GPT3-7B")
    assert load_model("gpt3-175b").num_hidden_layers == 96
