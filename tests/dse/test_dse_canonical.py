"""The canonical form: knobs with no effect never make two configurations distinct."""

from __future__ import annotations

import pytest
from dse_testkit import write_space

from dse.canonical import canonical_params, config_key, inert_knobs
from dse.config import make_trial_config
from dse.space import load_space


def _space(tmp_path, model="meta-llama/Llama-3.1-8B", **over):
    return load_space(write_space(tmp_path, model=model, **over))


@pytest.fixture
def dense(tmp_path):
    return _space(tmp_path, budget={"total_devices": 8, "devices_per_node": 8},
                  knobs={"tp": [1, 2], "replicas": [1, 2, 4], "routing_policy": ["LOAD", "RR"],
                         "pd": [False, True], "pd_ratio": ["1:1", "2:1", "3:1"],
                         "dp": [1, 2, 4]})


def test_routing_policy_with_one_replica_is_one_config(dense):
    a = {"tp": 2, "replicas": 1, "routing_policy": "LOAD"}
    b = {"tp": 2, "replicas": 1, "routing_policy": "RR"}
    assert config_key(dense, a) == config_key(dense, b)
    # with two replicas the router chooses, so the policy matters
    assert config_key(dense, {**a, "replicas": 2}) != config_key(dense, {**b, "replicas": 2})


def test_routing_policy_with_one_prefill_instance_is_one_config(dense):
    a = {"tp": 1, "replicas": 2, "pd": True, "pd_ratio": "1:1", "routing_policy": "LOAD"}
    b = {**a, "routing_policy": "RR"}
    assert config_key(dense, a) == config_key(dense, b)
    c = {**a, "replicas": 4, "pd_ratio": "3:1"}  # 3 prefill instances: routing matters
    assert config_key(dense, c) != config_key(dense, {**c, "routing_policy": "RR"})


def test_pd_ratios_realising_the_same_split_are_one_config(dense):
    a = {"tp": 1, "replicas": 4, "pd": True, "pd_ratio": "2:1"}
    b = {"tp": 1, "replicas": 4, "pd": True, "pd_ratio": "3:1"}
    assert canonical_params(dense, a)["pd_ratio"] == "3:1"
    assert config_key(dense, a) == config_key(dense, b)
    assert config_key(dense, a) != config_key(dense, {**a, "pd_ratio": "1:1"})
    # pd off: the ratio is not part of the configuration
    assert "pd_ratio" not in canonical_params(dense, {"tp": 1, "replicas": 4})


def test_dp_on_a_dense_model_or_one_replica_is_one_config(dense, tmp_path):
    assert config_key(dense, {"tp": 1, "replicas": 4, "dp": 4}) == \
        config_key(dense, {"tp": 1, "replicas": 4, "dp": 1})
    moe = _space(tmp_path, model="Qwen/Qwen3-30B-A3B",
                 budget={"total_devices": 8, "devices_per_node": 8},
                 knobs={"tp": [1, 2], "replicas": [1, 2, 4], "dp": [1, 2, 4], "ep": [1, 2]})
    assert config_key(moe, {"tp": 2, "replicas": 1, "dp": 4}) == \
        config_key(moe, {"tp": 2, "replicas": 1, "dp": 1})
    # dp larger than the replicas groups all of them: dp=4 on 2 replicas is dp=2
    assert config_key(moe, {"tp": 2, "replicas": 2, "dp": 4}) == \
        config_key(moe, {"tp": 2, "replicas": 2, "dp": 2})
    assert config_key(moe, {"tp": 2, "replicas": 2, "dp": 2}) != \
        config_key(moe, {"tp": 2, "replicas": 2, "dp": 1})


def test_prefix_tier_without_prefix_caching_is_one_config(tmp_path):
    sp = _space(tmp_path, knobs={"tp": [1], "replicas": [2], "enable_prefix_caching": [True, False],
                                 "prefix_tier": ["npu", "cpu"]})
    off = {"tp": 1, "replicas": 2, "enable_prefix_caching": False}
    assert config_key(sp, {**off, "prefix_tier": "cpu"}) == \
        config_key(sp, {**off, "prefix_tier": "npu"})
    on = {**off, "enable_prefix_caching": True}
    assert config_key(sp, {**on, "prefix_tier": "cpu"}) != \
        config_key(sp, {**on, "prefix_tier": "npu"})


def test_absent_knobs_equal_their_defaults(dense):
    assert config_key(dense, {"tp": 1, "replicas": 2}) == \
        config_key(dense, {"tp": 1, "replicas": 2, "routing_policy": "LOAD", "pp": 1,
                           "max_num_seqs": 256})
    assert config_key(dense, {"tp": 1, "replicas": 2}) != \
        config_key(dense, {"tp": 1, "replicas": 2, "max_num_seqs": 64})


def test_canonical_params_give_the_same_cluster_and_simulated_result(dense):
    """The canonical form is a runnable configuration with the same outcome: if a rule
    above called a knob effect-free when sim does use it, the results would differ."""
    from dse.worker import evaluate

    cases = [({"tp": 2, "replicas": 1, "routing_policy": "RR", "dp": 4},),
             ({"tp": 1, "replicas": 4, "pd": True, "pd_ratio": "2:1", "routing_policy": "LOAD"},),
             ({"tp": 1, "replicas": 2, "pd": True, "pd_ratio": "1:3", "routing_policy": "RR"},)]
    for (params,) in cases:
        canon = canonical_params(dense, params)
        a = make_trial_config(dense, 0, params)
        b = make_trial_config(dense, 0, canon)
        assert [i["pd_type"] for n in a.cluster["nodes"] for i in n["instances"]] == \
            [i["pd_type"] for n in b.cluster["nodes"] for i in n["instances"]]
        ra = evaluate(dense, {"number": 0, "cluster": a.cluster, "options": a.options})
        rb = evaluate(dense, {"number": 0, "cluster": b.cluster, "options": b.options})
        for k in ("ttft_ms", "tpot_ms"):
            assert ra.summary[k] == rb.summary[k], (params, k)


def test_inert_knobs_name_what_the_result_ignores(dense):
    one = dense.complete({"tp": 2, "replicas": 1, "routing_policy": "RR"})
    assert {"routing_policy", "pd_ratio", "dp"} <= inert_knobs(dense, one)
    two = dense.complete({"tp": 2, "replicas": 2, "routing_policy": "RR"})
    assert "routing_policy" not in inert_knobs(dense, two)
    pd = dense.complete({"tp": 1, "replicas": 4, "pd": True, "pd_ratio": "3:1"})
    assert "pd_ratio" not in inert_knobs(dense, pd)


def test_report_table_shows_a_dash_for_a_knob_with_no_effect(dense):
    """One replica: the routing policy chooses nothing, so the trials table must not
    claim 'RR' for it (it showed the sampled value before)."""
    import optuna

    from dse.report import trials_frame

    study = optuna.create_study(directions=["maximize", "minimize"])
    for replicas in (1, 2):
        t = optuna.trial.create_trial(
            params={"tp": 2, "replicas": replicas, "routing_policy": "RR"},
            distributions={"tp": optuna.distributions.CategoricalDistribution([1, 2]),
                           "replicas": optuna.distributions.CategoricalDistribution([1, 2, 4]),
                           "routing_policy": optuna.distributions.CategoricalDistribution(
                               ["LOAD", "RR"])},
            values=[1.0, 1.0], user_attrs={"feasible": True})
        study.add_trial(t)
    df = trials_frame(dense, study).set_index("replicas")
    assert df.isna().loc[1, "routing_policy"]
    assert df.loc[2, "routing_policy"] == "RR"
