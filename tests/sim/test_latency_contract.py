"""The latency-provider contract (issue #13): every registered provider is a
LatencyProvider with the methods the engine calls, on a dense and an MoE model, and the
registry is the only list of provider names."""

from __future__ import annotations

import importlib.util
import json

import pytest

import sim
from sim.cli import main
from sim.errors import InputError
from sim.latency.base import (LATENCY_PROVIDERS, BatchShape, LatencyProvider, LayerTimes,
                              load_providers, provider_names)
from sim.model import load_model
from sim.paths import shared_data_root
from sim.request import Request

HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
PROFILES = shared_data_root() / "profiles"
DENSE, MOE = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B-Instruct-2507"
HW = "RTXPRO6000"   # a measured bundle, an aiconfigurator database and a catalogue entry

SHAPES = (BatchShape(300, 3, prefill_tokens=256, prefill_kv=0, num_decode=44,
                     decode_kv_sum=44 * 900, decode_kv_max=1500, decode_kv_min=100),
          BatchShape(16, 16, num_decode=16, decode_kv_sum=16 * 512, decode_kv_max=512,
                     decode_kv_min=512))


def _cases():
    for name in ("measured", "roofline", "aic"):
        for model in (DENSE, MOE):
            marks = []
            if name == "aic" and not HAS_AIC:
                marks.append(pytest.mark.skip(reason="aiconfigurator-core not installed"))
            if name == "measured" and not (PROFILES / HW).is_dir():
                marks.append(pytest.mark.skip(reason="no shared measured bundles"))
            yield pytest.param(name, model, marks=marks, id=f"{name}-{model.split('/')[0]}")


@pytest.mark.parametrize("name,model_name", list(_cases()))
def test_every_provider_honours_the_contract(name, model_name):
    model = load_model(model_name)
    prov = load_providers().create(name, model, HW, 1, profiles_dirs=(str(PROFILES),))
    assert isinstance(prov, LatencyProvider) and prov.kind == name and prov.source
    for shape in SHAPES:
        lt = prov.layer_times(shape)
        assert isinstance(lt, LayerTimes) and lt.num_blocks == model.num_hidden_layers
        assert prov.iteration_ns(shape) == lt.total_ns() > 0
    assert isinstance(prov.extrapolations(), dict)
    if model.is_moe:
        # the expectation lives on the model spec, once
        assert prov.expected_active_experts(64) == model.expected_active_experts(64)
        assert 0 < prov.moe_ns(64, prov.expected_active_experts(64))
    else:
        with pytest.raises(InputError, match="not a"):
            prov.moe_ns(64, 8)


@pytest.mark.parametrize("name", ["measured", "roofline",
                                  pytest.param("aic", marks=pytest.mark.skipif(
                                      not HAS_AIC, reason="aiconfigurator-core not installed"))])
def test_moe_dp_ep_cluster_runs_with_every_provider(name, tmp_path):
    """`llmsim run --latency-provider aic` on an MoE cluster with ep > 1 died with an
    AttributeError (expected_active_experts); every provider now answers the wave."""
    folder = shared_data_root() / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
    if not folder.is_dir() or (name == "measured" and not (PROFILES / HW).is_dir()):
        pytest.skip("shared validation data absent")
    cluster = sim.load_cluster(folder / "cluster.json")
    reqs = [Request(i, i * 50_000_000, 300 + 7 * i, 20) for i in range(12)]
    res = sim.simulate(cluster, sim.Workload(reqs), sim.SimOptions(latency_provider=name))
    assert res.summary["num_finished"] == 12
    assert res.summary["latency_provider"] == name


def test_registry_is_the_only_list_of_names(tmp_path, capsys):
    from dse.space import latency_providers

    assert provider_names() == ["auto", *sorted(LATENCY_PROVIDERS.names())]
    assert latency_providers() == provider_names()

    class Constant(LatencyProvider):
        """A provider implementing only layer_times: the defaults do the rest."""
        kind = "constant"

        def __init__(self, model, hardware, tp=1, **_):
            self.model, self.source = model, "constant"

        def layer_times(self, shape):
            return LayerTimes((("embedding", 1000),), tuple((n, 1000) for n in
                              self.model.block_sequence), (("lm_head", 1000),),
                              self.model.num_hidden_layers)

    LATENCY_PROVIDERS.register("constant", Constant)
    try:
        assert "constant" in provider_names()
        c = tmp_path / "c.json"
        c.write_text(json.dumps({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
            "num_instances": 1, "instances": [{
                "model_name": DENSE, "hardware": "H100-SXM", "num_npus": 1, "tp_size": 1,
                "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]}))
        w = tmp_path / "w.jsonl"
        w.write_text("".join(json.dumps({"input_toks": 100, "output_toks": 5,
                                         "arrival_time_ns": i}) + "\n" for i in range(3)))
        rc = main(["run", "--cluster", str(c), "--dataset", str(w), "--output",
                   str(tmp_path / "o.csv"), "--latency-provider", "constant"])
        assert rc == 0 and "latency: constant" in capsys.readouterr().out
    finally:
        LATENCY_PROVIDERS._factories.pop("constant")
    with pytest.raises(SystemExit):   # argparse choices come from the registry
        main(["run", "--cluster", str(c), "--dataset", str(w), "--output", "x.csv",
              "--latency-provider", "constant"])


def test_auto_order_measured_then_aic_then_roofline(bundle_root):
    """auto takes a bundle when one exists for the precision and tp, else aiconfigurator's
    database where it covers the case, else the roofline; it says which and why."""
    from sim.latency.base import auto_choice
    from sim_testkit import make_bundle

    llama = load_model(DENSE)
    make_bundle(bundle_root, hardware="H100-SXM")
    assert auto_choice(llama, "H100-SXM", 1, (str(bundle_root),))[0] == "measured"
    fp8 = llama.with_precision("fp8")
    name, why = auto_choice(fp8, "H100-SXM", 1, (str(bundle_root),))
    assert name == ("aic" if HAS_AIC else "roofline") and "no fp8 bundle" in why
    assert auto_choice(llama, "RTX4090", 2, ())[0] == "roofline"  # no aic database for it


def test_catalogue_lists_providers_in_auto_order():
    from sim.latency.base import auto_choice
    from sim.latency.catalogue import available_providers

    llama = load_model(DENSE)
    listed = [e["provider"] for e in available_providers("H100-SXM", DENSE, 1)]
    assert listed[0] == auto_choice(llama, "H100-SXM", 1)[0] and "roofline" in listed
    assert "measured" not in listed   # no H100 bundle ships
