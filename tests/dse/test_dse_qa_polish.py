"""QA of the polish and of `dse search`'s summary line on the best's one-knob neighbourhood:
the line counts only neighbours that are other configurations and that were simulated (not
the configuration itself through a knob without effect, not a trial still waiting), words
a best without neighbours plainly, and does not enumerate the space a second time."""

from __future__ import annotations

import optuna
from dse_testkit import TINY_WORKLOAD, write_space
from optuna.trial import TrialState

import dse.sampling
from dse.canonical import config_key
from dse.cli import main
from dse.sampling import Neighbourhood, best_neighbourhood, feasible_set
from dse.space import load_space
from dse.study import open_storage


def _search(tmp_path, capsys, space, *args) -> tuple[str, list]:
    out = tmp_path / "out"
    assert main(["search", str(space), "--out", str(out), "--workers", "0", "--no-progress",
                 *args]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Best by ")]
    assert len(lines) == 1, lines
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()
    return lines[0], trials


def test_a_knob_without_effect_does_not_make_the_best_its_own_neighbour(tmp_path, capsys):
    """With one replica the routing policy has no effect: moving it gives the same
    configuration, which is not one of its neighbours (before: the best at one replica
    counted itself, "all 3 of its one-knob neighbours" for its 2)."""
    path = write_space(tmp_path, workload=TINY_WORKLOAD,
                       knobs={"tp": [1, 2], "replicas": [1, 2], "routing_policy": ["LOAD", "RR"]},
                       search={"sampler": "grid", "n_trials": 6, "seed": 0})
    space = load_space(path)
    one = {"tp": 1, "replicas": 1, "routing_policy": "LOAD"}
    around = Neighbourhood(space, feasible_set(space)).of(one)
    assert config_key(space, one) not in around
    assert sorted(knob for knob, _ in around.values()) == ["replicas", "tp"]
    line, trials = _search(tmp_path, capsys, path)
    best = trials[int(line.split("trial ")[1].split(";")[0])]
    assert best.params["tp"] == 1 and best.params["replicas"] == 1  # the best per device
    assert "all 2 of its one-knob neighbours" in line, line


def test_the_summary_counts_only_simulated_neighbours(tmp_path, capsys):
    """`sampler: grid` enqueues the whole grid; with a smaller budget the rest is left
    waiting, never simulated, and the summary must say so (before: "all 3 of its one-knob
    neighbours ... were simulated" with two of them waiting)."""
    path = write_space(tmp_path, workload=TINY_WORKLOAD,
                       knobs={"tp": [1, 2, 4], "replicas": [1, 2, 4],
                              "max_num_seqs": [16, 64, 256]},
                       search={"sampler": "grid", "n_trials": 8, "seed": 0})
    space = load_space(path)
    line, trials = _search(tmp_path, capsys, path)
    info = best_neighbourhood(space, trials)
    best = trials[info["trial"]]
    simulated = {config_key(space, t.params) for t in trials if t.state == TrialState.COMPLETE}
    around = Neighbourhood(space, feasible_set(space)).of(best.params)
    assert info["tried"] == sum(k in simulated for k in around)
    waiting = {config_key(space, t.system_attrs["fixed_params"]) for t in trials
               if t.state == TrialState.WAITING}
    assert any(k in waiting for k in around)  # the case this test is about
    assert info["tried"] < info["neighbours"] == len(around)
    assert (f"{info['tried']} of its {info['neighbours']} one-knob neighbours that pass the "
            f"check were simulated") in line, line
    assert f"{info['neighbours'] - info['tried']} were not" in line


def test_a_best_without_neighbours_is_worded_plainly(tmp_path, capsys):
    """One device: a single configuration passes the check (before: "all 0 of its
    one-knob neighbours that pass the check were simulated")."""
    path = write_space(tmp_path, workload=TINY_WORKLOAD,
                       budget={"total_devices": 1, "devices_per_node": 1},
                       knobs={"tp": [1, 2], "replicas": [1, 2]},
                       search={"sampler": "auto", "n_trials": 4, "seed": 0})
    line, _ = _search(tmp_path, capsys, path)
    assert "all 0" not in line
    assert line.endswith("none of its one-knob neighbours passes the check: no single knob "
                         "change improves it"), line


def test_the_summary_does_not_enumerate_the_space_again(tmp_path, capsys, monkeypatch):
    """The feasible set is enumerated once per process: the search reads the space by the
    path given (relative here), the summary by the absolute one the study folder records
    (before: a second enumeration at the end, ~20 s on a space of 100,000 combinations)."""
    path = write_space(tmp_path, workload=TINY_WORKLOAD,
                       knobs={"tp": [1, 2], "replicas": [1, 2], "max_num_seqs": [16, 64]},
                       search={"sampler": "auto", "n_trials": 3, "seed": 0})
    monkeypatch.chdir(tmp_path)
    calls = []
    real = dse.sampling.precheck
    monkeypatch.setattr(dse.sampling, "precheck", lambda *a: calls.append(1) or real(*a))
    _search(tmp_path, capsys, path.name)
    distinct = len({config_key(load_space(path), p) for p in load_space(path).grid()})
    assert len(calls) == distinct


def test_the_reports_best_is_the_summarys_with_three_objectives(tmp_path):
    """The summary's best (and the polish's) is the best feasible trial by the objectives
    in their order; the report lists the front in that order too, so its first row is the
    same trial (before: sorted by the first objective alone, then by trial number, a tie
    on the first went to the earlier trial even where the later one was better by the
    second)."""
    import pandas as pd

    from dse.report import pareto_frame
    from dse.sampling import objective_rank

    objectives = [{"name": "devices_used", "direction": "minimize"},
                  {"name": "throughput_per_device", "direction": "maximize"},
                  {"name": "p99_ttft", "direction": "minimize"}]
    space = load_space(write_space(tmp_path, objectives=objectives,
                                   knobs={"tp": [1, 2], "max_num_seqs": [16, 64, 256]}))
    rows = []
    for i, (params, dev, thr, ttft) in enumerate([({"tp": 1, "max_num_seqs": 16}, 1, 900, 20),
                                                  ({"tp": 1, "max_num_seqs": 64}, 1, 1200, 30),
                                                  ({"tp": 2, "max_num_seqs": 64}, 2, 1500, 10)]):
        p = space.complete(params)
        rows.append({"trial": i, "state": "COMPLETE", "config": config_key(space, p), **p,
                     "devices_used": dev, "throughput_per_device": thr, "p99_ttft": ttft,
                     "feasible": True, "rejected": False, "reason": ""})
    front = pareto_frame(space, pd.DataFrame(rows))
    assert len(front) == 3  # each better than the others in something
    dirs = [o["direction"] for o in objectives]
    names = [o["name"] for o in objectives]
    best = min(rows, key=lambda r: (objective_rank([r[n] for n in names], dirs), r["trial"]))
    assert best["trial"] == 1
    assert list(front["trial"]) == [1, 0, 2]


def test_the_recorded_polish_is_what_follows_the_design(tmp_path):
    """The design runs first and the polish only after it: a budget the design fills (the
    default NSGA-II population is 16) polishes nothing, and the study's settings (study.json,
    MLflow's sampler.polish_trials) say so (before: polish_trials 12 beside initial_design
    12 in a budget of 12)."""
    from dse.sampling import design_size, make_sampler, sampler_settings

    space = load_space(write_space(tmp_path, knobs={"tp": [1, 2, 4], "replicas": [1, 2, 4],
                                                    "max_num_seqs": [16, 64, 256]},
                                   search={"sampler": "auto", "n_trials": 12, "polish": 1}))
    s = sampler_settings(space, 0, False, 12)
    assert s["initial_design"] == design_size(space, 12) == 12
    assert s["polish_trials"] == 0
    sampler = make_sampler(space, 0, False, 12)
    assert sampler.start_after == 12  # no draw of the 12 is the sampler's, none polishes
    assert sampler_settings(space, 0, False, 20)["polish_trials"] == 4  # 20 - a design of 16
    half = load_space(write_space(tmp_path, "half.yaml",
                                  knobs={"tp": [1, 2, 4], "replicas": [1, 2, 4],
                                         "max_num_seqs": [16, 64, 256]},
                                  search={"sampler": "auto", "n_trials": 40, "polish": 0.25}))
    assert sampler_settings(half, 0, False, 40)["polish_trials"] == 10
