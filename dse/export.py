"""Deployable exports of the Pareto configurations: cluster JSON, vLLM commands, a benchmark.

For each distinct configuration on the front, ``best/`` gets

* ``<stem>.cluster.json``: the cluster the simulator ran;
* ``<stem>.serve.sh``: the ``vllm serve`` commands that deploy it, node by node, with
  ``CUDA_VISIBLE_DEVICES`` for each server. Aggregated replicas are one server each behind a
  load balancer of the simulated routing policy; an MoE data-parallel group is one server with
  ``--data-parallel-size``/``--enable-expert-parallel``; with PD disaggregation every prefill
  server is a KV producer and every decode server a KV consumer over vLLM's NixlConnector,
  joined by vLLM's toy proxy (``--prefiller-hosts/ports``, ``--decoder-hosts/ports``);
* ``<stem>.bench.sh``: a ``vllm bench serve`` line that offers the simulated workload
  (request count, rate, burstiness, length ranges) to the deployment's entry point.

``best/index.csv`` lists them with their objectives. dse knows nothing of vLLM's code; the
flags are those of the ``vllm serve`` and ``vllm bench serve`` command lines.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dse.config import TrialConfig, sim_inputs, space_workload, vllm_command
from dse.space import Space

BASE_PORT = 8100
PROXY_PORT = 8000
NIXL_SIDE_CHANNEL_PORT = 5600
#: the proxy that joins prefill and decode servers, in a vLLM source checkout
NIXL_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


@dataclass
class Server:
    """One ``vllm serve`` process: a replica, a DP group, or a PD role."""

    node: int
    gpus: list[int]
    port: int
    role: str | None  # None | "prefill" | "decode"
    dp: int  # data-parallel ranks inside this server


def servers(space: Space, cfg: TrialConfig) -> list[Server]:
    """The servers that realise ``cfg``'s cluster, in instance order."""
    p = cfg.params
    dp = int(p.get("dp", 1)) if space.is_moe else 1
    out: list[Server] = []
    for n, node in enumerate(cfg.cluster["nodes"]):
        gpu = 0
        groups: dict[str, Server] = {}
        for inst in node["instances"]:
            width = int(inst["num_npus"])
            gpus = list(range(gpu, gpu + width))
            gpu += width
            group = inst.get("dp_group") if dp > 1 else None
            if group is not None and group in groups:
                groups[group].gpus += gpus
                groups[group].dp += 1
                continue
            port = BASE_PORT + sum(1 for s in out if s.node == n)
            srv = Server(n, gpus, port, inst.get("pd_type"), 1)
            out.append(srv)
            if group is not None:
                groups[group] = srv
    return out


def served_model(space: Space) -> str:
    """The model as the space names it (sim may resolve it to a catalogue entry with a
    longer name, e.g. an -Instruct variant; vLLM must load the one the user chose)."""
    raw = space.raw.get("model") if isinstance(space.raw, dict) else None
    return str(raw) if raw else space.model


def _host(node: int) -> str:
    return f"${{NODE{node}_HOST:-localhost}}"


def serve_lines(space: Space, cfg: TrialConfig, max_model_len: int | None = None) -> list[str]:
    """The shell lines that start every server of ``cfg`` (each in the background), with
    ``--max-model-len`` where ``max_model_len`` is given."""
    head = f"vllm serve {shlex.quote(space.model)} "
    lines: list[str] = []
    node = None
    for i, s in enumerate(servers(space, cfg)):
        if s.node != node:
            node = s.node
            lines.append(f"\n# ---- node {node}: run these on {_host(node)} ----")
        env = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, s.gpus))}"]
        # its flags, dp included once
        base = vllm_command(space, cfg.params, dp_size=s.dp, max_model_len=max_model_len)
        if base.startswith(head):
            base = f"vllm serve {shlex.quote(served_model(space))} " + base[len(head):]
        args = [base, "--port", str(s.port)]
        if s.role:
            role = "kv_producer" if s.role == "prefill" else "kv_consumer"
            kv = {"kv_connector": "NixlConnector", "kv_role": role}
            env.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_PORT + i}")
            env.append(f"VLLM_NIXL_SIDE_CHANNEL_HOST={_host(s.node)}")
            args += ["--kv-transfer-config", shlex.quote(json.dumps(kv, separators=(",", ":")))]
        label = f"{s.role} server" if s.role else ("DP group" if s.dp > 1 else "replica")
        lines.append(f"# {label} {i}: GPUs {s.gpus[0]}-{s.gpus[-1]}")
        lines.append(" ".join(env + args) + f" > server{i}.log 2>&1 &")
    return lines


def entry_lines(space: Space, cfg: TrialConfig) -> tuple[list[str], str]:
    """What joins the servers into one endpoint, and that endpoint's URL."""
    srv = servers(space, cfg)
    if any(s.role for s in srv):
        pre = [s for s in srv if s.role == "prefill"]
        dec = [s for s in srv if s.role == "decode"]
        args = ["python", NIXL_PROXY, "--port", str(PROXY_PORT),
                "--prefiller-hosts", *[_host(s.node) for s in pre],
                "--prefiller-ports", *[str(s.port) for s in pre],
                "--decoder-hosts", *[_host(s.node) for s in dec],
                "--decoder-ports", *[str(s.port) for s in dec]]
        return (["", f"# ---- the proxy (from a vLLM source checkout): {len(pre)} prefill, "
                 f"{len(dec)} decode server(s) ----", " ".join(args) + " > proxy.log 2>&1 &"],
                f"http://{_host(0)}:{PROXY_PORT}")
    if len(srv) == 1:
        return [], f"http://{_host(srv[0].node)}:{srv[0].port}"
    policy = cfg.params.get("routing_policy", "LOAD")
    how = {"LOAD": "least outstanding requests", "RR": "round robin"}.get(policy, policy)
    ups = " ".join(f"{_host(s.node)}:{s.port}" for s in srv)
    return (["", f"# ---- a load balancer ({how}, the simulated routing policy {policy}) on "
             f"port {PROXY_PORT} in front of: {ups} ----"], f"http://{_host(0)}:{PROXY_PORT}")


def _lengths(reqs, which: str) -> tuple[int, float]:
    vals = [r.input_len if which == "input" else r.output_len for r in reqs]
    lo, hi = min(vals), max(vals)
    mid = (lo + hi) / 2
    return round(mid), (hi - mid) / mid if mid else 0.0


def _ratio_arg(ratio: float) -> str:
    """``--random-range-ratio`` as the bench line gives it."""
    return f"{ratio:.3f}"


def bench_longest(workload) -> int:
    """The most tokens (prompt + output) a request of the bench line's random dataset can
    reach: vLLM's RandomDataset draws prompts of at most ceil(input_len x (1 + ratio))
    tokens, special ones included, and outputs of at most ceil(output_len x (1 + ratio)),
    with the one ``--random-range-ratio`` for both."""
    reqs = workload.all_requests()
    in_len, in_ratio = _lengths(reqs, "input")
    out_len, _ = _lengths(reqs, "output")
    r = float(_ratio_arg(in_ratio))
    return math.ceil(in_len * (1 + r)) + math.ceil(out_len * (1 + r))


def bench_command(space: Space, base_url: str, workload=None,
                  rate: float | None = None) -> list[str]:
    """``vllm bench serve`` offering the space's workload: the same request count, rate and
    arrival burstiness, and random prompts over the same length ranges. ``rate``: the
    configuration's capacity a capacity search found (its runs are at that rate)."""
    wl = space.workload
    if workload is None:
        workload = space_workload(space)
    reqs = workload.all_requests()
    in_len, in_ratio = _lengths(reqs, "input")
    out_len, out_ratio = _lengths(reqs, "output")
    notes = []
    args = ["vllm", "bench", "serve", "--backend", "vllm", "--model", served_model(space),
            "--base-url", base_url, "--dataset-name", "random", "--num-prompts", str(len(reqs)),
            "--random-input-len", str(in_len), "--random-output-len", str(out_len),
            "--random-range-ratio", _ratio_arg(in_ratio), "--ignore-eos"]
    spec = wl.get("spec", {})
    if workload.closed_loop_clients:
        args += ["--max-concurrency", str(workload.closed_loop_clients)]
    elif wl["kind"] == "generate":
        burst = 1.0 if spec.get("arrival", "poisson") == "poisson" else 1.0 / spec.get("cv", 1) ** 2
        offered = float(spec.get("rate", 10.0)) if rate is None else rate
        args += ["--request-rate", f"{offered:g}", "--burstiness", f"{burst:g}"]
        if rate is not None:
            notes.append(f"# at this configuration's capacity, {rate:g} req/s: the highest "
                         "rate at which the capacity search found it meeting the SLOs")
    else:
        span_s = (max(r.arrival_ns for r in workload.requests)
                  - min(r.arrival_ns for r in workload.requests)) / 1e9
        rate = len(workload.requests) / span_s if span_s > 0 else float("inf")
        args += ["--request-rate", f"{rate:.4g}"]
        notes.append(f"# the trace {wl['path']} replayed as random prompts at its mean rate")
    args += ["--seed", str(spec.get("seed", 0)), "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,90,99"]
    if abs(out_ratio - in_ratio) > 0.02:
        lo, hi = round(out_len * (1 - in_ratio)), round(out_len * (1 + in_ratio))
        notes.append(f"# vLLM takes one range ratio for both lengths: outputs span {lo}-{hi} "
                     f"tokens here against {round(out_len * (1 - out_ratio))}-"
                     f"{round(out_len * (1 + out_ratio))} simulated")
    return notes + [" ".join(shlex.quote(a) if not a.startswith("http://$") else a
                             for a in args)]


def max_model_len_for(space: Space, cfg: TrialConfig, workload=None) -> tuple[int | None,
                                                                               list[str]]:
    """The ``--max-model-len`` the servers need to start as simulated (None: vLLM's default
    does) and the comment lines that say why. Without the flag vLLM takes the model's
    max_position_embeddings and refuses to start when one request of that length does not
    fit the KV cache. The simulation served the workload (``workload``, default the
    space's) at that default; vLLM serves it alike at any max_model_len from the workload's
    longest request (prompt + output, :meth:`sim.Workload.longest_sequence`) up to the
    default: it refuses and cuts the same requests (none, unless the default does). The
    flag takes the bench line's longest random request where that is longer and fits, so
    the server refuses none of those either."""
    import sim

    caps = [c for c in sim.kv_capacity(*sim_inputs(cfg)) if c.budget is not None]  # not PIM
    if not any(c.start_refusal() for c in caps):
        return None, []
    cap = min(caps, key=lambda c: (c.startable_blocks, c.instance_id))  # the binding one
    default = cap.max_model_len  # the simulation's: the model's unless the trial set it
    workload = workload or space_workload(space)
    longest = workload.longest_sequence(default)
    source = ("the simulated max_model_len" if cap.max_model_len_set
              else "the model's max_position_embeddings")
    why = (f"# Without it vLLM takes {source} ({default:,}) and refuses to start: one such "
           f"request needs {cap.blocks_needed(default):,} KV blocks of {cap.block_size}, "
           f"{cap.startable_blocks:,} fit ({cap.longest_startable:,} tokens).")
    if not longest:  # every prompt is refused at the default: no length serves them
        return None, [why]

    def fits(n: int) -> bool:
        return all(c.holds(n) and not c.start_refusal(n) for c in caps)

    bench = min(bench_longest(workload), default)
    if not fits(longest):  # (dse's precheck rejects such a trial)
        vllm = ("refuse to start" if any(c.start_refusal(longest) for c in caps)
                else "never schedule that request")
        return longest, [f"# --max-model-len {longest}: the workload's longest request "
                         f"(prompt + output). Even so vLLM would {vllm}: this configuration "
                         "cannot serve the workload's longest request (one request holds at "
                         f"most {min(c.longest_request for c in caps):,} tokens).", why]
    note = (f"# --max-model-len {longest}: the workload's longest request (prompt + output), "
            "so that vLLM starts and refuses or cuts no request.")
    if bench <= longest:
        return longest, [note, why]
    if fits(bench):
        return bench, [f"# --max-model-len {bench}: the longest request (prompt + output) of "
                       f"the bench line's random ones (the workload's: {longest:,}), so that "
                       "vLLM starts and refuses or cuts none.", why]
    return longest, [note[:-1] + f"; the bench line's random requests reach {bench:,} tokens, "
                     "more than fit: the server refuses those over it.", why]


def _not_in_vllm(space: Space, cfg: TrialConfig) -> list[str]:
    """Comment lines for what was simulated but vLLM cannot run: a modelled (non-GPU)
    device of the hardware catalogue, PIM attention and its sub-batch interleaving."""
    hw = cfg.params["hardware"]
    info = space.hw_info.get(hw)
    notes = []
    if info is not None and info.kind != "gpu":
        notes.append(f"# {hw} is a modelled device ({info.vendor}), not one vLLM runs on: "
                     "these commands carry the serving settings only.")
    mode = cfg.params.get("pim_mode", "off")
    if mode != "off":
        sbi = " with sub-batch interleaving" if cfg.params.get("sub_batch_interleaving") else ""
        notes.append(f"# The simulated pim_mode {mode}{sbi} (attention on PIM) has no vLLM "
                     "flag: it is not in these commands.")
    return notes


def deploy_script(space: Space, cfg: TrialConfig, objectives: dict[str, Any],
                  workload=None, rate: float | None = None) -> str:
    """The whole ``serve.sh`` of one configuration (``workload``: the simulated one,
    default the space's; ``rate``: the capacity its objectives were simulated at)."""
    s = cfg.summary
    srv = servers(space, cfg)
    head = ["#!/bin/sh", f"# {space.name}: trial {cfg.number}, {served_model(space)} on "
            f"{cfg.devices_used} x {s['hardware']} ({s['num_nodes']} node(s), "
            f"{len(srv)} vLLM server(s)).",
            "# Simulated: " + ", ".join(f"{k} {v:.4g}" for k, v in objectives.items())
            + (f", at {rate:g} req/s (its capacity)." if rate is not None else "."),
            "# Set NODE<i>_HOST to each node's address when it spans several nodes."]
    if space.is_moe and int(cfg.params.get("ep", 1)) > 1:
        width = int(cfg.params["tp"]) * max(s.dp for s in srv)
        if width != int(cfg.params["ep"]):
            head.append(f"# vLLM shards experts over all tp x dp = {width} GPUs of a server "
                        f"with --enable-expert-parallel; the simulated ep was {cfg.params['ep']}.")
    head += _not_in_vllm(space, cfg)
    max_model_len, notes = max_model_len_for(space, cfg, workload)
    head += notes
    body = serve_lines(space, cfg, max_model_len)
    entry, _ = entry_lines(space, cfg)
    return "\n".join(head + body + entry + ["wait", ""])


def export_config(space: Space, cfg: TrialConfig, objectives: dict[str, Any], best_dir: Path,
                  workload=None, rate: float | None = None) -> dict[str, str]:
    """Write one configuration's files; returns the commands shown in the report."""
    stem = f"trial_{cfg.number:04d}"
    (best_dir / f"{stem}.cluster.json").write_text(json.dumps(cfg.cluster, indent=2) + "\n")
    workload = workload or space_workload(space)
    serve = deploy_script(space, cfg, objectives, workload, rate)
    (best_dir / f"{stem}.serve.sh").write_text(serve)
    _, url = entry_lines(space, cfg)
    bench = bench_command(space, url, workload, rate)
    (best_dir / f"{stem}.bench.sh").write_text("#!/bin/sh\n" + "\n".join(bench) + "\n")
    return {"stem": stem, "serve": serve, "bench": bench[-1], "url": url}
