"""vLLM V1 scheduling rules that the previous scheduler missed (issue 14, items 3-5, 7, 8),
each driven on a bare Scheduler / KVCacheManager or a small end-to-end run."""

from __future__ import annotations

import json

import pytest

import sim
from sim import engine
from sim.kv_cache import KVCacheManager
from sim.metrics import GapRuns
from sim.options import SimOptions
from sim.request import PREEMPTED, Request
from sim.scheduler import Scheduler
from sim.workload import parse_jsonl_lines


def make_sched(num_blocks=101, block_size=16, caching=True, **opts) -> Scheduler:
    o = SimOptions(block_size=block_size, enable_prefix_caching=caching, **opts)
    return Scheduler(0, o, KVCacheManager(num_blocks, block_size, caching))


def scheduled(batch) -> dict[int, tuple[int, int]]:
    """{rid: (tokens computed before the step, new tokens)}"""
    return {r.rid: (r.num_computed - n, n) for r, n in zip(batch.requests, batch.num_new)}


# ------------------------------------------------------------ item 4: cache at allocation
def test_requests_admitted_in_the_same_step_share_a_prefix():
    # Three requests with a 64-token common prefix arrive together. vLLM caches the first
    # one's blocks when it allocates them, so the next two hit them in the same step.
    s = make_sched(max_num_batched_tokens=1000)
    prefix = list(range(64))
    for i in range(3):
        s.add_request(Request(i, 0, 80, 4, input_ids=prefix + [1000 + 16 * i + k
                                                              for k in range(16)]))
    got = scheduled(s.schedule(0))
    assert got == {0: (0, 80), 1: (64, 16), 2: (64, 16)}
    assert s.kv.hit_tokens == 128


# ------------------------------------------------------------ item 3: PP overlaps chunks
def test_next_chunk_is_scheduled_while_the_previous_is_in_flight():
    # Pipeline parallelism: a second batch is scheduled before the first completes. The
    # prompt's progress advanced at scheduling, so its next chunk goes into that batch.
    s = make_sched(max_num_batched_tokens=256, async_scheduling=False)
    s.add_request(Request(0, 0, 1000, 2))
    b1 = s.schedule(0)
    assert scheduled(b1) == {0: (0, 256)}
    b2 = s.schedule(0)
    assert scheduled(b2) == {0: (256, 256)}
    s.complete(b1, 1, GapRuns())
    s.complete(b2, 2, GapRuns())
    assert scheduled(s.schedule(2)) == {0: (512, 256)}


def test_decode_with_a_step_in_flight_waits_without_async_scheduling():
    s = make_sched(async_scheduling=False)
    s.add_request(Request(0, 0, 10, 5))
    b1 = s.schedule(0)
    assert s.schedule(0) is None  # its token is not sampled yet
    s.complete(b1, 1, GapRuns())
    assert scheduled(s.schedule(1)) == {0: (10, 1)}


def _pp_cluster(pp: int) -> dict:
    """One H100 instance of Llama-3.1-8B over ``pp`` pipeline stages (a cluster dict)."""
    return {"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
            "num_npus": pp, "tp_size": 1, "pp_size": pp}]}]}


def _prompt_ttft_ms(pp: int, async_scheduling: bool = False) -> float:
    c = _pp_cluster(pp)
    wl = parse_jsonl_lines([json.dumps({"input_toks": 16384, "output_toks": 2,
                                        "arrival_time_ns": 0})])
    res = sim.simulate(sim.parse_cluster(c), wl, SimOptions(
        latency_provider="roofline", async_scheduling=async_scheduling))
    return res.summary["ttft_ms"]["mean"]


def test_long_prompt_ttft_falls_with_pipeline_stages():
    # The chunks of one 16k prompt overlap across stages (they did not: 858/866/881 ms).
    t1, t2, t4 = _prompt_ttft_ms(1), _prompt_ttft_ms(2), _prompt_ttft_ms(4)
    assert t2 < 0.75 * t1 and t4 < t2


def test_long_prompt_chunks_do_not_overlap_with_async_pipeline():
    # With async scheduling every stage but the last waits for each step's sampled ids
    # before the next step (see test_async_pipeline_decode_waits_for_its_sampled_token),
    # partial-prefill steps included: chunks pass the stages one at a time, so the prompt
    # takes about as long as on one device (stage transfers added), not less.
    t1 = _prompt_ttft_ms(1, async_scheduling=True)
    t2, t4 = _prompt_ttft_ms(2, async_scheduling=True), _prompt_ttft_ms(4, async_scheduling=True)
    assert t2 > 0.95 * t1 and t4 > 0.95 * t1


# ------------------------------------------------------------ item 7: async scheduling
def test_async_scheduling_default_follows_the_vllm_version():
    assert SimOptions().async_enabled
    assert not SimOptions(vllm_version="0.10.1").async_enabled
    assert not SimOptions(async_scheduling=False).async_enabled
    with pytest.raises(sim.InputError, match="vllm_version"):
        SimOptions(vllm_version="latest").validate()


def test_async_schedules_the_next_decode_before_the_token_is_back():
    s = make_sched(async_scheduling=True)
    s.add_request(Request(0, 0, 10, 3))
    b1 = s.schedule(0)
    b2 = s.schedule(0)  # placeholder for b1's token: decode the next one already
    assert scheduled(b2) == {0: (10, 1)}
    # Tokens 1 and 2 are in flight; token 3 still needs a step once token 1 is back.
    s.complete(b1, 1, GapRuns())
    b3 = s.schedule(1)
    assert scheduled(b3) == {0: (11, 1)}
    s.complete(b2, 2, GapRuns())
    # Two placeholders would reach the output length: no wasted extra step.
    assert s.schedule(2) is None
    fin = s.complete(b3, 3, GapRuns())
    assert [r.rid for r in fin] == [0] and fin[0].num_output == 3


def _burst_summary(async_scheduling: bool) -> dict:
    lines = [json.dumps({"input_toks": 200, "output_toks": 30, "arrival_time_ns": i * 7_000_000})
             for i in range(30)]
    c = {"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]}
    return sim.simulate(sim.parse_cluster(c), parse_jsonl_lines(lines),
                        SimOptions(latency_provider="roofline",
                                   async_scheduling=async_scheduling)).summary


def test_async_scheduling_delays_arrivals_by_the_step_in_flight():
    # An arrival during a step joins the step after next (the next one was scheduled
    # when the running one started): TTFT grows, every request still finishes.
    on, off = _burst_summary(True), _burst_summary(False)
    assert on["num_finished"] == off["num_finished"] == 30
    assert on["ttft_ms"]["mean"] > off["ttft_ms"]["mean"]


# ------------------------------------------------------------ item 5: PD hand-off
def _pd(decode_blocks_util=0.9):
    def inst(role):
        return {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0,
                            "mem_util": decode_blocks_util}, "pd_type": role}
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 2000, "nodes": [{
        "num_instances": 2, "instances": [inst("prefill"), inst("decode")]}]})


def test_decode_side_holds_each_prompt_once(monkeypatch):
    # The decode side used to allocate the prompt on top of num_computed (twice the blocks).
    peaks = []
    orig = Scheduler.schedule

    def spy(self, now):
        b = orig(self, now)
        if self.role == "decode":
            for r in self.running:
                peaks.append((len(r.block_ids), self.kv.blocks_for(r.num_computed)))
        return b

    monkeypatch.setattr(Scheduler, "schedule", spy)
    wl = parse_jsonl_lines([json.dumps({"input_toks": 1000, "output_toks": 5,
                                        "arrival_time_ns": 0})])
    res = sim.simulate(_pd(), wl, SimOptions(latency_provider="roofline"))
    assert res.summary["num_finished"] == 1 and peaks
    assert all(held <= need for held, need in peaks)


def test_only_the_uncached_part_of_the_prompt_is_transferred():
    # The second request shares a 960-token prefix that the decode side already holds
    # from the first one: only the rest crosses the link.
    prefix = list(range(960))
    lines = [json.dumps({"input_toks": 1000, "output_toks": 4, "arrival_time_ns": i * 10**9,
                         "input_tok_ids": prefix + [5000 + 40 * i + k for k in range(40)]})
             for i in range(2)]
    res = sim.simulate(_pd(), parse_jsonl_lines(lines), SimOptions(latency_provider="roofline"))
    t = res.requests_table()
    first, second = t.kv_transfer_ns.iloc[0], t.kv_transfer_ns.iloc[1]
    assert second < 0.2 * first


def test_prefill_side_keeps_blocks_until_the_transfer_lands():
    s = make_sched(caching=False, async_scheduling=False)
    s.role = "prefill"
    r = Request(0, 0, 64, 8)
    s.add_request(r)
    b = s.schedule(0)
    s.complete(b, 1, GapRuns())
    assert s.handoffs == [r] and r.num_output == 0  # the prefill's token is not the client's
    assert s.kv.num_used == 4 and r.block_ids == [] and len(r.handoff_blocks) == 4
    s.release_handoff(r.handoff_blocks)
    assert s.kv.num_used == 0


# ------------------------------------------------------------ item 8: smaller rules
def test_request_without_token_ids_hits_its_own_blocks_after_preemption():
    # 4 usable blocks of 4 tokens; A (no token ids) is preempted by B's growth, then comes
    # back and finds its own cached prompt blocks.
    s = make_sched(num_blocks=6, block_size=4, max_num_batched_tokens=100,
                   async_scheduling=False, scheduling_policy="priority")
    a = Request(0, 0, 8, 2)
    a.priority = 1
    b = Request(1, 0, 8, 10)
    s.add_request(a)
    s.add_request(b)
    s.complete(s.schedule(0), 1, GapRuns())
    now = 1
    while a.preemptions == 0:
        s.complete(s.schedule(now), now + 1, GapRuns())
        now += 1
    assert a.status == PREEMPTED
    s.running.clear()  # B goes away; A's blocks are still cached in the free queue
    s.kv.free_request(b)
    got = scheduled(s.schedule(now))
    assert got[0][0] >= 8  # its 8-token prompt (and more) found cached


def test_duplicate_full_blocks_are_both_cached():
    # Two requests computed the same two blocks without seeing each other (no lookup).
    kv = KVCacheManager(9, 4, True)  # 8 usable blocks of 4 tokens
    ids = list(range(8))
    a, b = Request(0, 0, 9, 1, input_ids=ids + [9]), Request(1, 0, 9, 1, input_ids=ids + [10])
    assert kv.allocate(a, 9) and kv.allocate(b, 9)
    b_blocks = b.block_ids[:2]
    kv.free_request(a)
    kv.free_request(b)
    # The next 5 blocks handed out include a's two cached ones (freed first)...
    assert kv.allocate(Request(2, 0, 20, 1), 20)
    # ...but b's copies of the same blocks still serve the prefix.
    assert kv.lookup(Request(3, 0, 9, 1, input_ids=ids + [0])) == b_blocks


def test_evicting_an_ancestor_keeps_cached_descendants_reachable():
    # b computed a's first two blocks again (duplicates) and a third one after them; a's
    # copies are then evicted. b's third block must stay reachable through b's own copies
    # (a radix tree that hung it under a's nodes lost it with them).
    kv = KVCacheManager(9, 4, True)  # 8 usable blocks of 4 tokens
    ids = list(range(12))
    a = Request(0, 0, 9, 1, input_ids=ids[:8] + [99])
    b = Request(1, 0, 13, 1, input_ids=ids + [98])
    assert kv.allocate(a, 9) and kv.allocate(b, 13)
    kv.free_request(a)
    assert kv.allocate(Request(2, 0, 16, 1), 16)  # evicts a's blocks
    hit = kv.lookup(Request(3, 0, 13, 1, input_ids=ids + [0]))
    assert hit == b.block_ids[:3]


def _len_run(max_model_len):
    lines = [json.dumps({"input_toks": n, "output_toks": 50, "arrival_time_ns": i})
             for i, n in enumerate([100, 90, 300])]
    c = {"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "instances": [{
            "model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}}]}]}
    return sim.simulate(sim.parse_cluster(c), parse_jsonl_lines(lines),
                        SimOptions(latency_provider="roofline", max_model_len=max_model_len))


def test_max_model_len_rejects_long_prompts_and_caps_outputs():
    res = _len_run(120)
    assert res.summary["rejected_requests"] == 1  # the 300-token prompt
    t = res.requests_table().set_index("request_id")
    assert t.loc[0, "output_tokens"] == 20 and t.loc[1, "output_tokens"] == 30
    assert _len_run(None).summary["rejected_requests"] == 0


def test_priority_policy_admits_by_priority_and_preempts_the_lowest():
    s = make_sched(num_blocks=5, block_size=4, max_num_batched_tokens=100,
                   scheduling_policy="priority", async_scheduling=False, max_num_seqs=1)
    lo, hi = Request(0, 0, 4, 3), Request(1, 5, 4, 3)
    lo.priority, hi.priority = 2, 0
    s.add_request(lo)
    s.add_request(hi)
    assert list(scheduled(s.schedule(0))) == [1]  # later arrival, higher priority
    s2 = make_sched(num_blocks=4, block_size=4, max_num_batched_tokens=100,
                    scheduling_policy="priority", async_scheduling=False)
    a, b = Request(0, 0, 4, 8), Request(1, 1, 4, 8)
    a.priority, b.priority = 1, 0  # a is less important although it came first
    for r in (a, b):
        s2.add_request(r)
    now = 0
    while not a.preemptions and not b.preemptions:
        s2.complete(s2.schedule(now), now + 1, GapRuns())
        now += 1
    assert a.preemptions == 1 and b.preemptions == 0
    with pytest.raises(sim.InputError, match="scheduling_policy"):
        SimOptions(scheduling_policy="lifo").validate()


def test_decode_side_requests_wait_outside_running_until_their_kv_lands():
    # vLLM's WAITING_FOR_REMOTE_KVS: blocks are allocated at once, but the request joins
    # the running set (and counts against max_num_seqs) only when its transfer is done.
    s = make_sched(caching=False, async_scheduling=False, max_num_seqs=1)
    s.role = "decode"
    a, b = Request(0, 0, 32, 4), Request(1, 0, 32, 4)
    for r in (a, b):
        r.remote_kv = True
        s.add_request(r)
    assert s.schedule(0) is None
    assert s.receiving == [a, b] and not s.running and s.kv.num_used == 4
    assert s.admitted_transfers == [a, b] and a.kv_transfer_tokens == 32
    a.ready_ns, b.ready_ns = 10, 10
    assert s.schedule(5) is None
    assert scheduled(s.schedule(10)) == {0: (31, 1)}  # the first token, max_num_seqs = 1
    assert s.receiving == [b]


def test_without_max_model_len_the_models_position_limit_applies(monkeypatch):
    # vLLM derives max_model_len from the model's config (max_position_embeddings) when the
    # flag is not given: a longer prompt is refused and outputs stop at the limit. Before,
    # the simulator had no limit without the flag (a 200,000-token prompt was simulated).
    import dataclasses

    import sim.engine
    real = sim.engine.instance_model
    monkeypatch.setattr(sim.engine, "instance_model", lambda *a, **kw: dataclasses.replace(
        real(*a, **kw), max_position_embeddings=120))
    res = _len_run(None)
    assert res.summary["rejected_requests"] == 1  # the 300-token prompt
    t = res.requests_table().set_index("request_id")
    assert t.loc[0, "output_tokens"] == 20 and t.loc[1, "output_tokens"] == 30
    # the flag still overrides the model's limit
    assert _len_run(1000).summary["rejected_requests"] == 0


def test_a_cache_too_small_for_one_max_len_request_is_reported():
    # vLLM 0.19 refuses to start when the KV cache cannot hold one request of max_model_len
    # (check_enough_kv_cache_memory); the 4090 run passed --max-model-len 32768 for that
    # reason (131,072 tokens need 8,192 blocks; 2,586 fit).
    from sim.memory import MemoryBudget
    mem = MemoryBudget(1, 0.9, 1, 0, 0, 0, 0, 1, 16, 2586)
    text = mem.start_refusal(131072)
    assert "max_model_len=131,072 tokens needs 8,192 KV blocks, 2,586 fit" in text
    assert "41,376 tokens" in text
    assert text in mem.log_lines(131072)  # logged with vLLM's start-up lines
    assert mem.start_refusal(32768) == "" and mem.start_refusal(41376) == ""
    assert not any("refuse" in line for line in mem.log_lines(32768))


# ------------------------------------------------ pipeline parallelism: vLLM's batch queue
def _pp_run(pp: int, async_: bool, reqs: list[tuple[int, int, int]], monkeypatch):
    """A pp-stage instance serving ``reqs`` (arrival ns, prompt, output); returns the
    engine's scheduler calls in order: ("S", now, rids scheduled) and ("C", now)."""
    c = _pp_cluster(pp)
    wl = parse_jsonl_lines([json.dumps({"input_toks": n, "output_toks": o, "arrival_time_ns": t})
                            for t, n, o in reqs])
    calls = []
    sched, comp = Scheduler.schedule, Scheduler.complete

    def schedule(self, now):
        b = sched(self, now)
        calls.append(("S", now, [] if b is None else sorted(r.rid for r in b.requests)))
        return b

    def complete(self, batch, now, sink):
        calls.append(("C", now))
        return comp(self, batch, now, sink)

    monkeypatch.setattr(Scheduler, "schedule", schedule)
    monkeypatch.setattr(Scheduler, "complete", complete)
    sim.simulate(sim.parse_cluster(c), wl, SimOptions(
        latency_provider="roofline", async_scheduling=async_, event_leaping=False))
    monkeypatch.undo()
    return calls


def test_pipeline_engine_blocks_on_its_oldest_batch_after_an_empty_schedule(monkeypatch):
    # vLLM's step_with_batch_queue: having scheduled nothing with a batch in flight, the
    # engine waits for that batch's output; a request arriving meanwhile (after the
    # batch has left the first stage) is scheduled only then (sim scheduled it at once).
    first_end = next(t for k, t, *_ in _pp_run(2, False, [(0, 4096, 3)], monkeypatch)
                     if k == "C")
    calls = _pp_run(2, False, [(0, 4096, 3), (first_end * 3 // 4, 16, 3)], monkeypatch)
    read = next(t for k, t, *rest in calls if k == "S" and 1 in rest[0])
    assert read == first_end
    # and every schedule with a batch in flight right after an empty one is preceded by
    # that batch's completion
    for prev, nxt in zip(calls, calls[1:]):
        if prev[0] == "S" and not prev[2] and nxt[0] == "S":
            assert not nxt[2]


def test_pipeline_engine_fills_its_batch_queue_at_once(monkeypatch):
    # With async scheduling vLLM schedules a running request's next decodes (on
    # placeholders) at once while its queue of pp batches has room, not one stage later.
    calls = _pp_run(3, True, [(0, 512, 8)], monkeypatch)
    assert [c[:2] for c in calls[:3]] == [("S", 0)] * 3 and all(c[2] == [0] for c in calls[:3])
    assert calls[3][0] == "C"  # the queue is full: the engine blocks on its oldest batch


def _pp_tpot_ns(pp: int, async_: bool) -> float:
    c = _pp_cluster(pp)
    wl = parse_jsonl_lines([json.dumps({"input_toks": 512, "output_toks": 16,
                                        "arrival_time_ns": 0})])
    r = sim.simulate(sim.parse_cluster(c), wl, SimOptions(
        latency_provider="roofline", async_scheduling=async_, event_leaping=False))
    req = r.requests[0]
    return (req.last_token_ns - req.first_token_ns) / (req.output_len - 1)


def test_async_pipeline_decode_waits_for_its_sampled_token():
    # vLLM 0.19 with pipeline parallelism and async scheduling schedules a request's next
    # decode on a placeholder. After each step's forward, every stage but the last
    # receives that step's sampled token ids, broadcast by the last stage on the compute
    # stream (gpu_model_runner's _pp_broadcast_prev_sampled_token_ids /
    # _pp_receive_prev_sampled_token_ids_to_input_batch), before it runs the next step.
    # So steps do not overlap in the stages: one sequence's TPOT is a full pass, as
    # without async scheduling, not one stage time (sim gave about a quarter of it at
    # pp 4).
    for pp in (2, 4):
        sync_tpot, async_tpot = _pp_tpot_ns(pp, False), _pp_tpot_ns(pp, True)
        assert async_tpot >= 0.9 * sync_tpot, (pp, sync_tpot, async_tpot)


def test_async_pipeline_steps_do_not_overlap_in_the_stages(monkeypatch):
    # The broadcast is every step, whatever requests the next batch holds: with many
    # requests a step enters the first stage only when the one before has left the last.
    spans = []
    launch = engine._Run._launch

    def spy(self, unit, members, payload, dur):
        launch(self, unit, members, payload, dur)
        end = self.last_out[unit]
        spans.append((end - dur, end))
    monkeypatch.setattr(engine._Run, "_launch", spy)
    c = _pp_cluster(4)
    wl = parse_jsonl_lines([json.dumps({"input_toks": 300 + 7 * i, "output_toks": 12,
                                        "arrival_time_ns": i * 2_000_000}) for i in range(20)])
    sim.simulate(sim.parse_cluster(c), wl, SimOptions(latency_provider="roofline",
                                                      async_scheduling=True,
                                                      event_leaping=False))
    assert len(spans) > 20
    for (_, prev_end), (start, _) in zip(spans, spans[1:]):
        assert start >= prev_end
