"""Draws rejected before simulating (budget, memory, divisibility) spend no trial budget."""

from __future__ import annotations

import optuna
import pandas as pd
from dse_testkit import write_space
from optuna.trial import TrialState

from dse import study as study_mod
from dse.space import load_space
from dse.store import open_storage
from dse.study import Driver

# 4 devices: tp*replicas > 4 is rejected (3 of the 9 (tp, replicas) pairs)
KNOBS = {"tp": [1, 2, 4], "replicas": [1, 2, 4], "max_num_seqs": [16, 32, 64, 128]}


def _trials(out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()


def test_rejected_draws_do_not_count_toward_n_trials(tmp_path):
    n = 10
    path = write_space(tmp_path, knobs=KNOBS,
                       search={"sampler": "random", "n_trials": n, "seed": 1})
    out = tmp_path / "out"
    summary = Driver(load_space(path), out, workers=0, progress=False).run()
    trials = _trials(out)
    simulated = [t for t in trials if t.state == TrialState.COMPLETE
                 and "repeat_of" not in t.user_attrs]
    rejected = [t for t in trials if t.user_attrs.get("rejected")]
    assert len(simulated) == n == summary.complete
    assert not any(t.user_attrs.get("rejected") for t in simulated)
    assert rejected, "seed 1 draws some configuration over the budget"
    # told as FAIL: the sampler learns nothing from them (no made-up objective values)
    assert all(t.state == TrialState.FAIL and t.values is None for t in rejected)
    assert all("over the budget" in t.user_attrs["reason"] for t in rejected)
    firsts = [t for t in rejected if "repeat_of" not in t.user_attrs]
    assert summary.rejected == len(firsts)
    # trials.csv lists each rejected configuration once, with its reason and constraints
    df = pd.read_csv(out / "trials.csv")
    assert df.rejected.sum() == len(firsts) and (~df.rejected).sum() == n
    cons = [c for c in df.columns if c.startswith("constraint.")]
    assert cons and (df[df.rejected][cons] > 0).all().all()

    # rerunning the finished study resumes it: nothing is drawn again
    again = Driver(load_space(path), out, workers=0, progress=False).run()
    assert again.complete == n and again.rejected == summary.rejected
    assert len(_trials(out)) == len(trials)


def test_budget_is_capped_at_the_configurations_that_pass_the_check(tmp_path):
    # 9 (tp, replicas) pairs x 1 max_num_seqs: 6 pass the budget check
    knobs = {**KNOBS, "max_num_seqs": [64]}
    path = write_space(tmp_path, knobs=knobs,
                       search={"sampler": "random", "n_trials": 50, "seed": 0})
    summary = Driver(load_space(path), tmp_path / "out", workers=0, progress=False).run()
    assert summary.complete == 6 and summary.rejected == 3


def test_all_rejected_space_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(study_mod, "MAX_REJECTED_IN_A_ROW", 15)
    # an unbounded knob (no finite count of configurations), every draw rejected: PD
    # disaggregation with one instance (a space whose every draw is over the device budget
    # is refused at load, tests/dse/test_dse_malformed_inputs.py)
    # (a range of 60,000 values: 120,000 combinations, over the enumeration limit)
    knobs = {"tp": [2, 4], "replicas": [1], "pd": [True],
             "max_num_seqs": {"low": 8, "high": 60_000}}
    path = write_space(tmp_path, knobs=knobs,
                       search={"sampler": "tpe", "n_trials": 5, "seed": 0})
    out = tmp_path / "out"
    summary = Driver(load_space(path), out, workers=0, progress=False).run()
    assert summary.complete == 0
    assert len(_trials(out)) == 15


def test_summary_line_says_rejections_and_repeats_are_not_counted():
    # "100 trials complete (68 feasible, 19 rejected ...)" read as 19 of the 100 trials being
    # rejected; they are extra draws that do not count toward n_trials.
    from dse.cli import _uncounted_draws
    assert _uncounted_draws(0, 0) == ""
    assert _uncounted_draws(19, 10) == ("; not counted: 19 draw(s) rejected before simulation"
                                        " and 10 repeated configuration(s) answered from "
                                        "stored results")
    assert _uncounted_draws(0, 3) == ("; not counted: 3 repeated configuration(s) answered "
                                      "from stored results")
