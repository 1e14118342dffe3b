"""An actor started to replace one that died runs the same warm-up as the pool's first
actors, ahead of its first trial (before, it went straight to the trial, which then paid
the one-time costs the warm-up exists to take off the trials)."""

from __future__ import annotations

import os
import signal
import time

from dse_testkit import runnable_tasks, write_space

from dse.pool import RayPool, warmup_tasks
from dse.space import load_space


def _drain(pool, n, deadline):
    results = []
    while len(results) < n and time.monotonic() < deadline:
        results += pool.poll(timeout=0.1)
    return results


def test_replacement_actor_warms_up_before_its_first_trial(tmp_path, ray_session):
    import ray

    space = load_space(write_space(tmp_path, knobs={"tp": [1, 2], "replicas": [1]}))
    warm = warmup_tasks(space)
    assert len(warm) == 2
    pool = RayPool(space, 1, warmup=warm).start()
    deadline = time.monotonic() + 240
    try:
        first = pool._actors[0]
        assert ray.get(pool._control(first, "warmed_configs"), timeout=30) == 2
        os.kill(ray.get(pool._control(first, "pid"), timeout=30), signal.SIGKILL)
        tasks = runnable_tasks(space, 2)
        for task in tasks:
            pool.submit(task)
        results = _drain(pool, 2, deadline)
        assert sorted(r.number for r in results) == [0, 1], results
        assert all(r.error is None for r in results), results
        assert first not in pool._actors and len(pool._actors) == 1
        (replacement,) = pool._actors
        assert ray.get(pool._control(replacement, "warmed_configs"), timeout=30) == 2
        assert not pool._warming and not pool._queue[replacement]
    finally:
        pool.shutdown()
