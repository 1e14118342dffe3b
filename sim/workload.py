"""Workloads: JSONL replays (flat requests and agentic sessions, mixable) and generators.

JSONL lines are either a flat request ``{input_toks, output_toks, arrival_time_ns,
input_tok_ids?, output_tok_ids?, priority?}`` or a session ``{session_id?, arrival_time_ns,
sub_requests: [{input_toks, output_toks, tool_duration_ns?, input_tok_ids?, ...}]}``.
A session's first sub-request arrives at the session's arrival time; each later one is
released by the router when the previous one finishes, after its ``tool_duration_ns``.
Generators draw arrivals (Poisson, Gamma) and lengths (fixed, uniform, Zipf, or sampled
from a file), seeded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.request import Request


@dataclass
class Workload:
    """The requests to replay. ``requests`` holds first-turn requests only; later session
    turns hang off ``Request.next_sub``. ``closed_loop_clients`` > 0 means arrivals are
    ignored: N clients each send their next request when the previous one finishes."""

    requests: list[Request]
    source: str = "<workload>"
    closed_loop_clients: int = 0

    def all_requests(self) -> list[Request]:
        out = []
        for r in self.requests:
            while r is not None:
                out.append(r)
                r = r.next_sub
        return out

    @property
    def num_requests(self) -> int:
        return len(self.all_requests())


def _int_field(obj: dict, key: str, where: str, *, required: bool = True, default: int = 0) -> int:
    if key not in obj or obj[key] is None:
        if required:
            raise InputError(f"missing field {key!r}", source=where)
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        raise InputError(f"field {key!r} must be an integer, got {v!r}", source=where)
    if v < 0:
        raise InputError(f"field {key!r} must be >= 0, got {v!r}", source=where)
    return int(v)


def _ids(obj: dict, key: str, n: int, where: str) -> list[int] | None:
    ids = obj.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise InputError(f"field {key!r} must be a list of token ids", source=where)
    if len(ids) != n:
        raise InputError(f"field {key!r} has {len(ids)} ids but the count field says {n}",
                         source=where)
    return ids


def _make_request(obj: dict, rid: int, arrival_ns: int, where: str, session_id=None,
                  sub_index=0) -> Request:
    n_in = _int_field(obj, "input_toks", where)
    n_out = _int_field(obj, "output_toks", where)
    if n_in < 1:
        raise InputError("field 'input_toks' must be >= 1", source=where)
    if n_out < 1:
        raise InputError("field 'output_toks' must be >= 1", source=where)
    req = Request(rid, arrival_ns, n_in, n_out,
                  input_ids=_ids(obj, "input_tok_ids", n_in, where),
                  output_ids=_ids(obj, "output_tok_ids", n_out, where),
                  session_id=session_id, sub_index=sub_index,
                  tool_ns=_int_field(obj, "tool_duration_ns", where, required=False))
    # vLLM's request priority (lower runs first) for --scheduling-policy priority.
    req.priority = _int_field(obj, "priority", where, required=False)
    return req


def parse_jsonl_lines(lines, source: str = "<jsonl>", limit: int | None = None) -> Workload:
    requests: list[Request] = []
    rid = 0
    for lineno, line in enumerate(lines, start=1):
        if limit is not None and len(requests) >= limit:
            break
        line = line.strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"malformed JSON ({exc.msg} at column {exc.colno})",
                             source=where) from None
        if not isinstance(obj, dict):
            raise InputError("each line must be a JSON object", source=where)
        arrival = _int_field(obj, "arrival_time_ns", where, required=False)
        if "sub_requests" in obj:
            subs = obj["sub_requests"]
            if not isinstance(subs, list) or not subs:
                raise InputError("field 'sub_requests' must be a non-empty list", source=where)
            sid = str(obj.get("session_id", f"session-{lineno}"))
            prev = None
            for k, sub in enumerate(subs):
                sw = f"{where}: sub_requests[{k}]"
                if not isinstance(sub, dict):
                    raise InputError("must be an object", source=sw)
                req = _make_request(sub, rid, arrival if k == 0 else -1, sw, sid, k)
                rid += 1
                if prev is None:
                    requests.append(req)
                else:
                    prev.next_sub = req
                prev = req
        else:
            requests.append(_make_request(obj, rid, arrival, where))
            rid += 1
    if not requests:
        raise InputError("workload has no requests", source=source)
    requests.sort(key=lambda r: (r.arrival_ns, r.rid))
    return Workload(requests, source=source)


def load_jsonl(path: str | Path, limit: int | None = None) -> Workload:
    """Load a JSONL workload; ``limit`` keeps the first N entries (sessions count as one)."""
    path = Path(path)
    try:
        with path.open() as fh:
            return parse_jsonl_lines(fh, str(path), limit)
    except OSError as exc:
        raise InputError(f"cannot read workload: {exc.strerror}", source=str(path)) from None


# ---------------------------------------------------------------------------- generators
@dataclass
class LengthDist:
    """A token-length distribution: fixed, uniform[low, high], zipf(theta) on [low, high],
    or ``file``: sampled from the lengths of a JSONL workload (``field`` is input or
    output)."""

    kind: str = "fixed"
    value: int = 128
    low: int = 1
    high: int = 1024
    theta: float = 1.1
    path: str | None = None

    def sample(self, rng: np.random.Generator, n: int, which: str) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n)
        if self.kind == "zipf":
            ranks = np.arange(1, self.high - self.low + 2, dtype=np.float64)
            p = ranks ** (-self.theta)
            p /= p.sum()
            return self.low + rng.choice(len(ranks), size=n, p=p)
        if self.kind == "file":
            if not self.path:
                raise InputError("a 'file' length distribution needs a path")
            pool = load_jsonl(self.path).all_requests()
            vals = np.array([r.input_len if which == "input" else r.output_len for r in pool])
            return rng.choice(vals, size=n)
        raise InputError(f"unknown length distribution {self.kind!r}; known: fixed, uniform, "
                         "zipf, file")


@dataclass
class WorkloadSpec:
    """A synthetic workload. ``arrival`` is poisson or gamma (``cv`` sets burstiness:
    shape = 1/cv^2); ``concurrency`` > 0 makes it closed-loop instead."""

    num_requests: int = 100
    arrival: str = "poisson"
    rate: float = 10.0
    cv: float = 1.0
    input: LengthDist = field(default_factory=lambda: LengthDist("fixed", 512))
    output: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    seed: int = 0
    concurrency: int = 0
    #: when set, prompts are sampled jointly (input, output pairs) from this JSONL file
    sample_file: str | None = None


def generate(spec: WorkloadSpec) -> Workload:
    if spec.num_requests < 1:
        raise InputError(f"num_requests must be >= 1, got {spec.num_requests}")
    rng = np.random.default_rng(spec.seed)
    n = spec.num_requests
    if spec.concurrency > 0:
        arrivals = np.zeros(n)
    else:
        if spec.rate <= 0:
            raise InputError(f"arrival rate must be > 0, got {spec.rate}")
        if spec.arrival == "poisson":
            gaps = rng.exponential(1.0 / spec.rate, size=n)
        elif spec.arrival == "gamma":
            if spec.cv <= 0:
                raise InputError(f"gamma cv must be > 0, got {spec.cv}")
            shape = 1.0 / (spec.cv ** 2)
            gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), size=n)
        else:
            raise InputError(f"unknown arrival process {spec.arrival!r}; known: poisson, gamma")
        arrivals = np.cumsum(gaps) - gaps[0]
    if spec.sample_file:
        pool = load_jsonl(spec.sample_file).all_requests()
        idx = rng.integers(0, len(pool), size=n)
        ins = np.array([pool[i].input_len for i in idx])
        outs = np.array([pool[i].output_len for i in idx])
    else:
        ins = spec.input.sample(rng, n, "input")
        outs = spec.output.sample(rng, n, "output")
    reqs = [Request(i, math.floor(arrivals[i] * 1e9), max(1, int(ins[i])), max(1, int(outs[i])))
            for i in range(n)]
    return Workload(reqs, source=f"generated({spec.arrival}, seed={spec.seed})",
                    closed_loop_clients=spec.concurrency)


def workload_from_mapping(d: dict[str, Any], source: str = "<workload spec>") -> WorkloadSpec:
    """Build a WorkloadSpec from a YAML/JSON mapping (used by the CLI and the search)."""
    def dist(key: str, default: LengthDist) -> LengthDist:
        v = d.get(key)
        if v is None:
            return default
        if isinstance(v, int):
            return LengthDist("fixed", v)
        if not isinstance(v, dict):
            raise InputError(f"field {key!r} must be an int or a mapping", source=source)
        allowed = {"kind", "value", "low", "high", "theta", "path"}
        bad = set(v) - allowed
        if bad:
            raise InputError(f"{key}: unknown field(s) {sorted(bad)}; allowed: {sorted(allowed)}",
                             source=source)
        return LengthDist(**v)

    spec = WorkloadSpec(
        num_requests=int(d.get("num_requests", 100)), arrival=str(d.get("arrival", "poisson")),
        rate=float(d.get("rate", 10.0)), cv=float(d.get("cv", 1.0)),
        input=dist("input", LengthDist("fixed", 512)), output=dist("output", LengthDist("fixed", 128)),
        seed=int(d.get("seed", 0)), concurrency=int(d.get("concurrency", 0)),
        sample_file=d.get("sample_file"))
    return spec
