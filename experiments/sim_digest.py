"""Digests of the simulator's outputs over many varied scenarios (a byte-identity harness).

    python experiments/sim_digest.py [--save FILE] [--check FILE] [--only SUBSTR] [--quick]

Runs 154 scenarios (the validation replays, also with 10 ms time-series rows, the
ShareGPT trace under tight and loose KV pools, random workloads with shared prefixes,
every scheduling option, a CPU prefix tier, PD, PP, TP, DP/EP MoE, PIM, power), each with
event leaping on and off, and hashes what a user gets: the per-request CSV, the summary
JSON (less its wall-clock fields) and the time series CSV. Leaping on and off must give
the same digest; ``--save`` writes the digests and ``--check`` compares them with a saved
file (a speed change must keep every one). The first line says whether the simulator's
hot modules ran compiled or as their sources (``LLMSIM_PURE_PYTHON=1``): both must give
the same digests (``tests/sim/test_native.py`` compares them on ``--quick``).
"""

from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import io
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "astra-sim")]

import sim  # noqa: E402
import sim.errors  # noqa: E402
from sim.metrics import REQUEST_COLUMNS  # noqa: E402
from sim.paths import shared_data_root  # noqa: E402
from sim.request import Request  # noqa: E402

VOLATILE = ("wall_s", "speedup_vs_real_time")
RTX = "validation/RTX4090-Llama-3.1-8B"
MOE = "validation/RTXPRO6000-Qwen3-30B-A3B-DP2-EP2"
TRACE = "workloads/sharegpt-llama-3.1-8b-300-sps10.jsonl"


def digest(res) -> str:
    """sha256 of the per-request CSV, the summary JSON and the time series CSV."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_COLUMNS)
    w.writerows(res.request_rows())
    summary = {k: v for k, v in res.summary.items() if k not in VOLATILE}
    # (the bundle's path names the checkout: digests of two checkouts compare)
    buf.write(json.dumps(summary, indent=2, default=str).replace(
        str(shared_data_root().resolve()), "<shared>").replace(str(shared_data_root()), "<shared>"))
    cols = res.timeseries.columns()
    w.writerow(list(cols))
    w.writerows(zip(*cols.values()))
    return hashlib.sha256(buf.getvalue().encode()).hexdigest()[:20]


def _trace(limit: int, speed: float = 1.0) -> sim.Workload:
    wl = sim.load_jsonl(shared_data_root() / TRACE, limit=limit)
    if speed != 1.0:
        for r in wl.requests:
            r.arrival_ns = int(r.arrival_ns / speed)
    return wl


def _rtx_cluster(blocks: int | None = None, instances: int = 1) -> sim.ClusterConfig:
    data = json.loads((shared_data_root() / RTX / "cluster.json").read_text())
    node = data["nodes"][0]
    node["num_instances"] = instances
    node["instances"] = [copy.deepcopy(node["instances"][0]) for _ in range(instances)]
    cluster = sim.parse_cluster(data).with_mem_util(0.9)
    if blocks:
        cluster = cluster.map_instances(lambda i: replace(i, num_gpu_blocks_override=blocks))
    return cluster


def _random_workload(rng: random.Random, n: int, max_in: int, max_out: int,
                     shared: bool) -> sim.Workload:
    prefixes = [[1000 * p + t for t in range(rng.randint(8, 300))] for p in range(4)]
    reqs, t = [], 0
    for i in range(n):
        t += rng.choice([0, 1_000_000, 20_000_000, 100_000_000, 300_000_000])
        n_in, n_out = rng.randint(1, max_in), rng.randint(1, max_out)
        ids = None
        if shared and rng.random() < 0.7:
            pre = rng.choice(prefixes)[:n_in]
            ids = pre + [7 + i * 10_000 + k for k in range(n_in - len(pre))]
        reqs.append(Request(i, t, n_in, n_out, input_ids=ids))
        reqs[-1].priority = rng.randint(0, 2)
    return sim.Workload(reqs, source="<digest>")


def _pim_cluster() -> sim.ClusterConfig:
    return sim.parse_cluster({"num_nodes": 1, "link_bw": 64, "link_latency": 100, "nodes": [{
        "num_instances": 1,
        "cpu_mem": {"mem_size": 256, "mem_bw": 256, "mem_latency": 100,
                    "pim_config": "NeuPIMs-32GB-1TBps"},
        "instances": [{"model_name": "meta-llama/Llama-3.1-8B", "hardware": "NPU",
                       "npu_mem": {"mem_size": 24, "mem_bw": 936, "mem_latency": 0},
                       "num_npus": 1, "tp_size": 1}]}]})


def _h100_cluster(instances: list[dict], power: bool = False,
                  file_link: bool = True) -> sim.ClusterConfig:
    base = {"model_name": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "npu_mem": {"mem_size": 80, "mem_bw": 3350, "mem_latency": 0}, "num_npus": 1,
            "tp_size": 1}
    node = {"num_instances": len(instances),
            "cpu_mem": {"mem_size": 256, "mem_bw": 64, "mem_latency": 0},
            "instances": [{**copy.deepcopy(base), **i} for i in instances]}
    if power:
        node["power"] = {"base_node_power": 60,
                         "npu": {"H100-SXM": {"idle_power": 70, "standby_power": 300,
                                              "active_power": 700, "standby_duration": 18}},
                         "cpu": {"idle_power": 10, "active_power": 200, "util": 0.15},
                         "dram": {"dimm_size": 32, "idle_power": 2.0, "energy_per_bit": 6.0},
                         "link": {"num_links": 1, "idle_power": 5, "energy_per_bit": 4.0},
                         "nic": {"num_nics": 1, "idle_power": 20},
                         "storage": {"num_devices": 2, "idle_power": 5}}
    link = {"link_bw": 64, "link_latency": 1000} if file_link else {}
    return sim.parse_cluster({"num_nodes": 1, **link, "nodes": [node]})


def scenarios(quick: bool = False):
    """(name, thunk returning (cluster, workload, options)) for every case."""
    out = []
    base = dict(max_num_seqs=256, max_num_batched_tokens=2048)
    # The validation replay and variations of it (measured RTX 4090 profiles).
    for async_ in (True, False):
        for blocks in (None, 2588, 900, 400):
            for caching in (True, False):
                if quick and (blocks in (2588, 400) or not caching):
                    continue
                name = f"rtx_replay_async{int(async_)}_blocks{blocks}_cache{int(caching)}"
                out.append((name, lambda a=async_, b=blocks, c=caching: (
                    _rtx_cluster(b), _trace(300),
                    sim.SimOptions(**base, async_scheduling=a, enable_prefix_caching=c))))
    # time-series rows shorter than a step (a leap's records between two completions)
    for async_ in (True, False):
        out.append((f"rtx_replay_async{int(async_)}_rows10ms", lambda a=async_: (
            _rtx_cluster(None), _trace(120),
            sim.SimOptions(**base, async_scheduling=a, timeseries_interval_ns=10_000_000))))
    for speed in (0.3, 3.0):
        for tier in (None, "CPU"):
            for policy in ("fcfs", "priority"):
                name = f"rtx_trace_speed{speed}_tier{tier}_{policy}"
                out.append((name, lambda s=speed, t=tier, p=policy: (
                    _rtx_cluster(1200), _trace(150, s),
                    sim.SimOptions(**base, prefix_storage=t, scheduling_policy=p,
                                   async_scheduling=p == "fcfs"))))
    out.append(("rtx_trace_two_instances_tier_shared", lambda: (
        _rtx_cluster(700, 2), _trace(200, 2.0),
        sim.SimOptions(**base, prefix_storage="CPU", enable_prefix_sharing=True))))
    out.append(("rtx_trace_two_instances_rr", lambda: (
        _rtx_cluster(1000, 2), _trace(200, 2.0),
        sim.SimOptions(**base, routing_policy="RR", max_model_len=2048))))
    # Random workloads with shared prefixes over every scheduling option.
    rng = random.Random(18)
    n_random = 30 if quick else 90
    for k in range(n_random):
        seed = rng.randrange(1 << 30)
        kw = dict(
            async_scheduling=rng.random() < 0.5, enable_prefix_caching=rng.random() < 0.7,
            enable_chunked_prefill=rng.random() < 0.8, reserve_full_isl=rng.random() < 0.3,
            scheduling_policy=rng.choice(["fcfs", "fcfs", "priority"]),
            max_model_len=rng.choice([None, None, 700]),
            max_num_batched_tokens=rng.choice([2048, 512, 256]),
            max_num_seqs=rng.choice([256, 16, 4]), block_size=rng.choice([16, 16, 4]),
            long_prefill_token_threshold=rng.choice([0, 0, 128]))
        if kw["enable_prefix_caching"]:
            kw["prefix_storage"] = rng.choice([None, None, "CPU"])
        if not kw["enable_chunked_prefill"]:
            kw["max_num_batched_tokens"] = 2048
            kw["long_prefill_token_threshold"] = 0
        blocks = rng.choice([60, 120, 400, 3000]) * 16 // kw["block_size"]
        instances = rng.choice([1, 1, 1, 2])
        n = rng.randint(5, 80)
        name = (f"random{k:02d}_n{n}_b{blocks}_i{instances}_" + "_".join(
            f"{key}={val}" for key, val in sorted(kw.items())))
        out.append((name, lambda s=seed, kw=kw, b=blocks, i=instances, n=n: (
            _rtx_cluster(b, i), _random_workload(random.Random(s), n, 500, 400, True),
            sim.SimOptions(**kw))))
    # System features on the roofline provider.
    systems = {
        "pd": ([{"pd_type": "prefill"}, {"pd_type": "decode"}], False),
        "pp2": ([{"num_npus": 2, "pp_size": 2}], False),
        "tp2_power": ([{"num_npus": 2, "tp_size": 2}], True),
        "power_two_instances": ([{}, {}], True),
        "moe_dp_ep": ([{"model_name": "Qwen/Qwen3-30B-A3B-Instruct-2507", "ep_size": 2,
                        "dp_group": "A"}] * 2, False),
        "moe_single": ([{"model_name": "Qwen/Qwen3-30B-A3B-Instruct-2507"}], True),
    }
    for case, (insts, power) in sorted(systems.items()):
        for async_ in (True, False):
            for seed in (1, 2):
                out.append((f"sys_{case}_async{int(async_)}_seed{seed}",
                            lambda i=insts, p=power, a=async_, s=seed: (
                                _h100_cluster(i, p),
                                _random_workload(random.Random(s), 40, 1500, 300, True),
                                sim.SimOptions(latency_provider="roofline", async_scheduling=a,
                                               enable_prefix_caching=True,
                                               timeseries_interval_ns=100_000_000))))
    # DP/EP exchanges on the catalogue's link: measured NCCL / vLLM collectives
    moe_group = [{"model_name": "Qwen/Qwen3-30B-A3B-Instruct-2507", "ep_size": 2,
                  "dp_group": "A"}] * 2
    for backend in ("allgather_reducescatter", "naive", "deepep_low_latency"):
        for async_ in (True, False):
            out.append((f"sys_moe_catalogue_link_{backend}_async{int(async_)}",
                        lambda b=backend, a=async_: (
                            _h100_cluster(moe_group, file_link=False),
                            _random_workload(random.Random(3), 40, 1500, 300, True),
                            sim.SimOptions(latency_provider="roofline", async_scheduling=a,
                                           all2all_backend=b, enable_prefix_caching=True))))
    # Decode attention on PIM (LLMServingSim's NeuPIMs device), with and without sub-batch
    # interleaving, the PIM devices local or a pool.
    for mode in ("local", "pool"):
        for interleave in (False, True):
            name = f"sys_pim_{mode}_interleave{int(interleave)}"
            out.append((name, lambda m=mode, i=interleave: (
                _pim_cluster(), _random_workload(random.Random(4), 30, 1500, 300, False),
                sim.SimOptions(latency_provider="roofline", enable_attn_offloading=True,
                               pim_mode=m, enable_sub_batch_interleaving=i))))
    if not quick:
        for async_ in (True, False):
            out.append((f"moe_validation_async{int(async_)}", lambda a=async_: _moe_case(a)))
    return out


def _moe_case(async_: bool):
    sys.path.insert(0, str(REPO / "experiments"))
    from validate_vllm import apply_cluster_settings, run_settings

    folder = shared_data_root() / MOE
    meta = json.loads((folder / "vllm" / "meta.json").read_text())
    settings = run_settings(meta)
    cluster = apply_cluster_settings(sim.load_cluster(folder / "cluster.json"), settings)
    opts = sim.SimOptions(**{**settings, "async_scheduling": async_})
    wl = sim.load_jsonl(shared_data_root() / meta["dataset_path"], limit=120)
    return cluster, wl, opts


def _run_digest(cluster, wl, opts) -> str:
    try:
        return digest(sim.simulate(cluster, wl, opts))
    except (sim.errors.InputError, RuntimeError) as exc:  # refused or stalled: the message
        return "error:" + hashlib.sha256(str(exc).encode()).hexdigest()[:14]


def run_all(only: str | None, quick: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, make in scenarios(quick):
        if only and only not in name:
            continue
        cluster, wl, opts = make()
        t = time.perf_counter()
        leapt = _run_digest(cluster, wl, opts.replace(event_leaping=True))
        t_leap = time.perf_counter() - t
        stepped = _run_digest(cluster, wl, opts.replace(event_leaping=False))
        flag = "" if leapt == stepped else "   LEAP != STEP"
        print(f"{leapt}  {t_leap:6.2f}s  {name}{flag}", flush=True)
        out[name] = leapt if leapt == stepped else f"{leapt}!={stepped}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path)
    ap.add_argument("--check", type=Path)
    ap.add_argument("--only")
    ap.add_argument("--quick", action="store_true", help="a third of the scenarios")
    args = ap.parse_args(argv)
    print(f"modules: {sim.native_status()}", flush=True)
    digests = run_all(args.only, args.quick)
    bad = [n for n, d in digests.items() if "!=" in d]
    if args.save:
        args.save.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    if args.check:
        ref = json.loads(args.check.read_text())
        for n, d in digests.items():
            if n in ref and ref[n] != d:
                bad.append(n)
                print(f"CHANGED: {n}: {ref[n]} -> {d}")
        missing = [n for n in digests if n not in ref]
        if missing:
            print(f"{len(missing)} scenarios not in {args.check}")
    total = len(digests)
    total_all = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:20]
    print(f"{total} scenarios, {len(bad)} bad; digest of all: {total_all}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
