"""DP groups with MoE expert parallelism: lockstep waves, gate policies, validation."""

from __future__ import annotations

import json

import pytest

import sim
from sim.gate import GATE_POLICIES
from sim.scheduler import Scheduler
from sim.workload import parse_jsonl_lines

MOE = "Qwen/Qwen3-30B-A3B-Instruct-2507"
OPTS = sim.SimOptions(latency_provider="roofline")


def _cluster(members=2, tp=1, ep=2, dp_group="A", model=MOE, tps=None, link_bw=64):
    insts = []
    for m in range(members):
        t = tps[m] if tps else tp
        insts.append({"model_name": model, "hardware": "H100-SXM",
                      "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                      "num_npus": t, "tp_size": t, "ep_size": ep, "dp_group": dp_group})
    return sim.parse_cluster({"num_nodes": 1, "link_bw": link_bw, "link_latency": 1000, "nodes": [{
        "num_instances": members, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": insts}]})


def _workload(n=24, gap_ns=20_000_000, lengths=(200, 1500)):
    return parse_jsonl_lines(json.dumps({"input_toks": lengths[i % 2], "output_toks": 16 + 4 * i,
                                         "arrival_time_ns": i * gap_ns}) for i in range(n))


def test_dp_group_members_advance_in_lockstep(monkeypatch):
    steps: dict[int, list[int]] = {}
    original = Scheduler.complete

    def recording(self, batch, now, itl):
        steps.setdefault(self.instance_id, []).append(now)
        return original(self, batch, now, itl)

    monkeypatch.setattr(Scheduler, "complete", recording)
    res = sim.simulate(_cluster(), _workload(), OPTS.replace(routing_policy="RR"))
    assert res.summary["num_finished"] == 24
    a, b = set(steps[0]), set(steps[1])
    # Every step of either member ends at a wave boundary; whenever both had work they
    # finished together (an idle member ran a dummy step and has no completion).
    both = a & b
    assert len(both) > 0.5 * min(len(a), len(b))
    independent = sim.simulate(_cluster(dp_group=None, ep=1), _workload(),
                               OPTS.replace(routing_policy="RR"))
    assert independent.summary["num_finished"] == 24


def test_idle_member_slows_nothing_but_runs_dummy_steps():
    # All requests go to member 0 (LOAD ties to the lowest id with sparse arrivals); member 1
    # still joins every wave with a dummy step, so the wave costs at least one all-to-all.
    wl = _workload(n=4, gap_ns=3_000_000_000)
    grouped = sim.simulate(_cluster(link_bw=1), wl, OPTS).requests_table()
    assert set(grouped.instance_id) == {0}
    fast_link = sim.simulate(_cluster(link_bw=400), wl, OPTS).requests_table()
    assert grouped.tpot_ns.mean() > fast_link.tpot_ns.mean()


def test_gate_policies_conserve_assignments_and_register_custom():
    for name in ("BALANCED", "RR", "RAND"):
        gate = GATE_POLICIES.create(name, 0)
        ranks = gate.assign(100, 128, 8, 4)
        assert len(ranks) == 4
        assert sum(a for a, _ in ranks) == 800
        assert all(0 <= act <= 32 for _, act in ranks)

    class AllToRankZero:
        def __init__(self, seed=0):
            pass

        def assign(self, tokens, num_experts, top_k, ep):
            return [(tokens * top_k, num_experts // ep)] + [(0, 0)] * (ep - 1)

    GATE_POLICIES.register("RANK0", AllToRankZero)
    skewed = sim.simulate(_cluster(), _workload(), OPTS.replace(expert_routing_policy="RANK0"))
    balanced = sim.simulate(_cluster(), _workload(), OPTS.replace(expert_routing_policy="BALANCED"))
    # One rank doing all the expert work is slower than a balanced spread.
    assert skewed.summary["tpot_ms"]["mean"] > balanced.summary["tpot_ms"]["mean"]


def test_ep_must_divide_experts_and_group_members_must_match():
    with pytest.raises(sim.InputError, match="does not divide"):
        sim.validate_cluster(_cluster(ep=3), OPTS)
    with pytest.raises(sim.InputError, match="tp_size"):
        sim.validate_cluster(_cluster(tps=[1, 2]), OPTS)
    with pytest.raises(sim.InputError, match="not a mixture-of-experts"):
        sim.validate_cluster(_cluster(model="meta-llama/Llama-3.1-8B"), OPTS)
    with pytest.raises(sim.InputError, match="expert gate policy"):
        sim.simulate(_cluster(), _workload(n=2), OPTS.replace(expert_routing_policy="NOPE"))


def test_expert_parallelism_halves_expert_weights_per_npu():
    model = sim.engine.load_model(MOE)
    assert model.weight_bytes(tp=1, ep=2) < 0.6 * model.weight_bytes(tp=1, ep=1)


# ---- the DP wave as vLLM 0.19 runs it (issue #15) -----------------------------------------

from astrasim import GraphBuilder  # noqa: E402

from dataclasses import replace  # noqa: E402

from sim.engine import Simulator  # noqa: E402
from sim.topology import ASTRA, Dim, Link, Topology, group_topology  # noqa: E402
from sim.latency.base import BatchShape  # noqa: E402
from sim.moe_wave import (cudagraph_size, dp_padded_tokens, exchange_graphs,  # noqa: E402
                          ranks_hit_fraction)


def _decode(n, kv=1000):
    return BatchShape(n, n, 0, 0, n, n * kv, kv, kv)


def _wave(cluster, opts=OPTS, policy="BALANCED"):
    s = Simulator(cluster, opts)
    return s, GATE_POLICIES.create(policy, 0)


def _ag_rs_ns(s, dp, tokens_per_rank, model, bw=64, lat=1000):
    """The backend's time for one all-gather of hidden states + router logits and one
    reduce-scatter of the outputs over ``dp`` ranks."""
    row = model.hidden_size * model.dtype_bytes
    logits = model.num_experts * model.dtype_bytes
    total = dp * tokens_per_rank
    graphs = {}
    for r in range(dp):
        b = GraphBuilder(r)
        # ASTRA-Sim reads an all-gather's size as each NPU's own contribution
        d = b.all_gather(tokens_per_rank * (row + logits), involved_dim=[True])
        b.reduce_scatter(total * row, involved_dim=[True], deps=[d])
        graphs[r] = b.build()
    # the cluster's one network description: the file's link as LLMServingSim gives it to
    # ASTRA-Sim (FullyConnected, its 2^30 B/s unit, latency per message), the NPU's memory
    # bandwidth for the reduction
    net = Topology((Dim(dp, Link("FullyConnected", bw, lat, unit=ASTRA)),),
                   local_mem_bw_GBps=3350)
    return s.backend.run_graphs(net, graphs)


def test_exchange_runs_on_the_clusters_network_as_the_file_gives_it():
    # The exchange runs on sim.topology's description of the link. The cluster file's
    # link_bw / link_latency are LLMServingSim's: the GPU-to-GPU path as a FullyConnected
    # ASTRA-Sim network, bandwidth in its 2^30 B/s unit, latency per message; a 2-rank ring
    # all-gather / reduce-scatter is one step, one message. (The hardware's switch and its
    # two hops apply only to the catalogue's links: test_catalogue_exchange_... below.)
    s, gate = _wave(_cluster(link_bw=10))
    model = s.instances[0].model
    tokens = 2048  # large enough for the bandwidth term to dominate
    t = s.moe_wave._exchange_ns(s.instances, [tokens, tokens])
    row = model.hidden_size * model.dtype_bytes
    logits = model.num_experts * model.dtype_bytes
    ag = tokens * (row + logits)              # each rank's contribution, sent once
    rs = 2 * tokens * row // 2                # half the gathered outputs, sent once
    wire_ns = (ag + rs) / (10 * (1 << 30) / 1e9)  # 10 x 2^30 B/s
    hops_ns = 2 * 1000                        # two steps, one message each, 1000 ns
    assert t == pytest.approx(wire_ns + hops_ns, rel=0.01)
    net = group_topology(s.cluster, [i.config for i in s.instances], 2)
    assert net.network()["topology"] == ["FullyConnected"] and net.network()["bandwidth"] == [10]
    s.close()


def _without_link(cluster):
    """The same cluster from a file that leaves link_bw / link_latency out (the catalogue's
    link applies)."""
    return sim.parse_cluster({k: v for k, v in cluster.raw.items()
                              if k not in ("link_bw", "link_latency")})


def test_catalogue_exchange_takes_nccls_measured_collectives():
    # No link fields: the DP group sits on the catalogue's NVLink, and vLLM's pynccl
    # all_gather / reduce_scatter take what NCCL measured between two H100s (the
    # catalogue's nccl_us, read at the whole buffer's bytes as nccl-tests sizes it). The
    # link model alone gave 0.1-0.4 of it here: 0.3 us hops against NCCL's 5-10 us a call.
    from sim.hardware import load_hardware

    s, gate = _wave(_without_link(_cluster()))
    model = s.instances[0].model
    row = model.hidden_size * model.dtype_bytes
    logits = model.num_experts * model.dtype_bytes
    curves = load_hardware("H100-SXM").nccl_us
    for tokens in (1, 128, 2048):
        t = s.moe_wave._exchange_ns(s.instances, [tokens, tokens])
        ag = _read_curve(curves["all_gather"][2], 2 * tokens * (row + logits))
        rs = _read_curve(curves["reduce_scatter"][2], 2 * tokens * row)
        assert t == pytest.approx((ag + rs) * 1e3, abs=2), tokens
    # a 128-token decode wave: about 22 us a layer, where the link model said 4
    assert 20_000 < s.moe_wave._exchange_ns(s.instances, [128, 128]) < 25_000
    s.close()


def _read_curve(points, nbytes):
    """A (bytes, us) curve read as the simulator reads its measured curves."""
    from sim.backend import interpolate_log_log

    return interpolate_log_log(points, nbytes)


def _l40s_group(members):
    """A DP group of ``members`` one-GPU L40S ranks with expert parallelism over them, from
    a cluster file without link values."""
    return sim.parse_cluster({"num_nodes": 1, "nodes": [{
        "num_instances": members, "instances": [
            {"model_name": MOE, "hardware": "L40S", "num_npus": 1, "tp_size": 1,
             "ep_size": members, "dp_group": "A"} for _ in range(members)]}]})


def test_exchange_without_measured_curves_runs_on_the_link():
    # The L40S's 4-GPU NCCL curves are not catalogued (the measured node's bus bandwidth
    # was below a host-memory bounce): its DP4 exchange runs on the catalogue's PCIe link
    # through the switch, as a cluster file's link does; at 2 GPUs it takes NCCL's times.
    s, gate = _wave(_l40s_group(4))
    model = s.instances[0].model
    row = model.hidden_size * model.dtype_bytes
    logits = model.num_experts * model.dtype_bytes
    t = s.moe_wave._exchange_ns(s.instances, [2048] * 4)
    net = group_topology(s.cluster, [i.config for i in s.instances], 4)
    graphs = {}
    for r in range(4):
        b = GraphBuilder(r)
        d = b.all_gather(2048 * (row + logits), involved_dim=[True])
        b.reduce_scatter(4 * 2048 * row, involved_dim=[True], deps=[d])
        graphs[r] = b.build()
    assert t == s.backend.run_graphs(net, graphs, name="moe_exchange")
    s.close()
    s, gate = _wave(_l40s_group(2))
    from sim.hardware import load_hardware
    curves = load_hardware("L40S").nccl_us
    ag = _read_curve(curves["all_gather"][2], 2 * 512 * (row + logits))
    rs = _read_curve(curves["reduce_scatter"][2], 2 * 512 * row)
    assert s.moe_wave._exchange_ns(s.instances, [512, 512]) == pytest.approx((ag + rs) * 1e3,
                                                                              abs=2)
    s.close()


def test_exchange_across_nodes_runs_on_the_scale_out_link():
    # NCCL's curves were measured inside one node: a DP group spread over two nodes
    # exchanges over the catalogue's scale-out link, not at the intra-node times.
    member = {"model_name": MOE, "hardware": "H100-SXM", "num_npus": 1, "tp_size": 1,
              "ep_size": 2, "dp_group": "A"}
    cluster = sim.parse_cluster({"num_nodes": 2, "nodes": [
        {"num_instances": 1, "instances": [dict(member)]},
        {"num_instances": 1, "instances": [dict(member)]}]})
    s, gate = _wave(cluster)
    net = group_topology(s.cluster, [i.config for i in s.instances], 2)
    from sim.backend import measured_collectives
    assert measured_collectives("H100-SXM", net, 2) == {}
    one_node = _without_link(_cluster())
    on_one_node = group_topology(one_node, one_node.instances, 2)
    assert {"all_gather", "reduce_scatter"} <= set(measured_collectives("H100-SXM",
                                                                         on_one_node, 2))
    s.close()


def test_naive_exchange_on_the_catalogue_link_takes_measured_calls():
    # naive: every DP rank in turn broadcasts its tokens (an NCCL broadcast: one rank's
    # bytes across the link once, as NCCL's 2-GPU all-gather sends each half), then vLLM's
    # all-reduce of all the tokens' outputs (the catalogue's vllm_all_reduce_us at the
    # group's size): four calls of 5-10 us where allgather_reducescatter makes two, so it
    # is the slower backend here too (the link model alone made it the faster one).
    from sim.hardware import load_hardware

    c = _without_link(_cluster())
    s, gate = _wave(c, OPTS.replace(all2all_backend="naive"))
    model = s.instances[0].model
    row = model.hidden_size * model.dtype_bytes
    logits = model.num_experts * model.dtype_bytes
    hw = load_hardware("H100-SXM")
    tokens = [128, 40]
    bcast = sum(_read_curve(hw.nccl_us["all_gather"][2], 2 * t * (row + logits)) for t in tokens)
    ar = _read_curve(hw.vllm_all_reduce_us[2], sum(tokens) * row)
    assert s.moe_wave._exchange_ns(s.instances, tokens) == pytest.approx((bcast + ar) * 1e3,
                                                                         abs=3)
    naive = s.moe_wave._exchange_ns(s.instances, [128, 128])
    s.close()
    s, gate = _wave(c)
    assert naive > s.moe_wave._exchange_ns(s.instances, [128, 128])
    s.close()


def test_exchange_is_allgather_of_hidden_states_not_topk_copies():
    # vLLM 0.19's default all2all backend gathers every rank's hidden states and router
    # logits before the experts and reduce-scatters the outputs after them: the volume does
    # not depend on top_k (a direct all-to-all of the top-k copies did, k = 8 times more).
    s, gate = _wave(_cluster())
    members = s.instances
    step = s.moe_wave.step(members, [_decode(64), _decode(64)], gate)
    layers = members[0].model.num_hidden_layers
    per_layer = _ag_rs_ns(s, 2, 64, members[0].model)
    assert all(r.comm_ns == layers * per_layer for r in step.ranks)
    s.close()


def test_no_exchange_without_data_parallelism():
    # One instance whose TP ranks are its EP ranks (DP = 1): every rank holds all tokens and
    # the TP all-reduce after the MoE layer combines the experts' outputs; no all-to-all.
    s, gate = _wave(_cluster(members=1, tp=2, ep=2, dp_group=None))
    inst = s.instances[0]
    shape = _decode(32)
    step = s.moe_wave.step([inst], [shape], gate)
    assert step.ranks[0].comm_ns == 0
    lt = inst.provider.layer_times(shape)
    moe_full = dict(lt.block)["moe"]
    k = inst.model.num_experts_per_tok
    local = max(inst.provider.moe_ns(-(-a // k), act)
                for a, act in gate.assign(32, inst.model.num_experts, k, 2))
    layers = lt.num_blocks
    expected = s.backend.iteration_ns(inst, shape) - layers * moe_full + layers * local
    assert abs(step.wave_ns - expected) <= layers  # per-layer integer rounding only
    assert s._moe_wave_ns([inst], [shape], gate) == step.wave_ns
    s.close()


def test_every_rank_waits_for_the_slowest_at_each_layer():
    s, gate = _wave(_cluster())
    short, long_ = _decode(64, kv=200), _decode(64, kv=8000)
    step = s.moe_wave.step(s.instances, [short, long_], gate)
    fast, slow = step.ranks
    assert slow.wait_ns == 0 and fast.wait_ns > 0
    assert fast.attention_ns < slow.attention_ns
    # the wave is the slow rank's own time; the fast one idles for the difference
    assert step.wave_ns == slow.attention_ns + slow.dense_ns + slow.moe_ns + slow.comm_ns
    alone = s.moe_wave.step(s.instances, [long_, long_], gate)
    assert step.wave_ns == alone.wave_ns
    s.close()


def test_dp_padding_follows_cudagraph_mode():
    # vLLM pads every DP rank to the largest CUDA-graph size among them when all run a
    # graph; if any rank runs eagerly (too many tokens) each runs its own count.
    assert cudagraph_size(1, 512) == 1 and cudagraph_size(3, 512) == 4
    assert cudagraph_size(100, 512) == 104 and cudagraph_size(257, 512) == 272
    assert cudagraph_size(513, 512) is None
    assert dp_padded_tokens([8, 100], 512) == [104, 104]
    assert dp_padded_tokens([8, 1000], 512) == [8, 1000]
    s, gate = _wave(_cluster())
    step = s.moe_wave.step(s.instances, [_decode(8), _decode(100)], gate)
    assert [r.tokens for r in step.ranks] == [104, 104]
    eager = s.moe_wave.step(s.instances, [_decode(8), _decode(100)], gate)
    assert eager.wave_ns == step.wave_ns
    s.close()
    s, gate = _wave(_cluster(), OPTS.replace(max_cudagraph_capture_size=0))
    step = s.moe_wave.step(s.instances, [_decode(8), _decode(100)], gate)
    assert [r.tokens for r in step.ranks] == [8, 100]
    s.close()


def test_idle_rank_runs_a_padded_dummy_batch_without_sampling():
    s, gate = _wave(_cluster())
    step = s.moe_wave.step(s.instances, [None, _decode(40)], gate)
    dummy, busy = step.ranks
    assert not dummy.real and busy.real
    assert dummy.tokens == busy.tokens == 40
    lt = s.instances[0].provider.layer_times(_decode(40))
    head = sum(ns for _, ns in lt.head)
    assert dummy.dense_ns + head <= busy.dense_ns + 1  # no lm_head / sampler on the dummy
    s.close()


def test_dp_group_without_expert_parallelism_times_every_member():
    # ep_size = 1 in a DP group: the step still waits for the slowest member (before, only
    # the first member's batch was timed).
    def ttft_of_first(second_len):
        wl = parse_jsonl_lines(json.dumps({"input_toks": 100 if i == 0 else second_len,
                                           "output_toks": 8, "arrival_time_ns": 0})
                               for i in range(2))
        res = sim.simulate(_cluster(ep=1), wl, OPTS.replace(routing_policy="RR"))
        t = res.requests_table().sort_values("request_id")
        assert list(t.instance_id) == [0, 1]
        return t.ttft_ns.iloc[0], t.ttft_ns.iloc[1]

    short_alone, _ = ttft_of_first(100)
    short, long_ = ttft_of_first(2000)
    # the short request's first token comes with the long prefill's wave
    assert short == long_
    assert short > 1.5 * short_alone


def test_all2all_backends_volumes_and_order():
    s, gate = _wave(_cluster())
    times = {}
    for kind in ("allgather_reducescatter", "naive", "deepep_high_throughput",
                 "deepep_low_latency"):
        s2, g2 = _wave(_cluster(), OPTS.replace(all2all_backend=kind))
        times[kind] = s2.moe_wave.step(s2.instances, [_decode(128), _decode(128)],
                                       g2).ranks[0].comm_ns
        s2.close()
    # naive: two broadcasts in turn and an all-reduce: slower than all-gather/reduce-scatter
    assert times["naive"] > times["allgather_reducescatter"]
    # DeepEP sends a token only to the ranks owning its experts (with 2 ranks and k=8 of 128
    # experts almost always both), without the router logits
    assert times["deepep_high_throughput"] < times["allgather_reducescatter"]
    assert 0.99 < ranks_hit_fraction(128, 8, 2) < 1.0
    assert ranks_hit_fraction(128, 1, 128) == pytest.approx(1 / 128)
    g = exchange_graphs("naive", 3, [4, 5, 6], 10, 2, 0)
    assert len(g) == 3
    s.close()


def test_all2all_backend_input_errors():
    raw = json.loads(json.dumps({"num_nodes": 1, "link_bw": 64, "link_latency": 1000, "nodes": [{
        "num_instances": 2, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [{"model_name": MOE, "hardware": "H100-SXM",
                       "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                       "num_npus": 1, "tp_size": 1, "ep_size": 2, "dp_group": "A"}] * 2}]}))
    raw["nodes"][0]["instances"] = [dict(i) for i in raw["nodes"][0]["instances"]]
    raw["nodes"][0]["instances"][0]["all2all_backend"] = "pplx"
    with pytest.raises(sim.InputError, match=r"instances\[0\].*all2all_backend.*pplx"):
        sim.parse_cluster(raw, source="c.json")
    raw["nodes"][0]["instances"][0]["all2all_backend"] = "naive"
    with pytest.raises(sim.InputError, match="all2all_backend='allgather_reducescatter'"):
        sim.validate_cluster(sim.parse_cluster(raw), OPTS)
    with pytest.raises(sim.InputError, match="all2all_backend must be one of"):
        OPTS.replace(all2all_backend="nope").validate()
    with pytest.raises(sim.InputError, match="max_cudagraph_capture_size"):
        OPTS.replace(max_cudagraph_capture_size=-1).validate()


def test_cli_all2all_backend_flag(tmp_path, capsys):
    from sim.cli import main
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"num_nodes": 1, "link_bw": 64, "link_latency": 1000,
                                   "nodes": [{"num_instances": 2, "instances": [
                                       {"model_name": MOE, "hardware": "H100-SXM",
                                        "npu_mem": {"mem_size": 80, "mem_bw": 3350},
                                        "tp_size": 1, "ep_size": 2, "dp_group": "A"}] * 2}]}))
    data = tmp_path / "w.jsonl"
    data.write_text("\n".join(json.dumps({"input_toks": 64, "output_toks": 4,
                                          "arrival_time_ns": i}) for i in range(4)))
    outs = {}
    for kind in ("allgather_reducescatter", "naive"):
        out = tmp_path / f"{kind}.csv"
        assert main(["run", "--cluster", str(cluster), "--dataset", str(data), "--output",
                     str(out), "--latency-provider", "roofline", "--all2all-backend", kind]) == 0
        outs[kind] = json.loads(out.with_suffix(".summary.json").read_text())["tpot_ms"]["mean"]
    assert outs["naive"] > outs["allgather_reducescatter"]


def _replay_real_dp2_ep2_run(provider: str):
    """(simulated result, real mean TPOT ms, real mean E2E ms) of the real vLLM 0.19 run of
    Qwen3-30B-A3B on two RTX PRO 6000 with DP2 x EP2 (shared validation data)."""
    from sim.paths import shared_data_root
    folder = shared_data_root() / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
    if not (folder / "vllm" / "requests.jsonl").is_file():
        pytest.skip(f"shared validation data not available: {folder}")
    from experiments.validate_vllm import measured_stats

    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    kw = meta["engine_kwargs"]
    res = sim.simulate(sim.load_cluster(folder / "cluster.json"),
                       sim.load_jsonl(shared_data_root() / meta["dataset_path"]),
                       sim.SimOptions(max_num_seqs=kw["max_num_seqs"],
                                      max_num_batched_tokens=kw["max_num_batched_tokens"],
                                      latency_provider=provider))
    real = measured_stats(folder / "vllm" / "requests.jsonl")
    return res, real["tpot"]["mean"], real["e2e"]["mean"]


def test_replay_of_the_real_dp2_ep2_run_tracks_its_decode_speed():
    # Before the DP wave followed vLLM every step was ~18 ms slow (TPOT +39%);
    # experiments/validate_vllm.py prints the full table.
    res, real_tpot, real_e2e = _replay_real_dp2_ep2_run("measured")
    # The exchange runs on sim.topology's description of the cluster file's link, as
    # LLMServingSim gives it to ASTRA-Sim (16 x 2^30 B/s, one 20 us message per collective
    # step): TPOT +4.0%, E2E from arrival +4.6% (README, the MoE case).
    assert res.summary["tpot_ms"]["mean"] == pytest.approx(real_tpot, rel=0.06)
    assert res.summary["latency_ms"]["mean"] == pytest.approx(real_e2e, rel=0.06)


@pytest.mark.parametrize("provider", ["measured", "roofline", "aic"])
def test_dp_ep_waves_run_with_every_latency_provider(provider):
    # Before, an ep > 1 cluster with the aic provider crashed (the wave asked the provider
    # for expected_active_experts, which only some providers have).
    if provider == "aic":
        pytest.importorskip("aiconfigurator_core", reason="aiconfigurator not installed")
    from sim.paths import shared_data_root
    path = shared_data_root() / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2" / "cluster.json"
    if not path.is_file():
        pytest.skip(f"shared validation data not available: {path}")
    res = sim.simulate(sim.load_cluster(path), _workload(n=6),
                       sim.SimOptions(latency_provider=provider, max_num_seqs=16))
    assert res.summary["num_finished"] == 6
    assert res.summary["latency_provider"] == provider
    assert res.summary["tpot_ms"]["mean"] > 0


def test_less_loaded_ep_rank_waits_for_the_busiest_at_the_combine():
    class Skewed:
        def assign(self, tokens, num_experts, top_k, ep):
            total = tokens * top_k
            return [(total * 3 // 4, num_experts // ep), (total - total * 3 // 4, 8)]

    s, _ = _wave(_cluster())
    step = s.moe_wave.step(s.instances, [_decode(64), _decode(64)], Skewed())
    busy, light = step.ranks
    assert busy.moe_ns > light.moe_ns
    assert light.wait_ns - busy.wait_ns == busy.moe_ns - light.moe_ns
    s.close()


def test_dp_group_without_expert_parallelism_shards_experts_over_the_group():
    # vLLM 0.19 without --enable-expert-parallel (FusedMoEParallelConfig.make,
    # flatten_tp_across_dp): every rank holds every expert with its intermediate dimension
    # sharded over the dp * tp ranks of the group; the tokens of all DP ranks are still
    # gathered (dispatch) and reduce-scattered back (combine). Before, each member was
    # charged the whole experts' time on all gathered tokens.
    s, gate = _wave(_cluster(ep=1))
    lead = s.instances[0]
    step = s.moe_wave.step(s.instances, [_decode(64), _decode(64)], gate)
    layers = lead.model.num_hidden_layers
    k = lead.model.num_experts_per_tok
    ((assigned, active),) = gate.assign(128, lead.model.num_experts, k, 1)
    flat = sim.engine._resolve_provider("roofline", replace(lead.config, tp_size=2),
                                        lead.model, lead.opts)
    per_layer = flat.moe_ns(-(-assigned // k), active)
    assert all(r.moe_ns == layers * per_layer for r in step.ranks)
    whole = lead.provider.moe_ns(-(-assigned // k), active)
    assert per_layer < 0.75 * whole
    # the exchange is there (dispatch / combine over the DP group)
    assert all(r.comm_ns == layers * _ag_rs_ns(s, 2, 64, lead.model) for r in step.ranks)
    s.close()


def test_dp_group_without_expert_parallelism_scales_when_no_latency_data_at_dp_x_tp():
    s, gate = _wave(_cluster(ep=1))
    lead = s.instances[0]

    def uncovered(inst, tp):
        raise sim.InputError("no data at that TP degree")

    s.moe_wave.flat_provider = uncovered
    step = s.moe_wave.step(s.instances, [_decode(64), _decode(64)], gate)
    k = lead.model.num_experts_per_tok
    ((assigned, active),) = gate.assign(128, lead.model.num_experts, k, 1)
    whole = lead.provider.moe_ns(-(-assigned // k), active)
    layers = lead.model.num_hidden_layers
    assert step.ranks[0].moe_ns == layers * -(-whole // 2)
    s.close()


def test_tp_and_dp_with_expert_parallelism_run_sequence_parallel_moe():
    # vLLM 0.19 (ParallelConfig.use_sequence_parallel_moe): with EP, DP > 1, TP > 1 and the
    # allgather_reducescatter backend, each TP rank takes 1/tp of its DP rank's tokens into
    # the MoE layer, the exchange runs over the whole EP group (dp * tp ranks) and the TP
    # group all-gathers the MoE output instead of all-reducing it. Before, the exchange ran
    # over the DP ranks with every TP rank's full token count.
    s, gate = _wave(_cluster(tp=2, ep=4))
    lead = s.instances[0]
    layers = lead.model.num_hidden_layers
    step = s.moe_wave.step(s.instances, [_decode(64), _decode(64)], gate)
    assert all(r.comm_ns == layers * _ag_rs_ns(s, 4, 32, lead.model) for r in step.ranks)
    # the swap of the MoE's TP all-reduce for an all-gather of half the rows is cheaper
    assert s.moe_wave._tp_swap_ns(lead, 64) < 0
    naive, g2 = _wave(_cluster(tp=2, ep=4), OPTS.replace(all2all_backend="naive"))
    ns = naive.moe_wave.step(naive.instances, [_decode(64), _decode(64)], g2)
    # naive is not sequence parallel: the TP all-reduce stays, the rank's other time grows
    assert ns.ranks[0].dense_ns > step.ranks[0].dense_ns
    naive.close()
    s.close()


def test_dp_group_without_expert_parallelism_holds_a_dp_share_of_the_experts():
    # flatten_tp_across_dp: each of the dp * tp ranks holds 1/(dp * tp) of every expert,
    # so a DP2 group without EP has the expert weights of a DP2 x EP2 one per rank (and
    # so the same KV room, NCCL buffers included). Before, each member was charged all the
    # experts.
    s_ep1 = Simulator(_cluster(ep=1), OPTS)
    s_ep2 = Simulator(_cluster(ep=2), OPTS)
    a, b = s_ep1.instances[0].memory, s_ep2.instances[0].memory
    assert a.weight_bytes == b.weight_bytes
    assert a.num_blocks == b.num_blocks
    alone = Simulator(_cluster(members=1, ep=1, dp_group=None), OPTS).instances[0].memory
    assert alone.weight_bytes > 1.5 * a.weight_bytes
    s_ep1.close()
    s_ep2.close()


def _pro6000_dp2_ep2(opts=None):
    """The shared RTX PRO 6000 DP2 x EP2 cluster with the measured Qwen3-30B-A3B bundle
    (skips where the shared data is absent)."""
    from sim.paths import shared_data_root
    folder = shared_data_root() / "validation" / "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
    if not (folder / "cluster.json").is_file():
        pytest.skip(f"shared validation data not available: {folder}")
    opts = opts or sim.SimOptions(max_num_seqs=128, max_num_batched_tokens=2048,
                                  latency_provider="measured")
    return _wave(sim.load_cluster(folder / "cluster.json"), opts)


def test_dp_padding_keeps_each_ranks_varlen_prefill_attention():
    # vLLM pads the token counts across DP ranks (num_tokens_across_dp) for the MoE layers
    # and their exchange; each rank's attention is still its own FlashAttention varlen batch
    # over its own requests. Rank 0 runs two fresh 256-token prompts beside 64 decodes:
    # its attention costs their per-request work (sum of c_i * (2 kv_i + c_i)), not that of
    # one 512-token prompt over the summed KV.
    s, gate = _pro6000_dp2_ep2()
    inst = s.instances[0]
    two_prompts = BatchShape(576, 66, 512, 0, 64, 64 * 1000, 1000, 1000,
                             prefill_work=2 * 256 * 256)
    other = _decode(64)
    step = s.moe_wave.step(s.instances, [two_prompts, other], gate)
    layers = inst.model.num_hidden_layers
    own = inst.provider.attention_ns(two_prompts)
    one_prompt = inst.provider.attention_ns(replace(two_prompts, prefill_work=0))
    assert own < one_prompt
    assert step.ranks[0].attention_ns == layers * max(1, int(own))
    # padded (CUDA-graph) waves too: two 16-token prompts beside decodes, padded to 104
    small = BatchShape(96, 66, 32, 0, 64, 64 * 1000, 1000, 1000, prefill_work=2 * 16 * 16)
    step = s.moe_wave.step(s.instances, [small, _decode(100)], gate)
    assert [r.tokens for r in step.ranks] == [104, 104]
    padded = replace(small, num_tokens=104)
    assert step.ranks[0].attention_ns == layers * max(1, int(inst.provider.attention_ns(padded)))
    s.close()


def test_eager_wave_exchanges_each_ranks_own_tokens_at_the_largest_share():
    # vLLM 0.19 (AgRsAll2AllManager): with every rank in CUDA-graph mode the token counts are
    # padded to one size and dispatch/combine are ncclAllGather / ncclReduceScatter of that
    # size; with a rank in eager mode each rank keeps its own count and pynccl groups one
    # broadcast / reduce per root (all_gatherv / reduce_scatterv). The exchange is then the
    # all-gather at the largest share and the reduce-scatter of all the gathered tokens.
    s, gate = _wave(_cluster())
    model = s.instances[0].model
    step = s.moe_wave.step(s.instances, [_decode(128), BatchShape(1100, 101, 1000, 0, 100, 100 * 1000,
                                                                  1000, 1000)], gate)
    assert [r.tokens for r in step.ranks] == [128, 1100]  # eager: no DP padding
    per_layer = _ag_rs_ns(s, 2, 1100, model)
    assert all(r.comm_ns == model.num_hidden_layers * per_layer for r in step.ranks)
    s.close()


def test_sequence_parallel_swap_replaces_the_all_reduce_the_step_runs():
    """The swap subtracts the TP all-reduce as the step runs it: on two H100s (peer access)
    below 8 MiB that is vLLM's one-stage custom all-reduce, not the ring."""
    from sim.backend import custom_all_reduce_below
    from sim.graph_generator import tp_collective_graphs

    s, _ = _wave(_cluster(tp=2, ep=4))
    lead = s.instances[0]
    below = custom_all_reduce_below(lead)
    assert below == 8 << 20
    row = lead.model.hidden_size * lead.model.dtype_bytes
    run = s.backend.run_graphs
    ag = run(lead.network, tp_collective_graphs(2, "all_gather", 32 * row))
    ar = run(lead.network, tp_collective_graphs(2, "all_reduce", 64 * row,
                                                one_shot_below=below))
    assert s.moe_wave._tp_swap_ns(lead, 64) == ag - ar
    s.close()


def test_sequence_parallel_all_gather_on_the_catalogue_link_is_nccls():
    # On the catalogue's NVLink the TP all-reduce the swap removes is vLLM's measured one
    # and the all-gather it adds NCCL's (the link model's ~1 us would have made sequence-
    # parallel MoE look several microseconds a layer cheaper than it is).
    from sim.backend import measured_all_reduce
    from sim.hardware import load_hardware

    s, _ = _wave(_without_link(_cluster(tp=2, ep=4)))
    lead = s.instances[0]
    row = lead.model.hidden_size * lead.model.dtype_bytes
    gather = _read_curve(load_hardware("H100-SXM").nccl_us["all_gather"][2], 2 * 32 * row)
    reduce = measured_all_reduce(lead).ns(64 * row) / 1e3
    assert s.moe_wave._tp_swap_ns(lead, 64) == pytest.approx((gather - reduce) * 1e3, abs=3)
    s.close()


def test_aic_replay_of_the_real_dp2_ep2_run_models_each_rank_s_own_experts():
    # aiconfigurator's data, not the run's bundle. Before, each EP rank's MoE was
    # aiconfigurator's estimate for all 128 experts at the rank's tokens (its engine was
    # compiled without expert parallelism), where the rank holds 64: TPOT +27.7%, E2E
    # +30.7%, TTFT p99 +90% against the real run. Now the engine is compiled with the
    # run's EP group (moe_ep_size 2, two attention-DP ranks): TPOT -10.1%, E2E -10.9%.
    pytest.importorskip("aiconfigurator_core", reason="aiconfigurator not installed")
    res, real_tpot, real_e2e = _replay_real_dp2_ep2_run("aic")
    assert res.summary["latency_provider"] == "aic"
    assert res.summary["tpot_ms"]["mean"] == pytest.approx(real_tpot, rel=0.15)
    assert res.summary["latency_ms"]["mean"] == pytest.approx(real_e2e, rel=0.15)


def test_deepep_exchange_on_the_catalogue_link_takes_deepeps_measured_kernels():
    # DeepEP's low-latency kernels as aiconfigurator measured them on 8 H100s for
    # Qwen3-30B-A3B's shape (hidden 2,048, top-8 of 128): dispatch measured in FP8 (one
    # fp32 scale per 128 values), read at the token count moving the same bytes as vLLM's
    # bf16 dispatch; combine in bf16. About 10 us a call at one token where the link model
    # gave ~1 us, so DeepEP no longer looks several times cheaper than NCCL's collectives.
    pytest.importorskip("aiconfigurator_core", reason="needs the aic extra")
    import pandas as pd

    from sim.latency.aic import aic_system_data

    df = pd.read_parquet(aic_system_data("H100-SXM")
                         / "comm/sglang/0.5.12/wideep_deepep_ll_perf.parquet")
    g = df[(df.hidden_size == 2048) & (df.num_topk == 8) & (df.num_experts == 128)]
    g = g.sort_values("num_token")
    dispatch = tuple(zip(g.num_token, g.dispatch_avg_t_us))
    combine = tuple(zip(g.num_token, g.combine_avg_t_us))
    s, gate = _wave(_without_link(_cluster()), OPTS.replace(all2all_backend="deepep_low_latency"))

    def call(tokens):
        as_fp8 = tokens * 2048 * 2 / (2048 + 2048 // 128 * 4)
        return _read_curve(dispatch, as_fp8) + _read_curve(combine, tokens)

    for tokens in (1, 128, 256):
        assert s.moe_wave._exchange_ns(s.instances, [tokens, tokens]) == pytest.approx(
            call(tokens) * 1e3, abs=2), tokens
    # above vLLM's 256-token chunk (VLLM_MOE_DP_CHUNK_SIZE), one call per chunk
    assert s.moe_wave._exchange_ns(s.instances, [700, 700]) == pytest.approx(
        (2 * call(256) + call(188)) * 1e3, abs=3)
    assert 20_000 < s.moe_wave._exchange_ns(s.instances, [1, 1]) < 25_000
    s.close()


def test_deepep_without_a_measurement_of_the_shape_runs_on_the_link(monkeypatch):
    # a shape (or card) DeepEP was not measured for, and any cluster file's link, keep the
    # link model's all-to-all
    from sim import deepep

    assert deepep.deepep_exchange_ns("H100-SXM", "deepep_low_latency", 3000, 3, 48, 64,
                                     2) is None
    monkeypatch.setattr(deepep, "_tables", lambda hardware, kind: None)
    s, gate = _wave(_without_link(_cluster()), OPTS.replace(all2all_backend="deepep_low_latency"))
    net = group_topology(s.cluster, [i.config for i in s.instances], 2)
    model = s.instances[0].model
    frac = ranks_hit_fraction(model.num_experts, model.num_experts_per_tok, 2)
    graphs = exchange_graphs("deepep_low_latency", 2, [64, 64], 0, 0,
                             int(model.hidden_size * model.dtype_bytes * frac))
    assert s.moe_wave._exchange_ns(s.instances, [64, 64]) == s.backend.run_graphs(
        net, graphs, name="moe_exchange")
    s.close()


def test_gate_per_rank_counts_are_each_ranks_range():
    """Each EP rank's (assignments, activated experts) is read off its contiguous range of
    the experts' counts, idle experts not activated."""
    import numpy as np

    from sim.gate import _per_rank

    counts = np.array([0, 3, 0, 0, 5, 1, 0, 2], dtype=np.int64)
    assert _per_rank(counts, 4) == [(3, 1), (0, 0), (6, 2), (2, 1)]
    assert _per_rank(counts, 1) == [(11, 4)]
    assert all(isinstance(v, int) for pair in _per_rank(counts, 2) for v in pair)
