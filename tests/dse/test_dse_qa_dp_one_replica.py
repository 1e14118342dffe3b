"""``dp`` on an MoE model groups consecutive replicas into data-parallel groups; with one
replica the group has one member, nothing is exchanged, and ``all2all_backend`` (the
exchange) cannot change the result. Before, (dp 2, 1 replica, naive) and (dp 2, 1
replica, deepep_low_latency) were two distinct configurations: each simulated anew (the
same result twice), both listed, and trials.csv showed an all-to-all backend and a dp of
2 for a configuration that has neither."""

from __future__ import annotations

from dse_testkit import write_space

from dse.canonical import canonical_params, config_key, inert_knobs
from dse.config import make_trial_config
from dse.space import load_space
from dse.worker import _Workloads, evaluate

WORKLOAD = {"generate": {"num_requests": 24, "arrival": "poisson", "rate": 20,
                         "input": {"kind": "uniform", "low": 64, "high": 256},
                         "output": {"kind": "uniform", "low": 8, "high": 32}, "seed": 0}}


def _space(tmp_path):
    return load_space(write_space(
        tmp_path, model="Qwen/Qwen3-30B-A3B", workload=WORKLOAD,
        budget={"total_devices": 8, "devices_per_node": 8},
        knobs={"tp": [2], "ep": [1, 2], "dp": [1, 2], "replicas": [1, 2],
               "all2all_backend": ["allgather_reducescatter", "naive"]}))


def _summary(space, params):
    cfg = make_trial_config(space, 0, params)
    res = evaluate(space, {"number": 0, "cluster": cfg.cluster, "options": cfg.options},
                   _Workloads())
    assert res.simulated, (res.error, res.rejected)
    return {k: v for k, v in res.summary.items() if k not in ("wall_s", "speedup_vs_real_time")}


def test_one_replica_dp_group_is_one_configuration(tmp_path):
    space = _space(tmp_path)
    a = {"tp": 2, "ep": 2, "dp": 2, "replicas": 1, "all2all_backend": "naive"}
    b = {**a, "all2all_backend": "allgather_reducescatter"}
    c = {**a, "dp": 1}
    assert _summary(space, a) == _summary(space, b) == _summary(space, c)
    assert config_key(space, a) == config_key(space, b) == config_key(space, c)
    canon = canonical_params(space, a)
    assert canon["dp"] == 1 and canon["all2all_backend"] == "allgather_reducescatter"
    assert {"dp", "all2all_backend"} <= inert_knobs(space, space.complete(a))


def test_two_replica_dp_group_keeps_its_backend(tmp_path):
    space = _space(tmp_path)
    a = {"tp": 2, "ep": 2, "dp": 2, "replicas": 2, "all2all_backend": "naive"}
    b = {**a, "all2all_backend": "allgather_reducescatter"}
    assert _summary(space, a) != _summary(space, b)
    assert config_key(space, a) != config_key(space, b)
    assert not {"dp", "all2all_backend"} & inert_knobs(space, space.complete(a))
