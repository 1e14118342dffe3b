"""``llmsim bench``: ``vllm bench serve``'s command line, answered by the simulator.

The same flags as vLLM's serving benchmark (``--model``, ``--dataset-name``,
``--random-input-len``, ``--num-prompts``, ``--max-concurrency``, ``--request-rate``, ...)
plus the engine flags of ``vllm serve`` (``--tensor-parallel-size``, ``--quantization``,
``--kv-cache-dtype``, ...) and ours (``--hardware``, ``--latency-provider``). A cluster is
built from the flags (the hardware catalogue entry and the model spec), the workload from
the dataset flags, and the same engine as ``llmsim run`` simulates them. The result table
and the ``--save-result`` JSON use vLLM's labels and keys.

Workload semantics, as vLLM's benchmark client sends requests:
- ``--request-rate inf`` sends every prompt at once; with ``--max-concurrency N`` only N
  are in flight and the next is sent when one finishes (a closed loop of N clients); with a
  finite rate and ``--max-concurrency`` a request goes out at its Poisson time or when a
  slot frees, whichever is later;
- a finite rate draws Poisson arrivals (gamma with ``--burstiness``);
- ``random`` lengths are uniform in [floor(L(1-r)), ceil(L(1+r))] for L the requested
  length and r ``--random-range-ratio``; ``sharegpt``/``custom`` read token lengths
  from a JSONL file (``input_toks``/``output_toks``: the project's workload format or a
  real run's ``requests.jsonl``), as we have no tokenizer to count a raw ShareGPT JSON.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import InputError
from sim.options import DEFAULT_MEM_UTIL, add_cli_flags, check_engine_flags
from sim.request import Request
from sim.workload import Workload, load_jsonl

if TYPE_CHECKING:
    import numpy as np

DATASETS = ("random", "sharegpt", "custom")
#: devices in one node when the hardware spec does not say (an 8-GPU server)
DEFAULT_DEVICES_PER_NODE = 8
METRIC_LABELS = {"ttft": ("Time to First Token", "TTFT"),
                 "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
                 "itl": ("Inter-token Latency", "ITL"),
                 "e2el": ("End-to-end Latency", "E2EL")}


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """vLLM's ``bench serve`` flags (workload and result), ``serve`` flags (engine), ours."""
    g = p.add_argument_group("benchmark (as vllm bench serve)")
    g.add_argument("--model", required=True, help="catalogue name/alias or a HF config.json")
    g.add_argument("--dataset-name", default="random", choices=DATASETS)
    g.add_argument("--dataset-path", default=None,
                   help="JSONL with input_toks/output_toks per line (sharegpt, custom)")
    g.add_argument("--num-prompts", type=int, default=1000)
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-range-ratio", type=float, default=0.0)
    g.add_argument("--request-rate", default="inf", help="requests/s (Poisson) or inf")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times (1 = Poisson)")
    g.add_argument("--max-concurrency", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    g.add_argument("--metric-percentiles", default="99")
    g.add_argument("--save-result", action="store_true")
    g.add_argument("--result-dir", default=None)
    g.add_argument("--result-filename", default=None)
    g.add_argument("--label", default=None)
    e = p.add_argument_group(
        "engine (as vllm serve)",
        "--max-num-seqs and --max-num-batched-tokens left out are vllm serve's defaults for "
        "--hardware: 1024 and 8192 on a device of at least 70 GiB that is not an A100, else "
        "256 and 2048")
    e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    e.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    e.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    e.add_argument("--enable-expert-parallel", action="store_true")
    e.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_MEM_UTIL)
    add_cli_flags(e, names=("max_num_seqs", "max_num_batched_tokens", "block_size",
                            "enable_prefix_caching", "enable_chunked_prefill", "quantization",
                            "kv_cache_dtype"), aliases={"quantization": "-q"})
    # left out, they are vLLM's defaults for the hardware (serve_batch_defaults)
    p.set_defaults(max_num_seqs=None, max_num_batched_tokens=None)
    s = p.add_argument_group("simulator")
    s.add_argument("--hardware", required=True, help="hardware catalogue entry, e.g. H100-SXM")
    s.add_argument("--latency-provider", default="auto")
    s.add_argument("--profiles", action="append", default=[])
    s.add_argument("--use-trace-timestamps", action="store_true",
                   help="custom/sharegpt: replay the file's arrival_time_ns (as llmsim run) "
                        "instead of --request-rate")


# ---------------------------------------------------------------------- cluster
def bench_cluster(args) -> dict:
    """The cluster mapping ``vllm serve`` with these flags runs on: ``dp`` instances of
    ``tp x pp`` GPUs of the catalogue's hardware in one node; with expert parallelism the
    experts shard over tp x dp ranks (vLLM's EP size) and the DP ranks step together."""
    from sim.hardware import load_hardware

    hw = load_hardware(args.hardware, source="--hardware")
    tp, pp, dp = args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size
    for flag, v in (("--tensor-parallel-size", tp), ("--pipeline-parallel-size", pp),
                    ("--data-parallel-size", dp)):
        if v < 1:
            raise InputError(f"{flag} must be >= 1, got {v}")
    from sim.model import check_precision
    check_precision(args.quantization, args.kv_cache_dtype, quant_label="--quantization",
                    kv_label="--kv-cache-dtype")
    util = args.gpu_memory_utilization
    if not 0 < util <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    _check_parallel_sizes(hw, args, tp, pp, dp)
    inst: dict[str, Any] = {
        "model_name": args.model, "hardware": hw.name,
        "npu_mem": {"mem_size": hw.mem_size_GiB, "mem_bw": hw.mem_bw_GBps, "mem_latency": 0,
                    "mem_util": util},
        "num_npus": tp * pp, "tp_size": tp, "pp_size": pp,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "block_size": args.block_size, "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "kv_cache_dtype": args.kv_cache_dtype,
    }
    if args.quantization is not None:
        inst["quantization"] = args.quantization
    from sim.model import load_model
    if args.enable_expert_parallel and load_model(args.model, source="--model").is_moe:
        # vLLM ignores the flag for a dense model
        inst["ep_size"] = tp * dp
        if dp > 1:
            inst["dp_group"] = "dp"
    instances = [dict(inst) for _ in range(dp)]
    # no link_bw / link_latency: the catalogue's physical link (sim/topology.py)
    return {"num_nodes": 1, "nodes": [{"num_instances": dp, "instances": instances}]}


def _check_parallel_sizes(hw, args, tp: int, pp: int, dp: int) -> None:
    """What one ``vllm serve`` node of this hardware can run, before anything is built
    (``-dp 100000`` built 100,000 instances for minutes): tp divides the attention heads,
    every pipeline stage holds a layer, and dp x tp x pp devices fit in one node of the
    catalogue's hardware (vLLM starts every DP rank on this node unless it is given
    multi-node flags, which ``llmsim bench`` does not model)."""
    from sim.model import load_model

    model = load_model(args.model, source="--model")
    model.check_tp(tp, label="--tensor-parallel-size")
    model.check_pp(pp, label="--pipeline-parallel-size")
    per_node = hw.devices_per_node or DEFAULT_DEVICES_PER_NODE
    if dp * tp * pp > per_node:
        where = ("the catalogue's devices_per_node" if hw.devices_per_node else
                 "the default; the hardware spec gives no devices_per_node")
        raise InputError(
            f"--data-parallel-size {dp} x --tensor-parallel-size {tp} x "
            f"--pipeline-parallel-size {pp} = {dp * tp * pp} devices, but one {hw.name} node "
            f"holds {per_node} ({where}); allowed: dp x tp x pp <= {per_node} (simulate more "
            "nodes with `llmsim run --cluster`)")


# ---------------------------------------------------------------------- workload
def _request_rate(raw: str) -> float:
    try:
        rate = float(raw)
    except ValueError:
        raise InputError(f"--request-rate must be a number or inf, got {raw!r}") from None
    if not rate > 0:
        raise InputError(f"--request-rate must be > 0 (or inf), got {raw!r}")
    return rate


def _file_requests(args, n: int) -> list[Request]:
    """The first ``n`` requests of the dataset file, token ids kept (prefix caching sees
    the same prompts the real benchmark sends)."""
    if not args.dataset_path:
        raise InputError(f"--dataset-name {args.dataset_name} needs --dataset-path (a JSONL of "
                         "input_toks/output_toks)")
    heads = load_jsonl(args.dataset_path, limit=n).requests
    if any(r.next_sub is not None for r in heads):
        raise InputError("multi-turn sessions are not a vllm bench serve dataset; give flat "
                         "requests", source=args.dataset_path)
    if len(heads) < n:
        raise InputError(f"--num-prompts {n} but the file has {len(heads)} requests",
                         source=args.dataset_path)
    return heads


_MAX_LEN = 2**31 - 1  # a prompt or output length (vLLM's max_model_len is an int32)


def _random_requests(args, rng: np.random.Generator, n: int) -> list[Request]:
    r = args.random_range_ratio
    if not 0 <= r < 1:
        raise InputError(f"--random-range-ratio must be in [0, 1), got {r}")
    lens = []
    for flag, length in (("--random-input-len", args.random_input_len),
                         ("--random-output-len", args.random_output_len)):
        if not 1 <= length <= _MAX_LEN:
            raise InputError(f"{flag} must be in 1..{_MAX_LEN}, got {length}")
        lo, hi = max(1, math.floor(length * (1 - r))), math.ceil(length * (1 + r))
        lens.append(rng.integers(lo, hi + 1, size=n))
    return [Request(i, 0, int(lens[0][i]), int(lens[1][i])) for i in range(n)]


def bench_workload(args) -> Workload:
    """The requests ``vllm bench serve`` sends for these flags."""
    n = args.num_prompts
    if n < 1:
        raise InputError(f"--num-prompts must be >= 1, got {n}")
    if n >= 2**63:  # numpy's arrays stop there (a ValueError); far fewer fit in memory
        raise InputError(f"--num-prompts {n}: out of memory: more prompts than one array "
                         "holds (2**63); give fewer")
    rate = _request_rate(args.request_rate)
    burst = args.burstiness  # vLLM asserts > 0 whatever the rate; a finite rate uses it
    if not burst > 0 or (math.isinf(burst) and not math.isinf(rate)):
        raise InputError(f"--burstiness must be a finite number > 0, got {burst}")
    conc = args.max_concurrency
    if conc is not None and conc < 1:
        raise InputError(f"--max-concurrency must be >= 1, got {conc}")
    import numpy as np  # here: the parser of every llmsim command imports this module

    rng = np.random.default_rng(args.seed)
    from_file = args.dataset_name != "random"
    reqs = _file_requests(args, n) if from_file else _random_requests(args, rng, n)
    if args.use_trace_timestamps:
        if not from_file:
            raise InputError("--use-trace-timestamps needs --dataset-name custom or sharegpt")
    elif math.isinf(rate):
        for q in reqs:
            q.arrival_ns = 0
    else:
        with np.errstate(over="ignore"):
            gaps = rng.gamma(args.burstiness, 1.0 / (rate * args.burstiness), size=n)
            times = np.cumsum(gaps) - gaps[0]
        if not float(times[-1]) * 1e9 < 2**62:  # NaN fails too
            raise InputError(f"--request-rate {args.request_rate}: {n} prompts would arrive "
                             "over more than 146 years of simulated time; give a larger rate")
        for q, t in zip(reqs, times):
            q.arrival_ns = int(t * 1e9)
    # --max-concurrency caps the requests in flight: with an infinite rate a closed loop of N
    # clients; with a rate or trace timestamps, each request goes out at its own time or when
    # one of the N slots frees, whichever is later (vLLM's benchmark semaphore)
    closed = conc or 0
    paced = bool(closed) and (args.use_trace_timestamps or not math.isinf(rate))
    return Workload(reqs, source=f"bench({args.dataset_name}, seed={args.seed})",
                    closed_loop_clients=closed, paced=paced)


# ---------------------------------------------------------------------- results
def _percentiles(raw: str) -> list[float]:
    try:
        ps = [float(p) for p in raw.split(",") if p.strip()]
    except ValueError:
        raise InputError(f"--metric-percentiles must be numbers like 50,90,99, got {raw!r}") \
            from None
    if not ps or any(not 0 < p <= 100 for p in ps):  # NaN fails the test too
        raise InputError(f"--metric-percentiles must be in (0, 100], got {raw!r}")
    return ps


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def bench_metrics(result, args) -> dict:
    """vLLM's result keys from a simulated run (times in ms, throughputs per second)."""
    import numpy as np

    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in METRIC_LABELS]
    if bad:
        raise InputError(f"--percentile-metrics: unknown {bad}; allowed: "
                         f"{', '.join(METRIC_LABELS)}")
    pcts = _percentiles(args.metric_percentiles)
    done = [r for r in result.requests if r.finish_ns >= 0]
    start = min((r.arrival_ns for r in result.requests), default=0)
    end = max((r.last_token_ns for r in done), default=start)
    duration = max(1e-9, (end - start) / 1e9)
    per_req = {
        "ttft": [(r.first_token_ns - r.arrival_ns) / 1e6 for r in done],
        "tpot": [(r.last_token_ns - r.first_token_ns) / 1e6 / (r.num_output - 1)
                 for r in done if r.num_output > 1],
        "e2el": [(r.last_token_ns - r.arrival_ns) / 1e6 for r in done],
    }
    total_in = sum(r.input_len for r in done)
    total_out = sum(r.num_output for r in done)
    out: dict[str, Any] = {
        "duration": duration, "completed": len(done), "failed": len(result.requests) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [r.input_len for r in done], "output_lens": [r.num_output for r in done],
        "ttfts": [v / 1e3 for v in per_req["ttft"]],
    }
    itl = result.summary.get("itl_ms") or {}
    if not any(math.isfinite(v) for v in itl.values()):
        # no inter-token gap (every output one token): vLLM's np.mean(itls or 0) gives 0
        itl = {k: 0.0 for k in itl}
    for m in metrics:
        if m == "itl":
            out["mean_itl_ms"] = itl.get("mean")
            out["median_itl_ms"] = itl.get("p50")
            out["std_itl_ms"] = None   # the engine keeps ITL quantiles, not the samples
            for p in pcts:
                key = f"p{_pword(p)}"
                if key not in itl:
                    raise InputError(f"--metric-percentiles {_pword(p)}: ITL is kept at the "
                                     f"{', '.join(k[1:] for k in itl if k.startswith('p'))} "
                                     "percentiles only")
                out[f"p{_pword(p)}_itl_ms"] = itl[key]
            continue
        a = np.asarray(per_req[m] or [0.0])
        out[f"mean_{m}_ms"] = float(a.mean())
        out[f"median_{m}_ms"] = float(np.median(a))
        out[f"std_{m}_ms"] = float(a.std())
        for p in pcts:
            out[f"p{_pword(p)}_{m}_ms"] = float(np.percentile(a, p))
    return out


def result_table(res: dict, args, metrics: list[str], pcts: list[float]) -> str:
    """vLLM's printed ``Serving Benchmark Result`` block."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             "{:<40} {:<10}".format("Successful requests:", res["completed"])]
    if args.max_concurrency is not None:
        lines.append("{:<40} {:<10}".format("Maximum request concurrency:", args.max_concurrency))
    rows = (("Benchmark duration (s):", res["duration"]),
            ("Total input tokens:", res["total_input_tokens"]),
            ("Total generated tokens:", res["total_output_tokens"]),
            ("Request throughput (req/s):", res["request_throughput"]),
            ("Output token throughput (tok/s):", res["output_throughput"]),
            ("Total Token throughput (tok/s):", res["total_token_throughput"]))
    for label, v in rows:
        fmt = "{:<40} {:<10}" if isinstance(v, int) else "{:<40} {:<10.2f}"
        lines.append(fmt.format(label, v))
    for m in metrics:
        title, short = METRIC_LABELS[m]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines.append("{:<40} {:<10.2f}".format(f"Mean {short} (ms):", res[f"mean_{m}_ms"]))
        lines.append("{:<40} {:<10.2f}".format(f"Median {short} (ms):", res[f"median_{m}_ms"]))
        for p in pcts:
            w = _pword(p)
            lines.append("{:<40} {:<10.2f}".format(f"P{w} {short} (ms):", res[f"p{w}_{m}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)


#: vllm serve's scheduler defaults in vLLM 0.19 (EngineArgs.get_batch_defaults, the
#: OpenAI-API-server usage context): (max_num_seqs, max_num_batched_tokens) on a device
#: with at least 70 GiB of total memory that is not an A100, and on the others
LARGE_DEVICE_BATCH_DEFAULTS = (1024, 8192)
SMALL_DEVICE_BATCH_DEFAULTS = (256, 2048)
LARGE_DEVICE_GiB = 70


def serve_batch_defaults(hw) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that ``vllm serve`` picks on this hardware
    when neither is given: vLLM reads the device's total memory (what CUDA reports) and
    its name, and keeps the small defaults on A100s (vLLM PR #17885)."""
    total = hw.mem_reported_bytes or hw.mem_size_GiB * (1 << 30)
    large = total >= LARGE_DEVICE_GiB * (1 << 30) and "a100" not in hw.name.lower()
    return LARGE_DEVICE_BATCH_DEFAULTS if large else SMALL_DEVICE_BATCH_DEFAULTS


def resolve_serve_defaults(args) -> None:
    """Fill --max-num-seqs / --max-num-batched-tokens left out with vLLM's defaults for
    --hardware (before the flags are checked)."""
    if args.max_num_seqs is not None and args.max_num_batched_tokens is not None:
        return
    from sim.hardware import load_hardware

    seqs, tokens = serve_batch_defaults(load_hardware(args.hardware, source="--hardware"))
    if args.max_num_seqs is None:
        args.max_num_seqs = seqs
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = tokens


def _result_path(args) -> Path:
    return Path(args.result_dir or ".") / (args.result_filename or (
        f"llmsim-{args.request_rate}qps-{Path(args.model).name}-<date>.json"))


def _check_result_flags(args) -> None:
    """The flags only read after the simulation, checked before it: the metrics and
    percentiles, and (with --save-result) that the result file can be written."""
    check_engine_flags(args)
    bad = [m.strip() for m in args.percentile_metrics.split(",")
           if m.strip() and m.strip() not in METRIC_LABELS]
    if bad:
        raise InputError(f"--percentile-metrics: unknown {bad}; allowed: "
                         f"{', '.join(METRIC_LABELS)}")
    _percentiles(args.metric_percentiles)
    if args.save_result:
        from sim.paths import check_distinct_paths, check_output_file

        if args.dataset_path:
            check_distinct_paths([("--result-dir/--result-filename", _result_path(args))],
                                 [("--dataset-path", args.dataset_path)])
        check_output_file(_result_path(args), "--result-dir/--result-filename")


def run_bench(args) -> tuple[dict, str]:
    """Simulate the benchmark: (the saved JSON's mapping, the printed table)."""
    import sim
    from sim.cluster import parse_cluster
    from sim.latency.base import provider_names
    from sim.options import SimOptions

    if args.latency_provider not in provider_names():
        raise InputError(f"--latency-provider: unknown {args.latency_provider!r}; allowed: "
                         f"{', '.join(provider_names())}")
    resolve_serve_defaults(args)
    _check_result_flags(args)
    cluster = parse_cluster(bench_cluster(args), source="llmsim bench flags")
    workload = bench_workload(args)
    opts = SimOptions(seed=args.seed, latency_provider=args.latency_provider,
                      profiles_dirs=tuple(args.profiles))
    from sim.validate import check_workload
    check_workload(workload, cluster, opts)
    result = sim.simulate(cluster, workload, opts)
    res = bench_metrics(result, args)
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    table = result_table(res, args, metrics, _percentiles(args.metric_percentiles))
    rate = _request_rate(args.request_rate)
    s = result.summary
    head = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "llmsim", "backend": "llmsim", "label": args.label,
        "model_id": args.model, "tokenizer_id": args.model, "num_prompts": args.num_prompts,
        "request_rate": "inf" if math.isinf(rate) else rate, "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
    }
    extra = {"simulator": {k: s.get(k) for k in ("latency_provider", "latency_source",
                                                  "latency_note", "precision", "kv_blocks",
                                                  "wall_s")}}
    return {**head, **res, **extra}, table


def bench_main(args) -> int:
    res, table = run_bench(args)
    print(table)
    note = res["simulator"].get("latency_note") or {}
    src = res["simulator"].get("latency_source") or {}
    print(f"latency: {res['simulator']['latency_provider']} "
          f"({'; '.join(sorted(set(src.values())))})"
          + (f" | {'; '.join(sorted(set(note.values())))}" if note else ""))
    if args.save_result:
        name = args.result_filename or (
            f"llmsim-{args.request_rate}qps-{Path(args.model).name}-{res['date']}.json")
        path = Path(args.result_dir or ".") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {path}")
    return 0
