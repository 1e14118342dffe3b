"""Event leaping (sim.leap) against the step-by-step reference: byte-identical output.

Every case simulates one workload twice, with ``event_leaping`` on and off, and compares
every per-request timestamp and counter, the summary and the time series. The cases
cover preemption (tiny KV pools), prefix caching with shared prefixes and a lower tier,
async scheduling on and off, chunked prefill on and off, FCFS and priority scheduling,
max_model_len, several instances, pipeline parallelism, PD disaggregation, DP/EP MoE
groups and power modelling; randomized single-instance cases add closed-loop clients,
max_sim_time_ns and time-series rows of 10 ms to 1 s.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim
import sim.engine
from sim.latency.base import BatchShape
from sim.latency.grid import line
from sim.request import Request
from sim.workload import parse_jsonl_lines
from sim_testkit import POWER, cluster_dict, opts_for

REQUEST_FIELDS = ("rid", "instance_id", "arrival_ns", "queued_ns", "first_scheduled_ns",
                  "first_token_ns", "last_token_ns", "finish_ns", "num_output", "num_computed",
                  "preemptions", "prefix_hit", "lower_hit", "itl_max_ns", "kv_transfer_ns",
                  "prefill_instance", "rejected", "client_id")
VOLATILE = ("wall_s", "speedup_vs_real_time")


def _outputs(cluster, workload, opts) -> str:
    res = sim.simulate(cluster, workload, opts)
    rows = [tuple(getattr(r, f) for f in REQUEST_FIELDS) for r in res.requests]
    summary = {k: v for k, v in res.summary.items() if k not in VOLATILE}
    return json.dumps([rows, summary, res.timeseries.columns(), res.timeseries.power],
                      sort_keys=True, default=repr)


def _assert_same(cluster, workload, opts, *counters: list) -> str:
    """Leaping on gives the output of leaping off (returned). ``counters`` (the lists that
    monkeypatched calls append to) are cleared in between: they count the leapt run's."""
    stepped = _outputs(cluster, workload, opts.replace(event_leaping=False))
    for calls in counters:
        calls.clear()
    leapt = _outputs(cluster, workload, opts.replace(event_leaping=True))
    assert leapt == stepped
    return stepped


def _count_leaps(monkeypatch) -> list[int]:
    """Steps advanced by leaps (to show that a case exercises them)."""
    steps: list[int] = []
    original = sim.engine.apply_leap

    def counting(sch, plan, n, *args):
        steps.append(n)
        return original(sch, plan, n, *args)

    monkeypatch.setattr(sim.engine, "apply_leap", counting)
    return steps


@st.composite
def workloads(draw, max_requests=24, max_input=600, max_output=120, shared_prefixes=True):
    """Flat requests with clustered arrivals; with shared prefixes, prompts start with
    one of a few common token runs (prefix-cache hits, also across preemptions)."""
    n = draw(st.integers(2, max_requests))
    prefixes = [[1000 * p + t for t in range(draw(st.integers(8, 80)))] for p in range(3)]
    reqs = []
    t = 0
    for i in range(n):
        t += draw(st.sampled_from([0, 1_000_000, 20_000_000, 300_000_000]))
        n_in = draw(st.integers(1, max_input))
        n_out = draw(st.integers(1, max_output))
        ids = None
        if shared_prefixes and draw(st.booleans()):
            pre = prefixes[draw(st.integers(0, 2))][:n_in]
            ids = pre + [7 + i * 10_000 + k for k in range(n_in - len(pre))]
        reqs.append(Request(i, t, n_in, n_out, input_ids=ids))
        reqs[-1].priority = draw(st.integers(0, 2))
    return sim.Workload(reqs, source="<hypothesis>")


def _count_calls(monkeypatch, **labels) -> list[str]:
    """Wrap each Scheduler method named in ``labels`` so that a call appends its label to
    the list returned."""
    calls: list[str] = []
    for name, label in labels.items():
        original = getattr(sim.scheduler.Scheduler, name)

        def counting(self, *args, _original=original, _label=label):
            calls.append(_label)
            return _original(self, *args)

        monkeypatch.setattr(sim.scheduler.Scheduler, name, counting)
    return calls


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(wl=workloads(), kv_tokens=st.sampled_from([760, 1440, 6400]), instances=st.sampled_from([1, 1, 2]),
       async_=st.booleans(), caching=st.booleans(), chunked=st.booleans(),
       reserve_full=st.booleans(), policy=st.sampled_from(["fcfs", "priority"]),
       tier=st.sampled_from([None, None, "CPU"]), max_len=st.sampled_from([None, None, 500]),
       budget=st.sampled_from([2048, 256]), block_size=st.sampled_from([16, 4]))
def test_single_instances_leap_exactly(bundle_root, wl, kv_tokens, instances, async_, caching,
                                       chunked, reserve_full, policy, tier, max_len, budget,
                                       block_size):
    # every request fits the pool alone (prompt + output <= 720 tokens); 760 preempts often
    cluster = sim.parse_cluster(cluster_dict(kv_tokens // block_size + 1, instances, block_size))
    opts = opts_for(bundle_root, async_scheduling=async_, enable_prefix_caching=caching,
                    enable_chunked_prefill=chunked or budget < 600,  # unchunked prompts fit the budget
                    reserve_full_isl=reserve_full, scheduling_policy=policy,
                    prefix_storage=tier if caching else None, max_model_len=max_len,
                    max_num_batched_tokens=budget, block_size=block_size,
                    timeseries_interval_ns=50_000_000)
    _assert_same(cluster, wl, opts)


def test_leaps_happen_and_cover_most_decode_steps(bundle_root, monkeypatch):
    """A steady decode load: most steps are leapt over, and the output is unchanged."""
    steps = _count_leaps(monkeypatch)
    wl = sim.Workload([Request(i, i * 5_000_000, 100 + 37 * i, 200 + 11 * i) for i in range(12)],
                      source="<test>")
    cluster = sim.parse_cluster(cluster_dict(400))
    for async_ in (False, True):
        steps.clear()
        opts = opts_for(bundle_root, async_scheduling=async_)
        _assert_same(cluster, wl, opts)
        # about 330 steps in all: nearly all of them leapt, in stretches up to the next arrival
        assert sum(steps) >= 250 and sum(steps) >= 10 * len(steps)


def test_leaps_under_preemption_pressure(bundle_root, monkeypatch):
    """A pool too small for the load: preemptions happen, leaps stop short of them."""
    steps = _count_leaps(monkeypatch)
    wl = sim.Workload([Request(i, 0, 120, 300) for i in range(10)], source="<test>")
    cluster = sim.parse_cluster(cluster_dict(60))
    opts = opts_for(bundle_root)
    res = sim.simulate(cluster, wl, opts.replace(event_leaping=False))
    assert res.summary["preemptions"] > 0
    _assert_same(cluster, wl, opts)
    assert steps


H100 = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
        "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}, "num_npus": 1, "tp_size": 1}


def _cluster(instances: list[dict], power: bool = False) -> sim.ClusterConfig:
    node = {"num_instances": len(instances),
            "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
            "instances": [{**copy.deepcopy(H100), **i} for i in instances]}
    if power:
        node["power"] = copy.deepcopy(POWER)
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": 1000,
                              "nodes": [node]})


def _flat(spec: list[tuple[int, int, int]]) -> sim.Workload:
    return parse_jsonl_lines(json.dumps({"input_toks": i, "output_toks": o, "arrival_time_ns": t})
                             for t, i, o in spec)


SYSTEM_CASES = {
    "pd": ([{"pd_type": "prefill"}, {"pd_type": "decode"}], False),
    "pp2": ([{"num_npus": 2, "pp_size": 2}], False),
    "tp2_power": ([{"num_npus": 2, "tp_size": 2}], True),
    "power_two_instances": ([{}, {}], True),
    "moe_dp_ep": ([{"model_name": "Qwen/Qwen3-30B-A3B-Instruct-2507", "ep_size": 2,
                    "dp_group": "A"}] * 2, False),
    "moe_single": ([{"model_name": "Qwen/Qwen3-30B-A3B-Instruct-2507"}], True),
}


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(st.tuples(st.integers(0, 400_000_000), st.integers(1, 1500),
                               st.integers(1, 150)), min_size=1, max_size=12),
       async_=st.booleans())
@pytest.mark.parametrize("case", sorted(SYSTEM_CASES))
def test_system_features_leap_exactly(case, spec, async_):
    instances, power = SYSTEM_CASES[case]
    opts = sim.SimOptions(latency_provider="roofline", async_scheduling=async_,
                          timeseries_interval_ns=100_000_000)
    _assert_same(_cluster(instances, power), _flat(sorted(spec)), opts)


def _stretch_matches_steps(provider_factory, shape0, steps: int, taken: int) -> None:
    """``decode_stretch`` gives each step's ``iteration_ns`` and books the same off-grid
    lookups for the steps taken."""
    vec, ref = provider_factory(), provider_factory()
    stretch = vec.decode_stretch(shape0, steps)
    assert stretch is not None
    n = shape0.num_decode
    kv_sum, sq = shape0.decode_kv_sum, shape0.decode_kv_sq_sum

    def step(j):  # every KV one longer a step: the squared sum grows by 2 j sum + n j^2
        return BatchShape(n, n, 0, 0, n, kv_sum + n * j, shape0.decode_kv_max + j,
                          shape0.decode_kv_min + j, 0, sq + 2 * j * kv_sum + n * j * j if sq else 0)

    expected = [ref.iteration_ns(step(j)) for j in range(steps)]
    assert stretch.durations == expected
    stretch.record(taken)
    ref_taken = provider_factory()
    for j in range(taken):
        ref_taken.iteration_ns(step(j))
    assert list(vec.extrapolations().items()) == list(ref_taken.extrapolations().items())


@pytest.mark.parametrize("n,kv_min,kv_max", [(1, 100, 100), (7, 10, 900), (40, 500, 8150),
                                             (200, 3000, 9000)])
def test_measured_decode_stretch_is_exact(bundle_root, n, kv_min, kv_max):
    """The vectorised stretch against the scalar lookups, on and off the grid (the
    synthetic bundle's decode KV axis ends at 8192, its decode count at 256), and on a
    measured bundle with a skew fit."""
    from sim.latency.measured import MeasuredProvider
    from sim.model import load_model
    from sim_testkit import HW, MODEL

    kv_sum = kv_min * (n - 1) + kv_max if n > 1 else kv_max
    shape0 = BatchShape(n, n, 0, 0, n, kv_sum, kv_max, kv_min if n > 1 else kv_max)
    model = load_model(MODEL)
    _stretch_matches_steps(lambda: MeasuredProvider(model, HW, 1, profiles_dirs=(str(bundle_root),)),
                           shape0, 300, 200)
    skewed = MeasuredProvider(model, "RTXPRO6000", 1)
    assert skewed._skew is not None  # this bundle corrects attention for uneven KV lengths
    _stretch_matches_steps(lambda: MeasuredProvider(model, "RTXPRO6000", 1), shape0, 300, 123)
    # with the squared KV sum (the skew rate from the variance), as the scheduler gives it
    kvs = [kv_min + (kv_max - kv_min) * i // max(1, n - 1) for i in range(n)]
    spread = BatchShape(n, n, 0, 0, n, sum(kvs), max(kvs), min(kvs), 0, sum(k * k for k in kvs))
    _stretch_matches_steps(lambda: MeasuredProvider(model, "RTXPRO6000", 1), spread, 300, 123)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 256), kv_min=st.integers(0, 9000), spread=st.integers(0, 3000),
       steps=st.integers(1, 300), data=st.data())
def test_measured_decode_stretch_matches_each_step(bundle_root, n, kv_min, spread, steps, data):
    """The stretch is read a linear piece of the decode-KV lines at a time: every step's
    time and off-grid count as the scalar lookup's, from below the first KV key (16)
    through the keys to past the top one (the synthetic bundle's 8192, the measured
    ones' 16384), for decode counts on and between the grid's, with and without a skew
    fit, and with what a stretch of the same decode count shares taken from the first."""
    from sim.latency.measured import MeasuredProvider, _line_run, _piecewise
    from sim.model import load_model
    from sim_testkit import HW, MODEL

    kv_max = kv_min + spread if n > 1 else kv_min
    kv_sum = kv_min * (n - 1) + kv_max
    shape0 = BatchShape(n, n, 0, 0, n, kv_sum, kv_max, kv_min,
                        0, kv_min * kv_min * (n - 1) + kv_max * kv_max)
    taken = data.draw(st.integers(0, steps))
    model = load_model(MODEL)
    for hw, dirs in ((HW, (str(bundle_root),)), ("RTX4090", ()), ("RTXPRO6000", ())):
        factory = lambda hw=hw, dirs=dirs: MeasuredProvider(model, hw, 1, profiles_dirs=dirs)  # noqa: E731
        _stretch_matches_steps(factory, shape0, steps, taken)
        prov = factory()
        for kd_axis, vals, slope in (prov._attn[key][1][0] for key in prov._attn if key[0] == 0):
            # each decode-KV line a stretch reads, float for float (before the integer ns)
            pieces = _piecewise(kd_axis.vals, vals, slope)
            assert _line_run(pieces, kv_min, kv_min + steps) == [
                line(kd_axis, vals, q, slope) for q in range(kv_min, kv_min + steps)]
        prov = factory()
        prov.decode_stretch(BatchShape(n, n, 0, 0, n, n * 40, 40, 40), 3)  # (a first stretch)
        _stretch_matches_steps(lambda prov=prov: prov, shape0, steps, 0)


def test_decode_stretch_past_the_decode_count_grid_falls_back(bundle_root):
    """A decode count past the profiled ones is extrapolated per step (no stretch)."""
    from sim.latency.measured import MeasuredProvider
    from sim.model import load_model
    from sim_testkit import HW, MODEL

    prov = MeasuredProvider(load_model(MODEL), HW, 1, profiles_dirs=(str(bundle_root),))
    assert prov.decode_stretch(BatchShape(300, 300, 0, 0, 300, 6000, 20, 20), 50) is None


@pytest.mark.parametrize("caching,shared", [(True, False), (True, True), (False, False)])
def test_async_stretch_runs_through_finishes(bundle_root, monkeypatch, caching, shared):
    """Async scheduling, nothing waiting: a stretch goes on when requests finish (the
    batch shrinks mid-stretch, their blocks freed a completion later than their last
    step), so 12 requests of 12 output lengths, admitted together, decode in one or
    two stretches rather than one per finish; the output is unchanged (with shared
    prefix blocks, freed only by the last holder)."""
    steps = _count_leaps(monkeypatch)
    prefix = list(range(5000, 5048))
    wl = sim.Workload([Request(i, 0, 100 + 7 * i, 40 + 23 * i,
                               input_ids=(prefix + [90_000 + 1000 * i + k for k in range(52 + 7 * i)]
                                          if shared else None))
                       for i in range(12)], source="<test>")
    cluster = sim.parse_cluster(cluster_dict(400))
    opts = opts_for(bundle_root, async_scheduling=True, enable_prefix_caching=caching)
    _assert_same(cluster, wl, opts)
    assert sum(steps) >= 250 and len(steps) <= 2


def test_async_arrival_costs_one_stepped_step(bundle_root, monkeypatch):
    """Async scheduling, arrivals spaced out while a batch decodes: a stretch stopped by
    an arrival also takes the step the engine schedules at its last completion (the
    arrival is not there yet), so each arrival costs at most one stepped step, the one
    that admits it (it was two: that step and the one before it; where the stretch runs
    into that step, only its admission is: the test below); the output is unchanged."""
    calls = []
    original = sim.scheduler.Scheduler.schedule

    def counting(self, now):
        calls.append(now)
        return original(self, now)

    monkeypatch.setattr(sim.scheduler.Scheduler, "schedule", counting)
    steps = _count_leaps(monkeypatch)
    wl = sim.Workload([Request(i, i * 40_000_000, 200 + 13 * i, 400) for i in range(16)],
                      source="<test>")
    cluster = sim.parse_cluster(cluster_dict(400))
    opts = opts_for(bundle_root, async_scheduling=True)
    _assert_same(cluster, wl, opts, calls)
    # 16 admissions, a few steps more at the start and end; most steps leapt
    assert len(calls) <= 16 + 4 and sum(steps) >= 20 * len(calls)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(num_blocks=st.integers(4, 80), block_size=st.sampled_from([4, 16]),
       cached=st.integers(0, 300), head_len=st.integers(1, 500), shared=st.integers(0, 300),
       held=st.lists(st.integers(1, 120), max_size=5), threshold=st.sampled_from([0, 48]),
       chunked=st.booleans(), reserve=st.booleans(), budget=st.sampled_from([24, 256, 4096]))
def test_waiting_head_admissible_without_lookup_is_exact(num_blocks, block_size, cached, head_len,
                                                          shared, held, threshold, chunked,
                                                          reserve, budget):
    """``_head_hit`` answers "no stretch" (the head would be admitted) without its prefix
    lookup where its whole sequence fits the free blocks: the same answer as the lookup
    and the admission test, with cached prefix blocks (free or held) and held blocks."""
    from sim.kv_cache import KVCacheManager
    from sim.leap import _head_admissible, _head_hit
    from sim.scheduler import Scheduler

    o = sim.SimOptions(block_size=block_size, enable_prefix_caching=True,
                       enable_chunked_prefill=chunked, reserve_full_isl=reserve,
                       long_prefill_token_threshold=threshold, max_num_batched_tokens=budget)
    kv = KVCacheManager(num_blocks, block_size, True)
    sch = Scheduler(0, o, kv)
    ids = list(range(10_000, 10_000 + max(cached, shared, 1)))
    if cached and kv.blocks_for(cached) <= kv.num_free:  # a finished request's cached blocks
        done = Request(900, 0, cached, 1, input_ids=ids[:cached])
        kv.allocate(done, cached)
        kv.free_request(done)
    for k, n in enumerate(held):  # running requests holding blocks
        r = Request(k, 0, n, 50, input_ids=[7 + 1000 * k + t for t in range(n)])
        if kv.allocate(r, n):
            r.num_computed = n
            r.status = sim.request.RUNNING
            sch.running.append(r)
    n_shared = min(shared, head_len)
    head = Request(999, 0, head_len, 10,
                   input_ids=ids[:n_shared] + [5_000_000 + t for t in range(head_len - n_shared)])
    sch.add_request(head)
    n = len(sch.running)
    if sch.budget - n <= 0 or n >= sch.max_num_seqs:
        return
    expected = _head_admissible(sch, head, kv.lookup(head), kv.num_free - n, sch.budget - n)
    assert (_head_hit(sch) is False) == expected


@pytest.mark.parametrize("async_", [True, False])
@pytest.mark.parametrize("max_time", [None, 300_000_000, 301_234_567])
def test_stretch_runs_into_the_step_an_arrival_waits_for(bundle_root, monkeypatch, async_,
                                                         max_time):
    """An arrival that finds the unit full (sync one step in flight, async two) is routed
    when the first of them completes, and the unit then schedules the step that admits
    it: a stretch stopped by the arrival takes that completion too, routes it and takes
    that step's decodes as planned (the scheduler adding the waiting queue), and (async)
    the completion of the step still in flight, so per arrival the engine schedules one
    step fewer itself and retires one fewer (async: none but the admitting steps, which
    the next stretches start from); the output is unchanged, also with the simulated
    time cut short inside a stretch."""
    calls = _count_calls(monkeypatch, complete="complete", schedule="schedule")
    wl = sim.Workload([Request(i, i * 40_000_000 + 1, 200 + 13 * i, 400) for i in range(16)],
                      source="<test>")
    cluster = sim.parse_cluster(cluster_dict(400))
    opts = opts_for(bundle_root, async_scheduling=async_, max_sim_time_ns=max_time)
    stepped = _assert_same(cluster, wl, opts, calls)
    taken = calls.copy()
    calls.clear()
    monkeypatch.setattr(sim.engine._Run, "_arrival_completion", lambda self, *args: None)
    assert _outputs(cluster, wl, opts.replace(event_leaping=True)) == stepped
    if max_time is None:
        assert taken.count("complete") <= (2 if async_ else calls.count("complete") - 12)
        assert taken.count("schedule") <= calls.count("schedule") - 12


@pytest.mark.parametrize("async_", [True, False])
@pytest.mark.parametrize("caching", [True, False])
def test_stretch_into_an_arrival_with_short_series_rows(async_, caching):
    """The measured RTX 4090 bundle (decode steps of ~20 ms) with time-series rows of
    10 ms: where a stretch runs into an arrival's step, the rows between the completions
    it takes there carry over the state each leaves, as step by step."""
    cluster = sim.parse_cluster(cluster_dict(3000, hardware="RTX4090"))
    wl = sim.generate(sim.WorkloadSpec(num_requests=60, arrival="poisson", rate=5.0,
                                       input=sim.LengthDist("uniform", low=16, high=1500),
                                       output=sim.LengthDist("uniform", low=1, high=300),
                                       seed=3))
    opts = sim.SimOptions(max_num_seqs=16, max_num_batched_tokens=2048,
                          async_scheduling=async_, enable_prefix_caching=caching,
                          timeseries_interval_ns=10_000_000)
    _assert_same(cluster, wl, opts)


def _random_single_instance_case(seed: int):
    """A single-instance case drawn from ``seed``: the measured RTX 4090 bundle (decode
    steps of ~20 ms) under any of sync/async scheduling, prefix caching (shared prompt
    prefixes, a lower tier), FCFS/priority, max_model_len, max_sim_time_ns, closed-loop
    clients (paced or not) and time-series rows of 10 ms to 1 s; a KV pool from barely
    the longest request to forty times it."""
    rng = random.Random(seed)
    prefixes = [[1000 * p + k for k in range(rng.randint(8, 200))] for p in range(3)]
    reqs, t = [], 0
    for i in range(rng.randint(5, 60)):
        t += rng.choice([0, 1_000_000, 20_000_000, 300_000_000, rng.randint(0, 500_000_000)])
        n_in = rng.randint(1, 1500)
        ids = None
        if rng.random() < 0.5:
            pre = prefixes[rng.randint(0, 2)][:n_in]
            ids = pre + [7 + i * 100_000 + k for k in range(n_in - len(pre))]
        reqs.append(Request(i, t, n_in, rng.randint(1, 400), input_ids=ids))
        reqs[-1].priority = rng.randint(0, 2)
    clients = rng.choice([0, 0, 0, rng.randint(1, 12)])
    wl = sim.Workload(reqs, source="<random>", closed_loop_clients=clients,
                      paced=bool(clients) and rng.random() < 0.5)
    block_size = rng.choice([16, 16, 4, 32])
    longest = max(r.input_len + r.output_len for r in reqs)
    blocks = int((longest // block_size + 2) * rng.choice([1.05, 1.5, 3, 10, 40])) + 2
    layout = cluster_dict(blocks, 1, block_size, hardware="RTX4090")
    layout["nodes"][0]["instances"][0]["npu_mem"]["mem_size"] = 24  # (the override sets the pool)
    caching = rng.random() < 0.6
    opts = sim.SimOptions(
        max_num_seqs=rng.choice([4, 16, 256]),
        max_num_batched_tokens=rng.choice([256, 512, 2048, 4096]),
        async_scheduling=rng.random() < 0.6, enable_prefix_caching=caching,
        block_size=block_size, reserve_full_isl=rng.random() < 0.7,
        scheduling_policy=rng.choice(["fcfs", "priority"]),
        max_model_len=rng.choice([None, None, 700, 1200]),
        max_sim_time_ns=rng.choice([None, None, None, rng.randint(10**8, 2 * 10**10)]),
        prefix_storage=rng.choice([None, None, "CPU"]) if caching else None,
        timeseries_interval_ns=rng.choice([10**7, 2 * 10**7, 5 * 10**7, 10**8, 10**9]))
    return sim.parse_cluster(layout), wl, opts


@pytest.mark.parametrize("seed", range(24))
def test_random_single_instance_cases_leap_exactly(seed):
    """Randomized single-instance cases (``_random_single_instance_case``): leaping on
    and off give byte-identical output."""
    _assert_same(*_random_single_instance_case(seed))


@pytest.mark.parametrize("caching", [True, False])
def test_finish_that_admits_the_waiting_head_is_leapt(bundle_root, monkeypatch, caching):
    """Async scheduling, a pool too small for the queue: a stretch runs through the first
    finish past its first step (the batch shrinking there) and, at that completion, takes
    the next step's decodes, the scheduler adding the waiting queue to them; where a
    request's step in flight is its last and its blocks may let the head in at step 1,
    the stretch is step 0, that completion and step 1's decodes. So the engine schedules
    almost no step itself (it was two per finish: the one before it and the one that
    admits the head) and a finish costs about one stretch; the output is unchanged."""
    calls = _count_calls(monkeypatch, schedule_after_decodes="after_decodes",
                         schedule="schedule")
    steps = _count_leaps(monkeypatch)
    wl = sim.Workload([Request(i, 0, 150 + 9 * i, 60 + 17 * (i % 7)) for i in range(30)],
                      source="<test>")
    cluster = sim.parse_cluster(cluster_dict(120))
    opts = opts_for(bundle_root, async_scheduling=True, enable_prefix_caching=caching)
    _assert_same(cluster, wl, opts, calls)
    # 30 finishes, 7 preemptions; ~700 steps in all
    assert calls.count("after_decodes") >= 20 and calls.count("schedule") <= 15
    assert len(steps) <= 30 + 10
