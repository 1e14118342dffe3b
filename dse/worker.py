"""Evaluating one configuration: simulate, score against the SLOs, optionally search capacity.

:func:`evaluate` is a pure function of the space and a task (plain data), so the same code
runs in a long-lived Ray actor (:class:`SimWorker`) or in the driver process. Workers never
touch the Optuna study or MLflow; they return results to the driver, which records them.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from dse.metrics import evaluate_slos
from dse.space import Space
from dse.table import Columns
from sim.metrics import REQUEST_COLUMNS


@dataclass
class TrialResult:
    """What a worker sends back for one trial. Exactly one of three shapes: ``rejected``
    (sim refused the configuration: a reason), ``error`` (the trial failed: a message and
    a traceback), or a simulation (``summary``, per-request and time-series tables as
    :class:`dse.table.Columns`, the SLO evaluation, and for a capacity search the
    probes)."""

    number: int
    wall_s: float = 0.0
    attempts: int = 1
    rejected: str | None = None
    error: str | None = None
    traceback: str = ""
    summary: dict | None = None
    requests: Any = field(default=None, repr=False)
    timeseries: Any = field(default=None, repr=False)
    slo: dict | None = None
    rate: float | None = None
    capacity: dict | None = None
    worker_pid: int | None = None
    #: where it ran: the Ray node (id and IP), or "driver" for the in-process pool
    node_id: str = ""
    node_ip: str = ""

    @property
    def simulated(self) -> bool:
        return self.rejected is None and self.error is None


def node_identity() -> tuple[str, str]:
    """(node id, node IP) of this process: the Ray node when inside Ray, else the host."""
    try:
        import ray

        if ray.is_initialized():
            return (ray.get_runtime_context().get_node_id(),
                    ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001, S110 - not in Ray: the host names itself
        pass
    return "driver", socket.gethostname()


class _Workloads:
    """Workloads built once per worker and reused across trials (sim does not mutate them)."""

    def __init__(self) -> None:
        self._cache: dict[Any, Any] = {}

    def head(self, wl: dict, n: int):
        """The first ``n`` first-turn requests of the workload (their later session turns
        with them): what a warm-up simulation replays."""
        from dataclasses import replace

        full = self.get(wl)
        return replace(full, requests=full.requests[:n])

    def get(self, wl: dict, rate: float | None = None):
        import sim

        key = (wl["kind"], wl.get("path"), wl.get("limit"), rate)
        if key not in self._cache:
            if wl["kind"] == "file":
                self._cache[key] = sim.load_jsonl(wl["path"], limit=wl.get("limit"))
            else:
                spec = dict(wl["spec"])
                if rate is not None:
                    spec["rate"] = rate
                self._cache[key] = sim.generate(sim.workload_from_mapping(spec))
            if len(self._cache) > 64:  # capacity probes: keep memory bounded
                self._cache.pop(next(iter(self._cache)))
        return self._cache[key]


def process_cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its children, live ones too
    (psutil where installed, as with Ray; else the children already waited for)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    try:
        import psutil
    except ImportError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            continue
    return total


_BACKENDS: dict = {}


def _backend(opts):
    """One system backend per worker process, reused across trials (for the subprocess
    backend: one long-lived astra-sim process per instance network)."""
    import sim

    key = (opts.backend, opts.astra_sim_bin, opts.computation_reuse)
    if key not in _BACKENDS:
        _BACKENDS[key] = sim.make_backend(opts)
    return _BACKENDS[key]


def resolve_backend(options: dict, default: str) -> dict:
    """Trial options with the space's ``auto`` backend made concrete for this worker."""
    if options.get("backend", "auto") != "auto":
        return options
    return {**options, "backend": default}


def _simulate(space: Space, task: dict, workloads: _Workloads, rate: float | None,
              workload=None) -> TrialResult:
    import sim

    cluster = sim.parse_cluster(task["cluster"], source=f"trial {task['number']}")
    opts = sim.SimOptions(**resolve_backend(task["options"], task.get("default_backend",
                                                                      "inproc")))
    if workload is None:
        workload = workloads.get(space.workload, rate)
    res = sim.simulate(cluster, workload, opts, backend=_backend(opts))
    # plain columns, not DataFrames: no pandas in the worker (dse.table)
    requests = Columns.from_rows(REQUEST_COLUMNS, res.request_rows())
    summary = dict(res.summary)
    return TrialResult(task["number"], summary=summary, requests=requests,
                       timeseries=Columns(res.timeseries.columns()),
                       slo=evaluate_slos(summary, requests, space), rate=rate)


def _capacity(space: Space, task: dict, workloads: _Workloads) -> TrialResult:
    """Highest arrival rate that meets the SLOs: exponential probe, then bisection."""
    cap = space.capacity
    probes: list[tuple[float, bool]] = []
    best = last = None
    lo, hi = 0.0, None
    rate = cap.start_rate
    while len(probes) < cap.max_probes:
        run = _simulate(space, task, workloads, rate)
        ok = run.slo["feasible"]
        probes.append((rate, ok))
        last = run
        if ok:
            best, lo = run, rate
        else:
            hi = rate
        if hi is None:
            if rate >= cap.max_rate:
                break
            rate = min(rate * 2, cap.max_rate)
        elif lo == 0.0:
            rate = rate / 2  # even the start rate fails: walk down
            if rate < cap.start_rate / 2 ** 8:
                break
        else:
            if (hi - lo) / hi <= cap.tolerance:
                break
            rate = (lo + hi) / 2
    out = best or last
    out.capacity = {"capacity_rps": lo, "probes": probes}
    return out


def evaluate(space: Space, task: dict, workloads: _Workloads | None = None,
             node: tuple[str, str] = ("driver", "")) -> TrialResult:
    """Run one trial; user-input problems come back as ``rejected``, crashes as ``error``."""
    import sim

    workloads = workloads or _Workloads()
    t0 = time.perf_counter()
    try:
        if space.capacity.enabled:
            out = _capacity(space, task, workloads)
        else:
            out = _simulate(space, task, workloads, None)
    except sim.InputError as exc:
        out = TrialResult(task["number"], rejected=str(exc).removeprefix(
            f"trial {task['number']}: "))
    except Exception as exc:  # noqa: BLE001 - reported as a failed trial, the study goes on
        out = TrialResult(task["number"], error=f"{type(exc).__name__}: {exc}",
                          traceback=traceback.format_exc(limit=8))
    out.wall_s = time.perf_counter() - t0
    out.worker_pid = os.getpid()
    out.node_id, out.node_ip = node
    return out


#: first-turn requests of the space's workload that a warm-up simulation replays
WARMUP_REQUESTS = 4


def warm_up(space: Space, tasks: list[dict], workloads: _Workloads,
            default_backend: str = "subprocess") -> dict:
    """Pay a worker's one-time costs before its first trial: the imports, the workload,
    the latency provider of each instance shape in ``tasks`` (aiconfigurator's database
    and engine build take seconds the first time in a process), the system backend and
    its ``astra-sim`` processes. Each task is simulated on the workload's first
    :data:`WARMUP_REQUESTS` requests and its result dropped: what stays is only what the
    worker keeps across trials anyway (providers and backends are built once per
    process), so a trial's result is the same with or without it. Never raises: a
    configuration that fails here fails again, reported, as a trial. Returns seconds,
    CPU seconds, configurations warmed and the errors met."""
    t0, c0 = time.perf_counter(), time.process_time()
    errors: list[str] = []
    try:
        small = workloads.head(space.workload, WARMUP_REQUESTS)
    except Exception as exc:  # noqa: BLE001 - the trials will report it
        return {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                "configs": 0, "errors": [f"workload: {type(exc).__name__}: {exc}"]}
    for task in tasks:
        try:
            _simulate(space, {**task, "default_backend": default_backend}, workloads, None,
                      workload=small)
        except Exception as exc:  # noqa: BLE001 - the trial itself will report it
            errors.append(f"{type(exc).__name__}: {exc}")
    return {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "configs": len(tasks), "errors": errors}


class SimWorker:
    """A long-lived worker (a Ray actor in a pool): owns its workload cache, reused."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.workloads = _Workloads()
        self.node = node_identity()
        #: configurations this worker has warmed up on (see :meth:`warm`)
        self.warmed = 0

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> tuple[str, str]:
        return self.node

    def cpu(self) -> float:
        """CPU seconds this worker has used: its process and its children (the
        astra-sim processes it owns)."""
        return process_cpu_s()

    def warm(self, tasks: list[dict]) -> dict:
        """See :func:`warm_up` (run before the first trial, in the trials' own group)."""
        out = warm_up(self.space, tasks, self.workloads)
        self.warmed += out["configs"]
        return out

    def warmed_configs(self) -> int:
        """How many configurations this worker has warmed up on so far."""
        return self.warmed

    def run(self, task: dict) -> TrialResult:
        # an actor owns one long-lived astra-sim process unless the space chose inproc
        return evaluate(self.space, {**task, "default_backend": "subprocess"}, self.workloads,
                        self.node)
