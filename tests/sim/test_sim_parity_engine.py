"""Differential test of the whole engine (not only the scheduler) against vLLM 0.19's own
scheduler, on random workloads.

``test_sim_vllm_scheduler_parity`` drives sim's scheduler the way vLLM's engine loop
drives vLLM's; here sim's engine drives its scheduler itself (arrivals in nanoseconds,
steps timed by the latency model, async scheduling chained as the engine chains it, the
empty step after a self-preemption rescheduled at once) with event leaping off, and
every call it makes is replayed into vLLM's scheduler: each request added right before
the schedule call that first read it, each completion updating the oldest step in
flight. Every schedule call must decide as vLLM's does (which requests, from which
computed count, how many tokens, which are preempted, free blocks after it) and every
completion must finish the same requests; and the engine must call them in an order
vLLM's ``step``/``step_with_batch_queue`` can (``replay_in_vllm`` checks that too).
Each case then runs again with event leaping on, which must change nothing.

One instance; pipeline parallelism (pp 2-3, vLLM's batch queue of pp batches) is drawn
too unless ``PARITY_ENGINE_PP=0``.
``PARITY_ENGINE_EXAMPLES`` sets the number of examples (25 by default).
"""

from __future__ import annotations

import os
import random

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", reason="needs vLLM (the parity extra)")

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from sim_testkit import cluster_dict, mem_size_for_blocks, opts_for  # noqa: E402
from test_sim_leap import _assert_same  # noqa: E402
from test_sim_vllm_scheduler_parity import (Case, TooManyCalls, cases,  # noqa: E402
                                            record_calls, replay_in_vllm)

import sim  # noqa: E402
from sim.errors import InputError  # noqa: E402
from sim.request import Request  # noqa: E402


@st.composite
def engine_cases(draw) -> tuple[Case, int]:
    """A scheduler case (without pipeline parallelism if ``PARITY_ENGINE_PP=0``), and
    the nanoseconds per arrival iteration (from bursts inside one step to one arrival
    every few steps)."""
    case = draw(cases())
    if os.environ.get("PARITY_ENGINE_PP") == "0":
        case.pp = 1
    return case, draw(st.sampled_from([1_000_000, 20_000_000, 150_000_000]))


def _setup(case: Case, ns_per_iter: int, bundle_root):
    """The case as an engine run: (cluster, workload, options), event leaping off."""
    reqs = []
    for rid, (it, ids, out, prio) in enumerate(case.requests):
        r = Request(rid, it * ns_per_iter, len(ids), len(out), input_ids=list(ids),
                    output_ids=list(out))
        r.priority = prio
        reqs.append(r)
    opts = opts_for(bundle_root, async_scheduling=case.async_sched,
                    enable_prefix_caching=case.caching, enable_chunked_prefill=case.chunked,
                    reserve_full_isl=case.reserve_full,
                    scheduling_policy="priority" if case.priority else "fcfs",
                    max_num_batched_tokens=case.budget, max_num_seqs=case.max_num_seqs,
                    long_prefill_token_threshold=case.threshold, block_size=case.block_size,
                    max_model_len=case.max_model_len, event_leaping=False)
    cd = cluster_dict(case.num_blocks, 1, case.block_size, pp_size=case.pp, num_npus=case.pp)
    # (memory for the case's blocks at its engine limits, which move the activation peak)
    cd["nodes"][0]["instances"][0]["npu_mem"]["mem_size"] = mem_size_for_blocks(
        case.num_blocks, case.block_size, max_num_batched_tokens=case.budget,
        max_num_seqs=case.max_num_seqs)
    return sim.parse_cluster(cd), sim.Workload(reqs, source="<test>"), opts


def _run(case: Case, ns_per_iter: int, bundle_root, monkeypatch, max_calls: int = 5000):
    cluster, workload, opts = _setup(case, ns_per_iter, bundle_root)
    return record_calls(monkeypatch, lambda: sim.simulate(cluster, workload, opts),
                        max_calls)


@settings(max_examples=int(os.environ.get("PARITY_ENGINE_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ec=engine_cases())
def test_engine_matches_vllm_on_random_workloads(ec, bundle_root, model_dir, monkeypatch):
    case, ns_per_iter = ec
    event(f"pp={case.pp}" + (", async scheduling" if case.async_sched else ""))
    try:
        events, read_at, result = _run(case, ns_per_iter, bundle_root, monkeypatch)
    except InputError as e:
        # Without chunked prefill a request preempted after generating past the token
        # budget can never be scheduled again (vLLM would wait for ever): sim says so.
        assert not case.chunked and "chunked prefill is off" in str(e)
        event("a preempted request outgrew the token budget")
        return
    except TooManyCalls:
        # requests of a tiny pool preempting each other for ever (as in vLLM)
        event("stopped after 5000 steps")
        return
    finished = [r for r in result.requests if r.finish_ns > 0]
    assert len(finished) == len(case.requests)
    preemptions = replay_in_vllm(events, read_at, case, model_dir)
    assert preemptions == result.summary["preemptions"]
    # and event leaping changes nothing in these regimes either
    _assert_same(*_setup(case, ns_per_iter, bundle_root))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tiny-llama-engine"))


def test_random_engine_case_reaches_vllm(bundle_root, model_dir, monkeypatch):
    """One fixed case end to end (async scheduling, prefix caching, a small pool): the
    replay sees every request and some preemptions."""
    rng = random.Random(3)
    prefix = [rng.randrange(50) for _ in range(32)]
    reqs = [(i // 3, prefix + [rng.randrange(50) for _ in range(rng.randint(1, 40))],
             [rng.randrange(50) for _ in range(rng.randint(5, 30))], 0) for i in range(10)]
    case = Case(16, 9, 8, 64, True, 0, True, False, True, 1, False, 32768, reqs)
    events, read_at, result = _run(case, 20_000_000, bundle_root, monkeypatch)
    assert len(read_at) == 10
    assert replay_in_vllm(events, read_at, case, model_dir) == result.summary["preemptions"] > 0


def test_pipeline_engine_waits_for_the_oldest_step_after_an_empty_one(bundle_root, model_dir,
                                                                       monkeypatch):
    """Found by the fuzz above with ``PARITY_ENGINE_PP=1`` (shrunk). pp=2, no async
    scheduling. vLLM's ``step_with_batch_queue`` schedules whenever its queue (pp batches)
    is not full; when that schedules nothing (every running request has its step in
    flight) it blocks until the oldest batch is done and processes its output, and only
    then schedules again: a request arriving meanwhile waits for that. Sim's engine
    scheduled again as soon as the last batch had left the first stage, so the arrival
    (request 1 here) started one stage time after the empty attempt, before the oldest
    batch's output was in (the replay failed with "scheduled ... where vLLM waits for its
    oldest step")."""
    reqs = [(3, [2, 16, 32, 31, 25, 19, 30, 22, 37, 13, 32, 8, 18, 8, 48, 6, 30, 28, 33, 16,
                 3, 35], [45, 42, 40, 0, 39, 31, 21, 15, 46, 20, 45, 4, 12], 1),
            (4, [34, 28, 5], [20, 32, 31], 2)]
    case = Case(4, 11, 2, 22, False, 0, True, False, False, 2, False, 32768, reqs)
    events, read_at, result = _run(case, 1_000_000, bundle_root, monkeypatch)
    replay_in_vllm(events, read_at, case, model_dir)


def test_pipeline_engine_fills_its_batch_queue_at_once(bundle_root, model_dir, monkeypatch):
    """The other side of the same engine rule (found with the check above disabled). pp=3,
    async scheduling, one sequence at a time: while its queue holds fewer than pp batches
    vLLM schedules again at once (a running request's next decode, its token still a
    placeholder), and processes the oldest output only when the queue is full or the step
    is empty. Sim's engine waited until the last batch had left the first stage; when the
    oldest batch was done by then, it processed that output first. Here, with request 1's
    prefill in flight, sim waited for the oldest batch where vLLM, its queue not full,
    schedules request 1's first decode on a placeholder (``sim waited for its oldest step
    where vLLM schedules ([(1, 5, 1)], ...)``). Also checks the empty step before request
    1 arrives: it holds a slot of vLLM's queue (the queue is full with one batch less)."""
    reqs = [(9, [17, 8, 11, 43, 0, 21, 32, 29, 38, 5, 21, 35, 39, 44, 2, 46, 24, 10, 45, 28,
                 46, 27, 10, 10], [3, 7, 8, 32], 0),
            (9, [49, 44, 24, 47, 6], [18, 13, 43, 14, 46, 26, 5, 49, 17, 13, 25, 17, 21, 2,
                                      12], 0)]
    case = Case(16, 20, 1, 256, False, 0, True, False, True, 3, False, 32768, reqs)
    events, read_at, result = _run(case, 1_000_000, bundle_root, monkeypatch)
    replay_in_vllm(events, read_at, case, model_dir)
