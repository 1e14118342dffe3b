"""The few entry points of ``sim`` that dse uses, resolved in one place.

dse only calls sim's public surface (``sim.parse_cluster``, ``sim.validate_cluster``,
``sim.simulate`` ...). Catalogue look-ups (models, hardware, routing policies) are read
through these helpers so the rest of dse never imports sim's submodules directly, and a
capability that sim gains shows up here without dse changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import sim
from sim.errors import InputError

__all__ = [
    "HardwareInfo",
    "InputError",
    "hardware_info",
    "known_hardware",
    "known_models",
    "latency_providers",
    "load_model",
    "parse_cluster",
    "routing_policies",
    "unsupported_features",
    "validate_cluster",
]


def _attr(name: str, module: str):
    fn = getattr(sim, name, None)
    if fn is None:
        import importlib

        fn = getattr(importlib.import_module(f"sim.{module}"), name)
    return fn


def parse_cluster(mapping: dict, source: str):
    return _attr("parse_cluster", "cluster")(mapping, source=source)


def unsupported_features(cluster) -> list[str]:
    """What sim says it cannot model in ``cluster`` (empty when everything is modelled)."""
    fn = getattr(sim, "unsupported_features", None)
    if fn is None:
        from sim import cluster as _c

        fn = _c.unsupported_features
    return list(fn(cluster))


def validate_cluster(cluster, options) -> None:
    fn = getattr(sim, "validate_cluster", None)
    if fn is None:  # sim without the API module yet: at least refuse what it cannot model
        problems = unsupported_features(cluster)
        if problems:
            raise InputError(problems[0])
        return
    fn(cluster, options)


def load_model(name: str, source: str | None = None):
    from sim import model as _m

    return _m.load_model(name, source=source)


def known_models() -> list[str]:
    from sim import model as _m

    return _m.known_models()


def known_hardware() -> list[str]:
    try:
        from sim import hardware as _h
    except ImportError:
        return []
    return sorted(_h.known_hardware())


def routing_policies() -> list[str] | None:
    """Names of sim's routing policies, or None when sim does not list them."""
    for modname in ("router", "routing"):
        try:
            import importlib

            mod = importlib.import_module(f"sim.{modname}")
        except ImportError:
            continue
        reg = getattr(mod, "ROUTING_POLICIES", None)
        if reg is not None:
            return list(reg.names())
    return None


def latency_providers() -> list[str]:
    from sim.latency.base import provider_names
    return provider_names()


@dataclass(frozen=True)
class HardwareInfo:
    """What dse needs to lay out a cluster on one accelerator type."""

    name: str
    mem_gib: float
    mem_bw_GBps: float
    link_bw_GBps: float | None
    link_latency_ns: float | None
    price_per_hour: float | None
    has_pim: bool
    power_idle_W: float | None = None
    power_tdp_W: float | None = None
    pim_config: str | None = None
    pim_mem_GiB: float | None = None


def _first(obj: Any, *names: str):
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


@cache
def hardware_info(name: str, source: str | None = None) -> HardwareInfo:
    """Read the hardware catalogue entry for ``name`` (raises InputError listing known)."""
    try:
        from sim import hardware as _h
    except ImportError:
        raise InputError(f"hardware {name!r}: the simulator's hardware catalogue "
                         "(sim.hardware) is not available", source=source) from None
    spec = _h.load_hardware(name) if source is None else _h.load_hardware(name, source=source)
    mem = _first(spec, "mem_size_GiB", "mem_size_gib", "memory_gib", "mem_size")
    if mem is None:
        cap = _first(spec, "memory_bytes", "mem_bytes")
        mem = cap / (1 << 30) if cap else None
    bw = _first(spec, "mem_bw_GBps", "memory_bw_GBps", "mem_bw", "memory_bandwidth_GBps")
    if mem is None or bw is None:
        raise InputError(f"hardware {name!r}: catalogue entry lacks memory size/bandwidth",
                         source=source)
    pim = getattr(spec, "pim_config", None) is not None
    return HardwareInfo(
        name=getattr(spec, "name", name), mem_gib=float(mem), mem_bw_GBps=float(bw),
        link_bw_GBps=_f(_first(spec, "link_bw_GBps", "link_bw", "interconnect_bw_GBps")),
        link_latency_ns=_f(_first(spec, "link_latency_ns", "link_latency")),
        price_per_hour=_f(_first(spec, "price_per_hour_usd", "price_per_hour",
                                 "price_per_device_hour")),
        has_pim=bool(pim),
        power_idle_W=_f(_first(spec, "power_idle_W")), power_tdp_W=_f(_first(spec, "power_tdp_W")),
        pim_config=getattr(spec, "pim_config", None),
        pim_mem_GiB=_f(getattr(spec, "pim_mem_GiB", None)))


def _f(v) -> float | None:
    return None if v is None else float(v)
