"""Each option is declared once (sim/options.py) and the llmsim flags, the cluster loader's
per-instance keys and dse's knobs follow that declaration (issue #13)."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest
from sim_testkit import cluster_dict

import sim
from sim.errors import InputError
from sim.options import (INSTANCE_OPTIONS, Option, SimOptions, add_cli_flags, declarations,
                         knob_table, options_from_args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_cli_flags(p)
    return p


def test_every_field_is_declared():
    for f in fields(SimOptions):
        assert isinstance(f.metadata.get("option"), Option), f.name
        assert f.metadata["option"].help, f.name


def test_flag_defaults_are_the_option_defaults():
    assert options_from_args(_parser().parse_args([])) == SimOptions()


def test_flags_reach_their_fields():
    args = _parser().parse_args(["--max-num-seqs", "8", "--no-enable-prefix-caching",
                                 "--request-routing-policy", "RR", "--profiles", "a",
                                 "--profiles", "b", "--timeseries-interval-s", "0.5",
                                 "--no-computation-reuse", "--prefix-storage", "CPU"])
    o = options_from_args(args)
    assert (o.max_num_seqs, o.enable_prefix_caching, o.routing_policy) == (8, False, "RR")
    assert o.profiles_dirs == ("a", "b") and o.timeseries_interval_ns == 500_000_000
    assert o.computation_reuse is False and o.prefix_storage == "CPU"


def test_declared_choices_are_checked_by_the_flag():
    with pytest.raises(SystemExit):
        _parser().parse_args(["--all2all-backend", "pplx"])


def test_instance_scope_options_are_the_cluster_override_keys():
    assert set(INSTANCE_OPTIONS) == {n for n, _, _, o in declarations() if o.scope == "instance"}
    raw = cluster_dict()
    raw["nodes"][0]["instances"][0].update(max_num_seqs=7, all2all_backend="naive")
    inst = sim.parse_cluster(raw).instances[0]
    assert inst.overrides == {"max_num_seqs": 7, "all2all_backend": "naive"}
    raw["nodes"][0]["instances"][0]["all2all_backend"] = "pplx"
    with pytest.raises(InputError, match="all2all_backend.*allgather_reducescatter.*pplx"):
        sim.parse_cluster(raw)
    raw["nodes"][0]["instances"][0].pop("all2all_backend")
    raw["nodes"][0]["instances"][0]["routing_policy"] = "RR"  # global: not per instance
    with pytest.raises(InputError, match="unknown field.*routing_policy"):
        sim.parse_cluster(raw)


def test_knobs_follow_the_declarations():
    from dse.space import KNOB_DEFAULTS, KNOB_ORDER, OPTION_KNOBS

    declared = {n: (d, o.knob) for n, _, d, o in declarations() if o.knob is not None}
    assert set(OPTION_KNOBS) == set(declared)
    for name, (default, knob) in declared.items():
        spec = OPTION_KNOBS[name]
        assert spec.to_option(KNOB_DEFAULTS[name]) == default, name
        assert KNOB_ORDER.index(name) > KNOB_ORDER.index(spec.after), name
    assert [k.name for k in knob_table()] == list(declared)


def test_cluster_fields_are_enforced_at_every_level():
    raw = cluster_dict()
    raw["nodes"][0]["instances"][0]["npu_mem"]["mem_utl"] = 0.5  # a typo, not a default
    with pytest.raises(InputError, match=r"npu_mem.*unknown field.*mem_utl.*mem_util"):
        sim.parse_cluster(raw)
