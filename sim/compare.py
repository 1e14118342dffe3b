"""``llmsim compare SIM REAL``: the error table of two benchmark results.

Each side is a ``vllm bench serve --save-result`` JSON (or ``llmsim bench``'s, which has the
same keys), or a real run's per-request JSONL as in the validation folders
(``input_toks, output_toks, queued_ts, first_token_ts, last_token_ts`` per line), whose
metrics are computed here the way vLLM's benchmark computes them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from sim.errors import MAX_NUMBER, InputError

#: the rows of the table, in order (those present on both sides are shown)
ROWS = ("completed", "duration", "request_throughput", "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
        "mean_tpot_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
        "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
        "mean_e2el_ms", "median_e2el_ms", "p90_e2el_ms", "p99_e2el_ms")


def _stats(prefix: str, values_ms: list[float]) -> dict[str, float]:
    a = np.asarray(values_ms, dtype=np.float64)
    if a.size == 0:
        return {}
    out = {f"mean_{prefix}_ms": float(a.mean()), f"median_{prefix}_ms": float(np.median(a)),
           f"std_{prefix}_ms": float(a.std())}
    for p in (90, 99):
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(a, p))
    return out


def metrics_from_requests(rows: list[dict], source: str) -> dict:
    """vLLM's aggregate keys from per-request timestamps (seconds)."""
    need = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
    for i, r in enumerate(rows, start=1):
        missing = [k for k in need if isinstance(r.get(k), bool)
                   or not isinstance(r.get(k), (int, float))]
        if missing:
            raise InputError(f"line {i}: missing or non-numeric {missing}; a per-request JSONL "
                             f"needs {', '.join(need)}", source=source)
        bad = [k for k in need if abs(r[k]) > 1e15 or not math.isfinite(r[k]) or r[k] < 0]
        if bad:
            raise InputError(f"line {i}: {bad} must be finite numbers >= 0 (timestamps in "
                             "seconds, token counts)", source=source)
        if r["first_token_ts"] < r["queued_ts"] or r["last_token_ts"] < r["first_token_ts"]:
            raise InputError(f"line {i}: timestamps must satisfy queued_ts <= first_token_ts "
                             "<= last_token_ts", source=source)
    if not rows:
        raise InputError("no requests", source=source)
    start = min(r["queued_ts"] for r in rows)
    end = max(r["last_token_ts"] for r in rows)
    duration = max(1e-9, end - start)
    total_in = sum(int(r["input_toks"]) for r in rows)
    total_out = sum(int(r["output_toks"]) for r in rows)
    out = {"completed": len(rows), "duration": duration,
           "request_throughput": len(rows) / duration,
           "output_throughput": total_out / duration,
           "total_token_throughput": (total_in + total_out) / duration}
    out |= _stats("ttft", [(r["first_token_ts"] - r["queued_ts"]) * 1e3 for r in rows])
    out |= _stats("tpot", [(r["last_token_ts"] - r["first_token_ts"]) * 1e3 / (r["output_toks"] - 1)
                           for r in rows if r["output_toks"] > 1])
    out |= _stats("e2el", [(r["last_token_ts"] - r["queued_ts"]) * 1e3 for r in rows])
    return out


def _parse_result_text(text: str, source: str):
    """The JSON document, or the list of a JSONL's objects; malformed lines named."""
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise InputError("malformed JSON (nested too deeply)", source=source) from None
    rows = []
    for lineno, line in enumerate(stripped.splitlines(), start=1):
        if not line.strip():
            continue
        try:  # one JSON object per line: a per-request JSONL
            rows.append(json.loads(line, parse_constant=_refuse_constant))
        except json.JSONDecodeError as exc:
            raise InputError(f"line {lineno}: malformed JSON/JSONL ({exc.msg} at column "
                             f"{exc.colno})", source=source) from None
        except ValueError as exc:
            raise InputError(f"line {lineno}: malformed JSON ({exc})", source=source) from None
        except RecursionError:
            raise InputError(f"line {lineno}: malformed JSON (nested too deeply)",
                             source=source) from None
    return rows


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_metrics(data: dict, source: str) -> None:
    """A result JSON's metrics are numbers (null or NaN, as vLLM writes for a metric with
    no samples, count as absent); every one is a count, a duration, a rate or a latency:
    finite and >= 0."""
    for k in ROWS:
        v = data.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise InputError(f"field {k!r} must be a number, got {v!r}", source=source)
        if isinstance(v, int) and abs(v) > 2**53:
            raise InputError(f"field {k!r} is out of range: {v}", source=source)
        out_of_range = (not math.isnan(v) and not 0 <= v <= MAX_NUMBER
                        if isinstance(v, float) else isinstance(v, int) and v < 0)
        if out_of_range:
            raise InputError(f"field {k!r} must be a finite number >= 0 (and <= 1e15), "
                             f"got {v!r}", source=source)


def load_result(path: str | Path) -> dict:
    """A result mapping from a bench JSON or a per-request JSONL."""
    from sim.errors import read_text_input

    path = Path(path)
    text = read_text_input(path, "a benchmark result", "a JSON or JSONL")
    data = _parse_result_text(text, str(path))
    if isinstance(data, dict) and "first_token_ts" in data:
        data = [data]
    if isinstance(data, list):
        if not all(isinstance(r, dict) for r in data):
            raise InputError("a per-request JSONL needs one object per line", source=str(path))
        return metrics_from_requests(data, str(path))
    if not isinstance(data, dict) or not any(k in data for k in ROWS):
        raise InputError("not a benchmark result: expected vLLM's keys (mean_ttft_ms, "
                         "request_throughput, ...) or a per-request JSONL", source=str(path))
    _check_metrics(data, str(path))
    return data


def compare(sim: dict, real: dict) -> list[tuple[str, float, float, float]]:
    """(metric, sim, real, relative error %) for every metric both sides have."""
    rows = []
    for k in ROWS:
        a, b = sim.get(k), real.get(k)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            continue
        err = (a - b) / b * 100.0 if b else math.nan
        rows.append((k, float(a), float(b), err))
    if not rows:
        raise InputError("the two results share no metric")
    return rows


def format_table(rows, sim_name: str = "sim", real_name: str = "real") -> str:
    lines = [f"{'metric':<26} {sim_name:>12} {real_name:>12} {'error %':>9}", "-" * 62]
    for k, a, b, err in rows:
        lines.append(f"{k:<26} {a:>12.2f} {b:>12.2f} {err:>+9.1f}")
    errs = [abs(e) for k, _, _, e in rows if k.startswith("mean_") and not math.isnan(e)]
    if errs:
        lines.append("-" * 62)
        lines.append(f"{'median |error| of means':<26} {'':>12} {'':>12} {np.median(errs):>9.1f}")
    return "\n".join(lines)


def compare_main(args) -> int:
    rows = compare(load_result(args.sim), load_result(args.real))
    print(format_table(rows, Path(args.sim).stem[:12], Path(args.real).stem[:12]))
    return 0
