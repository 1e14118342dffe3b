"""``llmsim``: run one simulation (the equivalent of LLMServingSim's ``python -m serving``).

    llmsim run --cluster cluster.json --dataset workload.jsonl --output out.csv [--summary s.json]
    llmsim bench --model M --hardware HW [vllm bench serve / vllm serve flags]
    llmsim compare SIM.json REAL.json   (error table; REAL may be a per-request JSONL)
    llmsim profiles list [--hardware HW] [--model M] [--tp N]
    llmsim profile --model M --hardware HW --out DIR [--tp 1 2] [--device cuda|cpu]
    llmsim astra-config --cluster cluster.json --out DIR   (ASTRA-Sim input files)

User errors print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

from sim.errors import EXIT_INPUT_ERROR, InputError
from sim.options import add_cli_flags
from sim.paths import check_distinct_paths, check_output_file, writable_dir


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="simulate one workload on one cluster")
    p.add_argument("--cluster", required=True, help="cluster config (LLMServingSim JSON or YAML)")
    p.add_argument("--dataset", required=True, help="workload JSONL (flat requests and sessions)")
    p.add_argument("--num-reqs", type=int, default=None, help="replay only the first N entries")
    p.add_argument("--output", required=True, help="per-request CSV")
    p.add_argument("--summary", default=None, help="summary JSON (default: <output>.summary.json)")
    p.add_argument("--timeseries", default=None,
                   help="per-interval CSV (default: <output>.timeseries.csv)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vLLM's gpu_memory_utilization for every instance, in place of the "
                        "cluster file's npu_mem.mem_util (the KV capacity follows as vLLM "
                        "derives it)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                   help="vLLM's kv_cache_memory_bytes for every instance: each worker's KV cache "
                        "in bytes, in place of what gpu_memory_utilization leaves after the "
                        "profile run")
    add_cli_flags(p)  # one flag per SimOptions field that has one (sim/options.py)
    p.add_argument("--log-level", default="WARNING",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _check_run_flags(args) -> None:
    """Flags checked before any file is read or anything simulated."""
    from sim.options import check_engine_flags

    if args.num_reqs is not None and args.num_reqs < 1:
        raise InputError(f"--num-reqs must be >= 1, got {args.num_reqs}")
    iv = args.timeseries_interval_s
    if not (math.isfinite(iv) and 1e-3 <= iv <= 1e9):
        # one row per interval of simulated time: 1e-9 s made 10^9 rows a simulated
        # second (hours, then out of memory); 1e300 overflowed the clock
        raise InputError(f"--timeseries-interval-s must be a positive number of seconds in "
                         f"0.001..1e9, got {iv}")
    check_engine_flags(args)
    summary, series = _side_files(args)
    check_distinct_paths(
        [("--output", Path(args.output)), ("--summary", summary), ("--timeseries", series)],
        [("--cluster", args.cluster), ("--dataset", args.dataset)])
    check_output_file(args.output, "--output")
    if args.summary:
        check_output_file(args.summary, "--summary")
    if args.timeseries:
        check_output_file(args.timeseries, "--timeseries")
    for flag, given, default in (("--summary", args.summary, summary),
                                 ("--timeseries", args.timeseries, series)):
        if given is None and Path(default).is_dir():
            raise InputError(f"{flag} (default {str(default)!r}) is a folder; give {flag}")


def _side_files(args) -> tuple[str, str]:
    """The summary JSON and time-series CSV ``llmsim run`` writes: as given, or by default
    beside ``--output`` (``<output>.summary.json``, ``<output>.timeseries.csv``)."""
    for flag, path in (("--output", args.output), ("--summary", args.summary),
                       ("--timeseries", args.timeseries)):
        if path is not None and not Path(path).name:  # '', '.', '/'
            raise InputError(f"{flag} {path!r} names no file (empty, or a folder); give a "
                             "file path")
    stem = str(Path(args.output).with_suffix(""))
    return (args.summary or stem + ".summary.json",
            args.timeseries or stem + ".timeseries.csv")


def _check_instance_limits(cluster, opts) -> None:
    """vLLM's refusals for each instance's own scheduler settings (cluster overrides)."""
    from sim.options import vllm_refusal

    for inst in cluster.instances:
        o = opts.for_instance(inst.overrides)
        why = vllm_refusal(o.max_num_seqs, o.max_num_batched_tokens, o.block_size)
        if why and inst.overrides:
            raise InputError(f"{cluster.source}: instance {inst.instance_id}: {why}")


def _context_warnings(cluster, opts) -> list[str]:
    """vLLM 0.19's start-up refusal of a --max-model-len past the model's position limit
    (``_get_and_verify_max_len``, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), as a warning:
    the simulation goes on, as it does for a cache too small for one request."""
    from sim.validate import instance_model

    out = []
    for inst in cluster.instances:
        o = opts.for_instance(inst.overrides)
        model = instance_model(inst, o)
        limit = model.max_position_embeddings
        if o.max_model_len and limit and o.max_model_len > limit:
            out.append(f"instance {inst.instance_id}: warning: vLLM would refuse to start: "
                       f"max_model_len={o.max_model_len:,} is more than "
                       f"{model.name}'s max_position_embeddings={limit:,} (vLLM allows "
                       "it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    return out


def _mean_p99(stats: dict, digits: int) -> str:
    """``mean X ms p99 Y`` of a summary statistic, or ``n/a`` where it has no values (no
    request finished; TPOT when every output is one token)."""
    if not math.isfinite(stats["mean"]):
        return "n/a"
    return f"mean {stats['mean']:.{digits}f} ms p99 {stats['p99']:.{digits}f}"


def _run(args) -> int:
    import sim
    from sim.options import options_from_args

    _check_run_flags(args)
    util = args.gpu_memory_utilization
    if util is not None and not 0.0 < util <= 1.0:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    kv_bytes = args.kv_cache_memory_bytes
    if kv_bytes is not None and not 1 <= kv_bytes <= 10 ** 15:
        raise InputError(f"--kv-cache-memory-bytes must be an integer in 1..1e15, got {kv_bytes}")
    cluster = sim.load_cluster(args.cluster)
    if util is not None:
        cluster = cluster.with_mem_util(util)
    if kv_bytes is not None:
        cluster = cluster.map_instances(lambda i: replace(i, kv_cache_memory_bytes=kv_bytes))
    workload = sim.load_jsonl(args.dataset, limit=args.num_reqs)
    opts = options_from_args(args, progress=sys.stderr.isatty())
    _check_instance_limits(cluster, opts)
    sim.validate_cluster(cluster, opts)
    from sim.validate import check_workload
    check_workload(workload, cluster, opts)
    result = sim.simulate(cluster, workload, opts)
    out = Path(args.output)
    summary, series = _side_files(args)
    result.write(out, summary, series)
    s = result.summary
    print(f"{s['num_finished']}/{s['num_requests']} requests in {s['simulated_s']:.2f} s simulated "
          f"({s['wall_s']:.2f} s wall) | latency: {s['latency_provider']} | "
          f"TTFT {_mean_p99(s['ttft_ms'], 1)} | TPOT {_mean_p99(s['tpot_ms'], 2)} | "
          f"throughput {s['throughput_rps']:.2f} req/s, {s['gen_tps']:.0f} gen tok/s")
    for iid, kv in (s.get("kv_cache") or {}).items():
        line = f"instance {iid}: GPU KV cache size: {kv['kv_tokens']:,} tokens ({kv['num_blocks']} blocks)"
        if kv.get("max_model_len"):
            line += (f"; Maximum concurrency for {kv['max_model_len']:,} tokens per request: "
                     f"{kv['max_concurrency']:.2f}x")
            if kv["kv_tokens"] < kv["max_model_len"]:  # (see MemoryBudget.start_refusal)
                line += (f"\n  warning: vLLM would refuse to start: the cache holds less than "
                         f"one request of max_model_len={kv['max_model_len']:,} tokens; pass "
                         f"--max-model-len at most {kv['kv_tokens']:,}")
        print(line)
    for line in _context_warnings(cluster, opts):
        print(line)
    notes = sorted(set((s.get("latency_note") or {}).values()))
    if notes:
        print("latency: " + " | ".join(notes))
    print(f"wrote {out}, {summary}, {series}")
    if s.get("latency_extrapolations"):
        print(f"note: lookups outside the measured grid (extrapolated): "
              f"{json.dumps(s['latency_extrapolations'])}", file=sys.stderr)
    return 0


def _add_profiles(sub) -> None:
    p = sub.add_parser("profiles", help="what latency data is available")
    psub = p.add_subparsers(dest="profiles_cmd", required=True)
    lp = psub.add_parser("list", help="list bundles and which provider answers a (hw, model, tp)")
    lp.add_argument("--hardware", default=None)
    lp.add_argument("--model", default=None)
    lp.add_argument("--tp", type=int, default=None, help="one tp (default: 1, 2, 4, 8)")
    lp.add_argument("--profiles", action="append", default=[])


def _check_profiles_flags(args) -> None:
    """What ``profiles list`` cannot answer, refused before anything is listed."""
    from sim.hardware import load_hardware
    from sim.model import load_model
    from sim.options import check_profile_dirs

    if args.tp is not None and args.tp < 1:
        raise InputError(f"--tp must be >= 1, got {args.tp}")
    check_profile_dirs(args.profiles)
    if args.hardware:
        load_hardware(args.hardware, source="--hardware")
    if args.model:
        load_model(args.model, source="--model")


def _profiles(args) -> int:
    from sim.latency.measured import bundle_search_dirs

    _check_profiles_flags(args)
    found = False
    for d in bundle_search_dirs(args.profiles):
        for meta in sorted(Path(d).glob("*/*/*/*/meta.yaml")):
            variant = meta.parent
            hw = variant.parts[-4]
            model = "/".join(variant.parts[-3:-1])
            if args.hardware and hw != args.hardware:
                continue
            if args.model and args.model not in model:
                continue
            tps = sorted(p.name for p in variant.glob("tp*"))
            print(f"measured  {hw:12s} {model:45s} {variant.name:6s} {','.join(tps):10s} {variant}")
            found = True
    found = _coverage_matrix(args) or found
    if not found:
        print("no bundles found", file=sys.stderr)
    return 0


def _coverage_matrix(args) -> bool:
    """Which provider ``auto`` picks per hardware x model x tp x precision (a table)."""
    from sim.hardware import known_hardware, load_hardware
    from sim.latency.base import auto_choice
    from sim.model import known_models, load_model

    hws = [args.hardware] if args.hardware else known_hardware()
    models = [args.model] if args.model else known_models()
    tps = [args.tp] if args.tp is not None else [1, 2, 4, 8]
    rows = []
    for m in models:
        spec = load_model(m, source="--model")
        precisions = [("bf16", spec.with_precision(kv_cache_dtype="auto"))] if not spec.is_fp8 \
            else []
        precisions += [("fp8", spec.with_precision("fp8")),
                       ("fp8+kv-fp8", spec.with_precision("fp8", "fp8"))]
        for h in hws:
            hw = load_hardware(h, source="--hardware")
            if hw.kind != "gpu" and not args.hardware:
                continue
            for tp in tps:
                if spec.num_attention_heads % tp:
                    continue
                cells = []
                for _, variant in precisions:
                    try:
                        cells.append(auto_choice(variant, hw.name, tp, args.profiles)[0])
                    except InputError:
                        cells.append("-")
                rows.append((spec.name, hw.name, tp, cells, [p for p, _ in precisions]))
    if not rows:
        return False
    print(f"\n{'model':44s} {'hardware':13s} {'tp':>3s}  auto picks per precision")
    for name, hw, tp, cells, precs in rows:
        picks = "  ".join(f"{p}:{c:9s}" for p, c in zip(precs, cells))
        print(f"{name:44s} {hw:13s} {tp:>3d}  {picks}")
    return True


def _add_bench(sub) -> None:
    from sim.bench import add_bench_args

    p = sub.add_parser("bench", help="vllm bench serve's interface, answered by the simulator")
    add_bench_args(p)
    p.add_argument("--log-level", default="WARNING",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="error table of a simulated vs a real benchmark result")
    p.add_argument("sim", help="llmsim bench / vllm bench serve result JSON")
    p.add_argument("real", help="result JSON, or a real run's per-request JSONL")


def _add_native(sub) -> None:
    p = sub.add_parser("native", help="the compiled simulator modules (mypyc): build them, "
                                      "or say which modules run and why")
    p.add_argument("action", choices=["build", "status"])


def _native(args) -> int:
    import sim.native

    if args.action == "build":
        return sim.native.build()
    print(sim.native.status())
    return 0


def _add_astra_config(sub) -> None:
    p = sub.add_parser("astra-config",
                       help="write ASTRA-Sim input files (network.yml, system.json, memory.json) "
                            "and npus.json (each instance's NPU ids) for a cluster")
    p.add_argument("--cluster", required=True)
    p.add_argument("--out", required=True, help="folder to write into")
    from sim.topology import ALGORITHMS

    p.add_argument("--collective", default=None, choices=ALGORITHMS,
                   help="collective algorithm on every dimension (default: the cluster's "
                        "collective_algorithm, else ring)")


def _astra_config(args) -> int:
    import json

    import sim
    from sim.config_builder import build_layout, write_layout

    writable_dir(args.out, "--out")
    cluster = sim.load_cluster(args.cluster)
    layout = build_layout(cluster, collective_impl=args.collective)
    paths = dict(write_layout(layout, args.out))
    paths["npus"] = Path(args.out) / "npus.json"
    paths["npus"].write_text(json.dumps(
        {str(k): list(v) for k, v in layout.npus.items()}, indent=2) + "\n")
    print(f"{layout.num_npus} NPUs, topology {layout.network['topology']} "
          f"{layout.network['npus_count']}; wrote " + ", ".join(str(p) for p in paths.values())
          + " (npus.json: the NPU ids of each instance)")
    return 0


def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="measure a profile bundle with PyTorch")
    p.add_argument("--model", required=True)
    p.add_argument("--hardware", required=True, help="name to file the bundle under")
    p.add_argument("--out", required=True)
    p.add_argument("--tp", type=int, nargs="+", default=[1])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="tiny grid (for tests on CPU)")


def _profile(args) -> int:
    from sim.model import load_model
    try:
        from sim.profiler import check_hardware_name, profile_bundle
    except ImportError as exc:
        raise InputError(f"the profiler is unavailable: {exc}") from None
    model = load_model(args.model, source="--model")
    if args.iterations < 1:
        raise InputError(f"--iterations must be >= 1 (timed samples per point), "
                         f"got {args.iterations}")
    check_hardware_name(args.hardware, "--hardware")
    writable_dir(args.out, "--out", " to file the bundle under")
    path = profile_bundle(model, args.hardware, Path(args.out), tp_degrees=tuple(args.tp),
                          device=args.device, iterations=args.iterations, tiny=args.tiny)
    print(f"wrote bundle {path}")
    return 0


def _os_error(exc: OSError) -> int:
    where = f"{exc.filename}: " if exc.filename else ""
    print(f"llmsim: error: {where}{exc.strerror or exc}", file=sys.stderr)
    return EXIT_INPUT_ERROR


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (poll reports an error on it)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no real file behind stdout
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmsim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_run(sub)
    _add_profiles(sub)
    _add_profile(sub)
    _add_astra_config(sub)
    _add_bench(sub)
    _add_compare(sub)
    _add_native(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"))
    try:
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "profiles":
            return _profiles(args)
        if args.cmd == "astra-config":
            return _astra_config(args)
        if args.cmd == "bench":
            from sim.bench import bench_main
            return bench_main(args)
        if args.cmd == "compare":
            from sim.compare import compare_main
            return compare_main(args)
        if args.cmd == "native":
            return _native(args)
        return _profile(args)
    except InputError as exc:
        print(f"llmsim: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BrokenPipeError as exc:
        if not _stdout_gone():  # another pipe (an astra-sim process's): as any OSError
            return _os_error(exc)
        # the reader of stdout left (`| head`), after the files were written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a writer the pipe stopped
    except OSError as exc:  # a file that changed under us after the checks
        return _os_error(exc)
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's 128 + SIGINT, as `dse`
        print(f"llmsim: interrupted during `llmsim {args.cmd}`", file=sys.stderr)
        return 130
    except MemoryError:  # an input that asks for more than this machine has
        print(f"llmsim: error: out of memory running `llmsim {args.cmd}`: the input asks "
              "for more than this machine holds (fewer requests, shorter sequences or a "
              "smaller cluster)", file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main())
