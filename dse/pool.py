"""Worker pools: long-lived Ray actors (the default) or the driver process itself.

The Ray pool starts local Ray or joins a cluster (``--ray-address`` / ``RAY_ADDRESS``),
and is sized from the cluster's CPUs (one actor per free CPU; an actor whose resources
cannot be met would stay pending forever). Every wait has a timeout. A trial whose actor
dies (its process or its whole node) is retried once on another actor; a replacement actor
is started, and used only once Ray has placed it, so a pool that lost a node goes on, smaller,
on the nodes that are left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dse.space import Space
from dse.worker import SimWorker, TrialResult, _Workloads, evaluate, node_identity
from sim.errors import InputError

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0
#: how long the pool's start waits for the actors' warm-up (then trials queue behind it)
WARMUP_TIMEOUT_S = 60.0
#: at most this many instance shapes are warmed up (one configuration each)
WARMUP_MAX_CONFIGS = 16
#: knobs that do not change what a worker builds once per process for a configuration
#: (latency provider, system backend): the shape of an instance is the rest
_NOT_SHAPE = frozenset({"replicas", "max_num_seqs", "max_num_batched_tokens",
                        "long_prefill_token_threshold", "enable_prefix_caching",
                        "enable_chunked_prefill", "routing_policy", "pd_ratio"})
CONNECT_TIMEOUT_S = 10.0
MAX_ATTEMPTS = 2  # first try + one retry on a fresh actor


@dataclass
class _Job:
    task: dict
    attempt: int = 1
    #: when it started on its actor (None while it waits behind another trial there)
    started: float | None = field(default_factory=time.monotonic)
    errors: list[str] = field(default_factory=list)


def warmup_tasks(space: Space, limit: int = WARMUP_MAX_CONFIGS) -> list[dict]:
    """One task per instance shape of the space (its knobs but those in ``_NOT_SHAPE``),
    the first configuration of that shape that passes the pre-simulation check, at most
    ``limit``: what the actors warm up on (:func:`dse.worker.warm_up`). Empty when the
    space is too large to enumerate (the first trials then pay the warm-up)."""
    from dse.config import make_trial_config
    from dse.sampling import feasible_set

    try:
        feasible = feasible_set(space)
    except Exception as exc:  # noqa: BLE001 - the search itself reports a bad space
        log.debug("warm-up: %s", exc)
        return []
    tasks: list[dict] = []
    seen: set = set()
    for params in feasible or ():
        shape = tuple(sorted((k, repr(v)) for k, v in params.items() if k not in _NOT_SHAPE))
        if shape in seen:
            continue
        seen.add(shape)
        cfg = make_trial_config(space, -1 - len(tasks), params)
        tasks.append({"number": cfg.number, "cluster": cfg.cluster, "options": cfg.options})
        if len(tasks) >= limit:
            break
    return tasks


class LocalPool:
    """Evaluates in the driver process, one trial at a time (``--workers 0``)."""

    kind = "in-process"

    def __init__(self, space: Space) -> None:
        self.space = space
        self.size = 1
        self._workloads = _Workloads()
        self._queue: deque[dict] = deque()
        self._node = ("driver", socket.gethostname())

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

    def poll(self, timeout: float = 0.5) -> list[TrialResult]:
        out = []
        while self._queue:
            out.append(evaluate(self.space, self._queue.popleft(), self._workloads, self._node))
        return out

    def pids(self) -> dict[int, int]:
        return {}

    def shutdown(self) -> None:
        self._queue.clear()


# ---------------------------------------------------------------- joining Ray
def _token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()


def address_label(address: str) -> str:
    """How to name a Ray address in a message: the flag, or the environment variable."""
    from_env = os.environ.get("RAY_ADDRESS") == address
    return f"RAY_ADDRESS={address!r}" if from_env else f"--ray-address {address!r}"


def _probe_address(address: str, timeout: float) -> None:
    """Refuse an address nothing listens at, within ``timeout`` seconds (Ray itself would
    retry for minutes)."""
    label = address_label(address)
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 < int(port) < 65536:
        raise InputError(f"{label}: expected HOST:PORT of a Ray head (the GCS port `ray "
                         "start --head` prints), 'auto', or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise InputError(f"{label}: no Ray head answers there within "
                         f"{timeout:g}s ({exc.strerror or exc}); start one with `ray start "
                         "--head`, or leave --ray-address out to run a local Ray") from None


@contextlib.contextmanager
def _stderr_kept_on_success():
    """Hold what is written to file descriptor 2 (Ray's C++ logs too); replay it if the
    block succeeds, drop it if it raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if ok:
                tmp.seek(0)
                sys.stderr.write(tmp.read().decode(errors="replace"))


#: the logger of Ray's notice that a new local cluster turned token authentication on
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropAuthNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster" notice (logged on
    every local start when RAY_AUTH_MODE is unset); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


@contextlib.contextmanager
def _quiet_local_auth_notice():
    """For the local Ray this tool starts itself: auth stays as Ray sets it (token mode),
    only its notice is kept from the user's console."""
    logger = logging.getLogger(_AUTH_LOGGER)
    notice = _DropAuthNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def init_ray(address: str | None = None, num_cpus: int | None = None,
             connect_timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Start local Ray (or join ``address``/RAY_ADDRESS). Returns True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                          "log_to_driver": False}
    if not address:
        with _quiet_local_auth_notice():
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **kw)
        return True
    if address != "auto":
        _probe_address(address, connect_timeout)
    # Ray 2.60 turns token authentication on for clusters started without RAY_AUTH_MODE and
    # keeps the token in ~/.ray/auth_token; a client must then ask for token mode itself.
    if "RAY_AUTH_MODE" not in os.environ and _token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
    # One connection attempt (about 35 s when something listens there but is not a Ray
    # head), not Ray's default of retrying for minutes.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "1")
    try:
        with _stderr_kept_on_success():  # a failed join prints one line, not Ray's log
            ray.init(address=address, **kw)
    except Exception as exc:  # noqa: BLE001 - ConnectionError, AuthenticationError, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InputError(f"{address_label(address)}: cannot join the Ray cluster ({first}). "
                         "If the head uses token authentication (Ray's default), give this "
                         "machine its token: RAY_AUTH_MODE=token with ~/.ray/auth_token or "
                         "RAY_AUTH_TOKEN") from None
    return False


def cluster_cpus() -> int:
    """Free CPUs of the Ray cluster this process is connected to."""
    import ray

    return int(ray.available_resources().get("CPU", 0))


class RayPool:
    """A pool of long-lived :class:`SimWorker` actors, each given up to ``depth`` trials at
    once: the next trial waits in the actor's own queue while it simulates the current
    one, so it starts the moment the last one ends, not after the driver has recorded it
    and asked for another. An actor runs its trials one after the other (``run`` in its
    default concurrency group, of one thread); ``pid``/``where`` answer from a group of
    their own while it is busy."""

    kind = "ray"
    #: the actors' concurrency group for pid()/where() (run() keeps the default, serial)
    CONTROL = "control"

    def __init__(self, space: Space, workers: int | None = None, *, address: str | None = None,
                 trial_timeout_s: float = 600.0, depth: int = 2,
                 warmup: list[dict] | None = None) -> None:
        self.space = space
        #: tasks each actor simulates on a few requests before its first trial
        self.warmup = warmup or []
        self.requested = workers
        self.address = address
        self.trial_timeout_s = trial_timeout_s
        self.depth = max(1, depth)
        self.size = 0
        self._started_ray = False
        self._actors: list[Any] = []  # placed and alive
        self._queue: dict[Any, deque] = {}  # actor -> its submitted refs, in order
        self._starting: dict[Any, Any] = {}  # where() ref -> actor, not placed yet
        #: warm() ref of a replacement actor -> (actor, when it began); it heads its queue
        self._warming: dict[Any, tuple[Any, float]] = {}
        self._running: dict[Any, tuple[Any, _Job]] = {}  # ref -> (actor, job)
        self._pending: deque[_Job] = deque()
        self._space_ref = None
        self._actor_cls = None
        self._cpu0: dict[Any, float] = {}
        self._unplaced: list[Any] = []  # actors of start() not yet waited for
        self.timings: dict[str, float] = {}

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> RayPool:
        import ray

        t0 = time.perf_counter()
        # (set before: an interrupt inside Ray's start-up still shuts down what it started)
        self._started_ray = not ray.is_initialized() and not (
            self.address or os.environ.get("RAY_ADDRESS"))
        self._started_ray = init_ray(self.address)
        self.timings["ray_init_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        avail = cluster_cpus()
        if avail < 1:
            raise InputError("the Ray cluster has no free CPU for workers (available: "
                             f"{ray.available_resources()}); free some, or run --workers 0")
        self.size = min(self.requested, avail) if self.requested else avail
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0,
                                     concurrency_groups={self.CONTROL: 1})(SimWorker)
        self._space_ref = ray.put(self.space)
        actors = [self._actor_cls.remote(self._space_ref) for _ in range(self.size)]
        self._unplaced = actors  # killed by shutdown() if the start is interrupted here
        _, not_ready = ray.wait([self._control(a, "pid") for a in actors],
                                num_returns=len(actors), timeout=START_TIMEOUT_S)
        if not_ready:
            for a in actors:
                ray.kill(a)
            raise RuntimeError(f"{len(not_ready)} of {len(actors)} Ray workers did not start "
                               f"within {START_TIMEOUT_S:.0f}s")
        for a in actors:
            self._add_actor(a)
        self._unplaced = []
        self.timings["actors_s"] = time.perf_counter() - t1
        self._warm_up()
        self._cpu0 = self._actor_cpu()
        return self

    def _warm_up(self) -> None:
        """Each actor pays its one-time costs (imports, latency providers, astra-sim
        processes) before the first trial; waited for up to WARMUP_TIMEOUT_S (after that,
        trials queue behind it). Seconds and the actors' CPU go to ``timings``."""
        import ray

        if not self.warmup:
            return
        t0 = time.perf_counter()
        refs = [a.warm.remote(self.warmup) for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=WARMUP_TIMEOUT_S)
        cpu = 0.0
        for ref in ready:
            try:
                out = ray.get(ref, timeout=10)
            except Exception as exc:  # noqa: BLE001 - a dead actor is handled by the trials
                log.debug("warm-up: %s", exc)
                continue
            cpu += out["cpu_s"]
            for err in out["errors"][:1]:
                log.debug("warm-up: %s", err)
        self.timings["warmup_s"] = time.perf_counter() - t0
        self.timings["warmup_cpu_s"] = cpu
        self.timings["warmup_configs"] = len(self.warmup)

    def _actor_cpu(self) -> dict[Any, float]:
        """CPU seconds used so far by each placed actor (with its astra-sim processes)."""
        import ray

        refs = {a: self._control(a, "cpu") for a in self._actors}
        out = {}
        for a, ref in refs.items():
            try:
                out[a] = float(ray.get(ref, timeout=10))
            except Exception as exc:  # noqa: BLE001 - busy or gone: left out
                log.debug("cpu: %s", exc)
        return out

    def cpu_seconds(self) -> float:
        """CPU seconds the workers used since the pool started (actors started since
        count whole; actors that died are left out)."""
        now = self._actor_cpu()
        return sum(v - self._cpu0.get(a, 0.0) for a, v in now.items())

    def _control(self, actor, method: str):
        return getattr(actor, method).options(concurrency_group=self.CONTROL).remote()

    def _add_actor(self, actor) -> None:
        self._actors.append(actor)
        self._queue[actor] = deque()

    def _drop_actor(self, actor) -> bool:
        """Forget a dead (or killed) actor; False if it was already forgotten."""
        if actor not in self._queue:
            return False
        self._actors.remove(actor)
        del self._queue[actor]
        return True

    def shutdown(self) -> None:
        import ray

        for a in self._actors + list(self._starting.values()) + self._unplaced:
            try:
                ray.kill(a)
            except Exception as exc:  # noqa: BLE001 - already gone
                log.debug("kill: %s", exc)
        self._actors, self._queue, self._running, self._starting = [], {}, {}, {}
        self._warming, self._unplaced = {}, []
        if self._started_ray:
            try:
                ray.shutdown()
            except Exception as exc:  # noqa: BLE001 - a start-up cut short: nothing to stop
                log.debug("ray shutdown: %s", exc)

    # ---------------------------------------------------------------- work
    @property
    def free(self) -> int:
        """Trials that could be handed out now: open places in the placed actors' queues
        not claimed by a job waiting here."""
        slots = sum(self.depth - len(q) for q in self._queue.values())
        return max(0, slots - len(self._pending))

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._pending)

    def pids(self) -> dict[int, int]:
        """Worker process ids of the actors now running a trial: trial number -> pid
        (trials still queued behind another on their actor are left out)."""
        import ray

        out = {}
        for actor, job in list(self._running.values()):
            if job.started is None:
                continue
            try:
                out[job.task["number"]] = ray.get(self._control(actor, "pid"), timeout=10)
            except Exception as exc:  # noqa: BLE001 - busy or gone: skip it
                log.debug("pid: %s", exc)
        return out

    def submit(self, task: dict) -> None:
        self._pending.append(_Job(task))
        self._dispatch()

    def _replace_actor(self) -> None:
        """Start a replacement actor; it joins the pool once Ray has placed it."""
        actor = self._actor_cls.remote(self._space_ref)
        self._starting[self._control(actor, "where")] = actor

    def _adopt_started(self) -> None:
        import ray

        if not self._starting:
            return
        ready, _ = ray.wait(list(self._starting), num_returns=len(self._starting), timeout=0)
        for ref in ready:
            actor = self._starting.pop(ref)
            try:
                ray.get(ref, timeout=10)
            except Exception as exc:  # noqa: BLE001 - died before it was placed: try again
                log.debug("replacement actor failed to start: %s", exc)
                self._replace_actor()
                continue
            self._add_actor(actor)
            if self.warmup:  # the warm-up the first actors ran, ahead of its first trial
                warm = actor.warm.remote(self.warmup)
                self._queue[actor].append(warm)
                self._warming[warm] = (actor, time.monotonic())

    def _end_warm_ups(self) -> None:
        """A replacement actor's warm-up that ended (or ran past WARMUP_TIMEOUT_S: then its
        trials queue behind it, as at the start) hands the actor to its first trial."""
        import ray

        if not self._warming:
            return
        ready, _ = ray.wait(list(self._warming), num_returns=len(self._warming), timeout=0)
        now = time.monotonic()
        for ref, (actor, t0) in list(self._warming.items()):
            if ref in ready or now - t0 > WARMUP_TIMEOUT_S:
                del self._warming[ref]
                self._done_on(actor, ref)  # (a dead actor fails its trials' own refs)

    def _dispatch(self) -> None:
        self._adopt_started()
        self._end_warm_ups()
        while self._pending:
            open_ = [a for a in self._actors if len(self._queue[a]) < self.depth]
            if not open_:
                return
            actor = min(open_, key=lambda a: len(self._queue[a]))  # an idle one first
            job = self._pending.popleft()
            # a trial queued behind another starts (for its timeout) when that one ends
            job.started = time.monotonic() if not self._queue[actor] else None
            ref = actor.run.remote(job.task)
            self._queue[actor].append(ref)
            self._running[ref] = (actor, job)

    def poll(self, timeout: float = 0.5) -> list[TrialResult]:
        """Results that finished within ``timeout`` seconds (retries handled here)."""
        import ray

        self._dispatch()
        if not self._running:
            if self._pending:
                time.sleep(min(timeout, 0.2))  # waiting for a replacement actor
            return []
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        if ready:  # collect everything else that is already done, without waiting again
            more, _ = ray.wait([r for r in self._running if r not in ready],
                               num_returns=len(self._running) - len(ready), timeout=0)
            ready += more
        out: list[TrialResult] = []
        for ref in ready:
            if ref in self._running:  # (not handed back already with its dead actor)
                self._collect(ref, out)
        now = time.monotonic()
        for ref, (actor, job) in list(self._running.items()):
            if job.started is not None and now - job.started > self.trial_timeout_s:
                del self._running[ref]
                self._lose_actor(actor)
                out.append(TrialResult(job.task["number"], attempts=job.attempt,
                                       error=f"timed out after {self.trial_timeout_s:.0f}s"))
        self._dispatch()
        return out

    def _collect(self, ref, out: list[TrialResult]) -> None:
        import ray
        from ray.exceptions import (GetTimeoutError, NodeDiedError, OutOfMemoryError,
                                    RayActorError, WorkerCrashedError)

        actor, job = self._running.pop(ref)
        try:
            res = ray.get(ref, timeout=30)
            res.attempts = job.attempt
            out.append(res)
            self._done_on(actor, ref)
        except (RayActorError, WorkerCrashedError, OutOfMemoryError, NodeDiedError) as exc:
            # (Ray's memory monitor killing the worker, or its node gone, is a crash too)
            why = f"worker died: {type(exc).__name__}"
            if isinstance(exc, (OutOfMemoryError, NodeDiedError)):
                why += f" ({(str(exc).strip().splitlines() or [''])[0][:200]})"
            self._on_death(actor, job, why, out)
        except GetTimeoutError:
            self._on_death(actor, job, "worker did not return its result", out)
        except Exception as exc:  # noqa: BLE001 - a bug in evaluate(): fail the trial
            out.append(TrialResult(job.task["number"], attempts=job.attempt, error=repr(exc)))
            self._done_on(actor, ref)

    def _done_on(self, actor, ref) -> None:
        """``ref`` ended on ``actor``: the next trial in its queue starts now."""
        q = self._queue.get(actor)
        if q is None:
            return
        if ref in q:
            q.remove(ref)
        if q:
            nxt = self._running.get(q[0])
            if nxt is not None and nxt[1].started is None:
                nxt[1].started = time.monotonic()

    def _lose_actor(self, actor) -> None:
        """Kill an actor and start its replacement; trials queued behind the one it was
        running never started, and go back to the front of the queue as they were."""
        import ray

        if not self._drop_actor(actor):
            return
        try:
            ray.kill(actor)
        except Exception as exc:  # noqa: BLE001 - already dead
            log.debug("kill: %s", exc)
        self._replace_actor()
        queued = [(ref, job) for ref, (a, job) in self._running.items()
                  if a is actor and job.started is None]
        for ref, job in reversed(queued):
            del self._running[ref]
            self._pending.appendleft(job)

    def _on_death(self, actor, job: _Job, why: str, out: list[TrialResult]) -> None:
        self._lose_actor(actor)
        if job.started is None:  # it waited behind the trial the actor died in: not tried
            self._pending.appendleft(job)
            return
        job.errors.append(why)
        if job.attempt < MAX_ATTEMPTS:
            log.warning("trial %s: %s; retrying on another worker", job.task["number"], why)
            job.attempt += 1
            self._pending.appendleft(job)
        else:
            out.append(TrialResult(job.task["number"], attempts=job.attempt,
                                   error="; ".join(job.errors) + " (after retry)"))


__all__ = ["LocalPool", "RayPool", "cluster_cpus", "init_ray", "node_identity"]
