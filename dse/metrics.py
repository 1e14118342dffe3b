"""SLOs, objectives and Pareto fronts: pure functions of a run's summary and requests.

Constraint values follow Optuna's convention (feasible when <= 0) and are normalised so
NSGA-II's sum of violations compares like with like: an SLO on p99 TTFT of 200 ms gives
``p99_ttft / 200 - 1``; the attainment target gives ``(target - attained) / target``.
Every completed trial carries the same keys; a rejected configuration gets
:data:`REJECTED_VIOLATION` on each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dse.space import Space

REJECTED_VIOLATION = 1000.0
VALID_KEY = "config_valid"
_TABLE_COL = {"ttft": "ttft_ns", "tpot": "tpot_ns", "e2e": "latency_ns"}
_SUMMARY_KEY = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "latency_ms"}


def constraint_keys(space: Space) -> list[str]:
    keys = [VALID_KEY, *space.slo]
    if space.attainment is not None:
        keys.append("attainment")
    return keys


def slo_value(summary: dict, key: str) -> float:
    """The summary value an SLO key refers to, in ms (``p99_ttft_ms`` -> ttft_ms.p99)."""
    stat, metric, _ = key.split("_")
    block = summary.get(_SUMMARY_KEY[metric]) or {}
    v = block.get(stat)
    return float("nan") if v is None else float(v)


def good_mask(requests, space: Space) -> np.ndarray:
    """Per request: does it meet every per-request limit of slo.attainment?"""
    a = space.attainment
    n = len(requests)
    ok = np.ones(n, dtype=bool)
    if a is None or n == 0:
        return ok
    for metric, limit in (("ttft", a.ttft_ms), ("tpot", a.tpot_ms), ("e2e", a.e2e_ms)):
        if limit is None:
            continue
        col = np.asarray(requests[_TABLE_COL[metric]], dtype=float)
        bad = col > limit * 1e6
        if metric != "tpot":  # a 1-token output has no TPOT; no first token is a miss
            bad |= np.isnan(col)
        ok &= ~bad
    return ok


def evaluate_slos(summary: dict, requests, space: Space) -> dict[str, Any]:
    """Constraint values (normalised) plus attainment and good-token counts."""
    cons: dict[str, float] = {VALID_KEY: 0.0}
    for key, limit in space.slo.items():
        v = slo_value(summary, key)
        cons[key] = REJECTED_VIOLATION if math.isnan(v) else v / limit - 1.0
    mask = good_mask(requests, space)
    attained = float(mask.mean()) if len(mask) else 0.0
    if space.attainment is not None:
        t = space.attainment.target
        cons["attainment"] = (t - attained) / t
    good_tokens = float(np.asarray(requests["output_tokens"])[mask].sum()) if len(mask) else 0.0
    return {"constraints": cons, "attainment": attained, "good_output_tokens": good_tokens,
            "feasible": all(v <= 0 for v in cons.values())}


def rejected_constraints(space: Space) -> dict[str, float]:
    return {k: REJECTED_VIOLATION for k in constraint_keys(space)}


def price_per_hour(space: Space, hardware: str) -> float | None:
    if space.price_per_device_hour is not None:
        return space.price_per_device_hour
    return space.hw_info[hardware].price_per_hour_usd


def objective_values(space: Space, summary: dict, slo_eval: dict, devices: int,
                     hardware: str) -> dict[str, float | None]:
    """Every objective this run supports (None where the run lacks the data)."""
    sim_s = float(summary.get("simulated_s") or 0.0)
    gen_tps = float(summary.get("gen_tps") or 0.0)
    p = price_per_hour(space, hardware)
    total_out = gen_tps * sim_s
    energy = summary.get("energy_j")
    out = {
        "throughput_per_device": gen_tps / devices if devices else 0.0,
        "goodput_per_device": (slo_eval["good_output_tokens"] / sim_s / devices)
        if sim_s > 0 and devices else 0.0,
        "p99_ttft": slo_value(summary, "p99_ttft_ms"),
        "p99_tpot": slo_value(summary, "p99_tpot_ms"),
        "cost_per_million_tokens": (devices * p / 3600.0) / gen_tps * 1e6
        if p is not None and gen_tps > 0 else None,
        "energy_per_token": float(energy) / total_out if energy is not None and total_out > 0
        else None,
        "devices_used": float(devices),
        "avg_power": float(summary["avg_power_w"]) if summary.get("avg_power_w") else None,
        # latency lookups the provider's data did not cover (extrapolated): 0 is trustworthy
        "off_grid_lookups": float(summary.get("latency_off_grid_lookups") or 0),
    }
    return out


def penalty(direction: str) -> float:
    """What a rejected or unmeasurable trial reports for an objective (the worst end)."""
    return 0.0 if direction == "maximize" else 1e12


def told_values(space: Space, objectives: dict[str, float | None] | None) -> list[float]:
    vals = []
    for o in space.objectives:
        v = None if objectives is None else objectives.get(o.name)
        vals.append(penalty(o.direction) if v is None or not math.isfinite(v) else float(v))
    return vals


def pareto_mask(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    """Non-dominated rows of ``values`` (n x m) under the given directions."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=bool)
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    v = np.asarray(values, dtype=float) * sign  # all minimised now
    keep = np.ones(n, dtype=bool)
    for i in range(n):
        if not keep[i]:
            continue
        dominated_by = np.all(v <= v[i], axis=1) & np.any(v < v[i], axis=1)
        if dominated_by.any():
            keep[i] = False
    return keep


def flatten_summary(summary: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a (nested) summary as ``ttft_ms.p99`` -> value."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_summary(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[key] = float(v)
    return out


def latency_quantiles(requests, max_points: int = 400) -> dict[str, np.ndarray]:
    """TTFT and TPOT (ms, sorted; at most ``max_points`` quantiles each) of one trial's
    per-request table, as the report's distribution plot shows them (TPOT of requests
    with more than one output token)."""
    ttft = np.asarray(requests["ttft_ns"], dtype=float) / 1e6
    multi = np.asarray(requests["output_tokens"]) > 1
    tpot = np.asarray(requests["tpot_ns"], dtype=float)[multi] / 1e6
    return {"ttft_ms": _quantiles(ttft, max_points), "tpot_ms": _quantiles(tpot, max_points)}


def _quantiles(x: np.ndarray, n: int) -> np.ndarray:
    x = np.sort(x[np.isfinite(x)])
    if len(x) <= n:
        return x
    return np.quantile(x, np.linspace(0, 1, n))
