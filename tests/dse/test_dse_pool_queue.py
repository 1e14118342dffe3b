"""Ray actors hold a queue of trials: the next one waits on the actor while it simulates
the current one, and they run one after the other, never side by side."""

from __future__ import annotations

import time

from dse_testkit import runnable_tasks, write_space

from dse.pool import RayPool
from dse.space import load_space

WORKLOAD = {"generate": {"num_requests": 600, "rate": 40, "seed": 0,
                         "input": {"kind": "uniform", "low": 256, "high": 1024},
                         "output": {"kind": "uniform", "low": 32, "high": 128}}}


def test_one_actor_takes_two_trials_and_runs_them_in_turn(tmp_path, ray_session):
    space = load_space(write_space(tmp_path, workload=WORKLOAD))
    pool = RayPool(space, 1, depth=2).start()
    try:
        assert pool.size == 1 and pool.free == 2
        t0 = time.monotonic()
        for task in runnable_tasks(space, 3):
            pool.submit(task)
        # two handed to the actor at once (one running, one waiting there), one held back
        assert len(pool._running) == 2 and len(pool._pending) == 1 and pool.free == 0
        # only the running one has a process to name; the queued one has not started
        assert len(pool.pids()) == 1
        results, arrived = [], {}
        while len(results) < 3 and time.monotonic() - t0 < 300:
            got = pool.poll(timeout=0.05)
            for r in got:
                arrived[r.number] = time.monotonic() - t0
            results += got
    finally:
        pool.shutdown()
    assert sorted(r.number for r in results) == [0, 1, 2]
    assert all(r.error is None and r.rejected is None for r in results), results
    assert len({r.worker_pid for r in results}) == 1
    # in turn: the second ends a whole trial after the first (had they run side by side,
    # sharing the actor's process, they would end together)
    wall = {r.number: r.wall_s for r in results}
    first, second = sorted((0, 1), key=arrived.get)
    assert arrived[second] - arrived[first] >= 0.8 * wall[second], (arrived, wall)
