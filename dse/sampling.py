"""Which configurations the search proposes: the sampler and its initial design.

A finite space (every searched knob a list, or a range with a step) is enumerated once: its
*feasible set* is every distinct configuration (canonical form, :func:`config_key`) that the
pre-simulation check accepts. A fresh study starts with an *initial design* drawn from that
set only: a few configurations chosen so that every value of every knob appears at least
once (among the values some feasible configuration can take), the rest spread out (greedy
maximin distance on the knobs' ranks). They are enqueued in the study, so parallel workers
take them like any other trial, and a resumed study finds the ones not yet run still
waiting. The sampler (TPE, NSGA-II, random) then proposes the rest of the budget, learning
from the design.

Why: with 5% of the quickstart grid, a sampler that starts from its own random draws can
miss a whole corner of the front (the worst of five seeds reached 69% of the brute-force
hypervolume); ``experiments/search_quality.py`` measures each choice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from dse.canonical import KeyCache, canonical_params, config_key
from dse.config import make_trial_config, precheck
from dse.space import Space

log = logging.getLogger(__name__)

__all__ = ["DESIGN_ATTR", "Neighbourhood", "best_neighbourhood", "covering_size", "design_size",
           "enqueue_initial_design", "feasible_set", "initial_design", "make_sampler",
           "objective_rank", "polish_trials", "refuse_empty_space", "resolved_sampler",
           "sampler_settings"]

#: study user attribute set once the initial design is enqueued (value: its size)
DESIGN_ATTR = "dse.initial_design"
#: a finite space with more raw combinations than this is not enumerated
ENUMERATION_LIMIT = 100_000

#: share of the draws after the initial design that are neighbours of the front
DEFAULT_LOCAL_SEARCH = 0.5
#: share of n_trials, at the end of the budget, that polishes the best configurations
DEFAULT_POLISH = 0.1


_FEASIBLE_CACHE: dict[tuple[str, str, int], list[dict] | None] = {}


def feasible_set(space: Space, limit: int = ENUMERATION_LIMIT) -> list[dict] | None:
    """One parameter dict (searched knobs only, as :meth:`Space.grid` gives them) per
    distinct configuration that passes :func:`precheck`; None when the space is infinite
    or has more than ``limit`` raw combinations. Cached per space file and digest."""
    # (the resolved path: `dse search` reads the space as given, relative or not, and its
    # summary reads it back by the absolute path the study folder records)
    ck = (str(Path(space.path).resolve()) if space.path else "", space.digest, limit)
    if ck in _FEASIBLE_CACHE:
        return _FEASIBLE_CACHE[ck]
    n = 1
    out: list[dict] | None = None
    for dom in space.knobs.values():
        vals = dom.finite_values()
        if vals is None:
            n = limit + 1
            break
        n *= max(1, len(vals))
    if n <= limit:
        seen: set[str] = set()
        out = []
        for params in space.grid():
            key = config_key(space, params)
            if key in seen:
                continue
            seen.add(key)
            if precheck(space, make_trial_config(space, 0, params)) is None:
                out.append(params)
    if space.digest:
        _FEASIBLE_CACHE[ck] = out
    return out


def refuse_empty_space(space: Space) -> None:
    """Raise InputError when the space can be enumerated and the pre-simulation check
    rejects every configuration of it: one line with the commonest reasons and counts
    (a search would only draw rejected configurations until it gives up)."""
    from collections import Counter

    from sim.errors import InputError

    if feasible_set(space) != []:
        return
    reasons: Counter[str] = Counter()
    seen: set[str] = set()
    for params in space.grid():
        key = config_key(space, params)
        if key not in seen:
            seen.add(key)
            reasons[precheck(space, make_trial_config(space, 0, params)) or "?"] += 1
    n = len(seen)
    top = "; ".join(f"{why} ({k} of {n})" for why, k in reasons.most_common(2))
    more = f"; and {len(reasons) - 2} other reason(s)" if len(reasons) > 2 else ""
    raise InputError(f"{space.path}: every one of the {n} configuration(s) is rejected "
                     f"before simulation, nothing to search: {top}{more}")


def resolved_sampler(space: Space) -> str:
    """The sampler a search runs: ``auto`` is NSGA-II (with the initial design and local
    search where the space can be enumerated): on the quickstart grid it reached the most
    of the brute-force front's hypervolume in the worst of five seeds with 5% of the grid
    (experiments/search_quality.py; README, "How a study runs")."""
    s = space.search.sampler
    return "nsga2" if s == "auto" else s


def design_size(space: Space, n_trials: int, seed: int = 0) -> int:
    """How many configurations the initial design holds (0: none). ``search.initial_design``
    when given; else NSGA-II's population (its first generation), and for TPE a quarter of
    the budget; never fewer than it takes to show every knob value (:func:`covering_size`)
    and never more than the budget. None for ``random`` (the baseline) and
    ``grid``, and none when the space cannot be enumerated."""
    s = space.search
    sampler = resolved_sampler(space)
    if sampler in ("grid", "random") or feasible_set(space) is None:
        return 0
    n = getattr(s, "initial_design", None)
    if n is None:
        n = s.population_size if sampler == "nsga2" else round(0.25 * n_trials)
        n = max(n, covering_size(space, seed))
    return max(0, min(int(n), n_trials))


def _encode(space: Space, configs: list[dict]) -> tuple[np.ndarray, list[list[tuple]],
                                                      np.ndarray]:
    """Per configuration: its knob values as numbers in [0, 1] (rank among the knob's
    values; booleans and strings by rank too, compared as equal or not) and the (knob,
    value) pairs it shows, both taken from the canonical form (a knob without effect shows
    its default, not the value drawn)."""
    knobs = space.searched_knobs
    canon = [canonical_params(space, c) for c in configs]
    cols, pairs = [], [[] for _ in configs]
    numeric = []
    for k in knobs:
        vals = list(space.knobs[k].finite_values() or [])
        rank = {repr(v): i for i, v in enumerate(vals)}
        width = max(1, len(vals) - 1)
        col = []
        for i, c in enumerate(canon):
            v = c.get(k)
            r = rank.get(repr(v))
            if r is None:  # a value outside the list (a default of an inactive knob)
                r = -1
            col.append(r / width if r >= 0 else -1.0)
            if r >= 0:
                pairs[i].append((k, r))
        cols.append(col)
        numeric.append(all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           for v in vals))
    x = np.array(cols, float).T.reshape(len(configs), len(knobs))
    # categorical knobs compare as equal or not (distance 0 or 1); an inactive numeric
    # knob sits in the middle of its range, nearest to everything
    cat = np.array([not n for n in numeric], bool)
    x[:, ~cat] = np.where(x[:, ~cat] < 0, 0.5, x[:, ~cat])
    return x, pairs, cat


def _greedy(space: Space, feasible: list[dict], seed: int):
    """Indices into ``feasible``, best first: the configuration that shows the most (knob,
    value) pairs not shown yet, ties broken by the largest distance to those chosen, then
    at random (by ``seed``). Yields (index, pairs still not shown)."""
    x, pairs, cat = _encode(space, feasible)
    order = np.random.default_rng(seed).permutation(len(feasible))
    x, pairs = x[order], [pairs[i] for i in order]
    uncovered = {p for ps in pairs for p in ps}
    mind = np.full(len(feasible), np.inf)
    free = np.ones(len(feasible), bool)
    for _ in range(len(feasible)):
        gain = np.array([len(uncovered.intersection(ps)) for ps in pairs], float)
        score = np.where(free, gain * 1e9 + np.minimum(mind, 1e8), -np.inf)
        i = int(np.argmax(score))
        free[i] = False
        uncovered.difference_update(pairs[i])
        d = np.abs(x - x[i])
        d[:, cat] = (d[:, cat] > 0).astype(float)
        mind = np.minimum(mind, d.sum(axis=1))
        yield int(order[i]), len(uncovered)


def covering_size(space: Space, seed: int, feasible: list[dict] | None = None) -> int:
    """How many configurations the design needs to show every (knob, value) pair that a
    feasible configuration can show (0 when the space cannot be enumerated)."""
    feasible = feasible_set(space) if feasible is None else feasible
    if not feasible:
        return 0
    for n, (_, left) in enumerate(_greedy(space, feasible, seed), 1):
        if left == 0:
            return n
    return len(feasible)


def initial_design(space: Space, n: int, seed: int,
                   feasible: list[dict] | None = None) -> list[dict]:
    """``n`` configurations from the feasible set, chosen greedily (:func:`_greedy`): the
    first :func:`covering_size` of them show every knob value, the rest spread out. Empty
    when the space cannot be enumerated."""
    feasible = feasible_set(space) if feasible is None else feasible
    if not feasible or n <= 0:
        return []
    picks = _greedy(space, feasible, seed)
    return [dict(feasible[next(picks)[0]]) for _ in range(min(n, len(feasible)))]


def enqueue_initial_design(space: Space, study, n_trials: int, seed: int) -> int:
    """Enqueue the initial design in ``study`` once (a study attribute records it, so a
    resumed study does not enqueue it again; a driver killed while enqueueing leaves the
    attribute unset, and the next one enqueues only what is not in the study yet).
    Returns how many configurations were enqueued now."""
    if DESIGN_ATTR in study.user_attrs:
        return 0
    n = design_size(space, n_trials, seed)
    design = initial_design(space, n, seed) if n else []
    have = set()
    for t in study.get_trials(deepcopy=False):
        p = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
        if p:
            have.add(config_key(space, space.complete(p)))
    added = 0
    for params in design:
        if config_key(space, space.complete(params)) in have:
            continue
        study.enqueue_trial(params, user_attrs={"initial_design": True}, skip_if_exists=False)
        added += 1
    study.set_user_attr(DESIGN_ATTR, len(design))
    if design:
        log.info("initial design: %d configurations enqueued", added)
    return added


class Neighbourhood:
    """One-knob moves inside a finite space's feasible set: a knob moved to the next value
    of its list (numeric knobs) or to any other value (categorical ones)."""

    def __init__(self, space: Space, feasible: list[dict]) -> None:
        self.key = KeyCache(space)
        self.feasible = {self.key(f): f for f in feasible}
        self.values = {k: list(space.knobs[k].finite_values() or [])
                       for k in space.searched_knobs}
        self.numeric = {k: all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               for v in vals) for k, vals in self.values.items()}

    def of(self, params: dict, taken=frozenset()) -> dict[str, tuple[str, dict]]:
        """The feasible one-knob neighbours of ``params`` whose keys are not in ``taken``:
        by configuration key, the knob moved and the configuration. A move of a knob
        without effect there (the routing policy with one replica) is the configuration
        itself, not a neighbour."""
        base = {k: params[k] for k in self.values if k in params}
        own = self.key(base)
        cands: dict[str, tuple[str, dict]] = {}
        for k, vals in self.values.items():
            if k not in base or base[k] not in vals:
                continue
            j = vals.index(base[k])
            others = ([vals[m] for m in (j - 1, j + 1) if 0 <= m < len(vals)]
                      if self.numeric[k] else [v for v in vals if v != base[k]])
            for v in others:
                key = self.key({**base, k: v})
                if key != own and key in self.feasible and key not in taken:
                    cands.setdefault(key, (k, self.feasible[key]))
        return cands


class LocalSearchSampler:
    """Wraps a sampler: after the initial design, a share of the draws (``p``, decided per
    trial number by ``seed``) are one-knob neighbours of the configurations on the current
    Pareto front of the feasible trials: one knob moved to the next value of its list (or
    any other value of a categorical knob), kept only when the result is in the feasible
    set and no trial (finished, running or rejected) has that configuration yet. The front
    point is drawn in proportion to the hypervolume it alone dominates, so an isolated
    corner of the front is refined before a crowded stretch of it. Half the time (when
    there are any) the base point is instead one that would beat that front but breaks
    an SLO (on the front of all trials, feasible or not): its neighbours reach for the
    edge of the feasible region, where the best feasible configurations often are. The other
    draws, and any draw with no such neighbour left, are the wrapped sampler's. From the
    ``polish_from``-th counted trial on, every draw instead polishes the best feasible
    configuration (``_polish``). It reads only the study, so parallel workers (running
    trials count as taken) and a resumed study need nothing more."""

    def __init__(self, base, space: Space, feasible: list[dict], p: float, seed: int,
                 start_after: int, polish_from: int | None = None) -> None:
        self.base = base
        self.space = space
        self.p = p
        self.seed = seed
        self.start_after = start_after
        #: counted trials from which every draw polishes the best (None: never)
        self.polish_from = polish_from
        self._near = Neighbourhood(space, feasible)
        self._key = self._near.key
        self._values = self._near.values
        self._picked: dict[int, dict] = {}

    def __getattr__(self, name):  # anything else Optuna asks of a sampler: the wrapped one
        return getattr(self.base, name)

    # ------------------------------------------------------------ Optuna's sampler API
    def infer_relative_search_space(self, study, trial):
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        picked = self._picked.get(trial.number)
        if picked is not None:
            return {k: picked[k] for k in search_space if k in picked}
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, name, distribution):
        picked = self._picked.get(trial.number)
        if picked is not None and name in picked:
            return picked[name]
        return self.base.sample_independent(study, trial, name, distribution)

    def before_trial(self, study, trial) -> None:
        self.base.before_trial(study, trial)
        if trial.system_attrs.get("fixed_params"):
            return  # enqueued: the design, or a re-run after an interruption
        if self.p <= 0 and self.polish_from is None:
            return
        picked = self._neighbour(study, np.random.default_rng([self.seed, trial.number]))
        if picked is not None:
            self._picked[trial.number] = picked

    def after_trial(self, study, trial, state, values) -> None:
        self._picked.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    # ------------------------------------------------------------ neighbours
    def _neighbour(self, study, rng) -> dict | None:
        from dse.metrics import pareto_mask

        trials = study.get_trials(deepcopy=False)
        done = _evaluated(trials)
        if len(done) < self.start_after:
            return None
        taken = set()
        for t in trials:
            p = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
            if p:
                taken.add(self._key(p))  # (config_key completes the parameters itself)
        feas = [t for t in done if _meets_slos(t)]
        dirs = ["maximize" if d.name == "MAXIMIZE" else "minimize" for d in study.directions]
        if self.polish_from is not None and len(done) >= self.polish_from:
            picked = self._polish(feas, done, dirs, taken, rng)
            if picked is not None:
                return picked
        if rng.random() >= self.p:
            return None

        def front_of(ts):
            if not ts:
                return []
            vals = np.array([t.values for t in ts], float)
            return [ts[i] for i in np.flatnonzero(pareto_mask(vals, dirs))]

        # the front of the feasible trials, each point drawn by its hypervolume share; and
        # the points that would beat it but break an SLO (the front of every trial, less
        # the feasible ones): their neighbours reach toward the edge of the feasible region
        front = front_of(feas)
        ids = {t.number for t in front}
        beyond = [t for t in front_of(done) if t.number not in ids]
        sources = []
        if front:
            sources.append((front, _contributions(
                np.array([t.values for t in front], float),
                np.array([t.values for t in feas], float), dirs)))
        if beyond:
            sources.append((beyond, np.full(len(beyond), 1.0 / len(beyond))))
        if len(sources) == 2 and rng.random() < 0.5:
            sources.reverse()
        for points, weights in sources:
            picked = self._neighbour_of(points, weights, taken, rng)
            if picked is not None:
                return picked
        return None

    def _neighbour_of(self, front, weights, taken, rng) -> dict | None:
        for i in rng.choice(len(front), size=len(front), replace=False, p=weights):
            cands = self._near.of(front[i].params, taken)
            if cands:
                keys = sorted(cands)
                return dict(cands[keys[int(rng.integers(len(keys)))]][1])
        return None

    # ------------------------------------------------------------ polish
    def _polish(self, feas, done, dirs, taken, rng) -> dict | None:
        """An untried one-knob neighbour of the best feasible trial by the objectives in
        their order (the first decides; ties go to the next), else of the next best, and
        so on: the end of the budget climbs from the best configuration found, the one a
        user takes, so that no single knob change left untried beats it. Knobs that every
        comparison so far found inert (``_inert_knobs``) are moved last."""
        if not feas:
            return None
        ranked = sorted(feas, key=lambda t: (objective_rank(t.values, dirs), t.number))
        inert = self._inert_knobs(done)
        for t in ranked:
            cands = self._near.of(t.params, taken)
            if not cands:
                continue
            keys = sorted(k for k, (knob, _) in cands.items() if knob not in inert) or sorted(cands)
            return dict(cands[keys[int(rng.integers(len(keys)))]][1])
        return None

    def _inert_knobs(self, done) -> set[str]:
        """Knobs whose every observed change alone (two counted trials that differ in that
        knob only) left every objective value the same: a workload without shared prefixes
        makes prefix caching such a knob, one router such a routing policy."""
        same: set[str] = set()
        differ: set[str] = set()
        for k in self._values:
            groups: dict[tuple, dict] = {}
            for t in done:
                if k not in t.params:
                    continue
                rest = tuple((n, t.params.get(n)) for n in self._values if n != k)
                groups.setdefault(rest, {}).setdefault(t.params[k], tuple(t.values))
            for outcomes in groups.values():
                if len(outcomes) > 1:
                    (same if len(set(outcomes.values())) == 1 else differ).add(k)
        return same - differ


def _evaluated(trials) -> list:
    """The COMPLETE trials with objective values that were evaluated (a repeat's answer is
    its first evaluation's, left out)."""
    from optuna.trial import TrialState

    return [t for t in trials if t.state == TrialState.COMPLETE and t.values
            and "repeat_of" not in t.user_attrs]


def _meets_slos(trial) -> bool:
    """Every SLO constraint of ``trial`` holds (a normalised constraint <= 0)."""
    return all(v <= 0 for v in (trial.constraints or {}).values())


def objective_rank(values, dirs: list[str]) -> list[float]:
    """Sort key of a trial's objective values, best first: by the objectives in their order
    (the first decides, ties go to the next)."""
    return [v * (-1.0 if d == "maximize" else 1.0) for v, d in zip(values, dirs)]


def best_neighbourhood(space: Space, trials) -> dict | None:
    """The best feasible trial (``objective_rank``) and how much of its one-knob
    neighbourhood the study has simulated: ``{"trial", "neighbours", "tried", "untried"}``
    (the configurations not simulated, waiting ones included). A neighbour tried is never
    better: the best is the best feasible trial. None where the space cannot be enumerated
    or no trial is feasible."""
    from optuna.trial import TrialState

    feasible = feasible_set(space)
    if not feasible:
        return None
    dirs = [o.direction for o in space.objectives]
    feas = [t for t in _evaluated(trials) if _meets_slos(t)]
    if not feas:
        return None
    best = min(feas, key=lambda t: (objective_rank(t.values, dirs), t.number))
    near = Neighbourhood(space, feasible)
    # simulated: finished trials, less those an interruption ended (their configuration
    # re-enqueued); a waiting trial (a grid's rest, a design beyond a smaller budget) was not
    interrupted = {t.user_attrs.get("requeued_from") for t in trials}
    tried = set()
    for t in trials:
        if t.state in (TrialState.COMPLETE, TrialState.FAIL) and t.params \
                and t.number not in interrupted:
            tried.add(near.key(t.params))
    around = near.of(best.params)
    untried = [cfg for k, (_, cfg) in sorted(around.items()) if k not in tried]
    return {"trial": best.number, "neighbours": len(around),
            "tried": len(around) - len(untried), "untried": untried}


def _contributions(values: np.ndarray, seen: np.ndarray, dirs: list[str]) -> np.ndarray:
    """Probabilities over front points ``values``, in proportion to the hypervolume each
    alone dominates (two objectives; the reference point is the worst value of each
    objective among the feasible trials ``seen``, 1% of the range further; points with
    equal values share theirs; every point keeps a tenth of a uniform share). With more
    objectives, or nothing to measure, uniform."""
    n = len(values)
    if n == 0:
        return np.zeros(0)
    if values.shape[1] != 2 or n == 1:
        return np.full(n, 1.0 / n)
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in dirs])
    v = values * sign  # minimise both
    w_all = seen * sign
    span = np.ptp(w_all, axis=0)
    ref = w_all.max(axis=0) + np.where(span > 0, 0.01 * span, 1.0)
    uniq, inv = np.unique(v, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    order = np.argsort(uniq[:, 0], kind="stable")
    c = np.zeros(len(uniq))
    for r, u in enumerate(order):
        right = uniq[order[r + 1], 0] if r + 1 < len(order) else ref[0]
        up = uniq[order[r - 1], 1] if r > 0 else ref[1]
        c[u] = max(0.0, right - uniq[u, 0]) * max(0.0, up - uniq[u, 1])
    share = c[inv] / np.bincount(inv)[inv]
    total = share.sum()
    w = share / total if total > 0 else np.full(n, 1.0 / n)
    w = 0.9 * w + 0.1 / n
    return w / w.sum()


def make_sampler(space: Space, seed: int, deterministic: bool, n_trials: int | None = None):
    """The Optuna sampler of ``space.search`` (``grid`` enqueues the grid and draws the rest
    at random). TPE is multivariate with ``constant_liar`` while several trials are in
    flight (not in deterministic mode, whose batches are told before the next ask), and
    starts modelling after the initial design."""
    import optuna

    s = space.search
    sampler = resolved_sampler(space)
    n_design = design_size(space, n_trials or s.n_trials, seed)
    if sampler == "nsga2":
        base = optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=seed)
    elif sampler == "tpe":
        base = optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                          n_startup_trials=n_design or 10,
                                          constant_liar=not deterministic)
    else:
        return optuna.samplers.RandomSampler(seed=seed)
    p = local_search_share(space)
    n = n_trials or s.n_trials
    n_polish = polish_trials(space, n)
    feasible = feasible_set(space)
    if (p > 0 or n_polish > 0) and feasible:
        polish_from = n - n_polish if n_polish > 0 else None
        return LocalSearchSampler(base, space, feasible, p, seed, max(1, n_design), polish_from)
    return base


def local_search_share(space: Space) -> float:
    """The share of draws that are neighbours of the front (``search.local_search``)."""
    v = getattr(space.search, "local_search", None)
    return DEFAULT_LOCAL_SEARCH if v is None else float(v)


def polish_trials(space: Space, n_trials: int) -> int:
    """The trials at the end of a budget of ``n_trials`` that polish the best
    (``search.polish`` of them; the design, if longer, leaves fewer)."""
    v = getattr(space.search, "polish", None)
    return round((DEFAULT_POLISH if v is None else float(v)) * n_trials)


def sampler_settings(space: Space, seed: int, deterministic: bool,
                     n_trials: int | None = None) -> dict[str, Any]:
    s = space.search
    sampler = resolved_sampler(space)
    d: dict[str, Any] = {"sampler": sampler, "seed": seed, "deterministic": deterministic}
    if s.sampler == "auto":
        d["requested"] = "auto"
    if sampler == "nsga2":
        d["population_size"] = s.population_size
    if sampler == "tpe":
        d.update(multivariate=True, constant_liar=not deterministic,
                 n_startup_trials=design_size(space, n_trials or s.n_trials, seed) or 10)
    if sampler not in ("grid", "random"):
        d["initial_design"] = design_size(space, n_trials or s.n_trials, seed)
        if feasible_set(space) is not None:
            d["local_search"] = local_search_share(space)
            # the polish follows the design (LocalSearchSampler.start_after): a budget
            # the design fills has none
            n = n_trials or s.n_trials
            d["polish_trials"] = max(0, min(polish_trials(space, n), n - d["initial_design"]))
    return d
