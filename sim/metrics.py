"""Run results: per-request table, summary statistics and the per-interval time series.

Kept apart from the simulation: the engine records plain numbers, and this module turns
them into tables and JSON at the end. pandas is imported only when a DataFrame is asked
for: the CLI writes its CSVs with the csv module, and the summary statistics are computed
in plain Python (:func:`stats_ms`, numerically the same as numpy's), so `llmsim run` pays
neither pandas' nor numpy's import time.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

from sim.errors import InputError
from sim.request import COMPILED, Request

if TYPE_CHECKING:
    import pandas as pd
    # (an annotation only: compiled, a machine integer; as Python, never evaluated)
    from mypy_extensions import i64

REQUEST_COLUMNS = ("request_id", "instance_id", "session_id", "sub_request_index", "arrival_ns",
                   "first_token_ns", "last_token_ns", "input_tokens", "output_tokens", "ttft_ns",
                   "tpot_ns", "latency_ns", "queueing_ns", "prefix_hit_tokens",
                   "prefix_hit_tokens_lower_tier", "preemptions", "itl_max_ns",
                   "prefill_instance_id", "kv_transfer_ns")
TIMESERIES_COLUMNS = ("t_s", "prompt_tps", "gen_tps", "running", "waiting", "kv_usage")
PERCENTILES = (50, 90, 95, 99)


def _sum_loop(values, start: float) -> float:
    """``start`` plus each of ``values`` in turn, rounded after each addition."""
    for x in values:
        start += x
    return start


#: ``_sum_loop``, done by builtin ``sum`` where it adds floats one by one in order (before
#: Python 3.12, which compensates the rounding: other bits than numpy's)
_sum_in_order = sum if sys.version_info < (3, 12) else _sum_loop


def _pairwise_sum(a: list[float], lo: int, n: int) -> float:
    """Sum of ``a[lo:lo + n]`` added in numpy's order (its pairwise summation of float64:
    blocks of at most 128 summed in 8 interleaved lanes), so that it is bit for bit
    ``np.add.reduce``'s result."""
    if n < 8:
        return _sum_in_order(a[lo:lo + n], 0.0)
    if n <= 128:
        end = lo + n - n % 8
        r = [_sum_in_order(a[i + 8:end:8], a[i]) for i in range(lo, lo + 8)]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        return _sum_in_order(a[end:lo + n], res)
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, lo, n2) + _pairwise_sum(a, lo + n2, n - n2)


class _RunReader:
    """The values of runs (``values[k]`` repeated ``counts[k]`` times) summed in numpy's
    pairwise order (``_pairwise_sum``) without expanding them. The pairwise sum takes its
    blocks of at most 128 values left to right; a block's lane j adds the values at
    positions j, j + 8, ... in turn, which are read from the runs they fall in."""

    def __init__(self, values: list[float], counts: list[int]) -> None:
        self.values = values
        self.counts = counts
        self.run = 0  # the run the next value is in
        self.used = 0  # values of that run already read

    def sum(self, n: int) -> float:
        """``_pairwise_sum`` of the next ``n`` values."""
        if n > 128:
            n2 = n // 2
            n2 -= n2 % 8
            left = self.sum(n2)  # (in order: the left half's values come first)
            return left + self.sum(n - n2)
        values, counts = self.values, self.counts
        run0, used0 = self.run, self.used
        res = 0.0
        start: i64 = 0  # the first position added to res one by one
        k: i64
        end: i64
        p: i64
        if n >= 8:
            start = n - n % 8
            lanes = [0.0] * 8
            for j in range(8):
                # -0.0 + x is x for every x: the lane starts at its first value
                acc = -0.0
                k = run0
                end = counts[k] - used0  # (block position where run k ends)
                v = values[k]
                p = j
                while p < start:
                    while p >= end:
                        k += 1
                        end += counts[k]
                        v = values[k]
                    acc += v
                    p += 8
                lanes[j] = acc
            res = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + (
                (lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
        # the positions past the lanes, in order; then move past the block
        k = run0
        end = counts[k] - used0
        p = 0
        while p < n:
            while p >= end:
                k += 1
                end += counts[k]
            if p >= start:
                res += values[k]
            p += 1 if p >= start else start - p
        self.run, self.used = k, counts[k] - (end - n)
        if self.used == counts[k] and k + 1 < len(counts):
            self.run, self.used = k + 1, 0
        return res


def _percentile(s: list, q: float) -> float:
    """numpy's default ('linear') percentile ``q`` of the sorted ``s``, in ms from ns."""
    return _percentile_at(s.__getitem__, len(s), q)


def stats_ms(values_ns, use_numpy: bool | None = None) -> dict[str, float]:
    """Mean and percentiles in ms of values in ns: the numbers ``np.mean`` and
    ``np.percentile`` give for the values as float64 divided by 1e6, computed without numpy
    (whose import costs a `llmsim run` more than these few statistics) unless
    ``use_numpy`` (default: from NUMPY_FROM values on)."""
    if not isinstance(values_ns, list):
        values_ns = list(values_ns)
    if not values_ns:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    if use_numpy or (use_numpy is None and len(values_ns) >= NUMPY_FROM):
        return _stats_numpy(values_ns)
    ms = [v / 1e6 for v in values_ns]
    mean = (0.0 + _pairwise_sum(ms, 0, len(ms))) / len(ms)
    # x -> x / 1e6 is monotone, so the values sort as their ms do
    s = sorted(values_ns)
    return {"mean": mean, **{f"p{p}": _percentile(s, p) for p in PERCENTILES}}


def _stats_numpy(values: list, counts: list[int] | None = None) -> dict[str, float]:
    """``stats_ms`` through numpy (the same bits): of ``values``, or of each ``values[k]``
    repeated ``counts[k]`` times (in that order)."""
    import numpy as np

    if counts is None:
        v = np.asarray(values)
        ms = v / 1e6
        sv = np.sort(v)

        def at(i: int):
            return sv[i].item()
    else:
        # (gaps are integer ns: read as such, faster than np.asarray finds their type)
        v = np.fromiter(values, dtype=np.int64, count=len(values))
        c = np.fromiter(counts, dtype=np.int64, count=len(counts))
        ms = np.repeat(v / 1e6, c)
        # (equal values may come in any order: the i-th smallest is the same)
        order = np.argsort(v)
        sv = v[order]
        ends = np.cumsum(c[order])

        def at(i: int):  # the i-th smallest
            return sv[int(np.searchsorted(ends, i, side="right"))].item()
    n = len(ms)
    return {"mean": (0.0 + float(np.add.reduce(ms))) / n,
            **{f"p{p}": _percentile_at(at, n, p) for p in PERCENTILES}}


#: values from which statistics are computed with numpy (its import costs less than the
#: pure-Python pairwise sum and sort beyond this; both give the same bits)
NUMPY_FROM = 300_000


class GapRuns:
    """Inter-token gaps (ns) in the order they occur, run-length encoded: ``values[k]``
    repeated ``counts[k]`` times. A step gives most of its requests the same gap (each
    step of an event leap gives all of them one), so runs are long; the order is kept
    because the mean is summed in numpy's (pairwise) order."""

    __slots__ = ("counts", "values")

    def __init__(self) -> None:
        self.values: list[int] = []
        self.counts: list[int] = []

    def __len__(self) -> int:
        return sum(self.counts)

    def add(self, gap: int, count: int = 1) -> None:
        values = self.values
        if values and values[-1] == gap:
            self.counts[-1] += count
        else:
            values.append(gap)
            self.counts.append(count)

    def expanded(self) -> list[int]:
        """Every gap, in order."""
        out: list[int] = []
        for v, c in zip(self.values, self.counts):
            out += [v] * c
        return out

    def stats_ms(self, use_numpy: bool | None = None) -> dict[str, float]:
        """``stats_ms`` of the expanded gaps, without expanding them for the percentiles."""
        values, counts = self.values, self.counts
        n = sum(counts)
        if not n:
            return stats_ms([])
        if use_numpy or (use_numpy is None and n >= NUMPY_FROM):
            return _stats_numpy(values, counts)
        if COMPILED:  # (compiled, a loop over the runs; as Python, the builtins' passes)
            total = _RunReader([v / 1e6 for v in values], counts).sum(n)
        else:
            ms: list[float] = []
            for v, c in zip(values, counts):
                ms += [v / 1e6] * c
            total = _pairwise_sum(ms, 0, n)
        # the i-th smallest gap: the distinct gaps in order, with their counts through each
        per_gap: dict[int, int] = {}
        for v, c in zip(values, counts):
            per_gap[v] = per_gap.get(v, 0) + c
        sorted_values = sorted(per_gap)
        ends = list(accumulate([per_gap[v] for v in sorted_values]))

        def at(i: int) -> int:  # the i-th smallest gap
            return sorted_values[bisect_right(ends, i)]

        return {"mean": (0.0 + total) / n,
                **{f"p{p}": _percentile_at(at, n, p) for p in PERCENTILES}}


def _percentile_at(at, n: int, q: float) -> float:
    """``_percentile`` of n sorted values read through ``at(i)``."""
    vi = (n - 1) * (q / 100)
    lo = math.floor(vi)
    a = at(lo) / 1e6
    b = at(min(lo + 1, n - 1)) / 1e6
    g = vi - lo
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g


#: time-series rows a run may have (one per ``timeseries_interval_ns`` of simulated time,
#: idle stretches included): 10 million is 116 days at the default 1 s, ~2 GB to build;
#: a request at 2**62 ns would have taken hours (arrivals are checked against it before
#: the run, sim.validate.check_span; the clock itself while it runs, TimeSeries)
MAX_SERIES_BUCKETS = 10_000_000


def _approx(n: int) -> str:
    """``n`` to 4 significant digits, also past a float's range (a clock of 1e400 ns)."""
    return f"{n:.4g}" if n < 10**300 else f"{int(str(n)[:2]) / 10:.1f}e+{len(str(n)) - 1}"


def series_overflow(t_ns: int, interval_ns: int) -> InputError:
    """The error for a simulated clock past the time series' rows: the cluster is so slow
    that serving the workload takes months of simulated time."""
    need = t_ns // (MAX_SERIES_BUCKETS * 10**9) + 1  # whole seconds a row
    rows = t_ns // interval_ns + 1
    rows_text = f"{rows:,}" if rows < 10**12 else _approx(rows)
    # (--timeseries-interval-s allows up to 1e9 s a row)
    hint = f" (or give --timeseries-interval-s {need} or more)" if need <= 10**9 else ""
    return InputError(
        f"the simulated clock reached {_approx(t_ns // 10**9)} s "
        f"({_approx(t_ns // 86400_000_000_000)} days): the "
        f"time series would need {rows_text} rows of {interval_ns / 1e9:g} s; allowed: at "
        f"most {MAX_SERIES_BUCKETS:,}. No real run is that slow: check the cluster's "
        "link_bw/link_latency and npu_mem, and the hardware's peak_tflops/mem_bw" + hint)


@dataclass
class TimeSeries:
    """Buckets of ``interval_ns``: tokens per bucket, and the last-seen queue/KV state."""

    interval_ns: int
    prompt: list[int] = field(default_factory=list)
    gen: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    kv: list[float] = field(default_factory=list)
    #: power columns (W per bucket) when the cluster models power
    power: dict[str, list[float]] = field(default_factory=dict)

    def _extend_to(self, b: int) -> None:
        """Buckets up to ``b``: no tokens, the last-seen state carried over."""
        if b >= MAX_SERIES_BUCKETS:
            raise series_overflow(b * self.interval_ns, self.interval_ns)
        while len(self.prompt) <= b:
            self.prompt.append(0)
            self.gen.append(0)
            self.running.append(self.running[-1] if self.running else 0)
            self.waiting.append(self.waiting[-1] if self.waiting else 0)
            self.kv.append(self.kv[-1] if self.kv else 0.0)

    def record_decode_steps(self, times_ns: list[int], gen: int, running: int, waiting: int,
                            kv_at, lo: int = 0, n: int | None = None) -> None:
        """``record(t, 0, gen, running, waiting, kv_at(k))`` for each ``t = times_ns[k]``
        (increasing; ``k`` from ``lo`` up to ``n``, default all), a bucket at a time: its
        tokens added at once, its state the last."""
        interval = self.interval_ns
        if n is None:
            n = len(times_ns)
        while lo < n:
            b = times_ns[lo] // interval
            hi = bisect_left(times_ns, (b + 1) * interval, lo, n)
            if len(self.prompt) <= b:
                self._extend_to(b)
            self.gen[b] += gen * (hi - lo)
            self.running[b] = running
            self.waiting[b] = waiting
            self.kv[b] = kv_at(hi - 1)
            lo = hi

    def set_state_at(self, t_ns: int, running: int | None = None, waiting: int | None = None,
                     kv: float | None = None) -> None:
        """The state (those given) that the record at ``t_ns`` leaves, set after the
        records: in its bucket and the ones after it, which carry it over (a record after
        it is then given its own)."""
        b = t_ns // self.interval_ns
        n = len(self.prompt) - b
        if running is not None:
            self.running[b:] = [running] * n
        if waiting is not None:
            self.waiting[b:] = [waiting] * n
        if kv is not None:
            self.kv[b:] = [kv] * n

    def record(self, t_ns: int, prompt: int, gen: int, running: int, waiting: int, kv: float) -> None:
        b = t_ns // self.interval_ns
        if len(self.prompt) <= b:
            self._extend_to(b)
        self.prompt[b] += prompt
        self.gen[b] += gen
        self.running[b] = running
        self.waiting[b] = waiting
        self.kv[b] = kv

    def columns(self) -> dict[str, list]:
        """The time series as named columns of equal length."""
        sec = self.interval_ns / 1e9
        n = max([len(self.prompt)] + [len(v) for v in self.power.values()])

        def pad(v, fill):
            return list(v) + [fill] * (n - len(v))

        cols = {
            "t_s": [(i + 1) * sec for i in range(n)],
            "prompt_tps": pad([p / sec for p in self.prompt], 0.0),
            "gen_tps": pad([g / sec for g in self.gen], 0.0),
            "running": pad(self.running, self.running[-1] if self.running else 0),
            "waiting": pad(self.waiting, self.waiting[-1] if self.waiting else 0),
            "kv_usage": pad(self.kv, self.kv[-1] if self.kv else 0.0),
        }
        for name, values in self.power.items():
            cols[name] = pad(values, 0.0)
        return cols

    def table(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.columns())


@dataclass
class RunResult:
    requests: list[Request]
    summary: dict
    timeseries: TimeSeries

    def request_rows(self) -> list[tuple]:
        """One tuple per request in REQUEST_COLUMNS order, sorted by request id. A time a
        request never reached (refused at arrival, still running when the simulation
        stopped, or a session turn never sent after an earlier one was refused) is None,
        and so is every latency measured to it: an empty field in the CSV, NaN in a
        DataFrame, never ``-1 - arrival``."""
        rows = []
        for r in self.requests:
            first, last, arrival = r.first_token_ns, r.last_token_ns, r.arrival_ns
            ttft: int | None = first - arrival if first >= 0 else None
            tpot: int | None
            latency: int | None
            if r.finish_ns >= 0:
                tpot = (last - first) // max(1, r.num_output - 1)
                latency = last - arrival
            else:
                tpot = latency = None
            queueing = r.first_scheduled_ns - arrival if r.first_scheduled_ns >= 0 else None
            rows.append((r.rid, r.instance_id, r.session_id, r.sub_index,
                         arrival if arrival >= 0 else None,  # a session turn never sent
                         first if first >= 0 else None, last if last >= 0 else None,
                         r.input_len, r.num_output, ttft, tpot, latency, queueing,
                         r.prefix_hit, r.lower_hit, r.preemptions, r.itl_max_ns,
                         r.prefill_instance, r.kv_transfer_ns))
        rows.sort(key=lambda row: row[0])  # stable: equal ids keep their order
        return rows

    def requests_table(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.request_rows(), columns=list(REQUEST_COLUMNS))

    def timeseries_table(self) -> pd.DataFrame:
        return self.timeseries.table()

    def write(self, output_csv: str | Path | None, summary_json: str | Path | None = None,
              timeseries_csv: str | Path | None = None) -> None:
        for p in (output_csv, summary_json, timeseries_csv):
            if p:
                Path(p).parent.mkdir(parents=True, exist_ok=True)
        if output_csv:
            _write_csv(output_csv, REQUEST_COLUMNS, self.request_rows())
        if summary_json:
            Path(summary_json).write_text(
                json.dumps(json_safe(self.summary), indent=2, default=str) + "\n")
        if timeseries_csv:
            cols = self.timeseries.columns()
            _write_csv(timeseries_csv, list(cols), zip(*cols.values()))


def json_safe(obj):
    """``obj`` with every NaN or infinite float as None: a statistic over no values (no
    request finished, every output one token) is ``null`` in a JSON file, as JSON has no
    NaN (``json.dumps`` would write the bare word ``NaN``, which strict parsers refuse)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _write_csv(path: str | Path, header, rows) -> None:
    """Write rows as pandas' ``to_csv(index=False)`` would: None as an empty field."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def summarize(requests: list[Request], itl_ns: GapRuns | list[int], sim_end_ns: int, wall_s: float,
              preemptions: int, hit_tokens: int, queried_tokens: int) -> dict:
    done = [r for r in requests if r.finish_ns >= 0]
    ttft = [r.first_token_ns - r.arrival_ns for r in done]
    # TPOT is undefined for single-token outputs; they are left out (as vLLM's benchmark does).
    tpot = [(r.last_token_ns - r.first_token_ns) / (r.num_output - 1) for r in done
            if r.num_output > 1]
    lat = [r.last_token_ns - r.arrival_ns for r in done]
    # From the QUEUED event instead of arrival: what vLLM's per-request timestamps
    # (queued_ts, first_token_ts, last_token_ts) give, without the wait for the engine
    # to read its input between steps.
    queued = [r.queued_ns if r.queued_ns >= 0 else r.arrival_ns for r in done]
    engine_ttft = [r.first_token_ns - q for r, q in zip(done, queued)]
    engine_lat = [r.last_token_ns - q for r, q in zip(done, queued)]
    start = min((r.arrival_ns for r in requests), default=0)
    span_s = max(1e-9, (sim_end_ns - start) / 1e9)
    prompt = sum(r.input_len for r in done)
    gen = sum(r.num_output for r in done)
    sessions: dict[str, list[Request]] = {}
    for r in done:
        if r.session_id is not None:
            sessions.setdefault(r.session_id, []).append(r)
    session_e2e = [max(x.last_token_ns for x in rs) - min(x.arrival_ns for x in rs)
                   for rs in sessions.values()]
    # numpy where the values to summarise are many enough to pay for its import
    big = len(itl_ns) + 6 * len(done) >= NUMPY_FROM

    def stats(values):
        return stats_ms(values, big)

    return {
        "num_requests": len(requests),
        "num_sessions": len(sessions),
        "session_e2e_ms": stats(session_e2e) if sessions else None,
        "num_finished": len(done),
        "simulated_s": sim_end_ns / 1e9,
        "wall_s": wall_s,
        "speedup_vs_real_time": (sim_end_ns / 1e9) / wall_s if wall_s > 0 else None,
        "throughput_rps": len(done) / span_s,
        "prompt_tps": prompt / span_s,
        "gen_tps": gen / span_s,
        "ttft_ms": stats(ttft),
        "tpot_ms": stats(tpot),
        "itl_ms": itl_ns.stats_ms(big) if isinstance(itl_ns, GapRuns) else stats(itl_ns),
        "latency_ms": stats(lat),
        "engine_ttft_ms": stats(engine_ttft),
        "engine_latency_ms": stats(engine_lat),
        "preemptions": preemptions,
        "prefix_hit_tokens": hit_tokens,
        "prefix_hit_ratio": hit_tokens / queried_tokens if queried_tokens else 0.0,
    }
