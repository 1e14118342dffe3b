"""Accelerator specs: the project's hardware catalogue under ``profiles/hardware/``.

Each YAML file describes one device with the units in the field names (TFLOPS, GiB, GB/s,
ns, W). Names are looked up exactly, then by alias, then case-insensitively, so "H100",
"h100-sxm" and "H100-SXM" resolve to the same spec; the canonical names match the
profile-bundle folder names (``RTX4090``, ``RTXPRO6000``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sim.errors import MAX_NUMBER, InputError, unknown_name
from sim.paths import profiles_root
from sim.yamlio import load_yaml_files

REQUIRED_FIELDS = ("name", "peak_tflops", "mem_size_GiB", "mem_bw_GBps", "link_bw_GBps",
                   "link_latency_ns", "power_idle_W", "power_tdp_W")
# ModelSpec.dtype spellings -> the peak_tflops key that serves them.
_DTYPE_KEY = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
              "half": "fp16", "float32": "fp32", "fp32": "fp32", "fp8": "fp8", "float8": "fp8",
              "int8": "fp8"}


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    #: dense (no sparsity) peak tensor throughput per dtype key (bf16, fp16, fp8, fp32)
    peak_tflops: dict[str, float]
    mem_size_GiB: float
    mem_bw_GBps: float
    #: intra-node link, per direction
    link_bw_GBps: float
    link_latency_ns: float
    power_idle_W: float
    power_tdp_W: float
    kind: str = "gpu"
    vendor: str = ""
    link_type: str = ""
    compute_capability: str | None = None
    clock_GHz: float | None = None
    price_per_hour_usd: float | None = None
    aliases: tuple[str, ...] = field(default=())
    source: str = ""
    #: a PIM device (profiles/pim/<name>.ini) this system pairs with in host memory
    pim_config: str | None = None
    #: host memory per node for that PIM device, GiB
    pim_mem_GiB: float | None = None
    #: how ASTRA-Sim models the intra-node fabric (Switch: NVSwitch, PCIe via the host)
    link_topology: str = "Ring"
    #: the scale-out link between nodes (InfiniBand / RoCE NIC per GPU), per direction
    scale_out_type: str = ""
    scale_out_bw_GBps: float | None = None
    scale_out_latency_ns: float | None = None
    #: total device memory as CUDA reports it (torch.cuda.mem_get_info) for a card with
    #: mem_size_GiB; less than the nominal size (driver/firmware reservations). None = nominal.
    mem_reported_bytes: int | None = None
    #: streaming multiprocessors (CUDA's multi_processor_count); vLLM sizes per-SM buffers
    #: by it (the Triton top-k/top-p sampler's scratch rows). None = not catalogued.
    num_sms: int | None = None
    #: devices in one node (server) of this hardware, e.g. the 8 GPUs of an HGX board:
    #: what one `vllm serve` without multi-node flags can use (``llmsim bench``'s bound on
    #: dp x tp x pp). None = not catalogued.
    devices_per_node: int | None = None
    #: whether two GPUs of this kind reach each other's memory directly (CUDA peer access:
    #: NVLink, or PCIe P2P where the card allows it); vLLM's custom all-reduce needs it
    peer_access: bool = False
    #: what a card of this kind was measured to sustain (experiments/gpu_probe.py), not
    #: its datasheet: the TFLOPS of its best large dense GEMM per dtype key, and the bytes/s
    #: a one-token GEMM streams its weights at. The roofline provider runs no faster than
    #: these. Empty / None: not measured.
    measured_gemm_tflops: dict[str, float] = field(default_factory=dict)
    measured_mem_bw_GBps: float | None = None
    #: the soft-roofline exponent of this card's GEMMs, fitted to the same measured GEMMs
    #: (how fully its kernels overlap weight loads with math); None: the calibration's
    gemm_overlap_p: float | None = None
    #: the GPU-to-GPU link as collectives measured between two of these cards see it, in a
    #: cluster file's terms (ASTRA-Sim's one-hop FullyConnected model: bandwidth in 2^30 B/s,
    #: latency per message); what a cluster file that leaves link_bw / link_latency out gets
    #: in place of the physical link above. None: not measured.
    measured_link_bw_GiBps: float | None = None
    measured_link_latency_ns: float | None = None
    #: vLLM's own TP all-reduce between these cards (``tensor_model_parallel_all_reduce``:
    #: custom all-reduce, symmetric memory or NCCL, as vLLM picks them by size), as measured
    #: inside a CUDA graph: {tp: ((bytes, us), ...)}, bytes increasing
    #: (sim.backend.measured_all_reduce). Empty: not measured.
    vllm_all_reduce_us: dict = field(default_factory=dict)
    #: NCCL's own collectives between these cards on one node (nccl-tests style, bf16, as
    #: aiconfigurator-core ships them): {"all_gather" | "reduce_scatter": {ranks:
    #: ((bytes of the whole gathered / scattered buffer, us), ...)}}, bytes increasing;
    #: what an MoE layer's DP exchange (pynccl all_gather / reduce_scatter) takes on the
    #: catalogue's link (sim.backend.measured_collectives). Empty: not measured.
    nccl_us: dict = field(default_factory=dict)
    #: the "non-torch forward increase memory" vLLM 0.19 logs for a single-GPU worker on
    #: this device, GiB: driver-side memory the profile run leaves (kernel images, the
    #: local-memory reservation for every resident thread), a property of the device and
    #: the compiled kernels that no code path sizes (sim.memory). None: sim.memory's
    #: default (what H100 logs).
    vllm_non_torch_GiB: float | None = None

    @property
    def mem_visible_fraction(self) -> float:
        """The share of the nominal memory that CUDA reports as the device's total."""
        if not self.mem_reported_bytes or not self.mem_size_GiB:
            return 1.0
        return self.mem_reported_bytes / (self.mem_size_GiB * (1 << 30))

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a model dtype (fp8/int8 fall back to bf16 where absent)."""
        key = _DTYPE_KEY.get(dtype, dtype)
        tf = self.peak_tflops.get(key)
        if tf is None and key in ("fp8", "fp16"):
            tf = self.peak_tflops.get("bf16")
        if tf is None and key == "bf16":
            tf = self.peak_tflops.get("fp16")
        if tf is None:
            raise InputError(f"hardware {self.name!r} has no peak_tflops for dtype {dtype!r} "
                             f"(has {sorted(self.peak_tflops)})", source=self.source or None)
        return tf * 1e12

    def measured_flops(self, dtype: str) -> float | None:
        """The measured sustained GEMM FLOP/s for a dtype (bf16 and fp16 stand in for each
        other: the same tensor-core rate), or None where not measured."""
        key = _DTYPE_KEY.get(dtype, dtype)
        table = self.measured_gemm_tflops
        tf = table.get(key)
        if tf is None and key in ("bf16", "fp16"):
            tf = table.get("fp16" if key == "bf16" else "bf16")
        return None if tf is None else tf * 1e12

    @property
    def mem_bw_Bps(self) -> float:
        return self.mem_bw_GBps * 1e9


def _number(d: dict, key: str, source: str) -> float:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise InputError(f"field {key!r} must be a non-negative number, got {v!r}", source=source)
    return float(v)


#: fields the simulator divides by (> 0), and the other plain numbers (>= 0); every one
#: finite and at most MAX_NUMBER (as in a cluster file)
_POSITIVE = ("mem_size_GiB", "mem_bw_GBps", "link_bw_GBps", "scale_out_bw_GBps",
             "measured_mem_bw_GBps", "measured_link_bw_GiBps")
_NON_NEGATIVE = ("link_latency_ns", "power_idle_W", "power_tdp_W", "scale_out_latency_ns",
                 "clock_GHz", "price_per_hour_usd", "pim_mem_GiB", "measured_link_latency_ns",
                 "vllm_non_torch_GiB")


#: the dtype keys a measured GEMM rate may name
_MEASURED_KEYS = ("bf16", "fp16", "fp8", "fp32")


def _bad_number(v: object, positive: bool) -> bool:
    return (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or v > MAX_NUMBER or (v <= 0 if positive else v < 0))


def _check_fields(d: dict, source: str) -> None:
    """The name, the numbers, the aliases and peak_tflops of a catalogue entry, each in
    range (a YAML .nan, .inf or 0 bandwidth failed later as a traceback)."""
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"field 'name' must be a name (a non-empty string), got {name!r}",
                         source=source)
    for key in (*_POSITIVE, *_NON_NEGATIVE):
        v = d.get(key)
        if v is not None and _bad_number(v, key in _POSITIVE):
            op = "> 0" if key in _POSITIVE else ">= 0"
            raise InputError(f"field {key!r} must be a finite number {op} and <= 1e+15, got "
                             f"{v!r}", source=source)
    mrb = d.get("mem_reported_bytes")
    if mrb is not None and (_bad_number(mrb, True) or mrb != int(mrb) or mrb > 1 << 60):
        raise InputError(f"field 'mem_reported_bytes' must be an integer in 1..2**60 (bytes "
                         f"CUDA reports), got {mrb!r}", source=source)
    aliases = d.get("aliases")
    if aliases is not None and not (isinstance(aliases, list) and all(
            isinstance(a, (str, int)) and not isinstance(a, bool) for a in aliases)):
        raise InputError(f"field 'aliases' must be a list of names, got {aliases!r}",
                         source=source)
    _check_tflops(d, "peak_tflops", source, required=True)
    p = d.get("gemm_overlap_p")
    if p is not None and (_bad_number(p, True) or not 1 <= p <= 50):
        raise InputError(f"field 'gemm_overlap_p' must be a number in 1..50 (the soft-"
                         f"roofline exponent), got {p!r}", source=source)
    _check_tflops(d, "measured_gemm_tflops", source, required=False)
    given = [k for k in ("measured_link_bw_GiBps", "measured_link_latency_ns")
             if d.get(k) is not None]
    if len(given) == 1:
        raise InputError(f"field {given[0]!r} needs its pair (measured_link_bw_GiBps and "
                         "measured_link_latency_ns describe one measured link)", source=source)


def _degree_curves(v: object, field_name: str, source: str) -> dict:
    """{degree >= 2: [[bytes, us], ...]} checked: at least two points a curve, bytes
    increasing, every value a positive number; ``field_name`` names it in errors."""
    if not isinstance(v, dict) or not v:
        raise InputError(f"field {field_name!r} must map degrees (GPUs) to [[bytes, us], "
                         f"...], got {v!r}", source=source)
    out = {}
    for n, points in v.items():
        ok = (isinstance(n, int) and not isinstance(n, bool) and n >= 2
              and isinstance(points, list) and len(points) >= 2
              and all(isinstance(p, list) and len(p) == 2
                      and not any(_bad_number(x, positive=True) for x in p) for p in points)
              and all(a[0] < b[0] for a, b in zip(points, points[1:])))
        if not ok:
            raise InputError(f"field {field_name!r} at {n!r}: must be a degree >= 2 mapped "
                             "to two or more [bytes, us] pairs of positive numbers, bytes "
                             "increasing", source=source)
        out[n] = tuple((int(b), float(us)) for b, us in points)
    return out


def _all_reduce_curves(v: object, source: str) -> dict:
    """``vllm_all_reduce_us``: {tp >= 2: [[bytes, us], ...]} (see _degree_curves)."""
    return {} if v is None else _degree_curves(v, "vllm_all_reduce_us", source)


#: the NCCL collectives the catalogue's ``nccl_us`` may give
NCCL_OPS = ("all_gather", "reduce_scatter")


def _nccl_curves(v: object, source: str) -> dict:
    """``nccl_us``: {op: {ranks >= 2: [[bytes, us], ...]}} for the ops in NCCL_OPS."""
    if v is None:
        return {}
    if not isinstance(v, dict) or not v:
        raise InputError(f"field 'nccl_us' must map {' / '.join(NCCL_OPS)} to their curves "
                         f"by GPU count, got {v!r}", source=source)
    unknown = [k for k in v if k not in NCCL_OPS]
    if unknown:
        raise InputError(f"field 'nccl_us': unknown collective {unknown[0]!r}; allowed: "
                         f"{', '.join(NCCL_OPS)}", source=source)
    return {op: _degree_curves(curves, f"nccl_us.{op}", source) for op, curves in v.items()}


def _check_tflops(d: dict, key: str, source: str, *, required: bool) -> None:
    """A dtype -> TFLOPS mapping: peak_tflops (required, any dtype key) or the measured
    rates (optional, keyed like the dtypes a model runs in)."""
    table = d.get(key)
    if table is None and not required:
        return
    if not isinstance(table, dict) or (required and not table):
        raise InputError(f"field {key!r} must map dtype -> TFLOPS", source=source)
    for k, v in table.items():
        if not required and k not in _MEASURED_KEYS:
            raise InputError(f"field '{key}.{k}': unknown dtype key; allowed: "
                             f"{', '.join(_MEASURED_KEYS)}", source=source)
        if _bad_number(v, True):
            raise InputError(f"field '{key}.{k}' must be a positive finite number "
                             f"(TFLOPS) <= 1e+15, got {v!r}", source=source)


#: every field a catalogue entry may give (a misspelt optional one was ignored)
_FIELDS = frozenset((*REQUIRED_FIELDS, *_POSITIVE, *_NON_NEGATIVE, "aliases", "kind",
                     "vendor", "compute_capability", "num_sms", "mem_reported_bytes",
                     "measured_gemm_tflops", "gemm_overlap_p", "link_type", "link_topology",
                     "peer_access", "vllm_all_reduce_us", "nccl_us", "scale_out_type",
                     "devices_per_node", "pim_config"))
#: the descriptive text fields
_TEXT = ("kind", "vendor", "link_type", "scale_out_type")


def _check_names(d: dict, source: str) -> None:
    """No unknown field; the text fields are text, compute_capability a version."""
    unknown = sorted(str(k) for k in d if k not in _FIELDS)
    if unknown:
        raise InputError(f"unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}",
                         source=source)
    for key in _TEXT:
        v = d.get(key)
        if v is not None and not isinstance(v, str):
            raise InputError(f"field {key!r} must be a string, got {v!r}", source=source)
    cc = d.get("compute_capability")
    if cc is not None and (isinstance(cc, bool) or not isinstance(cc, (str, int, float))):
        raise InputError(f"field 'compute_capability' must be a version such as '12.0', got "
                         f"{cc!r}", source=source)


def _from_mapping(d: object, source: str) -> HardwareSpec:
    if not isinstance(d, dict):
        raise InputError("hardware spec must be a mapping", source=source)
    _check_names(d, source)
    for key in REQUIRED_FIELDS:
        if key not in d:
            raise InputError(f"hardware spec is missing field {key!r}", source=source)
    _check_fields(d, source)
    peak = d["peak_tflops"]
    if not ({"bf16", "fp16"} & set(peak)):
        raise InputError("field 'peak_tflops' needs a bf16 or fp16 entry", source=source)
    opt = {k: d.get(k) for k in ("clock_GHz", "price_per_hour_usd", "mem_reported_bytes")}
    for k, v in opt.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise InputError(f"field {k!r} must be a non-negative number, got {v!r}", source=source)
    sms = d.get("num_sms")
    if sms is not None and (isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0):
        raise InputError(f"field 'num_sms' must be a positive integer, got {sms!r}",
                         source=source)
    per_node = d.get("devices_per_node")
    if per_node is not None and (isinstance(per_node, bool) or not isinstance(per_node, int)
                                 or not 1 <= per_node <= 1 << 20):
        raise InputError(f"field 'devices_per_node' must be an integer in 1..{1 << 20}, got "
                         f"{per_node!r}", source=source)
    cc = d.get("compute_capability")
    link_type = str(d.get("link_type") or "")
    peer = d.get("peer_access", link_type.lower().startswith("nvlink"))
    if not isinstance(peer, bool):
        raise InputError(f"field 'peer_access' must be true or false, got {peer!r}",
                         source=source)
    derived = "Switch" if link_type.lower().startswith(("nvlink", "pcie")) else "Ring"
    topo = d.get("link_topology", derived)
    if topo not in ("Ring", "FullyConnected", "Switch"):
        raise InputError(f"field 'link_topology' must be Ring, FullyConnected or Switch, got "
                         f"{topo!r}", source=source)
    scale = {k: _number(d, k, source) if d.get(k) is not None else None
             for k in ("scale_out_bw_GBps", "scale_out_latency_ns")}
    measured = {k: None if d.get(k) is None else float(d[k])
                for k in ("measured_mem_bw_GBps", "gemm_overlap_p", "measured_link_bw_GiBps",
                          "measured_link_latency_ns")}
    return HardwareSpec(
        name=str(d["name"]),
        peak_tflops={str(k): float(v) for k, v in peak.items()},
        mem_size_GiB=_number(d, "mem_size_GiB", source),
        mem_bw_GBps=_number(d, "mem_bw_GBps", source),
        link_bw_GBps=_number(d, "link_bw_GBps", source),
        link_latency_ns=_number(d, "link_latency_ns", source),
        power_idle_W=_number(d, "power_idle_W", source),
        power_tdp_W=_number(d, "power_tdp_W", source),
        kind=str(d.get("kind") or "gpu"),
        vendor=str(d.get("vendor") or ""),
        link_type=link_type,
        link_topology=topo,
        scale_out_type=str(d.get("scale_out_type") or ""),
        scale_out_bw_GBps=scale["scale_out_bw_GBps"] if scale["scale_out_bw_GBps"] is not None
        else _number(d, "link_bw_GBps", source),
        scale_out_latency_ns=scale["scale_out_latency_ns"]
        if scale["scale_out_latency_ns"] is not None else _number(d, "link_latency_ns", source),
        compute_capability=None if cc is None else str(cc),
        clock_GHz=None if opt["clock_GHz"] is None else float(opt["clock_GHz"]),
        price_per_hour_usd=(None if opt["price_per_hour_usd"] is None
                            else float(opt["price_per_hour_usd"])),
        aliases=tuple(str(a) for a in (d.get("aliases") or ())),
        pim_config=d.get("pim_config"),
        pim_mem_GiB=float(d["pim_mem_GiB"]) if d.get("pim_mem_GiB") is not None else None,
        mem_reported_bytes=(None if opt["mem_reported_bytes"] is None
                            else int(opt["mem_reported_bytes"])),
        num_sms=sms,
        devices_per_node=per_node,
        peer_access=peer,
        measured_gemm_tflops={str(k): float(v)
                              for k, v in (d.get("measured_gemm_tflops") or {}).items()},
        **measured,
        vllm_all_reduce_us=_all_reduce_curves(d.get("vllm_all_reduce_us"), source),
        nccl_us=_nccl_curves(d.get("nccl_us"), source),
        vllm_non_torch_GiB=(None if d.get("vllm_non_torch_GiB") is None
                            else float(d["vllm_non_torch_GiB"])),
        source=source,
    )


def hardware_dir(directory: str | os.PathLike | None = None) -> Path:
    return Path(directory) if directory is not None else profiles_root() / "hardware"


@cache
def _catalogue_at(directory: str) -> tuple[dict[str, HardwareSpec], dict[str, HardwareSpec]]:
    exact: dict[str, HardwareSpec] = {}
    files = sorted(Path(directory).glob("*.yaml"))
    for f, data in zip(files, load_yaml_files("hardware", files), strict=True):
        spec = _from_mapping(data, str(f))
        if spec.name in exact and exact[spec.name].source != spec.source:
            raise InputError(f"hardware name {spec.name!r} also defined in "
                             f"{exact[spec.name].source}", source=str(f))
        exact[spec.name] = spec
    by_key: dict[str, HardwareSpec] = {}
    for spec in exact.values():
        for key in (spec.name, Path(spec.source).stem, *spec.aliases):
            by_key.setdefault(key, spec)
    folded = {k.casefold(): s for k, s in by_key.items()}
    return by_key, folded


def _catalogue(directory=None):
    return _catalogue_at(str(hardware_dir(directory).resolve()))


def known_hardware(directory: str | os.PathLike | None = None) -> list[str]:
    """Canonical names of every device in the catalogue."""
    by_key, _ = _catalogue(directory)
    return sorted({s.name for s in by_key.values()})


def load_hardware(name: str, source: str | None = None, *,
                  directory: str | os.PathLike | None = None) -> HardwareSpec:
    """Resolve a device by name or alias (case-insensitive); ``source`` names the config
    that asked, for the error message."""
    by_key, folded = _catalogue(directory)
    spec = by_key.get(name) or folded.get(str(name).casefold())
    if spec is None:
        raise unknown_name("hardware", name, known_hardware(directory), source)
    return spec


def clear_cache() -> None:
    """Forget loaded catalogues (tests that write YAML files call this)."""
    _catalogue_at.cache_clear()
