"""Repeated parameter sets: answered from the stored result, not simulated again, and not
counted toward n_trials (n_trials counts distinct configurations)."""

from __future__ import annotations

import optuna
from dse_testkit import write_space
from optuna.trial import TrialState

import dse.pool
from dse.canonical import config_key
from dse.space import load_space
from dse.study import Driver, open_storage


def test_repeats_are_answered_from_the_stored_result(tmp_path, monkeypatch):
    # 2 x 2 = 4 configurations, 3 wanted: a random sampler repeats itself often here
    path = write_space(tmp_path, knobs={"tp": [1, 2], "max_num_seqs": [16, 128]},
                       budget={"total_devices": 2, "devices_per_node": 2},
                       search={"sampler": "random", "n_trials": 3, "seed": 3})
    simulated = []
    real = dse.pool.evaluate

    def counting(space, task, *a, **k):
        simulated.append(task["number"])
        return real(space, task, *a, **k)

    monkeypatch.setattr(dse.pool, "evaluate", counting)
    space = load_space(path)
    summary = Driver(space, tmp_path / "out", workers=0, progress=False).run()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="t", storage=open_storage(tmp_path / "out")
                               ).get_trials()
    firsts = [t for t in trials if "repeat_of" not in t.user_attrs]
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    assert summary.complete == len(firsts) == 3
    assert repeats, "seed 3 draws repeats in this space; pick another seed if not"
    assert summary.repeats == len(repeats)
    # each configuration simulated once: the repeats were not
    keys = [config_key(space, t.params) for t in firsts]
    assert len(set(keys)) == len(keys)
    assert sorted(simulated) == sorted(t.number for t in firsts)
    by_number = {t.number: t for t in trials}
    for t in repeats:
        first = by_number[t.user_attrs["repeat_of"]]
        assert t.state == TrialState.COMPLETE
        assert config_key(space, t.params) == \
            config_key(space, first.params)
        assert t.values == first.values and t.constraints == first.constraints
    # trials.csv: one row per configuration
    import pandas as pd

    assert len(pd.read_csv(tmp_path / "out" / "trials.csv")) == 3


def test_n_trials_is_capped_at_the_distinct_configurations(tmp_path):
    path = write_space(tmp_path, knobs={"tp": [1, 2], "max_num_seqs": [16, 128]},
                       budget={"total_devices": 2, "devices_per_node": 2},
                       search={"sampler": "tpe", "n_trials": 50, "seed": 0})
    summary = Driver(load_space(path), tmp_path / "out", workers=0, progress=False).run()
    assert summary.complete == 4


def test_knobs_without_effect_do_not_make_a_new_configuration(tmp_path, monkeypatch):
    # one replica: the routing policy cannot change anything, so LOAD and RR are one
    # configuration, simulated once; the space holds 2 distinct configurations, not 4
    path = write_space(tmp_path, knobs={"max_num_seqs": [16, 128],
                                        "routing_policy": ["LOAD", "RR"]},
                       budget={"total_devices": 1, "devices_per_node": 1},
                       search={"sampler": "random", "n_trials": 10, "seed": 0})
    simulated = []
    real = dse.pool.evaluate

    def counting(*a, **kw):
        simulated.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(dse.pool, "evaluate", counting)
    summary = Driver(load_space(path), tmp_path / "out", workers=0, progress=False).run()
    assert summary.complete == 2 and len(simulated) == 2
