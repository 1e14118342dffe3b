"""A worker that Ray's memory monitor kills (OutOfMemoryError) or whose node dies
(NodeDiedError) is a worker crash: the trial is retried once on a replacement actor, as
for any other dead worker. Before, the trial was failed at once as if evaluate() had a
bug, and the dead actor stayed in the pool: on a machine short of memory a resumed search
ended with "22 trials simulated, 40 failed", every failure an OOM kill."""

from __future__ import annotations

import pytest
from ray.exceptions import NodeDiedError, OutOfMemoryError

from dse.pool import RayPool, _Job


class _Actor:
    pass


@pytest.mark.parametrize("exc", [OutOfMemoryError("2 worker(s) were killed due to the node "
                                                  "running low on memory"),
                                 NodeDiedError("node died")])
def test_killed_worker_trial_is_retried_on_a_new_actor(monkeypatch, exc):
    import ray

    pool = RayPool.__new__(RayPool)
    RayPool.__init__(pool, space=None, workers=1)
    actor = _Actor()
    pool._add_actor(actor)
    ref = object()
    pool._queue[actor].append(ref)
    pool._running[ref] = (actor, _Job({"number": 7}))
    replaced = []

    def _get(r, timeout=None):
        raise exc

    monkeypatch.setattr(ray, "get", _get)
    monkeypatch.setattr(ray, "kill", lambda a: None)
    monkeypatch.setattr(pool, "_replace_actor", lambda: replaced.append(1))
    out: list = []
    pool._collect(ref, out)
    assert out == []  # not failed: retried
    assert replaced == [1] and actor not in pool._actors
    (job,) = pool._pending
    assert job.task["number"] == 7 and job.attempt == 2
    assert type(exc).__name__ in job.errors[0]
