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
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import InputError, unique_keys
from sim.request import Request

if TYPE_CHECKING:
    import numpy as np


@dataclass
class Workload:
    """The requests to replay. ``requests`` holds first-turn requests only; later session
    turns hang off ``Request.next_sub``. ``closed_loop_clients`` > 0 means arrivals are
    ignored: N clients each send their next request when the previous one finishes. With
    ``paced`` as well, a request is sent at its own arrival time or when a client frees,
    whichever is later (``vllm bench serve --request-rate R --max-concurrency N``)."""

    requests: list[Request]
    source: str = "<workload>"
    closed_loop_clients: int = 0
    paced: bool = False

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

    def longest_sequence(self, max_model_len: int | None = None) -> int:
        """The most tokens (prompt + output) a request reaches when served with
        ``max_model_len`` (None: no limit), as vLLM 0.19 serves it: a prompt of
        max_model_len tokens or more is refused (``_validate_prompt_len``: it leaves no
        room for one output token), and generation stops when a sequence reaches
        max_model_len (``check_stop``). 0 when every prompt is refused.

        Serving with ``--max-model-len`` equal to this refuses and cuts exactly the
        requests ``max_model_len`` does (none, with None): every prompt served counts at
        least one token more than its prompt, so no prompt served reaches it."""
        cap = max_model_len if max_model_len is not None else 2 * MAX_LEN + 1
        return max((min(max(r.input_len + r.output_len, r.input_len + 1), cap)
                    for r in self.all_requests() if r.input_len < cap), default=0)


_MAX_INT = 2**63 - 1
#: a prompt or output length: vLLM's max_model_len is an int32 (a longer request would
#: also make the simulator build per-token state for minutes before refusing it)
MAX_LEN = 2**31 - 1


def _int_field(obj: dict, key: str, where: str, *, required: bool = True, default: int = 0,
               signed: bool = False) -> int:
    """``obj[key]`` as an int in [0, 2**63) (``signed``: in [-2**63, 2**63))."""
    if key not in obj or obj[key] is None:
        if required:
            raise InputError(f"missing field {key!r}", source=where)
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or int(v) != v:
        raise InputError(f"field {key!r} must be an integer, got {v!r}", source=where)
    if signed and v < -_MAX_INT - 1:
        raise InputError(f"field {key!r} must be >= -2**63, got {v!r}", source=where)
    if v < 0 and not signed:
        raise InputError(f"field {key!r} must be >= 0, got {v!r}", source=where)
    if v > _MAX_INT:
        raise InputError(f"field {key!r} must be < 2**63, got {v!r}", source=where)
    return int(v)


def _ids(obj: dict, key: str, n: int, where: str, may_hold_bools: bool = True) -> list[int] | None:
    """The token-id list ``obj[key]`` (None when absent), checked: ``n`` ints in [0, 2**63).
    ``may_hold_bools`` False (the line's text has no ``true``/``false``) skips the
    per-element type check, which only bools (ints to ``array``) would need."""
    ids = obj.get(key)
    if ids is None:
        return None
    if not isinstance(ids, list):
        raise InputError(f"field {key!r} must be a list of token ids", source=where)
    if len(ids) != n:
        raise InputError(f"field {key!r} has {len(ids)} ids but the count field says {n}",
                         source=where)
    try:
        # in C: every id an int (or a bool) in [0, 2**63): signed and unsigned 64-bit
        array("q", ids)
        array("Q", ids)
        ok = True
    except (TypeError, OverflowError):
        ok = False
    if ok and may_hold_bools:
        ok = all(type(t) is int for t in ids)
    if not ok:
        raise InputError(f"field {key!r} must hold integer token ids >= 0", source=where)
    return ids


def _make_request(obj: dict, rid: int, arrival_ns: int, where: str, session_id=None,
                  sub_index=0, may_hold_bools: bool = True) -> Request:
    n_in = _int_field(obj, "input_toks", where)
    n_out = _int_field(obj, "output_toks", where)
    for key, n in (("input_toks", n_in), ("output_toks", n_out)):
        if n < 1:
            raise InputError(f"field {key!r} must be >= 1", source=where)
        if n > MAX_LEN:
            raise InputError(f"field {key!r} must be in 1..{MAX_LEN} (vLLM's max_model_len "
                             f"is an int32), got {n}", source=where)
    req = Request(rid, arrival_ns, n_in, n_out,
                  input_ids=_ids(obj, "input_tok_ids", n_in, where, may_hold_bools),
                  output_ids=_ids(obj, "output_tok_ids", n_out, where, may_hold_bools),
                  session_id=session_id, sub_index=sub_index,
                  tool_ns=_int_field(obj, "tool_duration_ns", where, required=False))
    # vLLM's request priority (lower runs first; any int, negative too) for
    # --scheduling-policy priority.
    req.priority = _int_field(obj, "priority", where, required=False, signed=True)
    return req


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


#: the fields of a flat request, which a session line carries in its sub_requests
_FLAT_FIELDS = ("input_toks", "output_toks", "input_tok_ids", "output_tok_ids")


def _session_id(obj: dict, lineno: int, where: str, seen: dict[str, int]) -> str:
    """A session line's id (a string or an integer, read as text; default
    ``session-<line>``), used by no earlier line: the summary's per-session statistics
    group the turns by it."""
    both = [k for k in _FLAT_FIELDS if k in obj]
    if both:
        raise InputError(f"field {both[0]!r} beside 'sub_requests': a line is a flat request "
                         "or a session (its turns in sub_requests), not both", source=where)
    raw = obj.get("session_id")
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, (str, int))):
        raise InputError(f"field 'session_id' must be a string or an integer, got {raw!r}",
                         source=where)
    sid = f"session-{lineno}" if raw is None else str(raw)
    if sid in seen:
        raise InputError(f"session_id {sid!r} is also the session of line {seen[sid]}; each "
                         "session needs its own id (its turns all in one line's "
                         "sub_requests)", source=where)
    seen[sid] = lineno
    return sid


def parse_jsonl_lines(lines, source: str = "<jsonl>", limit: int | None = None) -> Workload:
    requests: list[Request] = []
    sessions: dict[str, int] = {}  # session id -> its line
    rid = 0
    for lineno, line in enumerate(lines, start=1):
        if limit is not None and len(requests) >= limit:
            break
        if lineno == 1 and line.startswith("\ufeff"):  # a UTF-8 byte-order mark (Windows)
            line = line[1:]
        line = line.strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line, parse_constant=_refuse_constant, object_pairs_hook=unique_keys)
        except json.JSONDecodeError as exc:
            raise InputError(f"malformed JSON ({exc.msg} at column {exc.colno})",
                             source=where) from None
        except ValueError as exc:  # NaN / Infinity, which JSON does not allow
            raise InputError(f"malformed JSON ({exc})", source=where) from None
        except RecursionError:
            raise InputError("malformed JSON (nested too deeply)", source=where) from None
        if not isinstance(obj, dict):
            raise InputError("each line must be a JSON object", source=where)
        bools = "true" in line or "false" in line
        arrival = _int_field(obj, "arrival_time_ns", where, required=False)
        if "sub_requests" in obj:
            subs = obj["sub_requests"]
            if not isinstance(subs, list) or not subs:
                raise InputError("field 'sub_requests' must be a non-empty list", source=where)
            sid = _session_id(obj, lineno, where, sessions)
            prev = None
            for k, sub in enumerate(subs):
                sw = f"{where}: sub_requests[{k}]"
                if not isinstance(sub, dict):
                    raise InputError("must be an object", source=sw)
                req = _make_request(sub, rid, arrival if k == 0 else -1, sw, sid, k, bools)
                rid += 1
                if prev is None:
                    requests.append(req)
                else:
                    prev.next_sub = req
                prev = req
        else:
            requests.append(_make_request(obj, rid, arrival, where, may_hold_bools=bools))
            rid += 1
    if not requests:
        raise InputError("workload has no requests", source=source)
    requests.sort(key=lambda r: (r.arrival_ns, r.rid))
    return Workload(requests, source=source)


def load_jsonl(path: str | Path, limit: int | None = None) -> Workload:
    """Load a JSONL workload; ``limit`` keeps the first N entries (sessions count as one)."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as fh:
            return parse_jsonl_lines(fh, str(path), limit)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (undecodable byte {exc.object[exc.start]:#04x}); "
                         "a workload is a JSONL text file", source=str(path)) from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(f"cannot read workload: {getattr(exc, 'strerror', None) or exc}",
                         source=str(path)) from None


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
        import numpy as np

        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind in ("uniform", "zipf") and self.low > self.high:
            raise InputError(f"{which}: low ({self.low}) must be <= high ({self.high})")
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n)
        if self.kind == "zipf":
            if not self.theta > 0:  # (NaN too)
                raise InputError(f"{which}: zipf theta must be > 0, got {self.theta}")
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
    if spec.num_requests > MAX_GENERATED:
        raise InputError(f"num_requests must be <= {MAX_GENERATED:,}, got {spec.num_requests}")
    import numpy as np  # generators only: a replay of a JSONL file does not import it

    try:
        rng = np.random.default_rng(spec.seed)
    except (TypeError, ValueError):
        raise InputError(f"seed must be an integer >= 0, got {spec.seed!r}") from None
    n = spec.num_requests
    if spec.concurrency > 0:
        arrivals = np.zeros(n)
    else:
        if not spec.rate > 0:  # (NaN too)
            raise InputError(f"arrival rate must be > 0, got {spec.rate}")
        if spec.arrival == "poisson":
            gaps = rng.exponential(1.0 / spec.rate, size=n)
        elif spec.arrival == "gamma":
            if not spec.cv > 0:
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


#: generated requests live in memory: more than this is a typo, not a workload
MAX_GENERATED = 10_000_000
_LENGTH_KINDS = ("fixed", "uniform", "zipf", "file")
_SPEC_KEYS = ("num_requests", "arrival", "rate", "cv", "input", "output", "seed",
              "concurrency", "sample_file")


def _spec_num(d: dict, key: str, default, source: str, *, integer: bool, low: float,
              exclusive: bool = False):
    """A finite number >= low (> low when exclusive) from a spec mapping, or InputError."""
    v = d.get(key, default)
    if v is None:
        v = default
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (integer and int(v) != v):
        raise InputError(f"field {key!r} must be {kind}, got {v!r}", source=source)
    if v < low or (exclusive and v == low):
        raise InputError(f"field {key!r} must be {'>' if exclusive else '>='} {low}, got {v!r}",
                         source=source)
    if v > _MAX_INT:
        raise InputError(f"field {key!r} must be < 2**63, got {v!r}", source=source)
    return int(v) if integer else float(v)


def _length_dist(key: str, v: Any, default: LengthDist, source: str) -> LengthDist:
    """Validate one length distribution (``input`` or ``output``) of a generator spec."""
    where = f"{source}: {key}"
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool):
        v = {"kind": "fixed", "value": v}
    if not isinstance(v, dict):
        raise InputError(f"field {key!r} must be an integer length >= 1 or a mapping "
                         "{kind, value, low, high, theta, path}", source=source)
    allowed = {"kind", "value", "low", "high", "theta", "path"}
    bad = set(v) - allowed
    if bad:
        raise InputError(f"{key}: unknown field(s) {sorted(map(str, bad))}; allowed: "
                         f"{sorted(allowed)}", source=source)
    kind = v.get("kind", "fixed")
    if kind not in _LENGTH_KINDS:
        raise InputError(f"{key}.kind: unknown {kind!r}; known: {', '.join(_LENGTH_KINDS)}",
                         source=source)
    d = LengthDist(kind=kind)
    need = {"fixed": ("value",), "uniform": ("low", "high"), "zipf": ("low", "high")}
    missing = [k for k in need.get(kind, ()) if v.get(k) is None]
    if missing:  # no silent default length (a bare mapping gave 128, an absent field 512)
        raise InputError(f"{key}: a {kind} length needs {' and '.join(map(repr, missing))}",
                         source=source)
    if kind == "fixed":
        d.value = _spec_num(v, "value", 128, where, integer=True, low=1)
        _check_len(d.value, "value", where)
    elif kind in ("uniform", "zipf"):
        d.low = _spec_num(v, "low", 1, where, integer=True, low=1)
        d.high = _spec_num(v, "high", 1024, where, integer=True, low=1)
        _check_len(d.high, "high", where)
        if d.low > d.high:
            raise InputError(f"low ({d.low}) must be <= high ({d.high})", source=where)
        if kind == "zipf":
            if d.high - d.low > 10_000_000:
                raise InputError("zipf range high - low must be <= 10,000,000", source=where)
            d.theta = _spec_num(v, "theta", 1.1, where, integer=False, low=0, exclusive=True)
    else:
        if not isinstance(v.get("path"), str) or not v["path"]:
            raise InputError("a 'file' length distribution needs 'path' (a JSONL workload)",
                             source=where)
        d.path = v["path"]
        try:  # validated now, not when a trial first samples from it
            load_jsonl(d.path)
        except InputError as exc:
            raise InputError(f"path: {exc}", source=where) from None
    return d


def _check_len(n: int, key: str, where: str) -> None:
    if n > MAX_LEN:
        raise InputError(f"field {key!r} must be <= {MAX_LEN} (vLLM's max_model_len is an "
                         f"int32), got {n}", source=where)


#: the most seconds a generated workload may span on average (num_requests / rate): the
#: run's time series keeps one row per second of it (sim.validate.MAX_SERIES_BUCKETS)
MAX_SPAN_S = 10_000_000


def workload_from_mapping(d: dict[str, Any], source: str = "<workload spec>") -> WorkloadSpec:
    """Build and validate a WorkloadSpec from a YAML/JSON mapping (used by the CLI and the
    search). Every field is checked here, so ``generate`` cannot fail on the spec later."""
    if not isinstance(d, dict):
        raise InputError("a workload spec must be a mapping", source=source)
    bad = [k for k in d if k not in _SPEC_KEYS]
    if bad:
        raise InputError(f"unknown field {bad[0]!r}; allowed: {', '.join(_SPEC_KEYS)}",
                         source=source)
    arrival = d.get("arrival", "poisson")
    if arrival not in ("poisson", "gamma"):
        raise InputError(f"field 'arrival' must be poisson or gamma, got {arrival!r}",
                         source=source)
    sample_file = d.get("sample_file")
    if sample_file is not None:
        if not isinstance(sample_file, str) or not sample_file:
            raise InputError("field 'sample_file' must be a path to a JSONL workload",
                             source=source)
        try:
            load_jsonl(sample_file)
        except InputError as exc:
            raise InputError(f"field 'sample_file': {exc}", source=source) from None
    num_requests = _spec_num(d, "num_requests", 100, source, integer=True, low=1)
    if num_requests > MAX_GENERATED:
        raise InputError(f"field 'num_requests' must be <= {MAX_GENERATED:,}, got "
                         f"{num_requests}", source=source)
    rate = _spec_num(d, "rate", 10.0, source, integer=False, low=0, exclusive=True)
    if num_requests / rate > MAX_SPAN_S and not d.get("concurrency"):
        raise InputError(f"field 'rate' {rate:g} spreads {num_requests} requests over "
                         f"{num_requests / rate:.3g} s; allowed: num_requests / rate <= "
                         f"{MAX_SPAN_S:,} s (116 days), i.e. rate >= "
                         f"{num_requests / MAX_SPAN_S:g}", source=source)
    return WorkloadSpec(
        num_requests=num_requests,
        arrival=arrival,
        rate=rate,
        cv=_spec_num(d, "cv", 1.0, source, integer=False, low=0, exclusive=True),
        input=_length_dist("input", d.get("input"), LengthDist("fixed", 512), source),
        output=_length_dist("output", d.get("output"), LengthDist("fixed", 128), source),
        seed=_spec_num(d, "seed", 0, source, integer=True, low=0),
        concurrency=_spec_num(d, "concurrency", 0, source, integer=True, low=0),
        sample_file=sample_file)
