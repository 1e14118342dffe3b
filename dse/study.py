"""The search driver: the only writer of the Optuna study and of MLflow.

Optuna ask/tell with storage in a journal file under the output folder, so re-running the
same command resumes: trials a killed driver left RUNNING are failed and their parameters
re-enqueued, and only COMPLETE trials count toward ``n_trials``. Configurations that cannot
work are rejected before simulating: told as FAIL with ``rejected`` and the reason recorded
(so the sampler learns nothing from them) and not counted, the sampler draws again; a draw
of a configuration rejected before is marked ``repeat_of`` its first rejection. ``deterministic`` asks a batch, waits for all of it and tells in
trial order, so the same seed gives the same trials.
"""

from __future__ import annotations

import logging
import math
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dse import metrics as M
from dse.canonical import KeyCache
from dse.config import make_trial_config, precheck
from dse.sampling import enqueue_initial_design, feasible_set, make_sampler, sampler_settings
from dse.space import Space, load_space
from dse.store import (
    JOURNAL,
    MLFLOW_DB,
    SPACE_COPY,
    SPOOL,
    STUDY_FILES,
    STUDY_JSON,
    StudyLock,
    check_not_foreign,
    check_out_dir,
    check_study_there,
    default_tracking_uri,
    driver_journal,
    open_storage,
    open_tracker,
    read_meta,
    save_meta,
)
from dse.worker import TrialResult
from sim.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["JOURNAL", "SPACE_COPY", "STUDY_FILES", "STUDY_JSON", "Driver", "SearchSummary",
           "open_storage", "run_search"]
#: per-instance summary blocks left out of a trial's MLflow metrics (one per instance,
#: ~40 per trial of 8 replicas); its summary.json artifact keeps them
PER_INSTANCE_METRICS = ("kv_cache.", "kv_blocks.")
#: consecutive draws of already-evaluated configurations after which the search stops
#: (the sampler keeps proposing what it has seen: the space is exhausted for it)
MAX_REPEATS_IN_A_ROW = 500
#: consecutive draws rejected before simulating after which the search stops (a space whose
#: every configuration is rejected, or a sampler stuck where nothing fits, still ends)
MAX_REJECTED_IN_A_ROW = 500


def versions() -> dict[str, str]:
    """The versions of the packages a study depends on, from their installed metadata
    (importing mlflow and ray here would cost the driver ~1.5 s of CPU before Ray starts)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("optuna", "ray", "mlflow", "numpy", "pandas"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass
class Outcome:
    number: int
    params: dict
    values: list[float] | None = None
    constraints: dict[str, float] = field(default_factory=dict)
    state: str = "COMPLETE"  # or FAIL
    attrs: dict[str, Any] = field(default_factory=dict)
    result: TrialResult | None = field(default=None, repr=False)


@dataclass
class SearchSummary:
    out_dir: Path
    complete: int
    feasible: int
    failed: int
    rejected: int
    pareto: int
    wall_s: float
    tracking_s: float
    resumed: bool
    requeued: int
    #: draws that repeated an evaluated configuration, answered from its stored result
    repeats: int = 0
    #: where the trials ran: "ray (N workers)" or "in-process"
    pool: str = ""
    #: where the seconds went (see :meth:`Driver.timing_lines`)
    timings: dict[str, float] = field(default_factory=dict)
    #: COMPLETE trials the study held before this run (a resumed study)
    complete_before: int = 0
    #: the study already held n_trials COMPLETE trials: no worker was started
    nothing_to_run: bool = False
    #: (n_trials asked for, the cap) when the space has fewer distinct configurations
    capped: tuple[int, int] | None = None
    #: how much of the best configuration's one-knob neighbourhood was simulated (the
    #: report's line, dse.report.best_neighbourhood_text); None where not known
    best_note: str | None = None


class Driver:
    def __init__(self, space: Space, out_dir: Path, *, n_trials: int | None = None,
                 workers: int | None = None, ray_address: str | None = None,
                 tracking_uri: str | None = None, fresh: bool = False,
                 deterministic: bool = False, seed: int | None = None,
                 progress: bool = True, pool=None, console=None) -> None:
        self.space = space
        self.out = out_dir
        self.seed = space.search.seed if seed is None else seed
        self.deterministic = deterministic
        self.n_trials = n_trials or space.search.n_trials
        #: the budget asked for, before the cap at the space's distinct configurations
        self.n_trials_asked = self.n_trials
        distinct = _distinct_configurations(space)
        if distinct is not None:  # repeats and rejected draws are not counted: at most
            # every configuration that passes the pre-simulation check
            self.n_trials = min(self.n_trials, distinct)
        self.workers = space.search.workers if workers is None else workers
        self.ray_address = ray_address
        self.tracking_uri = tracking_uri
        self.fresh = fresh
        self.progress = progress
        self.pool = pool
        self.console = console
        #: the MLflow writer (dse.tracking.TrackingWriter), set by _open_tracking
        self.tracker = None
        self._journal = None
        self._stale: list[int] = []
        self.timings: dict[str, float] = {}
        self.requeued = 0
        self.resumed = False
        self.repeats = 0
        self._repeats_in_a_row = 0
        self._rejected_in_a_row = 0
        self._key = KeyCache(space)  # dse.canonical.config_key, memoised
        #: config_key -> the first rejected outcome of that configuration
        self._rejected_keys: dict[str, Outcome] = {}
        #: config_key -> the outcome of its first evaluation (COMPLETE ones)
        self._known: dict[str, Outcome] = {}
        #: config_key -> the outcome of a failed evaluation (such a configuration is drawn
        #: again only while its first evaluation is still running)
        self._failed: dict[str, Outcome] = {}
        #: config_key -> number of the trial evaluating it now
        self._evaluating: dict[str, int] = {}
        #: config_key -> repeats waiting for that evaluation: [(trial, cfg)]
        self._waiting: dict[str, list] = {}
        #: trial -> its TTFT/TPOT quantiles (dse.metrics.latency_quantiles), for the report
        self._latency: dict[int, dict] = {}
        #: the report's line on the best configuration's neighbourhood (set by _finish)
        self._best_note: str | None = None

    # ---------------------------------------------------------------- setup
    def _other_space(self, meta: dict) -> str:
        """Why ``--out`` cannot take this space: it holds the study of another one (or of
        this file as it was before an edit)."""
        given = Path(self.space.path)
        stored = meta.get("space_path")
        was = (f"the study there was made from {stored} as it was (digest "
               f"{meta.get('space_digest')}), and that file changed since (digest now "
               f"{self.space.digest})" if stored == str(given.resolve()) else
               f"holds the study of {stored} (digest {meta.get('space_digest')}), not of "
               f"{given} (digest {self.space.digest})")
        return (f"{self.out}: {was}; its space is kept in {self.out / SPACE_COPY}; rerun "
                "with --fresh to start over, or choose another --out")

    def _prepare_dir(self) -> dict:
        check_out_dir(self.out)
        check_not_foreign(self.out, Path(self.space.path))
        if self.fresh:
            for name in STUDY_FILES:
                p = self.out / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            _forget_mlflow_stores(self.out / MLFLOW_DB)
        meta = read_meta(self.out)
        if meta:
            if meta.get("space_digest") != self.space.digest:
                raise InputError(self._other_space(meta))
            if meta.get("seed") != self.seed:
                raise InputError(f"{self.out}: the study there used seed {meta.get('seed')}, "
                                 f"not {self.seed}; rerun with --fresh or the same --seed")
            self.resumed = True
        meta.update({
            "space_path": str(Path(self.space.path).resolve()),
            "space_digest": self.space.digest, "study_name": self.space.name,
            "seed": self.seed, "n_trials": self.n_trials,
            "sampler": sampler_settings(self.space, self.seed, self.deterministic,
                                        self.n_trials),
            "directions": [o.direction for o in self.space.objectives],
            "objectives": [o.name for o in self.space.objectives],
            "constraints": M.constraint_keys(self.space), "versions": versions(),
            "tracking_uri": self.tracking_uri, "command": " ".join(sys.argv),
        })
        src = Path(self.space.path)
        if src.is_file() and src.resolve() != (self.out / SPACE_COPY).resolve():
            shutil.copyfile(src, self.out / SPACE_COPY)
        return meta

    def _save_meta(self, meta: dict) -> None:
        save_meta(self.out, meta)

    @property
    def _meta_lock(self):
        if getattr(self, "_meta_lock_obj", None) is None:
            import threading

            self._meta_lock_obj = threading.Lock()
        return self._meta_lock_obj

    def _open_study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self._journal = driver_journal(self.out)
        self._storage = open_storage(self.out, self._journal)
        if self.resumed:
            check_study_there(self._storage, self.out, self.space.name)
        study = optuna.create_study(
            storage=self._storage,
            sampler=make_sampler(self.space, self.seed, self.deterministic, self.n_trials),
            study_name=self.space.name, load_if_exists=True,
            directions=[o.direction for o in self.space.objectives])
        return study

    def _recover(self, study) -> list[int]:
        """Fail trials a killed driver left RUNNING and re-enqueue their parameters; the
        numbers of those re-enqueued. A trial killed before its first parameter was drawn
        has nothing to re-run: it is failed, and its slot goes to a fresh draw (only
        COMPLETE trials count toward the budget, so nothing is lost)."""
        from optuna.trial import TrialState

        storage = getattr(self, "_storage", None) or open_storage(self.out)
        study_id = storage.get_study_id_from_name(study.study_name)
        stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        self._stale = [t.number for t in stale]
        numbers = []
        for t in stale:
            params = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
            reason = ("interrupted: the driver stopped; re-enqueued" if params else
                      "interrupted before any parameter was drawn; its slot is drawn anew")
            # the storage interface is Optuna's public API for trials of other processes
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            storage.set_trial_user_attr(trial_id, "reason", reason)
            study.tell(t.number, state=TrialState.FAIL)
            if params:
                study.enqueue_trial(params, user_attrs={"requeued_from": t.number},
                                    skip_if_exists=False)
                numbers.append(t.number)
        return numbers

    def _enqueue_grid(self, study) -> None:
        if self.space.search.sampler != "grid":
            enqueue_initial_design(self.space, study, self.n_trials, self.seed)
            return
        if study.get_trials(deepcopy=False):
            return
        grid = self.space.grid()
        order = np.random.default_rng(self.seed).permutation(len(grid))
        for i in order:  # rejected ones do not count: the whole grid, in a random order
            study.enqueue_trial(grid[int(i)])

    def _start_pool(self) -> None:
        """Start ``self.pool`` (made here unless given); it is ``self.pool`` while it
        starts, so an interrupted start is shut down with it."""
        if self.pool is not None:
            if hasattr(self.pool, "start") and not getattr(self.pool, "size", 0):
                self.pool = self.pool.start() or self.pool
            return
        from dse.pool import LocalPool, RayPool, warmup_tasks

        if self.workers == 0:
            self.pool = LocalPool(self.space)
            return
        self.pool = RayPool(self.space, self.workers or None, address=self.ray_address,
                            trial_timeout_s=self.space.search.trial_timeout_s,
                            warmup=warmup_tasks(self.space))
        self.pool.start()
        self.timings.update(self.pool.timings)

    # ---------------------------------------------------------------- trials
    def _task(self, cfg) -> dict:
        return {"number": cfg.number, "cluster": cfg.cluster, "options": cfg.options}

    def _outcome_from_result(self, cfg, res: TrialResult) -> Outcome:
        space = self.space
        base_attrs = {"devices_used": cfg.devices_used, "attempts": res.attempts,
                      "wall_s": res.wall_s, "node_id": res.node_id or None,
                      "node_ip": res.node_ip or None}
        if res.rejected is not None:
            return self._rejected(cfg, res.rejected, base_attrs)
        if res.error is not None:
            return Outcome(cfg.number, cfg.params, state="FAIL",
                           attrs={**base_attrs, "reason": res.error,
                                  "traceback": res.traceback[-2000:]})
        summary, slo = res.summary, res.slo
        objs = M.objective_values(space, summary, slo, cfg.devices_used,
                                  cfg.params["hardware"])
        attrs = {**base_attrs, "feasible": slo["feasible"], "reason": "" if slo["feasible"]
                 else "violates " + ", ".join(k for k, v in slo["constraints"].items() if v > 0),
                 "objectives": {k: v for k, v in objs.items() if v is not None
                                and math.isfinite(v)},
                 "attainment": slo["attainment"],
                 "latency_provider": str(summary.get("latency_provider", "")),
                 "latency_source": _source_text(summary.get("latency_source")),
                 "metrics": {k: v for k, v in M.flatten_summary(summary).items()
                             if not k.startswith("wall")}}
        if res.capacity is not None:
            attrs["capacity_rps"] = res.capacity["capacity_rps"]
            attrs["capacity_probes"] = len(res.capacity["probes"])
        out = Outcome(cfg.number, cfg.params, M.told_values(space, objs), slo["constraints"],
                      attrs=attrs)
        out.result = res  # for tracking artifacts
        if res.requests is not None and "ttft_ns" in res.requests:
            self._latency[cfg.number] = M.latency_quantiles(res.requests)  # for the report
        return out

    def _rejected(self, cfg, reason: str, attrs: dict | None = None) -> Outcome:
        return Outcome(cfg.number, cfg.params, None, M.rejected_constraints(self.space),
                       state="FAIL", attrs={**(attrs or {}), "devices_used": cfg.devices_used,
                              "feasible": False, "rejected": True, "reason": reason})

    def _record(self, study, trial, cfg, outcome: Outcome) -> None:
        """Spool the trial for MLflow (its writer thread logs it later), then tell Optuna:
        a kill between the two re-runs the trial and drops its spool file; a kill after
        the tell leaves the spool file, which the next run logs. Then answer the repeats
        that waited for this configuration."""
        self._tell(study, trial, cfg, outcome)
        key = self._key(cfg.params)
        self._evaluating.pop(key, None)
        if outcome.attrs.get("rejected"):
            self._rejected_keys.setdefault(key, outcome)
        elif outcome.state == "COMPLETE":
            self._known.setdefault(key, outcome)
        else:
            self._failed[key] = outcome
        for dup_trial, dup_cfg in self._waiting.pop(key, []):
            self._answer_repeat(study, dup_trial, dup_cfg, outcome)

    def _tell(self, study, trial, cfg, outcome: Outcome, count: bool = True) -> None:
        from optuna.trial import TrialState

        if count:  # a repeat has no run of its own: its first evaluation's run holds it
            self._track(cfg, outcome)
        for k, v in outcome.attrs.items():
            if v is not None:
                trial.set_user_attr(k, v)
        for k, v in outcome.constraints.items():
            trial.set_constraint(k, v)
        if outcome.state == "FAIL":
            study.tell(trial, state=TrialState.FAIL)
            if outcome.attrs.get("rejected"):
                self.rejected += count
            else:
                self.failed += count
            return
        study.tell(trial, outcome.values)
        if not count:
            return
        self.complete += 1
        if outcome.attrs.get("feasible"):
            self.feasible += 1
            self._update_best(outcome)

    def _answer_repeat(self, study, trial, cfg, first: Outcome) -> None:
        """A draw of a configuration already evaluated: told the stored result (so the
        sampler sees it as usual), marked ``repeat_of``, not simulated, not counted."""
        attrs = {k: v for k, v in first.attrs.items() if k not in ("traceback",)}
        attrs["repeat_of"] = first.number
        if first.state == "FAIL":
            attrs["reason"] = f"same configuration as trial {first.number}, which failed"
        dup = Outcome(trial.number, cfg.params, first.values, dict(first.constraints),
                      state=first.state, attrs=attrs)
        self.repeats += 1
        self._tell(study, trial, cfg, dup, count=False)

    def _update_best(self, outcome: Outcome) -> None:
        o = self.space.objectives[0]
        v = outcome.attrs["objectives"].get(o.name)
        if v is None:
            return
        better = self.best is None or (v > self.best if o.direction == "maximize"
                                       else v < self.best)
        if better:
            self.best = v

    def _track(self, cfg, outcome: Outcome) -> None:
        if self.tracker is None:
            return
        a = outcome.attrs
        params = {**{k: v for k, v in cfg.params.items()},
                  **{f"cluster.{k}": v for k, v in cfg.summary.items()}}
        metrics = {f"objective.{k}": v for k, v in (a.get("objectives") or {}).items()}
        metrics.update((k, v) for k, v in (a.get("metrics") or {}).items()
                       if not k.startswith(PER_INSTANCE_METRICS))  # in summary.json
        metrics.update({f"constraint.{k}": v for k, v in outcome.constraints.items()})
        for k in ("attainment", "capacity_rps", "wall_s", "attempts"):
            if a.get(k) is not None:
                metrics[k] = a[k]
        tags = {"feasible": str(bool(a.get("feasible"))), "reason": a.get("reason", ""),
                "latency_provider": a.get("latency_provider", ""),
                "latency_source": a.get("latency_source", ""), "state": outcome.state,
                "rejected": str(bool(a.get("rejected"))),
                "node_id": a.get("node_id") or "", "node_ip": a.get("node_ip") or ""}
        if a.get("repeat_of") is not None:
            tags["repeat_of"] = str(a["repeat_of"])
        files: dict[str, Any] = {"cluster.json": cfg.cluster}
        res = outcome.result
        if res is not None and res.simulated:
            files["requests.csv"] = res.requests
            if res.timeseries is not None:
                files["timeseries.csv"] = res.timeseries
            files["summary.json"] = _jsonable(res.summary)
        try:
            self.tracker.log_trial(cfg.number, params, metrics, tags, files)
        except Exception as exc:  # noqa: BLE001 - tracking must not kill the study
            log.warning("MLflow logging failed for trial %d: %s", cfg.number, exc)

    # ---------------------------------------------------------------- main loop
    def _open_tracking(self, meta: dict, requeue: list[int]) -> None:
        """Start the MLflow writer thread: it opens the store and the parent run while the
        workers start (both take seconds), then logs each trial as it is told. Trials a
        killed driver told but had not logged yet are logged first; those it had not told
        (re-run now) are dropped from the spool."""
        from dse.tracking import TrackingWriter

        uri = self.tracking_uri or meta.get("tracking_uri") or default_tracking_uri(self.out)
        meta["tracking_uri"] = uri
        parent_params = {
            "space": self.space.path, "n_trials": self.n_trials,
            "objectives": [f"{o.name}:{o.direction}" for o in self.space.objectives],
            "slo": self.space.slo, "model": self.space.model,
            "hardware": list(self.space.hardware),
            "total_devices": self.space.total_devices,
            **{f"sampler.{k}": v for k, v in sampler_settings(
                self.space, self.seed, self.deterministic, self.n_trials).items()}}
        parent_tags = {"dse.out_dir": str(self.out.resolve()),
                       "dse.space_digest": self.space.digest,
                       **{f"version.{k}": v for k, v in meta["versions"].items()}}
        experiment = f"dse-{self.space.name}"

        def connect():
            t0 = time.perf_counter()
            tracker = open_tracker(uri, self.out, experiment)
            parent = tracker.open_parent(meta.get("mlflow_parent_run_id"),
                                         f"{self.space.name} study", params=parent_params,
                                         tags=parent_tags)
            tracker.delete_trial_runs(requeue)
            with self._meta_lock:
                meta["mlflow_parent_run_id"] = parent
                meta["experiment_id"] = tracker.experiment_id
                self._save_meta(meta)
            self.timings["mlflow_open_s"] = time.perf_counter() - t0
            return tracker

        self.tracker = TrackingWriter(self.out / SPOOL, connect, before_log=self._journal.sync
                                      if self._journal is not None else None)
        stale = set(self._stale)
        for number, path in sorted(self.tracker.spooled().items()):
            if number in stale:  # never told: it runs again (re-enqueued) and is logged then
                path.unlink()
            else:
                self.tracker.replay(number)
        self.tracker.start()

    def _load_counts(self, study) -> None:
        """Counters and the stored results of a resumed study (repeats are not counted)."""
        from optuna.trial import TrialState

        done = study.get_trials(deepcopy=False)
        rejected = [t for t in done if t.user_attrs.get("rejected")
                    and t.user_attrs.get("repeat_of") is None]
        first = [t for t in done if t.state == TrialState.COMPLETE
                 and t.user_attrs.get("repeat_of") is None and not t.user_attrs.get("rejected")]
        self.complete = len(first)
        self.failed = 0
        self.rejected = len(rejected)
        self.feasible = sum(bool(t.user_attrs.get("feasible")) for t in first)
        self.repeats = sum(t.user_attrs.get("repeat_of") is not None
                           and not t.user_attrs.get("rejected") for t in done)
        self.best = None
        for t in rejected:
            self._rejected_keys.setdefault(
                self._key(t.params),
                Outcome(t.number, t.params, None, dict(t.constraints or {}), state="FAIL",
                        attrs=dict(t.user_attrs)))
        for t in first:
            out = Outcome(t.number, t.params, list(t.values), dict(t.constraints or {}),
                          attrs=dict(t.user_attrs))
            self._known.setdefault(self._key(t.params), out)
            if t.user_attrs.get("feasible"):
                self._update_best(out)

    def run(self) -> SearchSummary:
        check_out_dir(self.out)
        with StudyLock(self.out):
            return self._run_locked()

    def _run_locked(self) -> SearchSummary:
        t_start = time.perf_counter()
        tm = self.timings
        meta = self._prepare_dir()
        study = self._open_study()
        requeue = self._recover(study)
        self.requeued = len(requeue)
        self._enqueue_grid(study)
        self._commit()
        self._open_tracking(meta, requeue)
        with self._meta_lock:
            self._save_meta(meta)
        self._load_counts(study)
        complete_before = self.complete
        nothing_to_run = self.complete >= self.n_trials and self.pool is None
        if nothing_to_run:
            from dse.pool import LocalPool

            self.pool = LocalPool(self.space)  # nothing to run: no need to start Ray
        t = t_ready = time.perf_counter()
        tm["setup_s"] = t - t_start
        cpu0, main0 = time.process_time(), time.thread_time()
        status = "FINISHED"
        try:  # the workers' start-up too: an interrupt there is cleaned up as in the loop
            self._start_pool()
            t_ready = time.perf_counter()
            tm["pool_start_s"] = t_ready - t
            cpu0, main0 = time.process_time(), time.thread_time()
            self._loop(study)
        except BaseException as exc:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            raise
        finally:
            t = time.perf_counter()
            tm["loop_s"] = t - t_ready
            if hasattr(self.pool, "cpu_seconds") and "pool_start_s" in tm:
                tm["worker_cpu_s"] = self.pool.cpu_seconds()
            if self.pool is not None:
                self.pool.shutdown()
            tm["pool_shutdown_s"] = time.perf_counter() - t
            self._finish(study, status, time.perf_counter() - t_start)
            tm["search_s"] = time.perf_counter() - t_ready - tm["pool_shutdown_s"]
            tm["wall_s"] = time.perf_counter() - t_start
            tm["driver_cpu_s"] = time.process_time() - cpu0  # all its threads
            tm["driver_main_cpu_s"] = time.thread_time() - main0
        self._check_tracking()  # a store that failed to open after the last trial
        kind = getattr(self.pool, "kind", "")
        return SearchSummary(self.out, self.complete, self.feasible, self.failed, self.rejected,
                             self._pareto_count, time.perf_counter() - t_start,
                             self.tracker.seconds, self.resumed, self.requeued, self.repeats,
                             f"{kind} ({self.pool.size} workers)" if kind == "ray" else kind,
                             dict(tm), complete_before, nothing_to_run,
                             (self.n_trials_asked, self.n_trials)
                             if self.n_trials < self.n_trials_asked else None,
                             self._best_note)

    def timing_lines(self) -> list[str]:
        """Where the seconds went, for the end of ``dse search``."""
        tm = self.timings
        g = tm.get
        lines = [
            f"setup {g('setup_s', 0):.1f}s (study journal, MLflow writer started); "
            f"workers start-up {g('pool_start_s', 0):.1f}s"
            + (f" (Ray {g('ray_init_s', 0):.1f}s, actors {g('actors_s', 0):.1f}s"
               + (f", warm-up {g('warmup_s', 0):.1f}s on {int(g('warmup_configs', 0))} "
                  f"instance shape(s), {g('warmup_cpu_s', 0):.1f}s of their CPU"
                  if "warmup_s" in tm else "") + ")"
               if "ray_init_s" in tm else ""),
            f"search after the workers are up {g('search_s', 0):.1f}s: loop "
            f"{g('loop_s', 0):.1f}s, report {g('report_s', 0):.1f}s, waiting for the MLflow "
            f"writer at the end {g('mlflow_flush_wait_s', 0):.1f}s"
            f"; then workers shut down {g('pool_shutdown_s', 0):.1f}s",
            f"in the loop: waiting for results {g('wait_s', 0):.1f}s, ask + check + submit "
            f"{g('ask_s', 0):.1f}s, tell + record {g('record_s', 0):.1f}s; workers "
            f"simulated {g('simulate_s', 0):.1f}s over {int(g('simulated', 0))} trial(s)",
            f"MLflow (writer thread, off the search's path): store opened in "
            f"{g('mlflow_open_s', 0):.1f}s, {int(g('mlflow_logged', 0))} run(s) logged, busy "
            f"{g('mlflow_s', 0):.1f}s ({g('mlflow_cpu_s', 0):.1f}s CPU); journal "
            f"{int(g('journal_writes', 0))} writes {g('journal_write_s', 0):.2f}s, "
            f"{int(g('journal_syncs', 0))} fsyncs {g('journal_sync_s', 0):.1f}s",
        ]
        if "driver_cpu_s" in tm:
            lines.append(
                f"CPU after the workers are up: driver {g('driver_cpu_s', 0):.1f}s (main thread "
                f"{g('driver_main_cpu_s', 0):.1f}s, the rest MLflow writer and Ray's threads)"
                + (f", workers {g('worker_cpu_s'):.1f}s (with their astra-sim processes)"
                   if "worker_cpu_s" in tm else ""))
        return lines

    def _can_ask(self, deadline: float | None, inflight: dict) -> bool:
        out_of_time = deadline is not None and time.monotonic() > deadline
        if self._repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            if not getattr(self, "_warned_exhausted", False):
                self._warned_exhausted = True
                log.warning("the sampler proposed %d evaluated configurations in a row; "
                            "stopping at %d distinct ones", self._repeats_in_a_row,
                            self.complete)
            return False
        if self._rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
            if not getattr(self, "_warned_rejected", False):
                self._warned_rejected = True
                log.warning("%d draws in a row were rejected before simulating; stopping at "
                            "%d trials", self._rejected_in_a_row, self.complete)
            return False
        return (not out_of_time and self.failed < max(10, self.n_trials)
                and self.complete + len(inflight) < self.n_trials)

    def _loop(self, study) -> None:
        deadline = (time.monotonic() + self.space.search.timeout_s
                    if self.space.search.timeout_s else None)
        inflight: dict[int, tuple[Any, Any]] = {}  # number -> (trial, cfg)
        tm = self.timings
        for k in ("ask_s", "record_s", "wait_s", "simulate_s", "simulated"):
            tm.setdefault(k, 0.0)
        with _Progress(self, enabled=self.progress, console=self.console) as prog:
            while True:
                if self.deterministic:
                    if self._can_ask(deadline, inflight):
                        self._batch(study, inflight, prog)
                        continue
                else:
                    t = time.perf_counter()
                    while self._can_ask(deadline, inflight) and self.pool.free > 0:
                        self._ask_one(study, inflight, submit=True)
                        prog.update()
                    # one write for the trials just told (below, in the last round) and
                    # those just asked and submitted: about one a trial
                    self._commit()
                    tm["ask_s"] += time.perf_counter() - t
                if not inflight:
                    break
                self._check_tracking()
                results = self._poll(timeout=0.5)
                t = time.perf_counter()
                for res in results:
                    trial, cfg = inflight.pop(res.number)
                    self._record(study, trial, cfg, self._outcome_from_result(cfg, res))
                tm["record_s"] += time.perf_counter() - t
                prog.update()

    def _commit(self) -> None:
        """Write the study journal out (see dse.store.DriverJournal), when anything was
        added since the last write."""
        if self._journal is not None:
            self._journal.commit()

    def _poll(self, timeout: float) -> list:
        t = time.perf_counter()
        out = self.pool.poll(timeout=timeout)
        self.timings["wait_s"] += time.perf_counter() - t
        self.timings["simulate_s"] += sum(r.wall_s for r in out)
        self.timings["simulated"] += sum(r.simulated for r in out)
        return out

    def _check_tracking(self) -> None:
        """The MLflow writer could not open the store: stop the search with its error."""
        check = getattr(self.tracker, "check", None)
        if check is not None:
            check()

    def _ask_one(self, study, inflight: dict, submit: bool):
        """Ask a trial and start it. Returns (trial, cfg, outcome) where outcome is set
        when it was decided without simulating: "rejected" (told at once as FAIL, not
        counted) or "repeat" (answered from the stored result; when not ``submit``, by
        the caller)."""
        trial = study.ask()
        params = self.space.suggest(trial)
        cfg = make_trial_config(self.space, trial.number, params)
        key = self._key(cfg.params)
        if key in self._rejected_keys:  # rejected before: no need to check it again
            first = self._rejected_keys[key]
            self._reject(study, trial, cfg, first.attrs.get("reason", ""), first.number)
            return trial, cfg, "rejected"
        if key in self._known or key in self._evaluating:
            self._repeats_in_a_row += 1
            if not submit:
                return trial, cfg, "repeat"
            if key in self._known:
                self._answer_repeat(study, trial, cfg, self._known[key])
            else:  # answered when the running evaluation of it is recorded
                self._waiting.setdefault(key, []).append((trial, cfg))
            return trial, cfg, "repeat"
        reason = precheck(self.space, cfg)
        if reason:
            self._reject(study, trial, cfg, reason)
            return trial, cfg, "rejected"
        self._repeats_in_a_row = 0
        self._rejected_in_a_row = 0
        self._evaluating[key] = trial.number
        inflight[trial.number] = (trial, cfg)
        self.pool.submit(self._task(cfg))
        return trial, cfg, None

    def _reject(self, study, trial, cfg, reason: str, first: int | None = None) -> None:
        """A draw rejected before simulating: told as FAIL (the sampler learns nothing from
        it), not counted toward ``n_trials``; a configuration rejected before is marked
        ``repeat_of`` its first rejection and not tracked again."""
        self._rejected_in_a_row += 1
        if first is None:
            self._record(study, trial, cfg, self._rejected(cfg, reason))
            return
        out = self._rejected(cfg, reason)
        out.attrs["repeat_of"] = first
        self._tell(study, trial, cfg, out, count=False)

    def _batch(self, study, inflight: dict, prog) -> None:
        """Deterministic mode: ask a batch, wait for all of it, tell in trial order."""
        k = min(max(1, self.pool.size), self.n_trials - self.complete)
        asked = [self._ask_one(study, inflight, submit=False) for _ in range(k)]
        self._commit()
        results: dict[int, TrialResult] = {}
        while len(results) < len(inflight):
            self._check_tracking()
            for res in self._poll(timeout=0.5):
                results[res.number] = res
            prog.update()
        for trial, cfg, outcome in sorted(asked, key=lambda x: x[0].number):
            if outcome == "rejected":  # told when drawn
                continue
            if outcome == "repeat":  # its first evaluation is earlier in this order
                key = self._key(cfg.params)
                self._answer_repeat(study, trial, cfg,
                                    self._known.get(key) or self._failed[key])
                continue
            if outcome is None:
                outcome = self._outcome_from_result(cfg, results[trial.number])
                inflight.pop(trial.number)
            self._record(study, trial, cfg, outcome)
        self._commit()
        prog.update()

    def _finish(self, study, status: str, wall_s: float) -> None:
        """The report files, then the study's parent run (after every trial's run: the
        writer keeps the order), then wait for the writer to drain its queue."""
        from dse.report import write_results

        tm = self.timings
        self._pareto_count = 0
        self._best_note = None
        writer = self.tracker
        t = time.perf_counter()
        try:
            # the front's latency distributions as kept here; a resumed study's earlier
            # trials are read from their MLflow runs once the writer has logged them
            files = write_results(self.space, study, self.out, self._latency,
                                  getattr(writer, "flush", None))
            self._pareto_count = files.get("pareto_count", 0)
            self._best_note = files.get("best_note")
        except Exception as exc:  # noqa: BLE001 - results can be re-made with `dse report`
            log.warning("writing results failed: %s (rerun `dse report %s`)", exc, self.out)
        tm["report_s"] = time.perf_counter() - t
        if writer is None or not hasattr(writer, "call"):
            return
        counts = {"trials_complete": self.complete, "trials_feasible": self.feasible,
                  "trials_failed": self.failed, "trials_rejected": self.rejected,
                  "trials_repeated": self.repeats, "pareto_size": self._pareto_count,
                  "wall_s": wall_s}
        artifacts = [p for p in (self.out / "trials.csv", self.out / "pareto.csv",
                                 self.out / "report.html", self.out / STUDY_JSON,
                                 self.out / "best") if p.exists()]

        def close_parent(tracker) -> None:
            if tracker.parent_id:
                tracker.close_parent({**counts, "tracking_s": tracker.seconds}, artifacts,
                                     status=status)

        writer.call(close_parent)
        try:
            writer.close()
        finally:
            if self._journal is not None:
                self._journal.sync()
                tm["journal_write_s"] = self._journal.write_s
                tm["journal_sync_s"] = self._journal.sync_s
                tm["journal_writes"] = self._journal.writes
                tm["journal_syncs"] = self._journal.syncs
            tm["mlflow_flush_wait_s"] = writer.wait_s
            tm["mlflow_s"] = writer.seconds
            tm["mlflow_cpu_s"] = writer.cpu_s
            tm["mlflow_logged"] = writer.logged
            calls = writer.tracker.calls if writer.tracker is not None else {}
            for k, v in calls.items():
                tm[f"mlflow_{k}"] = v


def _forget_mlflow_stores(db: Path) -> None:
    """Drop what MLflow keeps per URI in this process for the deleted ``db``: after
    ``--fresh`` deleted ``mlflow.db``, a cached store or SQLAlchemy engine would still
    write to the deleted file (sqlite: "attempt to write a readonly database") when a
    study is rerun in the same process."""
    import sys

    if "mlflow" not in sys.modules:
        return
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
        with SqlAlchemyStore._engine_map_lock:
            for uri in [u for u in SqlAlchemyStore._engine_map if u.endswith(str(db))]:
                SqlAlchemyStore._engine_map.pop(uri).dispose()
    except (ImportError, AttributeError) as exc:  # another MLflow: nothing cached that way
        log.debug("mlflow store cache: %s", exc)


def _distinct_configurations(space: Space, limit: int = 100_000) -> int | None:
    """How many distinct configurations a finite space holds that the pre-simulation check
    accepts, knobs without effect normalised away (None when infinite or more than
    ``limit``): a search cannot evaluate more than that many."""
    feasible = feasible_set(space, limit)
    return None if feasible is None else len(feasible)


def _source_text(src: Any) -> str:
    """sim reports a latency source per instance; name each distinct one once."""
    if isinstance(src, dict):
        return ", ".join(dict.fromkeys(str(v) for v in src.values()))
    return "" if src is None else str(src)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    return obj


class _Progress:
    """A rich progress bar: trials done, feasible, best so far, ETA."""

    def __init__(self, driver: Driver, enabled: bool, console=None) -> None:
        self.d = driver
        self.enabled = enabled
        self.console = console
        self._p = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                               MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                               console=self.console or Console(stderr=True), transient=False)
            self._p.__enter__()
            self._task = self._p.add_task(self.d.space.name, total=self.d.n_trials,
                                          completed=self.d.complete, info="")
        return self

    def update(self) -> None:
        if self._p is None:
            return
        o = self.d.space.objectives[0]
        best = "-" if self.d.best is None else f"{self.d.best:.4g}"
        info = (f"feasible {self.d.feasible}  rejected {self.d.rejected}  failed "
                f"{self.d.failed}  best {o.name}={best}")
        self._p.update(self._task, completed=self.d.complete, info=info)

    def __exit__(self, *exc):
        if self._p is not None:
            self.update()
            self._p.__exit__(*exc)


def run_search(space_path: str | Path, out_dir: str | Path, **kw) -> SearchSummary:
    space = load_space(space_path)
    return Driver(space, Path(out_dir), **kw).run()
