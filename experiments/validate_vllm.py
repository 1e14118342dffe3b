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


def simulated_stats(summary: dict) -> dict[str, dict[str, float]]:
    """A replay's statistics in ``measured_stats``' layout. Like for like: the real TTFT and
    E2E count from queued_ts (the engine core reading the request between steps), so the
    simulated ones count from the same event (the summary's engine_* values)."""
    return {"ttft": summary["engine_ttft_ms"], "tpot": summary["tpot_ms"],
            "e2e": summary["engine_latency_ms"]}


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
    simulated = simulated_stats(s)
    info = {"wall_s": s["wall_s"], "kv_blocks_sim": s["kv_blocks"],
            "kv_blocks_vllm": kv.get("num_gpu_blocks"), "preemptions": s["preemptions"],
            "provider": s["latency_provider"]}
    return simulated, info


def run_validation(folder: Path, latency_provider: str = "measured",
                   async_scheduling: bool | None = None, kv_blocks_from_run: bool = False,
                   kv_blocks: int | None = None, cluster: sim.ClusterConfig | None = None,
                   **option_overrides):
    """Replay one validation folder; returns (the simulator's RunResult, meta.json).
    The engine settings are the run's own (``run_settings``). ``async_scheduling`` None
    follows the run; ``kv_blocks_from_run`` replays with the KV block count vLLM logged
    (its num_gpu_blocks_override) instead of the count the simulator derives from memory;
    ``kv_blocks`` replays with that many; ``cluster`` replaces the folder's cluster file
    (a sensitivity study edits one of its values); ``option_overrides`` replace any other
    SimOptions field (a test turns event leaping off to see every step)."""
    meta = load_meta(folder)
    kv = meta.get("kv_cache", {})
    dataset = shared_data_root() / meta["dataset_path"]
    if cluster is None:
        cluster = sim.load_cluster(cluster_file(folder))
    settings = run_settings(meta)
    check_parallelism(meta, cluster, cluster_file(folder))
    if kv_blocks_from_run and kv.get("num_gpu_blocks"):
        # (a run that logged no count is replayed with the derived one)
        kv_blocks = int(kv["num_gpu_blocks"])
    cluster = apply_cluster_settings(cluster, settings, kv_blocks)
    if async_scheduling is not None:
        settings["async_scheduling"] = async_scheduling
    opts = sim.SimOptions(latency_provider=latency_provider,
                          **{**settings, **option_overrides})
    workload = sim.load_jsonl(dataset, limit=meta.get("num_requests"))
    return sim.simulate(cluster, workload, opts), meta


#: vLLM engine settings a replay takes from the run: SimOptions field (or one of the
#: CLUSTER_SETTINGS the harness applies to the cluster's instances) -> where vLLM records
#: it: "section.field" of its resolved config (what the engine really ran with), else the
#: engine argument of that name (what the run asked for; ENGINE_ARGUMENT where it is named
#: apart), else meta.json's kv_cache summary.
RUN_SETTINGS = {
    "max_num_seqs": "scheduler_config.max_num_seqs",
    "max_num_batched_tokens": "scheduler_config.max_num_batched_tokens",
    "long_prefill_token_threshold": "scheduler_config.long_prefill_token_threshold",
    "enable_chunked_prefill": "scheduler_config.enable_chunked_prefill",
    "reserve_full_isl": "scheduler_config.scheduler_reserve_full_isl",
    "async_scheduling": "scheduler_config.async_scheduling",
    "scheduling_policy": "scheduler_config.policy",
    "block_size": "cache_config.block_size",
    "enable_prefix_caching": "cache_config.enable_prefix_caching",
    "kv_cache_dtype": "cache_config.cache_dtype",
    "gpu_memory_utilization": "cache_config.gpu_memory_utilization",
    "num_gpu_blocks_override": "cache_config.num_gpu_blocks_override",
    "kv_cache_memory_bytes": "cache_config.kv_cache_memory_bytes",
    "max_model_len": "model_config.max_model_len",
    "quantization": "model_config.quantization",
    "all2all_backend": "parallel_config.all2all_backend",
    "disable_custom_all_reduce": "parallel_config.disable_custom_all_reduce",
    "max_cudagraph_capture_size": "compilation_config.max_cudagraph_capture_size",
}
#: engine arguments named apart from the resolved config's field
ENGINE_ARGUMENT = {"policy": "scheduling_policy", "cache_dtype": "kv_cache_dtype"}
#: the run settings the harness applies to the cluster's instances, not to SimOptions
CLUSTER_SETTINGS = ("gpu_memory_utilization", "num_gpu_blocks_override", "kv_cache_memory_bytes")

#: settings of a run the simulator does not model: (section, field, engine argument, the
#: value at which it changes nothing); a run that set another value is refused, since its
#: replay would compare a different engine
UNMODELLED = (
    ("parallel_config", "enable_dbo", "enable_dbo", False),
    ("parallel_config", "enable_eplb", "enable_eplb", False),
    ("parallel_config", "decode_context_parallel_size", "decode_context_parallel_size", 1),
    ("parallel_config", "prefill_context_parallel_size", "prefill_context_parallel_size", 1),
    ("speculative_config", None, "speculative_config", None),
    ("lora_config", None, "enable_lora", None),
)


def _recorded(meta: dict, section: str, field: str | None, kwarg: str):
    """(found, value) of one engine setting: the resolved config's, else the engine
    argument's, else meta.json's kv_cache summary's."""
    resolved = meta.get("resolved_config")
    part = resolved.get(section) if isinstance(resolved, dict) else None
    if field is None and isinstance(resolved, dict) and section in resolved:
        return True, part
    if isinstance(part, dict) and field in part:
        return True, part[field]
    for where in (meta.get("engine_kwargs"), meta.get("kv_cache")):
        if isinstance(where, dict) and kwarg in where:
            return True, where[kwarg]
    return False, None


def run_settings(meta: dict) -> dict:
    """The SimOptions of the run ``meta`` records (plus the CLUSTER_SETTINGS, which the
    caller applies to the cluster): every setting in RUN_SETTINGS the run records, the
    simulated vLLM version, and eager mode (``enforce_eager`` or a
    cudagraph_mode of NONE: no CUDA graphs, max_cudagraph_capture_size 0). Settings the run
    left out keep the simulator's defaults (vLLM 0.19's). Raises InputError naming the
    field when the run used a feature the simulator does not model (UNMODELLED) or a
    value SimOptions refuses."""
    from sim.errors import InputError

    source = "vllm/meta.json"
    for section, field, kwarg, neutral in UNMODELLED:
        found, value = _recorded(meta, section, field, kwarg)
        if found and value not in (neutral, None, {}, False):
            name = f"resolved_config.{section}" + (f".{field}" if field else "")
            raise InputError(f"{name} (or engine_kwargs.{kwarg}) is {value!r}: the simulator "
                             "does not model it, so this run cannot be replayed like for like",
                             source=source)
    settings: dict = {"vllm_version": str(meta.get("vllm_version") or "0.19.0")}
    for option, where in RUN_SETTINGS.items():
        section, field = where.split(".")
        found, value = _recorded(meta, section, field, ENGINE_ARGUMENT.get(field, field))
        if found and value is not None:
            settings[option] = value
    found, eager = _recorded(meta, "model_config", "enforce_eager", "enforce_eager")
    _, mode = _recorded(meta, "compilation_config", "cudagraph_mode", "cudagraph_mode")
    if (found and eager is True) or mode in (0, "NONE", [0, 0]):
        settings["max_cudagraph_capture_size"] = 0
    if settings.get("quantization") in ("none", ""):
        settings.pop("quantization")
    try:
        probe = {k: v for k, v in settings.items() if k not in CLUSTER_SETTINGS}
        sim.SimOptions(**probe).validate()
    except (InputError, TypeError, ValueError) as exc:
        raise InputError(f"an engine setting the simulator cannot take: {exc}",
                         source=source) from None
    return settings


def apply_cluster_settings(cluster, settings: dict, kv_blocks: int | None = None):
    """``cluster`` with the run's CLUSTER_SETTINGS (taken out of ``settings``) on every
    instance: vLLM's own gpu_memory_utilization (not a value calibrated in the cluster
    file: the KV capacity follows from it as vLLM derives it, sim/memory.py), its blocks
    override (``kv_blocks`` in its place where given) and kv_cache_memory_bytes."""
    util = settings.pop("gpu_memory_utilization", None)
    run_override = settings.pop("num_gpu_blocks_override", None)
    override = kv_blocks or run_override
    reserved = settings.pop("kv_cache_memory_bytes", None)
    if util:
        cluster = cluster.with_mem_util(util)
    if override or reserved:
        cluster = cluster.map_instances(lambda i: replace(
            i, num_gpu_blocks_override=override, kv_cache_memory_bytes=reserved))
    return cluster


def check_parallelism(meta: dict, cluster, path: Path) -> None:
    """The run's tensor/pipeline/data parallel sizes and expert parallelism (as meta.json
    records them) are the cluster file's: each instance's tp_size and pp_size, its DP
    group's size, ep_size = dp x tp under expert parallelism. A folder whose files
    disagree would replay another deployment than the one measured; it is refused."""
    from sim.errors import InputError
    from sim.validate import dp_group_size

    want = {}
    for field in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                  "enable_expert_parallel"):
        found, value = _recorded(meta, "parallel_config", field, field)
        if found and value is not None:
            want[field] = value
    for inst in cluster.instances:
        dp = dp_group_size(cluster, inst)
        tp = want.get("tensor_parallel_size", inst.tp_size)
        has = {"tensor_parallel_size": inst.tp_size, "pipeline_parallel_size": inst.pp_size,
               "data_parallel_size": dp}
        if want.get("enable_expert_parallel"):
            has["ep_size (dp x tp under enable_expert_parallel)"] = inst.ep_size
            want["ep_size (dp x tp under enable_expert_parallel)"] = (
                want.get("data_parallel_size", dp) * tp)
        for field, value in has.items():
            if field in want and want[field] != value:
                raise InputError(
                    f"the run's {field} is {want[field]} (vllm/meta.json) but instance "
                    f"{inst.instance_id} of the cluster file has {value}: the two files "
                    "describe different deployments", source=str(path))


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
