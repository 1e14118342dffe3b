"""Worker pools: long-lived Ray actors (default) or the driver process itself.

The Ray pool is sized from ``ray.available_resources()`` (an actor whose resources cannot
be met would stay pending forever), every wait has a timeout, and a trial whose actor
dies is retried once on a fresh actor before it is reported as failed.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dse.space import Space
from dse.worker import SimWorker, _Workloads, evaluate

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
MAX_ATTEMPTS = 2  # first try + one retry on a fresh actor


@dataclass
class _Job:
    task: dict
    attempt: int = 1
    started: float = field(default_factory=time.monotonic)
    errors: list[str] = field(default_factory=list)


class LocalPool:
    """Evaluates in the driver process, one trial at a time (``--workers 0``)."""

    kind = "in-process"

    def __init__(self, space: Space) -> None:
        self.space = space
        self.size = 1
        self._workloads = _Workloads()
        self._queue: deque[dict] = deque()

    def start(self) -> LocalPool:
        return self

    @property
    def free(self) -> int:
        return 0 if self._queue else 1

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def submit(self, task: dict) -> None:
        self._queue.append(task)

    def poll(self, timeout: float = 0.5) -> list[dict]:
        out = []
        while self._queue:
            task = self._queue.popleft()
            res = evaluate(self.space, task, self._workloads)
            res["attempts"] = 1
            out.append(res)
        return out

    def pids(self) -> dict[int, int]:
        return {}

    def shutdown(self) -> None:
        self._queue.clear()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start local Ray (or join ``address``/RAY_ADDRESS). Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                          "log_to_driver": False}
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **kw)
    return True


class RayPool:
    """A pool of long-lived :class:`SimWorker` actors."""

    kind = "ray"

    def __init__(self, space: Space, workers: int | None = None, *, address: str | None = None,
                 trial_timeout_s: float = 600.0) -> None:
        self.space = space
        self.requested = workers
        self.address = address
        self.trial_timeout_s = trial_timeout_s
        self.size = 0
        self._started_ray = False
        self._idle: list[Any] = []
        self._running: dict[Any, tuple[Any, _Job]] = {}  # ref -> (actor, job)
        self._pending: deque[_Job] = deque()
        self._space_ref = None
        self._actor_cls = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> RayPool:
        import ray

        self._started_ray = init_ray(self.address)
        avail = int(ray.available_resources().get("CPU", 0))
        if avail < 1:
            raise RuntimeError("Ray reports no free CPU for workers "
                               f"(available: {ray.available_resources()})")
        self.size = min(self.requested, avail) if self.requested else avail
        self._actor_cls = ray.remote(SimWorker).options(
            num_cpus=1, max_restarts=0, max_task_retries=0,
            max_concurrency=2)  # so pid() answers while run() is busy
        self._space_ref = ray.put(self.space)
        actors = [self._actor_cls.remote(self._space_ref) for _ in range(self.size)]
        _, not_ready = ray.wait([a.pid.remote() for a in actors], num_returns=len(actors),
                                    timeout=START_TIMEOUT_S)
        if not_ready:
            for a in actors:
                ray.kill(a)
            raise RuntimeError(f"{len(not_ready)} of {len(actors)} Ray workers did not start "
                               f"within {START_TIMEOUT_S:.0f}s")
        self._idle = actors
        return self

    def shutdown(self) -> None:
        import ray

        for a in self._idle + [a for a, _ in self._running.values()]:
            try:
                ray.kill(a)
            except Exception as exc:  # noqa: BLE001 - already gone
                log.debug("kill: %s", exc)
        self._idle, self._running = [], {}
        if self._started_ray:
            ray.shutdown()

    # ---------------------------------------------------------------- work
    @property
    def free(self) -> int:
        return max(0, self.size - len(self._running) - len(self._pending))

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._pending)

    def pids(self) -> dict[int, int]:
        """Worker process ids of the actors now running a trial: trial number -> pid."""
        import ray

        out = {}
        for actor, job in list(self._running.values()):
            try:
                out[job.task["number"]] = ray.get(actor.pid.remote(), timeout=10)
            except Exception as exc:  # noqa: BLE001 - busy or gone: skip it
                log.debug("pid: %s", exc)
        return out

    def submit(self, task: dict) -> None:
        self._pending.append(_Job(task))
        self._dispatch()

    def _fresh_actor(self):
        return self._actor_cls.remote(self._space_ref)

    def _dispatch(self) -> None:
        while self._pending and self._idle:
            job = self._pending.popleft()
            actor = self._idle.pop()
            job.started = time.monotonic()
            self._running[actor.run.remote(job.task)] = (actor, job)

    def poll(self, timeout: float = 0.5) -> list[dict]:
        """Results that finished within ``timeout`` seconds (retries handled here)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, WorkerCrashedError

        self._dispatch()
        if not self._running:
            return []
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        # collect everything else that is already done, without waiting again
        if ready:
            more, _ = ray.wait([r for r in self._running if r not in ready],
                               num_returns=len(self._running) - len(ready), timeout=0)
            ready += more
        out = []
        for ref in ready:
            actor, job = self._running.pop(ref)
            try:
                res = ray.get(ref, timeout=30)
                res["attempts"] = job.attempt
                out.append(res)
                self._idle.append(actor)
            except (RayActorError, WorkerCrashedError) as exc:
                self._on_death(actor, job, f"worker died: {type(exc).__name__}", out)
            except GetTimeoutError:
                self._on_death(actor, job, "worker did not return its result", out)
            except Exception as exc:  # noqa: BLE001 - a bug in evaluate(): fail the trial
                out.append({"number": job.task["number"], "error": repr(exc),
                            "attempts": job.attempt})
                self._idle.append(actor)
        now = time.monotonic()
        for ref, (actor, job) in list(self._running.items()):
            if now - job.started > self.trial_timeout_s:
                del self._running[ref]
                ray.kill(actor)
                self._idle.append(self._fresh_actor())
                out.append({"number": job.task["number"], "attempts": job.attempt,
                            "error": f"timed out after {self.trial_timeout_s:.0f}s"})
        self._dispatch()
        return out

    def _on_death(self, actor, job: _Job, why: str, out: list) -> None:
        import ray

        try:
            ray.kill(actor)
        except Exception as exc:  # noqa: BLE001 - already dead
            log.debug("kill: %s", exc)
        self._idle.append(self._fresh_actor())
        job.errors.append(why)
        if job.attempt < MAX_ATTEMPTS:
            log.warning("trial %s: %s; retrying on a fresh worker", job.task["number"], why)
            job.attempt += 1
            self._pending.appendleft(job)
        else:
            out.append({"number": job.task["number"], "attempts": job.attempt,
                        "error": "; ".join(job.errors) + " (after retry)"})
