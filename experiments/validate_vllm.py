"""Replay real vLLM measurements through the simulator and print their error tables.

    python experiments/validate_vllm.py [VALIDATION_DIR ...] [--latency-provider measured|roofline]

Without folders it replays every case under ../shared/data/validation (CASES lists the
known ones with their targets: the largest |error| allowed on the means and on the
percentiles).

A validation folder holds cluster.json (or config.json, as LLMServingSim's bench/examples
name it) and vllm/{meta.json,requests.jsonl}. meta.json names
the dataset (relative to ../shared/data) and the engine's batching limits, which are
replayed as they were. Measured TTFT = first_token_ts - queued_ts, TPOT = (last -
first) / (output - 1), E2E = last_token_ts - queued_ts. queued_ts is when the engine core
took the request from its input queue (between two steps, or at once when idle), so the
simulated TTFT and E2E compared with them count from the same event (the summary's
engine_ttft_ms / engine_latency_ms), not from the client's arrival.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

import sim
from sim.paths import shared_data_root

METRICS = ("ttft", "tpot", "e2e")
#: known cases: folder name -> (target |error| % on means, on percentiles)
CASES = {
    "RTX4090-Llama-3.1-8B": (1.0, 1.0),                 # dense, TP1
    "RTXPRO6000-Qwen3-30B-A3B-DP2-EP2": (5.0, 10.0),    # MoE, DP2 x EP2 (issue #15)
}
STATS = ("mean", "p50", "p90", "p99")


def measured_stats(requests_jsonl: Path) -> dict[str, dict[str, float]]:
    from sim.compare import metrics_from_requests
    from sim.errors import InputError, read_text_input

    rows = []
    text = read_text_input(requests_jsonl, "a per-request JSONL", "a JSONL")
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError) as exc:
                raise InputError(f"malformed JSON ({exc or 'nested too deeply'})",
                                 source=f"{requests_jsonl}:{lineno}") from None
    if not all(isinstance(r, dict) for r in rows):
        raise InputError("each line must be a JSON object", source=str(requests_jsonl))
    metrics_from_requests(rows, str(requests_jsonl))  # every field checked, one line each
    ttft = [r["first_token_ts"] - r["queued_ts"] for r in rows]
    # TPOT is undefined for a one-token output (left out, as vLLM's benchmark does)
    tpot = [(r["last_token_ts"] - r["first_token_ts"]) / (r["output_toks"] - 1) for r in rows
            if r["output_toks"] > 1]
    e2e = [r["last_token_ts"] - r["queued_ts"] for r in rows]
    return {m: _stats(np.asarray(v) * 1e3) for m, v in zip(METRICS, (ttft, tpot, e2e))}


def _stats(a: np.ndarray) -> dict[str, float]:
    if not a.size:  # (TPOT of a run whose outputs are all one token long)
        return dict.fromkeys(("mean", "p50", "p90", "p99"), float("nan"))
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def simulate_validation(folder: Path, latency_provider: str = "measured",
                        kv_blocks_from_run: bool = False) -> tuple[dict, dict]:
    result, meta = run_validation(folder, latency_provider,
                                  kv_blocks_from_run=kv_blocks_from_run)
    kv = meta.get("kv_cache", {})
    s = result.summary
    # Like for like: the real TTFT/E2E count from queued_ts (the engine core reading the
    # request between steps), so the simulated ones count from the same event.
    simulated = {"ttft": s["engine_ttft_ms"], "tpot": s["tpot_ms"], "e2e": s["engine_latency_ms"]}
    info = {"wall_s": s["wall_s"], "kv_blocks_sim": s["kv_blocks"],
            "kv_blocks_vllm": kv.get("num_gpu_blocks"), "preemptions": s["preemptions"],
            "provider": s["latency_provider"]}
    return simulated, info


def run_validation(folder: Path, latency_provider: str = "measured",
                   async_scheduling: bool | None = None, kv_blocks_from_run: bool = False,
                   kv_blocks: int | None = None, **option_overrides):
    """Replay one validation folder; returns (the simulator's RunResult, meta.json).
    ``async_scheduling`` None follows the run's resolved config (else the version's default).
    ``kv_blocks_from_run`` replays with the KV block count vLLM logged (its
    num_gpu_blocks_override) instead of the count the simulator derives from memory;
    ``kv_blocks`` replays with that many; ``option_overrides`` replace any other SimOptions
    field (a test turns event leaping off to see every step)."""
    meta = load_meta(folder)
    kw = meta["engine_kwargs"]
    kv = meta.get("kv_cache", {})
    dataset = shared_data_root() / meta["dataset_path"]
    cluster = sim.load_cluster(cluster_file(folder))
    if kv.get("gpu_memory_utilization"):
        # vLLM's own setting, not a value calibrated in cluster.json: the KV capacity
        # follows from it as vLLM derives it (sim/memory.py).
        cluster = cluster.with_mem_util(kv["gpu_memory_utilization"])
    if kv_blocks_from_run and kv.get("num_gpu_blocks"):
        # (a run that logged no count is replayed with the derived one)
        kv_blocks = int(kv["num_gpu_blocks"])
    if kv_blocks:
        cluster = cluster.map_instances(
            lambda i: replace(i, num_gpu_blocks_override=kv_blocks))
    opts = sim.SimOptions(max_num_seqs=kw["max_num_seqs"],
                          max_num_batched_tokens=kw["max_num_batched_tokens"],
                          max_model_len=kw.get("max_model_len"),
                          block_size=kv.get("block_size", 16),
                          enable_prefix_caching=kv.get("enable_prefix_caching", True),
                          vllm_version=meta.get("vllm_version", "0.19.0"),
                          async_scheduling=async_scheduling if async_scheduling is not None
                          else meta.get("resolved_config", {}).get(
                              "scheduler_config", {}).get("async_scheduling"),
                          latency_provider=latency_provider,
                          **{**_resolved_moe_options(meta), **option_overrides})
    workload = sim.load_jsonl(dataset, limit=meta.get("num_requests"))
    return sim.simulate(cluster, workload, opts), meta


def load_meta(folder: Path) -> dict:
    """A validation folder's vllm/meta.json, with the fields the replay reads checked."""
    from sim.errors import InputError, read_text_input

    path = folder / "vllm" / "meta.json"
    try:
        meta = json.loads(read_text_input(path, "a run's meta.json", "a JSON"))
    except (ValueError, RecursionError) as exc:
        raise InputError(f"malformed JSON ({exc or 'nested too deeply'})",
                         source=str(path)) from None
    kw = meta.get("engine_kwargs") if isinstance(meta, dict) else None
    if isinstance(kw, dict):
        # a limit the run left to vLLM: the value its resolved config records
        resolved = (meta.get("resolved_config") or {}).get("scheduler_config") or {}
        for k in ("max_num_seqs", "max_num_batched_tokens"):
            if kw.get(k) is None and isinstance(resolved, dict):
                kw[k] = resolved.get(k)
    ok = isinstance(kw, dict) and all(
        isinstance(kw.get(k), int) and not isinstance(kw.get(k), bool) and kw[k] > 0
        for k in ("max_num_seqs", "max_num_batched_tokens"))
    if not ok or not isinstance(meta.get("dataset_path"), str) \
            or not isinstance(meta.get("kv_cache", {}), dict):
        raise InputError("needs engine_kwargs.max_num_seqs and .max_num_batched_tokens "
                         "(integers > 0; or resolved_config.scheduler_config's where the "
                         "run left them to vLLM), dataset_path (a path under ../shared/data) "
                         "and kv_cache (a mapping)", source=str(path))
    return meta


#: the names a validation folder's cluster file may have, in the order they are looked for
CLUSTER_FILES = ("cluster.json", "config.json")


def cluster_file(folder: Path) -> Path:
    """The folder's cluster file: cluster.json, else config.json (LLMServingSim's
    bench/examples name)."""
    return next((folder / n for n in CLUSTER_FILES if (folder / n).is_file()),
                folder / CLUSTER_FILES[0])


def check_folder(folder: Path) -> None:
    """A validation folder holds a cluster file, vllm/meta.json and vllm/requests.jsonl."""
    from sim.errors import InputError

    holds = "cluster.json (or config.json), vllm/meta.json and vllm/requests.jsonl"
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder (a validation folder with {holds})")
    missing = [n for n in ("vllm/meta.json", "vllm/requests.jsonl")
               if not (folder / n).is_file()]
    if not cluster_file(folder).is_file():
        missing.insert(0, "cluster.json")
    if missing:
        raise InputError(f"{folder}: missing {', '.join(missing)} (a validation folder holds "
                         f"{holds})")


def _blocks(per_instance: dict) -> str:
    values = sorted(set(per_instance.values()))
    return str(values[0]) if len(values) == 1 else "/".join(map(str, per_instance.values()))


def _block_error(info: dict) -> str:
    real, simulated = info["kv_blocks_vllm"], set(info["kv_blocks_sim"].values())
    if not real or len(simulated) != 1:
        return ""
    return f" ({100.0 * (simulated.pop() - real) / real:+.2f}%)"
def _resolved_moe_options(meta: dict) -> dict:
    """The MoE/DP settings vLLM resolved (when meta.json records them; else the
    simulator's defaults, which are vLLM 0.19's)."""
    resolved = meta.get("resolved_config", {})
    out = {}
    a2a = resolved.get("parallel_config", {}).get("all2all_backend")
    if a2a:
        out["all2all_backend"] = a2a
    cap = resolved.get("compilation_config", {}).get("max_cudagraph_capture_size")
    if isinstance(cap, int):
        out["max_cudagraph_capture_size"] = cap
    return out


def error_table(measured: dict, simulated: dict) -> list[tuple[str, str, float, float, float]]:
    rows = []
    for m in METRICS:
        for st in STATS:
            a, b = measured[m][st], simulated[m][st]
            rows.append((m, st, a, b, 100.0 * (b - a) / a))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path)
    ap.add_argument("--latency-provider", default="measured")
    ap.add_argument("--kv-blocks-from-run", action="store_true",
                    help="replay with the KV block count vLLM logged (meta.json "
                         "kv_cache.num_gpu_blocks) instead of the derived one: checks the "
                         "scheduling and timing model apart from the memory accounting")
    args = ap.parse_args(argv)
    folders = args.folders or sorted(p for p in (shared_data_root() / "validation").glob("*")
                                     if (p / "vllm" / "meta.json").is_file())
    if not folders:
        print(f"no validation folders under {shared_data_root() / 'validation'}", file=sys.stderr)
        return 2
    from sim.errors import EXIT_INPUT_ERROR, InputError
    from sim.latency.base import provider_names

    try:
        if args.latency_provider not in provider_names():
            raise InputError(f"--latency-provider: unknown {args.latency_provider!r}; "
                             f"allowed: {', '.join(provider_names())}")
        for folder in folders:
            check_folder(folder)
        return _report(folders, args)
    except InputError as exc:
        print(f"validate_vllm: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR


def _report(folders: list[Path], args) -> int:
    """Replay each folder and print its error table."""
    worst = 0.0
    missed = []
    for folder in folders:
        measured = measured_stats(folder / "vllm" / "requests.jsonl")
        simulated, info = simulate_validation(folder, args.latency_provider,
                                              args.kv_blocks_from_run)
        print(f"\n{folder.name}  (latency provider: {info['provider']}, sim wall {info['wall_s']:.2f} s, "
              f"KV blocks sim {_blocks(info['kv_blocks_sim'])} vs vLLM {info['kv_blocks_vllm']}"
              f"{_block_error(info)}, "
              f"preemptions {info['preemptions']})")
        target = CASES.get(folder.name)
        print(f"{'metric':8s}{'stat':6s}{'vLLM (ms)':>14s}{'sim (ms)':>14s}{'error':>9s}"
              + ("  target" if target else ""))
        for m, st, a, b, err in error_table(measured, simulated):
            line = f"{m:8s}{st:6s}{a:14.2f}{b:14.2f}{err:8.2f}%"
            if target:
                limit = target[0] if st == "mean" else target[1]
                ok = abs(err) <= limit
                line += f"  {'ok' if ok else 'MISS'} (<= {limit:g}%)"
                if not ok:
                    missed.append(f"{folder.name} {m} {st}")
            print(line)
            worst = max(worst, abs(err))
    print(f"\nworst |error|: {worst:.2f}%")
    if missed:
        print(f"outside target: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
