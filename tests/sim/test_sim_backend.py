"""The system backend: execution graphs, layer-block reuse, and in-process/subprocess parity."""

from __future__ import annotations

import os
import random

import pytest

import sim
from sim.backend import _act_bytes, custom_all_reduce_below
from sim.graph_generator import block_pattern, build_graphs, logits_shard_bytes
from sim.latency.base import BatchShape
from sim.paths import shared_data_root


LLAMA, MOE = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B-Instruct-2507"


def _cluster(tp: int, pp: int, model=LLAMA, hw="H100-SXM", mem=80):
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
        "instances": [{"model_name": model, "hardware": hw,
                       "npu_mem": {"mem_size": mem, "mem_bw": 3350, "mem_latency": 0},
                       "num_npus": tp * pp, "tp_size": tp, "pp_size": pp}]}]})


def _shapes(n=15, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        nd = rng.randrange(1, 64)
        kv = [rng.randrange(16, 4096) for _ in range(nd)]
        pf = rng.choice([0, rng.randrange(16, 1024)])
        out.append(BatchShape(nd + pf, nd + (1 if pf else 0), pf, 0, nd, sum(kv), max(kv), min(kv)))
    return out


def test_block_pattern_puts_allreduce_after_row_parallel_layers():
    block = (("layernorm", 1), ("qkv_proj", 2), ("attention", 3), ("o_proj", 4),
             ("layernorm", 5), ("gate_up_proj", 6), ("act_fn", 7), ("down_proj", 8))
    assert block_pattern(block, 1) == [(0, 36)]
    assert block_pattern(block, 2) == [(0, 10), (1, 0), (0, 26), (1, 0)]


def test_graph_shape_for_tp_and_pp():
    s = sim.Simulator(_cluster(2, 2), sim.SimOptions(latency_provider="roofline"))
    inst = s.instances[0]
    lt = inst.provider.layer_times(_shapes(1)[0])
    graphs = build_graphs(lt, 2, 2, 1 << 20, load_bytes=4096, logits_bytes=8192)
    assert sorted(graphs) == [0, 1, 2, 3]
    kinds = [[n.type for n in graphs[npu].nodes] for npu in (0, 2)]
    from astrasim import NodeType
    assert kinds[0][0] == NodeType.MEM_LOAD_NODE and kinds[0][-1] == NodeType.COMM_SEND_NODE
    assert NodeType.COMM_RECV_NODE in kinds[1] and kinds[1][-1] == NodeType.COMP_NODE
    n_ar = sum(1 for k in kinds[0] if k == NodeType.COMM_COLL_NODE)
    # the embedding's all-reduce, then two all-reduces per block, 16 of the 32 on stage 0
    assert n_ar == 1 + 2 * 16
    # the last stage: two per block, then the logits' all-gather before the sampler
    names = [n.name for n in graphs[2].nodes if n.type == NodeType.COMM_COLL_NODE]
    assert len(names) == 2 * 16 + 1 and names[-1] == "logits_all_gather"
    assert graphs[2].nodes[-1].type == NodeType.COMP_NODE  # the sampler


def test_tp_ends_run_vllms_embedding_all_reduce_and_logits_all_gather():
    """vLLM 0.19 at tp > 1: VocabParallelEmbedding all-reduces its output
    (tensor_model_parallel_all_reduce) and LogitsProcessor all-gathers every rank's vocabulary
    shard of the logits (Platform.use_all_gather() is True on CUDA), once per step each; a
    tp=2 iteration costs its blocks' all-reduces plus those two collectives."""
    from sim.graph_generator import tp_collective_graphs

    s = sim.Simulator(_cluster(2, 1), sim.SimOptions(latency_provider="roofline"))
    inst = s.instances[0]
    engine = s.backend._engine(inst)
    shape = BatchShape(128, 128, 0, 0, 128, 128 * 1000, 1000, 1000)
    lt = inst.provider.layer_times(shape)
    act = 128 * 4096 * 2
    shard = logits_shard_bytes(128256, 2, 128, 2)
    assert shard == 128 * 64128 * 2  # 128,256 is a multiple of 64: no vocabulary padding
    assert logits_shard_bytes(151937, 2, 1, 2) == (151936 + 64) // 2 * 2
    below = custom_all_reduce_below(inst)  # H100 x 2: vLLM's custom all-reduce below 8 MiB
    assert below == 8 << 20
    blocks_only = max(r.cycles for r in engine.run(
        build_graphs(lt, 2, 1, act, ends=False, one_shot_below=below)).values())
    ar = max(r.cycles for r in engine.run(
        tp_collective_graphs(2, "all_reduce", act, one_shot_below=below)).values())
    ag = max(r.cycles for r in engine.run(tp_collective_graphs(2, "all_gather", shard)).values())
    assert ar > 0 and ag > ar  # the logits shard is larger than the activations
    assert s.backend.iteration_ns(inst, shape) == blocks_only + ar + ag


@pytest.mark.parametrize("tp,pp,model", [(1, 1, LLAMA), (2, 1, LLAMA), (4, 1, LLAMA),
                                         (1, 2, LLAMA), (2, 2, LLAMA), (2, 1, MOE),
                                         (2, 2, MOE)])
def test_layer_block_reuse_equals_the_full_graph(tp, pp, model):
    s = sim.Simulator(_cluster(tp, pp, model=model), sim.SimOptions(latency_provider="roofline"))
    inst = s.instances[0]
    engine = s.backend._engine(inst)
    for shape in _shapes():
        lt = inst.provider.layer_times(shape)
        act = _act_bytes(inst, shape)  # the step's rows, CUDA-graph padding included
        logits = logits_shard_bytes(inst.model.vocab_size, tp, shape.num_seqs, 2)
        full = max(r.cycles for r in engine.run(build_graphs(
            lt, tp, pp, act, 8192, logits_bytes=logits,
            one_shot_below=custom_all_reduce_below(inst))).values())
        assert s.backend.iteration_ns(inst, shape, 8192) == full


def test_tp_adds_communication_and_splits_compute():
    one = sim.Simulator(_cluster(1, 1), sim.SimOptions(latency_provider="roofline"))
    two = sim.Simulator(_cluster(2, 1), sim.SimOptions(latency_provider="roofline"))
    big = BatchShape(2048, 1, 2048, 0, 0, 0, 0, 0)
    t1 = one.backend.iteration_ns(one.instances[0], big)
    t2 = two.backend.iteration_ns(two.instances[0], big)
    comp2 = two.instances[0].provider.layer_times(big).total_ns()
    assert t2 > comp2  # the all-reduces cost something
    assert t2 < t1     # but TP still speeds up a large prefill


def test_inprocess_and_subprocess_backends_agree_on_a_synthetic_replay():
    wl = sim.generate(sim.WorkloadSpec(num_requests=12, rate=20.0, seed=4,
                                       input=sim.LengthDist("uniform", low=50, high=600),
                                       output=sim.LengthDist("uniform", low=2, high=20)))
    tables = {}
    for backend in ("inproc", "subprocess"):
        res = sim.simulate(_cluster(2, 2), wl, sim.SimOptions(latency_provider="roofline",
                                                              backend=backend))
        tables[backend] = res.requests_table().to_csv(index=False)
        assert res.summary["backend"] == backend
    assert tables["inproc"] == tables["subprocess"]


@pytest.mark.slow
def test_backend_parity_tp2_qwen3_32b_replay():
    data = shared_data_root()
    if not (data / "profiles" / "RTXPRO6000" / "Qwen" / "Qwen3-32B").is_dir():
        pytest.skip("../shared/data profiles are not present")
    cluster = _cluster(2, 1, model="Qwen/Qwen3-32B", hw="RTXPRO6000", mem=96)
    wl = sim.load_jsonl(data / "workloads" / "sharegpt-qwen3-32b-300-sps10.jsonl", limit=50)
    out = {}
    for backend in ("inproc", "subprocess"):
        res = sim.simulate(cluster, wl, sim.SimOptions(backend=backend))
        assert res.summary["latency_provider"] == "measured"
        out[backend] = res.requests_table().to_csv(index=False).encode()
    assert out["inproc"] == out["subprocess"]


def test_bad_astra_sim_binary_is_an_input_error():
    with pytest.raises(sim.InputError, match="astra-sim-bin"):
        sim.simulate(_cluster(2, 1), sim.generate(sim.WorkloadSpec(num_requests=1)),
                     sim.SimOptions(latency_provider="roofline", backend="subprocess",
                                    astra_sim_bin="/nonexistent/astra"))


def test_subprocess_backend_survives_a_killed_astra_sim_process():
    opts = sim.SimOptions(latency_provider="roofline", backend="subprocess",
                          computation_reuse=False)  # every iteration goes to the process
    backend = sim.make_backend(opts)
    try:
        wl = sim.generate(sim.WorkloadSpec(num_requests=6, rate=50.0, seed=1,
                                           input=sim.LengthDist("uniform", low=20, high=200),
                                           output=sim.LengthDist("uniform", low=2, high=8)))
        first = sim.simulate(_cluster(2, 1), wl, opts, backend=backend)
        assert backend.starts == 1  # reused across iterations, left running for the caller
        for proc, _ in backend._procs.values():
            proc.kill()
            proc.wait()
        again = sim.simulate(_cluster(2, 1), wl, opts, backend=backend)
        assert backend.starts == 2
        assert again.requests_table().equals(first.requests_table())
    finally:
        backend.close()


@pytest.mark.parametrize("model,provider", [("meta-llama/Llama-3.1-8B", "roofline"),
                                            ("Qwen/Qwen3-30B-A3B-Instruct-2507", "roofline"),
                                            ("meta-llama/Llama-3.1-8B", "measured")])
def test_provider_fast_path_equals_the_sum_of_its_layers(model, provider):
    if provider == "measured" and not (shared_data_root() / "profiles" / "RTX4090").is_dir():
        pytest.skip("../shared/data profiles are not present")
    hw = "RTX4090" if provider == "measured" else "H100-SXM"
    mem = 24 if provider == "measured" else 80
    s = sim.Simulator(_cluster(1, 1, model=model, hw=hw, mem=mem),
                      sim.SimOptions(latency_provider=provider))
    prov = s.instances[0].provider
    for shape in _shapes(40, seed=7):
        assert prov.iteration_ns(shape) == prov.layer_times(shape).total_ns()


def test_computation_reuse_changes_nothing_but_the_work():
    """Reused iteration parts give the very same per-request output as simulating every
    iteration, and most iterations need no backend call."""
    wl = sim.generate(sim.WorkloadSpec(num_requests=40, rate=30.0, seed=7,
                                       input=sim.LengthDist("uniform", low=20, high=900),
                                       output=sim.LengthDist("uniform", low=2, high=40)))
    tables, backends = {}, {}
    for reuse in (True, False):
        opts = sim.SimOptions(latency_provider="roofline", backend="subprocess",
                              computation_reuse=reuse)
        backends[reuse] = backend = sim.make_backend(opts)
        try:
            res = sim.simulate(_cluster(2, 2), wl, opts, backend=backend)
        finally:
            backend.close()
        tables[reuse] = res.requests_table().to_csv(index=False)
    assert tables[True] == tables[False]
    assert backends[True].exchanges < backends[False].exchanges / 3


def test_reused_parts_with_tier_loads_equal_the_full_graph():
    """The ends part (a KV load from a lower tier) is reused by load size; prologue, head
    and attention are added outside the simulated graphs. Every combination equals the
    whole iteration graph simulated in one piece."""
    s = sim.Simulator(_cluster(2, 2), sim.SimOptions(latency_provider="roofline"))
    inst = s.instances[0]
    engine = s.backend._engine(inst)
    for i, shape in enumerate(_shapes(30, seed=3)):
        load = (i % 3) * 65536
        lt = inst.provider.layer_times(shape)
        act = _act_bytes(inst, shape)  # the step's rows, CUDA-graph padding included
        logits = logits_shard_bytes(inst.model.vocab_size, 2, shape.num_seqs, 2)
        full = max(r.cycles for r in engine.run(build_graphs(
            lt, 2, 2, act, load, logits_bytes=logits,
            one_shot_below=custom_all_reduce_below(inst))).values())
        assert s.backend.iteration_ns(inst, shape, load) == full
    assert 0 < s.backend.reuse_entries() < 5 * 30  # block, ends, hop, embedding, logits


def test_single_npu_iterations_need_no_astra_sim_process():
    backend = sim.make_backend(sim.SimOptions(backend="subprocess"))
    try:
        res = sim.simulate(_cluster(1, 1), sim.generate(sim.WorkloadSpec(num_requests=3)),
                           sim.SimOptions(latency_provider="roofline", backend="subprocess"),
                           backend=backend)
        assert res.summary["num_finished"] == 3
        assert backend.starts == 0
    finally:
        backend.close()


def test_only_communication_is_sent_to_astra_sim():
    """Compute is summed outside the simulated parts: a TP=1 pipeline sends only its
    stage hops (one per distinct activation size), never its compute-only blocks."""
    backend = sim.make_backend(sim.SimOptions(backend="subprocess"))
    try:
        s = sim.Simulator(_cluster(1, 2), sim.SimOptions(latency_provider="roofline"),
                          backend=backend)
        inst = s.instances[0]
        shapes = _shapes(20, seed=5)
        for shape in shapes:
            backend.iteration_ns(inst, shape)
        # (one per distinct activation size: the step's rows after CUDA-graph padding)
        assert backend.exchanges == len({inst.provider.dense_tokens(sh.num_tokens)
                                         for sh in shapes})
    finally:
        backend.close()


def test_astra_sim_process_runs_on_the_client_core():
    """The subprocess client keeps its astra-sim process on its own current CPU (they take
    turns); without that option the process may run anywhere. Cycles are the same."""
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs CPU affinity control and two CPUs")
    from sim.backend import AstraSubprocessBackend

    cycles = {}
    for same_core in (True, False):
        backend = AstraSubprocessBackend(same_core=same_core)
        try:
            s = sim.Simulator(_cluster(2, 1), sim.SimOptions(latency_provider="roofline"),
                              backend=backend)
            cycles[same_core] = [backend.iteration_ns(s.instances[0], sh) for sh in _shapes()]
            # an iteration's several new parts go out in one exchange (overlapping: any CPU);
            # a single graph set is what holds the process to the client's core
            from sim.graph_generator import tp_collective_graphs
            backend.run_graphs(s.instances[0].network, tp_collective_graphs(2, "all_reduce", 4096))
            (proc, _), = backend._procs.values()
            allowed = os.sched_getaffinity(proc.pid)
            if same_core:
                assert len(allowed) == 1 and allowed <= os.sched_getaffinity(0)
            else:
                assert allowed == os.sched_getaffinity(0)
        finally:
            backend.close()
    assert cycles[True] == cycles[False]


def test_cli_backends_and_reuse_flag_give_the_same_requests(tmp_path):
    """`llmsim run` on a TP=2 cluster: in-process, subprocess, and subprocess with
    --no-computation-reuse write the same per-request CSV."""
    import json

    from sim.cli import main

    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "num_nodes": 1, "link_bw": 450, "link_latency": 500, "nodes": [{
            "num_instances": 1, "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
            "instances": [{"model_name": LLAMA, "hardware": "H100-SXM",
                           "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0},
                           "num_npus": 2, "tp_size": 2, "pp_size": 1}]}]}))
    wl = sim.generate(sim.WorkloadSpec(num_requests=12, rate=20.0, seed=4,
                                       input=sim.LengthDist("uniform", low=20, high=600),
                                       output=sim.LengthDist("uniform", low=2, high=30)))
    dataset = tmp_path / "w.jsonl"
    dataset.write_text("".join(json.dumps({"input_toks": r.input_len,
                                           "output_toks": r.output_len,
                                           "arrival_time_ns": r.arrival_ns}) + "\n"
                               for r in wl.requests))
    tables = []
    for i, extra in enumerate((["--backend", "inproc"], ["--backend", "subprocess"],
                               ["--backend", "subprocess", "--no-computation-reuse"])):
        out = tmp_path / f"o{i}" / "o.csv"
        rc = main(["run", "--cluster", str(cluster), "--dataset", str(dataset),
                   "--output", str(out), "--latency-provider", "roofline", *extra])
        assert rc == 0
        tables.append(out.read_text())
    assert tables[0] == tables[1] == tables[2]
    assert tables[0].count("\n") == 13


def test_a_dead_backends_scratch_folder_is_swept_by_the_next_one(tmp_path):
    """A Ray actor killed at a search's end never closes its subprocess backend, so its
    scratch folder (in RAM under /dev/shm) used to stay behind: hundreds after a day of
    searches. The next backend removes the folders whose owner process is gone."""
    import subprocess
    import sys

    from sim.backend import SCRATCH_PREFIX, sweep_orphaned_scratch

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{SCRATCH_PREFIX}{dead.pid}-abc"
    mine = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    unnamed = tmp_path / f"{SCRATCH_PREFIX}xyz123"  # an old folder: no owner to check
    for folder in (gone, mine, unnamed):
        (folder / "net0-0").mkdir(parents=True)
    assert sweep_orphaned_scratch(str(tmp_path)) == 1
    assert not gone.exists() and mine.exists() and unnamed.exists()


def test_a_subprocess_backend_names_its_folder_by_pid_and_sweeps_on_start(tmp_path, monkeypatch):
    import subprocess
    import sys

    import sim.backend as backend_module

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{backend_module.SCRATCH_PREFIX}{dead.pid}-abc"
    gone.mkdir()
    monkeypatch.setattr(backend_module, "_scratch_root", lambda: str(tmp_path))
    b = backend_module.AstraSubprocessBackend()
    try:
        assert not gone.exists()
        assert b.workdir.parent == tmp_path
        assert b.workdir.name.startswith(f"{backend_module.SCRATCH_PREFIX}{os.getpid()}-")
    finally:
        b.close()
    assert not b.workdir.exists()


def _pro6000_tp2(**opts):
    c = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 20000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": LLAMA, "hardware": "RTXPRO6000",
                       "npu_mem": {"mem_size": 96, "mem_bw": 1597, "mem_latency": 0},
                       "num_npus": 2, "tp_size": 2}]}]})
    return sim.Simulator(c, sim.SimOptions(latency_provider="roofline", **opts))


def test_tp2_all_reduce_is_vllms_one_stage_custom_kernel_below_its_limit():
    """vLLM 0.19 at TP 2 on GPUs with peer access (RTX PRO 6000: PCIe P2P) all-reduces
    inputs below 8 MiB with its custom kernel, one-stage for two ranks: one transfer of the
    whole buffer from the peer (one message on the link), where NCCL's ring sends two of
    half the size. At 8 MiB and above, and with --disable-custom-all-reduce, the ring."""
    from sim.graph_generator import tp_collective_graphs

    s = _pro6000_tp2()
    inst = s.instances[0]
    assert custom_all_reduce_below(inst) == 8 << 20
    engine = s.backend._engine(inst)

    def cycles(graphs):
        return max(r.cycles for r in engine.run(graphs).values())

    lat, bw = 20000, 16 * (1 << 30) / 1e9  # the file's link: ns per message, bytes per ns
    small = 1 << 20
    one_shot = cycles(tp_collective_graphs(2, "all_reduce", small, one_shot_below=8 << 20))
    ring = cycles(tp_collective_graphs(2, "all_reduce", small))
    assert abs(one_shot - (lat + small / bw)) < 100   # one message of the whole buffer
    assert abs(ring - (2 * lat + small / bw)) < 3000  # two of half (plus the reduction)
    big = 16 << 20
    assert cycles(tp_collective_graphs(2, "all_reduce", big, one_shot_below=8 << 20)) == \
        cycles(tp_collective_graphs(2, "all_reduce", big))
    # a decode step: every all-reduce one message shorter than the ring's
    shape = BatchShape(64, 64, 0, 0, 64, 64 * 512, 512, 512)
    eager_ring = _pro6000_tp2(disable_custom_all_reduce=True)
    assert custom_all_reduce_below(eager_ring.instances[0]) == 0
    saved = eager_ring.backend.iteration_ns(eager_ring.instances[0], shape) \
        - s.backend.iteration_ns(inst, shape)
    assert abs(saved - (2 * inst.model.num_hidden_layers + 1) * lat) < 70 * 3000


def test_no_custom_all_reduce_without_peer_access_or_beyond_two_ranks():
    four090 = sim.Simulator(sim.parse_cluster({
        "num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
            "num_instances": 1, "cpu_mem": {"mem_size": 64, "mem_bw": 50, "mem_latency": 0},
            "instances": [{"model_name": LLAMA, "hardware": "RTX4090",
                           "npu_mem": {"mem_size": 24, "mem_bw": 1008, "mem_latency": 0},
                           "num_npus": 2, "tp_size": 2}]}]}),
        sim.SimOptions(latency_provider="roofline"))
    assert custom_all_reduce_below(four090.instances[0]) == 0  # GeForce: no P2P
    h100x4 = sim.Simulator(_cluster(4, 1), sim.SimOptions(latency_provider="roofline"))
    assert custom_all_reduce_below(h100x4.instances[0]) == 0


@pytest.mark.parametrize("hardware,tp,nbytes,vllm_us", [
    # vLLM 0.19's tensor_model_parallel_all_reduce in a CUDA graph (aiconfigurator's
    # measured comm/vllm/0.19.0 data): one, 64 and 256 tokens of Llama-3.1-70B
    ("H100-SXM", 2, 16_384, 4.411), ("H100-SXM", 2, 1_048_576, 8.303),
    ("H100-SXM", 4, 4_194_304, 30.356), ("H100-SXM", 8, 16_384, 5.201),
    ("H100-SXM", 8, 4_194_304, 30.57),
    ("RTXPRO6000", 2, 16_384, 20.55), ("RTXPRO6000", 2, 4_194_304, 295.94),
])
def test_tp_all_reduce_takes_vllms_measured_time_on_catalogue_links(hardware, tp, nbytes,
                                                                     vllm_us):
    """vLLM's TP all-reduce (custom all-reduce, symmetric memory or NCCL as it picks them)
    is timed by its kernels, not by a transfer at the link's full bandwidth: on the
    catalogue's links it takes vLLM's measured time. Before, the H100's NVLink charged
    0.56-0.77 of it at TP 2 from 1 MiB up, 0.62-0.88 at TP 4 and 0.91-1.65 at TP 8 (a ring
    of 14 hops at one token); the RTX PRO 6000 pair's NCCL-measured link 0.35-0.51 (vLLM's
    custom kernel polls and reads across PCIe). A cluster file's link values are the link as
    LLMServingSim gives it to ASTRA-Sim: the all-reduce runs on them."""
    from sim.backend import measured_all_reduce
    from sim.graph_generator import tp_collective_graphs

    def all_reduce(instance=(), **top):
        cluster = {"num_nodes": 1, "nodes": [{"num_instances": 1, "instances": [{
            "model_name": LLAMA, "hardware": hardware, "npu_mem": {"mem_util": 0.9},
            "num_npus": tp, "tp_size": tp, **dict(instance)}]}], **top}
        s = sim.Simulator(sim.parse_cluster(cluster), sim.SimOptions(latency_provider="roofline"))
        inst = s.instances[0]
        ns = s.backend.run_graphs(inst.network, tp_collective_graphs(
            tp, "all_reduce", nbytes, one_shot_below=custom_all_reduce_below(inst),
            all_reduce_curve=measured_all_reduce(inst)))
        s.close()
        return ns, measured_all_reduce(inst)

    ns, curve = all_reduce()
    assert curve is not None and ns == pytest.approx(vllm_us * 1e3, rel=0.01)
    # between two measured sizes: between their times
    assert curve.points[0][1] * 1e3 <= curve.ns(3 * nbytes // 2) <= curve.ns(2 * nbytes)
    # a file's link: the all-reduce on it, whatever vLLM measured
    ns, curve = all_reduce(link_bw=419, link_latency=4000)
    assert curve is None and ns > 4_000
    # --disable-custom-all-reduce: vLLM always takes NCCL, which the curve is not
    assert all_reduce({"disable_custom_all_reduce": True})[1] is None


def test_all_reduce_curve_interpolates_log_log_and_extends_at_its_last_bandwidth():
    from sim.backend import MeasuredCurve

    c = MeasuredCurve("t", ((1000, 2.0), (4000, 8.0), (8000, 10.0)))
    assert c.ns(10) == 2000                      # below the first size: its time
    assert c.ns(2000) == 4000                    # 2 x 2^(log 2 / log 4 x log 4) us
    assert c.ns(4000) == 8000
    assert c.ns(12000) == 12000                  # the last stretch's 2 us per 4000 bytes


