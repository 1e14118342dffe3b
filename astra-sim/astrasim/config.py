"""Input configurations in ASTRA-Sim's own formats: network.yml, system.json, memory json.

Units: bandwidths in GB/s where 1 GB/s = 2^30 bytes per 1e9 ns (ASTRA-Sim's analytical
backend convention), i.e. ``bytes_per_ns = GBps * 2**30 / 1e9``; latencies and delays in
ns (= cycles); peak-perf in TFLOPS.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A malformed or inconsistent configuration file (message names file and field)."""


def gbps_to_bytes_per_ns(gbps: float) -> float:
    return gbps * (1 << 30) / 1e9


# canonical topology names (upstream spelling) by lower-case alias
TOPOLOGIES = {"ring": "Ring", "fullyconnected": "FullyConnected", "switch": "Switch"}
# canonical collective implementation names by lower-case alias
IMPLEMENTATIONS = {"ring": "ring", "direct": "direct", "halvingdoubling": "halvingDoubling",
                   "doublebinarytree": "doubleBinaryTree"}
#: most chunks one collective may be cut into (each is simulated as its own events: 2**62
#: never finished)
MAX_SPLITS = 1 << 20
MEMORY_TYPES = ("NO_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION",
                "PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL")


def _num(v: Any, where: str, *, positive=False, nonneg=False, integer=False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) \
            or abs(v) > 2**63 or not math.isfinite(v):
        raise ConfigError(f"{where}: expected a finite number below 2**63, got {v!r}")
    if integer and v != int(v):
        raise ConfigError(f"{where}: expected an integer, got {v!r}")
    if positive and v <= 0:
        raise ConfigError(f"{where}: must be > 0, got {v!r}")
    if nonneg and v < 0:
        raise ConfigError(f"{where}: must be >= 0, got {v!r}")
    return int(v) if integer else float(v)


@dataclass(frozen=True)
class Dim:
    """One network dimension: topology, NPU count, link bandwidth (GB/s), latency (ns)."""

    topology: str
    npus: int
    bandwidth: float
    latency: float

    @property
    def bytes_per_ns(self) -> float:
        return gbps_to_bytes_per_ns(self.bandwidth)

    def hops(self, distance: int) -> int:
        """Hops between two NPUs ``distance`` positions apart in this dimension."""
        if distance % self.npus == 0:
            return 0
        if self.topology == "Ring":
            d = distance % self.npus
            return min(d, self.npus - d)
        if self.topology == "FullyConnected":
            return 1
        return 2  # Switch: NPU -> switch -> NPU


@dataclass(frozen=True)
class Network:
    """A multi-dimensional network; dimension 0 varies fastest in the NPU id."""

    dims: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if not self.dims:
            raise ConfigError("network: at least one dimension is required")

    @property
    def num_npus(self) -> int:
        return math.prod(d.npus for d in self.dims)

    @property
    def ndims(self) -> int:
        return len(self.dims)

    def coords(self, npu: int) -> tuple[int, ...]:
        out = []
        for d in self.dims:
            out.append(npu % d.npus)
            npu //= d.npus
        return tuple(out)

    def npu_id(self, coords) -> int:
        npu, stride = 0, 1
        for c, d in zip(coords, self.dims):
            npu += c * stride
            stride *= d.npus
        return npu

    @classmethod
    def build(cls, topology, npus_count, bandwidth, latency, *, source="network") -> Network:
        """From the four parallel lists of ASTRA-Sim's network.yml."""
        lists = {"topology": topology, "npus_count": npus_count, "bandwidth": bandwidth,
                 "latency": latency}
        for k, v in lists.items():
            if not isinstance(v, (list, tuple)) or not v:
                raise ConfigError(f"{source}: field '{k}' must be a non-empty list, got {v!r}")
        n = len(topology)
        for k, v in lists.items():
            if len(v) != n:
                raise ConfigError(f"{source}: field '{k}' has {len(v)} entries but 'topology' "
                                  f"has {n} (one per dimension)")
        dims = []
        for i in range(n):
            t = topology[i]
            canon = TOPOLOGIES.get(str(t).lower()) if isinstance(t, str) else None
            if canon is None:
                raise ConfigError(f"{source}: field 'topology'[{i}]: unknown topology {t!r}; "
                                  f"known: {', '.join(TOPOLOGIES.values())}")
            npus = _num(npus_count[i], f"{source}: field 'npus_count'[{i}]", positive=True,
                        integer=True)
            bw = _num(bandwidth[i], f"{source}: field 'bandwidth'[{i}]", positive=True)
            lat = _num(latency[i], f"{source}: field 'latency'[{i}]", nonneg=True)
            dims.append(Dim(canon, npus, bw, lat))
        return cls(tuple(dims))

    @classmethod
    def from_dict(cls, d: dict, *, source="network") -> Network:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a mapping with topology, npus_count, "
                              f"bandwidth, latency")
        for k in ("topology", "npus_count", "bandwidth", "latency"):
            if k not in d:
                raise ConfigError(f"{source}: missing field '{k}'")
        return cls.build(d["topology"], d["npus_count"], d["bandwidth"], d["latency"],
                         source=source)

    @classmethod
    def load(cls, path) -> Network:
        import yaml

        p = Path(path)
        text = _read_text(p, "network configuration", "a YAML")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{p}: not valid YAML{at}: {problem}") from None
        except (RecursionError, ValueError) as e:  # ValueError: an int of > 4300 digits
            raise ConfigError(f"{p}: not valid YAML: {e or 'nested too deeply'}") from None
        return cls.from_dict(data, source=str(p))


_IMPL_KEYS = {
    "all-reduce-implementation": "all_reduce_impl",
    "all-gather-implementation": "all_gather_impl",
    "reduce-scatter-implementation": "reduce_scatter_impl",
    "all-to-all-implementation": "all_to_all_impl",
}


@dataclass(frozen=True)
class SystemConfig:
    """The keys of ASTRA-Sim's system.json that this backend models (others are ignored)."""

    scheduling_policy: str = "LIFO"
    endpoint_delay: int = 10
    preferred_dataset_splits: int = 1
    active_chunks_per_dimension: int = 1
    #: per-dimension algorithms; None (the key absent) = ring on every dimension
    all_reduce_impl: tuple[str, ...] | None = None
    all_gather_impl: tuple[str, ...] | None = None
    reduce_scatter_impl: tuple[str, ...] | None = None
    all_to_all_impl: tuple[str, ...] | None = None
    collective_optimization: str = "localBWAware"
    local_mem_bw: float = 1600.0  # GB/s
    local_mem_latency: float = 0.0  # ns
    roofline_enabled: bool = False
    peak_perf: float = 900.0  # TFLOPS
    source: str = field(default="system", compare=False)

    @classmethod
    def from_dict(cls, d: dict, *, source="system") -> SystemConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        kw: dict[str, Any] = {"source": source}

        def where(k):
            return f"{source}: field '{k}'"

        if "scheduling-policy" in d:
            v = d["scheduling-policy"]
            if not isinstance(v, str) or v.upper() not in ("LIFO", "FIFO"):
                raise ConfigError(f"{where('scheduling-policy')}: must be LIFO or FIFO, got {v!r}")
            kw["scheduling_policy"] = v.upper()
        if "endpoint-delay" in d:
            kw["endpoint_delay"] = _num(d["endpoint-delay"], where("endpoint-delay"),
                                        nonneg=True, integer=True)
        for key, attr in (("preferred-dataset-splits", "preferred_dataset_splits"),
                          ("active-chunks-per-dimension", "active_chunks_per_dimension")):
            if key in d:
                kw[attr] = _num(d[key], where(key), positive=True, integer=True)
        if kw.get("preferred_dataset_splits", 1) > MAX_SPLITS:  # one event per chunk
            raise ConfigError(f"{where('preferred-dataset-splits')}: must be <= {MAX_SPLITS} "
                              f"(chunks per collective), got {kw['preferred_dataset_splits']}")
        for key, attr in _IMPL_KEYS.items():
            if key in d:
                v = d[key]
                if isinstance(v, str):
                    v = [v]
                if not isinstance(v, list) or not v:
                    raise ConfigError(f"{where(key)}: must be a non-empty list of algorithm "
                                      f"names, got {v!r}")
                out = []
                for i, name in enumerate(v):
                    canon = IMPLEMENTATIONS.get(str(name).lower())
                    if canon is None:
                        raise ConfigError(f"{where(key)}[{i}]: unknown implementation {name!r}; "
                                          f"known: {', '.join(IMPLEMENTATIONS.values())}")
                    out.append(canon)
                kw[attr] = tuple(out)
        if "collective-optimization" in d:
            v = d["collective-optimization"]
            canon = {"localbwaware": "localBWAware", "baseline": "baseline"}.get(str(v).lower())
            if canon is None:
                raise ConfigError(f"{where('collective-optimization')}: must be localBWAware "
                                  f"or baseline, got {v!r}")
            kw["collective_optimization"] = canon
        if "local-mem-bw" in d:
            kw["local_mem_bw"] = _num(d["local-mem-bw"], where("local-mem-bw"), positive=True)
        if "local-mem-latency" in d:
            kw["local_mem_latency"] = _num(d["local-mem-latency"], where("local-mem-latency"),
                                           nonneg=True)
        if "roofline-enabled" in d:
            v = d["roofline-enabled"]
            if v not in (0, 1, True, False):
                raise ConfigError(f"{where('roofline-enabled')}: must be 0 or 1, got {v!r}")
            kw["roofline_enabled"] = bool(v)
        if "peak-perf" in d:
            kw["peak_perf"] = _num(d["peak-perf"], where("peak-perf"), positive=True)
        return cls(**kw)

    @classmethod
    def load(cls, path) -> SystemConfig:
        p = Path(path)
        return cls.from_dict(_load_json(p, "system configuration"), source=str(p))

    def impl(self, comm: str, ndims: int) -> tuple[str, ...]:
        """Per-dimension implementations of ``comm``. As upstream's GeneralComplexTopology,
        a list shorter than the network covers its first dimensions only (the collective
        runs on those); the key absent means ring on every dimension."""
        v = getattr(self, f"{comm}_impl")
        if v is None:
            return ("ring",) * ndims
        key = next(k for k, a in _IMPL_KEYS.items() if a == f"{comm}_impl")
        if len(v) > ndims:
            raise ConfigError(f"{self.source}: field '{key}' has {len(v)} entries but the "
                              f"network has {ndims} dimensions")
        return v


@dataclass(frozen=True)
class MemoryConfig:
    """ASTRA-Sim's (remote) memory configuration plus optional local-memory overrides.

    MEM_LOAD / MEM_STORE nodes take ``latency + tensor_size / bandwidth``: the remote
    memory's ``remote-mem-latency`` / ``remote-mem-bw`` when ``memory-type`` is an
    expansion type, else the local memory's (``local-mem-latency`` / ``local-mem-bw`` from
    this file, falling back to the system configuration).
    """

    memory_type: str = "NO_MEMORY_EXPANSION"
    remote_mem_bw: float = 0.0  # GB/s
    remote_mem_latency: float = 0.0  # ns
    local_mem_bw: float | None = None
    local_mem_latency: float | None = None
    source: str = field(default="memory", compare=False)

    @classmethod
    def from_dict(cls, d: dict, *, source="memory") -> MemoryConfig:
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object")
        kw: dict[str, Any] = {"source": source}
        mt = d.get("memory-type", "NO_MEMORY_EXPANSION")
        if mt not in MEMORY_TYPES:
            raise ConfigError(f"{source}: field 'memory-type': unknown {mt!r}; known: "
                              f"{', '.join(MEMORY_TYPES)}")
        kw["memory_type"] = mt
        for key, attr, pos in (("remote-mem-bw", "remote_mem_bw", False),
                               ("remote-mem-latency", "remote_mem_latency", False),
                               ("local-mem-bw", "local_mem_bw", True),
                               ("local-mem-latency", "local_mem_latency", False)):
            if key in d:
                kw[attr] = _num(d[key], f"{source}: field '{key}'", nonneg=True, positive=pos)
        if mt != "NO_MEMORY_EXPANSION" and kw.get("remote_mem_bw", 0.0) <= 0:
            raise ConfigError(f"{source}: field 'remote-mem-bw' must be > 0 for memory-type {mt}")
        return cls(**kw)

    @classmethod
    def load(cls, path) -> MemoryConfig:
        p = Path(path)
        return cls.from_dict(_load_json(p, "memory configuration"), source=str(p))


def _read_text(p: Path, what: str, kind: str) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (undecodable byte {e.object[e.start]:#04x}); "
                          f"a {what} is {kind} text file") from None


def _load_json(p: Path, what: str) -> Any:
    text = _read_text(p, what, "a JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise ConfigError(f"{p}: not valid JSON ({e})") from None
