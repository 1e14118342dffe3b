"""The initial design: every knob value, only configurations that pass the pre-simulation
check, enqueued once; a study interrupted in the middle of it resumes without repeating or
losing a trial."""

from __future__ import annotations

import collections
import json

import numpy as np
import optuna
import pytest
from dse_testkit import write_space
from optuna.trial import TrialState

import dse.pool
from dse.canonical import canonical_params, config_key
from dse.config import make_trial_config, precheck
from dse.pool import LocalPool
from dse.sampling import (
    DESIGN_ATTR,
    LocalSearchSampler,
    Neighbourhood,
    best_neighbourhood,
    covering_size,
    design_size,
    enqueue_initial_design,
    feasible_set,
    initial_design,
    make_sampler,
)
from dse.space import load_space
from dse.study import Driver, open_storage

# 4 devices: tp x replicas over 4 is over the budget, and vLLM refuses
# max_num_batched_tokens 128 < max_num_seqs 256: the extreme corners a space-filling design
# reaches first are the ones the check rejects
KNOBS = {"tp": [1, 2, 4], "replicas": [1, 2, 4], "max_num_seqs": [16, 64, 256],
         "max_num_batched_tokens": [128, 1024, 4096], "enable_prefix_caching": [True, False]}


def _space(tmp_path, **search):
    return load_space(write_space(tmp_path, knobs=KNOBS,
                                  search={"n_trials": 12, "seed": 0, **search}))


def _trials(out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()


def test_the_space_has_corners_the_check_rejects(tmp_path):
    space = _space(tmp_path)
    rejected = [p for p in space.grid()
                if precheck(space, make_trial_config(space, 0, p)) is not None]
    assert any(p["tp"] * p["replicas"] > 4 for p in rejected)
    assert any(p["max_num_batched_tokens"] < p["max_num_seqs"] for p in rejected)
    assert len(feasible_set(space)) < len(space.grid())


@pytest.mark.parametrize("extra", [0, 2, 9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_initial_design_covers_every_value_and_passes_the_check(tmp_path, extra, seed):
    space = _space(tmp_path)
    cover = covering_size(space, seed)
    assert 3 <= cover <= 5  # the widest knob has 3 values
    n = cover + extra
    design = initial_design(space, n, seed=seed)
    assert len(design) == n
    assert len({config_key(space, p) for p in design}) == n  # distinct configurations
    for p in design:
        assert precheck(space, make_trial_config(space, 0, p)) is None, p
    # every value a feasible configuration can show (canonical form) is in the design
    shown = collections.defaultdict(set)
    for p in feasible_set(space):
        for k, v in canonical_params(space, p).items():
            if k in KNOBS:
                shown[k].add(v)
    assert shown["tp"] == {1, 2, 4} and shown["replicas"] == {1, 2, 4}
    for k, values in shown.items():
        got = {canonical_params(space, p)[k] for p in design}
        assert got == values, (k, got, values)


def test_initial_design_depends_on_the_seed_only(tmp_path):
    space = _space(tmp_path)
    assert initial_design(space, 6, seed=2) == initial_design(space, 6, seed=2)
    designs = {tuple(config_key(space, p) for p in initial_design(space, 6, seed=s))
               for s in range(6)}
    assert len(designs) > 1


def test_design_size_defaults(tmp_path):
    assert design_size(_space(tmp_path, sampler="tpe"), 40) == 10  # a quarter of 40
    small = _space(tmp_path, sampler="tpe")
    assert design_size(small, 8) == covering_size(small, 0) > 2  # every value at least
    assert design_size(_space(tmp_path, sampler="nsga2", population_size=7), 40) == 7
    assert design_size(_space(tmp_path, sampler="tpe", initial_design=0), 40) == 0
    assert design_size(_space(tmp_path, sampler="random"), 40) == 0
    assert design_size(_space(tmp_path, sampler="tpe", initial_design=99), 12) == 12
    wrapped = make_sampler(_space(tmp_path, sampler="tpe"), 0, False, 40)
    assert isinstance(wrapped, LocalSearchSampler)
    assert isinstance(wrapped.base, optuna.samplers.TPESampler)
    assert wrapped.base._n_startup_trials == 10  # it models from right after the design
    assert wrapped.p == 0.5 and wrapped.start_after == 10
    assert wrapped.polish_from == 36  # the last tenth of the budget polishes the best
    bare = make_sampler(_space(tmp_path, sampler="tpe", local_search=0, polish=0), 0, False, 40)
    assert isinstance(bare, optuna.samplers.TPESampler)
    assert isinstance(make_sampler(_space(tmp_path, sampler="random"), 0, False, 40),
                      optuna.samplers.RandomSampler)


def test_auto_is_the_default_and_resolves_to_nsga2(tmp_path):
    space = _space(tmp_path, population_size=8)
    assert space.search.sampler == "auto"
    sampler = make_sampler(space, 0, False, 12)
    assert isinstance(sampler, LocalSearchSampler)
    assert isinstance(sampler.base, optuna.samplers.NSGAIISampler)
    assert design_size(space, 40) == 8  # its first generation
    # a space that cannot be enumerated: plain NSGA-II, no design
    inf = load_space(write_space(tmp_path, "inf.yaml", knobs={
        "tp": [1, 2], "max_num_seqs": {"low": 8, "high": 256, "log": True}},
        search={"n_trials": 12}))
    assert design_size(inf, 12) == 0
    assert isinstance(make_sampler(inf, 0, False, 12), optuna.samplers.NSGAIISampler)


def test_a_search_starts_with_the_design_and_never_draws_it_twice(tmp_path, monkeypatch):
    space = _space(tmp_path, sampler="tpe")
    n = design_size(space, 12)
    simulated = []
    real = dse.pool.evaluate

    def counting(sp, task, *a, **k):
        simulated.append(task["number"])
        return real(sp, task, *a, **k)

    monkeypatch.setattr(dse.pool, "evaluate", counting)
    s = Driver(space, tmp_path / "out", workers=0, progress=False).run()
    trials = _trials(tmp_path / "out")
    design = [t for t in trials if t.user_attrs.get("initial_design")]
    assert [t.number for t in design] == list(range(n))
    assert all(t.state == TrialState.COMPLETE and not t.user_attrs.get("rejected")
               for t in design)
    want = [config_key(space, p) for p in initial_design(space, n, 0)]
    assert [config_key(space, t.params) for t in design] == want
    assert s.complete == 12
    assert len(simulated) == len(set(simulated))
    # a second run of the finished study enqueues nothing
    study = optuna.load_study(study_name="t", storage=open_storage(tmp_path / "out"))
    assert study.user_attrs[DESIGN_ATTR] == n
    assert enqueue_initial_design(space, study, 12, 0) == 0


class _Interrupting(LocalPool):
    """Evaluates ``after`` trials, then raises KeyboardInterrupt as a Ctrl-C would, with a
    trial submitted and not yet evaluated."""

    def __init__(self, space, after: int) -> None:
        super().__init__(space)
        self.left = after

    def poll(self, timeout: float = 0.5):
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return super().poll(timeout)


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])
def test_resume_in_the_middle_of_the_design_neither_repeats_nor_loses(tmp_path, monkeypatch,
                                                                      sampler):
    n_trials = 12
    # NSGA-II: its first generation (population_size); TPE: asked for 6
    space = _space(tmp_path, sampler=sampler, population_size=6,
                   **({"initial_design": 6} if sampler == "tpe" else {}))
    n = design_size(space, n_trials)
    assert n == 6
    simulated = collections.Counter()
    real = dse.pool.evaluate

    def counting(sp, task, *a, **k):
        simulated[json.dumps([task["cluster"], task["options"]], sort_keys=True,
                             default=str)] += 1
        return real(sp, task, *a, **k)

    monkeypatch.setattr(dse.pool, "evaluate", counting)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        Driver(space, out, workers=0, progress=False, pool=_Interrupting(space, 2)).run()
    before = _trials(out)
    assert sum(t.state == TrialState.COMPLETE for t in before) == 2
    running = [t.number for t in before if t.state == TrialState.RUNNING]
    waiting = [t for t in before if t.state == TrialState.WAITING]
    assert len(running) == 1 and len(waiting) == n - 3

    s = Driver(load_space(space.path), out, workers=0, progress=False).run()
    after = _trials(out)
    counted = [t for t in after if t.state == TrialState.COMPLETE
               and "repeat_of" not in t.user_attrs]
    assert s.complete == len(counted) == n_trials
    keys = [config_key(space, t.params) for t in counted]
    assert len(set(keys)) == len(keys)  # no configuration evaluated twice
    # every design configuration was evaluated, exactly once, the interrupted one by its
    # re-enqueued trial; the design was not enqueued again
    design = [config_key(space, p) for p in initial_design(space, n, 0)]
    assert set(design) <= set(keys)
    # (a later draw of a design configuration is a repeat answered from its result)
    drawn = collections.Counter(config_key(space, t.params) for t in after
                                if t.params and t.number not in running
                                and "repeat_of" not in t.user_attrs)
    assert all(drawn[k] == 1 for k in design), drawn
    assert sum(bool(t.user_attrs.get("initial_design")) for t in after) == n
    assert [t.user_attrs.get("requeued_from") for t in after
            if "requeued_from" in t.user_attrs] == running
    # each configuration simulated once (the interrupted trial was never simulated)
    assert sum(simulated.values()) == n_trials + sum(
        bool(t.user_attrs.get("rejected")) and "repeat_of" not in t.user_attrs
        and t.user_attrs.get("wall_s") is not None for t in after)
    assert max(simulated.values()) == 1


def _knob_diff(a: dict, b: dict) -> list[str]:
    return [k for k in KNOBS if a.get(k) != b.get(k)]


def test_local_search_proposes_untried_feasible_neighbours_of_the_front(tmp_path):
    """Every draw of a search that is all local search (after a 4-point design) is a
    configuration the check accepts, not tried before, one knob away from a configuration
    on the front of the trials before it (of the feasible ones, or of all)."""
    from dse.metrics import pareto_mask

    space = _space(tmp_path, sampler="tpe", initial_design=4, local_search=1.0, n_trials=14)
    s = Driver(space, tmp_path / "out", workers=0, progress=False).run()
    assert s.rejected == 0 and s.repeats == 0 and s.complete == 14
    trials = _trials(tmp_path / "out")
    dirs = [o.direction for o in space.objectives]
    local = 0
    for t in trials[4:]:
        done = [u for u in trials[:t.number] if u.state == TrialState.COMPLETE]
        prev = [u for u in done if all(v <= 0 for v in u.constraints.values())]
        if not prev:
            continue
        assert precheck(space, make_trial_config(space, 0, t.params)) is None
        assert config_key(space, t.params) not in {config_key(space, u.params)
                                                   for u in trials[:t.number]}
        front = [ts[i] for ts in (prev, done) for i in np.flatnonzero(pareto_mask(
            np.array([u.values for u in ts], float), dirs))]
        near = [u for u in front if len(_knob_diff(
            canonical_params(space, t.params), canonical_params(space, u.params))) == 1]
        assert near, (t.number, t.params, [u.params for u in front])
        local += 1
    assert local >= 5


def _rank_key(t, dirs):
    return [v * (-1.0 if d == "maximize" else 1.0) for v, d in zip(t.values, dirs)]


def test_polish_climbs_from_the_best_feasible_configuration(tmp_path):
    """With the whole budget after the design polishing, each draw is an untried feasible
    one-knob neighbour of the best feasible trial before it that still has one (ranked by
    the objectives in order), so the search ends on a configuration no single untried
    knob change can beat."""
    space = _space(tmp_path, sampler="tpe", initial_design=4, local_search=0, polish=1.0,
                   n_trials=14)
    s = Driver(space, tmp_path / "out", workers=0, progress=False).run()
    assert s.rejected == 0 and s.repeats == 0 and s.complete == 14
    trials = _trials(tmp_path / "out")
    dirs = [o.direction for o in space.objectives]
    feasible = {config_key(space, p) for p in feasible_set(space)}
    moves = ([1, 2, 4], [1, 2, 4], [16, 64, 256], [128, 1024, 4096])
    polished = 0
    for t in trials[4:]:
        before = trials[:t.number]
        taken = {config_key(space, u.params) for u in before}
        feas = [u for u in before if u.state == TrialState.COMPLETE
                and all(v <= 0 for v in u.constraints.values())]
        ranked = sorted(feas, key=lambda u: (_rank_key(u, dirs), u.number))
        key = config_key(space, t.params)
        assert key in feasible and key not in taken
        for u in ranked:
            near = []
            for k, vals in zip(KNOBS, (*moves, [True, False])):
                base = canonical_params(space, u.params)
                j = vals.index(base[k])
                for v in (vals[j - 1:j] + vals[j + 1:j + 2]) if k != "enable_prefix_caching" \
                        else [not base[k]]:
                    c = config_key(space, {**base, k: v})
                    if c in feasible and c not in taken:
                        near.append(c)
            if near:
                assert key in near, (t.number, t.params, u.params)
                polished += 1
                break
    assert polished >= 5
    # the search's summary: the best, and how much of its neighbourhood was simulated
    info = best_neighbourhood(space, trials)
    feas = [u for u in trials if u.state == TrialState.COMPLETE
            and all(v <= 0 for v in u.constraints.values())]
    best = min(feas, key=lambda u: (_rank_key(u, dirs), u.number))
    taken = {config_key(space, u.params) for u in trials}
    around = Neighbourhood(space, feasible_set(space)).of(best.params)
    assert info["trial"] == best.number and info["neighbours"] == len(around) > 0
    assert info["tried"] == sum(k in taken for k in around)
    assert [config_key(space, c) for c in info["untried"]] == sorted(set(around) - taken)


def test_inert_knobs_are_those_that_never_changed_a_result(tmp_path):
    from types import SimpleNamespace

    sampler = make_sampler(_space(tmp_path, sampler="tpe"), 0, False, 40)
    base = {"tp": 1, "replicas": 1, "max_num_seqs": 64, "max_num_batched_tokens": 1024,
            "enable_prefix_caching": True}

    def trial(values, **change):
        return SimpleNamespace(params={**base, **change}, values=values)

    done = [trial([10.0, 2.0]), trial([10.0, 2.0], enable_prefix_caching=False),
            trial([12.0, 3.0], max_num_seqs=256),
            trial([12.0, 3.0], max_num_seqs=256, enable_prefix_caching=False),
            trial([9.0, 1.0], replicas=2)]
    assert sampler._inert_knobs(done) == {"enable_prefix_caching"}
    # one comparison where it mattered and the knob is not inert
    done.append(trial([11.0, 3.0], max_num_seqs=16))
    done.append(trial([11.5, 3.0], max_num_seqs=16, enable_prefix_caching=False))
    assert sampler._inert_knobs(done) == set()


def test_search_summary_says_whether_a_knob_change_could_beat_the_best(tmp_path, capsys):
    """`dse search` ends with the best configuration's one-knob neighbourhood: all of it
    simulated (no single knob change improves it) or how much was left; so does the
    report."""
    from dse.cli import main

    space = write_space(tmp_path, knobs=KNOBS, search={"sampler": "tpe", "n_trials": 6,
                                                       "seed": 0, "polish": 0.5})
    out = tmp_path / "out"
    assert main(["search", str(space), "--out", str(out), "--workers", "0",
                 "--no-progress"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Best by ")]
    assert len(lines) == 1, lines
    info = best_neighbourhood(load_space(space), _trials(out))
    assert f"trial {info['trial']};" in lines[0]
    if info["tried"] == info["neighbours"]:
        assert f"all {info['neighbours']} of its one-knob neighbours" in lines[0]
    else:
        assert f"{info['tried']} of its {info['neighbours']} one-knob neighbours" in lines[0]
    assert lines[0] in (out / "report.html").read_text()  # the report says it too
