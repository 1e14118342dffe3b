"""A step whose preemptions leave its batch empty (priority scheduling, tiny KV pool).

With the ``priority`` policy, a running request that needs a new KV block while the pool
is full preempts the running request of lowest priority (latest arrival); when that is
the request itself, vLLM 0.19 stops the running loop, and a step that preempted anything
admits nobody from the waiting queue. If the request was first in the running order, the
step schedules nothing. vLLM's engine executes that empty step at once (no tokens, no
model run) and schedules again, now with the victim's blocks free and no preemption in
the step, so the other running requests go on. The simulator used to wait for an event
that never came ("simulation stalled"). ``test_sim_vllm_scheduler_parity`` checks the
scheduler's side of this against vLLM's own scheduler.
"""

from __future__ import annotations

import pytest

import sim
from sim.request import Request
from sim.scheduler import Scheduler
from sim_testkit import cluster_dict, opts_for

# Found by hypothesis in test_sim_leap.test_single_instances_leap_exactly.
SPECS = [(1, 85), (1, 1), (397, 20), (296, 106), (1, 1), (296, 63), (1, 1)]
ARRIVALS = [(20_000_000, 2), (21_000_000, 2), (22_000_000, 2), (23_000_000, 1),
            (23_000_000, 2), (24_000_000, 0), (25_000_000, 0)]


def _workload(specs, arrivals) -> sim.Workload:
    reqs = []
    for i, ((n_in, n_out), (t, prio)) in enumerate(zip(specs, arrivals)):
        reqs.append(Request(i, t, n_in, n_out))
        reqs[-1].priority = prio
    return sim.Workload(reqs, source="<test>")


def _opts(bundle_root, leap: bool):
    return opts_for(bundle_root, async_scheduling=False, enable_prefix_caching=False,
                    enable_chunked_prefill=False, reserve_full_isl=False,
                    scheduling_policy="priority", max_num_batched_tokens=2048, block_size=4,
                    timeseries_interval_ns=50_000_000, event_leaping=leap)


@pytest.mark.parametrize("leap", [False, True])
def test_empty_step_after_self_preemption_does_not_stall(bundle_root, monkeypatch, leap):
    calls: list[tuple[int, list[int], list[int]]] = []
    original = Scheduler.schedule

    def recording(self, now):
        batch = original(self, now)
        calls.append((now, [] if batch is None else [r.rid for r in batch.requests],
                      [r.rid for r in self.preempted_last]))
        return batch

    monkeypatch.setattr(Scheduler, "schedule", recording)
    # 760 tokens of KV in blocks of 4 (190 blocks and the null block)
    cluster = sim.parse_cluster(cluster_dict(760 // 4 + 1, 1, 4))
    res = sim.simulate(cluster, _workload(SPECS, ARRIVALS), _opts(bundle_root, leap))
    assert all(r.finish_ns > 0 and r.num_output == r.output_len for r in res.requests)
    assert res.summary["preemptions"] > 0
    # The case does hit the empty step: request 0 (priority 2, first in the running
    # order) preempts itself and nothing runs; the engine schedules again at once and the
    # other running requests (3 and 5) take the step.
    empty = [k for k, (_, rids, pre) in enumerate(calls) if not rids and pre]
    assert empty
    for k in empty:
        now, _, pre = calls[k]
        nxt_now, nxt_rids, _ = calls[k + 1]
        assert nxt_now == now and nxt_rids and not set(pre) & set(nxt_rids)
    assert (calls[empty[0]][2], calls[empty[0] + 1][1]) == ([0], [3, 5])


def test_leaping_matches_step_by_step_through_the_empty_step(bundle_root):
    cluster = sim.parse_cluster(cluster_dict(760 // 4 + 1, 1, 4))
    wl = _workload(SPECS, ARRIVALS)
    stepped = sim.simulate(cluster, wl, _opts(bundle_root, False))
    leapt = sim.simulate(cluster, wl, _opts(bundle_root, True))
    fields = ("first_token_ns", "finish_ns", "preemptions", "num_output")
    assert ([tuple(getattr(r, f) for f in fields) for r in stepped.requests]
            == [tuple(getattr(r, f) for f in fields) for r in leapt.requests])
