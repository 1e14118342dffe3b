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
from typing import Any

import numpy as np

from dse.canonical import canonical_params, config_key
from dse.config import make_trial_config, precheck
from dse.space import Space

log = logging.getLogger(__name__)

__all__ = ["DESIGN_ATTR", "covering_size", "design_size", "enqueue_initial_design", "feasible_set",
           "initial_design", "make_sampler", "resolved_sampler", "sampler_settings"]

#: study user attribute set once the initial design is enqueued (value: its size)
DESIGN_ATTR = "dse.initial_design"
#: a finite space with more raw combinations than this is not enumerated
ENUMERATION_LIMIT = 100_000

_FEASIBLE_CACHE: dict[tuple[str, str, int], list[dict] | None] = {}


def feasible_set(space: Space, limit: int = ENUMERATION_LIMIT) -> list[dict] | None:
    """One parameter dict (searched knobs only, as :meth:`Space.grid` gives them) per
    distinct configuration that passes :func:`precheck`; None when the space is infinite
    or has more than ``limit`` raw combinations. Cached per space file and digest."""
    ck = (str(space.path), space.digest, limit)
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


def resolved_sampler(space: Space) -> str:
    """The sampler a search runs: ``auto`` resolves to TPE (see README, search quality)."""
    s = space.search.sampler
    return "tpe" if s == "auto" else s


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


def make_sampler(space: Space, seed: int, deterministic: bool, n_trials: int | None = None):
    """The Optuna sampler of ``space.search`` (``grid`` enqueues the grid and draws the rest
    at random). TPE is multivariate with ``constant_liar`` while several trials are in
    flight (not in deterministic mode, whose batches are told before the next ask), and
    starts modelling after the initial design."""
    import optuna

    s = space.search
    sampler = resolved_sampler(space)
    if sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=seed)
    if sampler == "tpe":
        startup = design_size(space, n_trials or s.n_trials, seed) or 10
        return optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                          n_startup_trials=startup,
                                          constant_liar=not deterministic)
    return optuna.samplers.RandomSampler(seed=seed)


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
    return d
