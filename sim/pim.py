"""Processing-in-memory devices and attention offloading.

A PIM device is described by a DRAMSim3-style .ini file (sections dram_structure, timing,
system). Every bank of every chip has a processing unit next to its row buffer, so a
memory-bound GEMV streams from all banks at once. From the .ini follow:

- chips per rank = bus_width / device_width; banks per chip = bankgroups * banks_per_group;
- one burst per bank moves device_width * BL / 8 bytes and a bank can issue one burst
  every tCCD_L cycles of tCK ns, so
  internal bandwidth = channels * ranks * chips * banks * (device_width * BL / 8) / (tCCD_L * tCK)
  bytes per ns, against the external bus's data_rate * bus_width / 8;
- a bank's row holds columns * device_width / 8 bytes; reading a fresh row costs
  (tRCD + tRP) cycles of activation and precharge;
- capacity = channels * channel_size (MB).

Decode attention for one layer reads every decode request's K and V (score = q K^T and
attend = p V are both GEMVs over the KV): kv_len * 2 * kv_heads * head_dim * dtype bytes.
A request's KV heads are spread over up to ``kv_heads`` channels and requests over all
channels, so the layer takes the larger of the batch's KV over all channels and the
longest request's KV over its channels, plus one row activation per row of that data.
"""

from __future__ import annotations

import configparser
import math
from dataclasses import dataclass
from pathlib import Path

from sim.errors import MAX_NUMBER, InputError, unknown_name
from sim.paths import is_dir, is_file, profiles_root, shared_data_root

_REQUIRED = {
    "dram_structure": ("bankgroups", "banks_per_group", "columns", "device_width", "BL"),
    "timing": ("tCK", "tRP"),
    "system": ("channel_size", "channels", "bus_width"),
}


@dataclass(frozen=True)
class PimDevice:
    name: str
    protocol: str
    channels: int
    ranks: int
    bankgroups: int
    banks_per_group: int
    columns: int
    device_width: int
    burst_length: int
    bus_width: int
    tCK_ns: float
    tCCD_L: int
    tRCD: int
    tRP: int
    channel_size_MB: int
    data_rate_MTps: float | None

    @property
    def chips_per_rank(self) -> int:
        return max(1, self.bus_width // self.device_width)

    @property
    def banks_per_chip(self) -> int:
        return self.bankgroups * self.banks_per_group

    @property
    def burst_bytes(self) -> float:
        return self.device_width * self.burst_length / 8

    @property
    def channel_bw_bytes_per_ns(self) -> float:
        """Internal bandwidth of one channel: every bank of every chip streaming bursts."""
        banks = self.ranks * self.chips_per_rank * self.banks_per_chip
        return banks * self.burst_bytes / (self.tCCD_L * self.tCK_ns)

    @property
    def internal_bw_GBps(self) -> float:
        return self.channels * self.channel_bw_bytes_per_ns  # bytes/ns == GB/s

    @property
    def external_bw_GBps(self) -> float | None:
        if self.data_rate_MTps is None:
            return None
        return self.channels * self.data_rate_MTps * 1e6 * self.bus_width / 8 / 1e9

    @property
    def capacity_GiB(self) -> float:
        return self.channels * self.channel_size_MB / 1024

    @property
    def row_bytes_per_channel(self) -> float:
        """Bytes one row activation exposes across every bank of a channel."""
        return (self.columns * self.device_width / 8) * self.ranks * self.chips_per_rank * \
            self.banks_per_chip

    @property
    def row_cycle_ns(self) -> float:
        return (self.tRCD + self.tRP) * self.tCK_ns

    def stream_ns(self, num_bytes: float, channels: int) -> float:
        """Time to stream ``num_bytes`` through the PUs of ``channels`` channels."""
        if num_bytes <= 0:
            return 0.0
        rows = math.ceil(num_bytes / (channels * self.row_bytes_per_channel))
        return rows * self.row_cycle_ns + num_bytes / (channels * self.channel_bw_bytes_per_ns)


def parse_pim_ini(path: str | Path) -> PimDevice:
    path = Path(path)
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        with path.open(encoding="utf-8") as fh:
            cp.read_file(fh)
    except OSError as exc:
        raise InputError(f"cannot read PIM config: {exc.strerror or exc}",
                         source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (undecodable byte {exc.object[exc.start]:#04x}); "
                         "a PIM config is a DRAMSim3 .ini text file", source=str(path)) from None
    except configparser.Error as exc:
        raise InputError(f"malformed PIM config: {' '.join(str(exc).split())}",
                         source=str(path)) from None
    for section, keys in _REQUIRED.items():
        if not cp.has_section(section):
            raise InputError(f"missing section [{section}]", source=str(path))
        for k in keys:
            if not cp.has_option(section, k):
                raise InputError(f"[{section}] is missing {k!r}", source=str(path))

    def num(section, key, default=None, kind=float):
        if not cp.has_option(section, key):
            if default is None:
                raise InputError(f"[{section}] is missing {key!r}", source=str(path))
            return default
        raw = cp.get(section, key).strip()
        try:
            f = float(raw)
        except ValueError:
            raise InputError(f"[{section}] {key} must be a number, got {raw!r}",
                             source=str(path)) from None
        if not math.isfinite(f) or (kind is int and not f.is_integer()):
            what = "an integer" if kind is int else "a finite number"
            raise InputError(f"[{section}] {key} must be {what}, got {raw!r}",
                             source=str(path))
        if f > MAX_NUMBER:  # finite but absurd: the derived bandwidths overflow a float
            raise InputError(f"[{section}] {key} must be at most 1e15, got {raw!r}",
                             source=str(path))
        v = kind(f)
        if v <= 0 and key not in ("AL",):
            raise InputError(f"[{section}] {key} must be > 0, got {raw}", source=str(path))
        return v

    t = "timing"
    return PimDevice(
        name=path.stem, protocol=cp.get("dram_structure", "protocol", fallback="?").strip(),
        channels=num("system", "channels", kind=int),
        ranks=num("system", "ranks", 1, int),
        bankgroups=num("dram_structure", "bankgroups", kind=int),
        banks_per_group=num("dram_structure", "banks_per_group", kind=int),
        columns=num("dram_structure", "columns", kind=int),
        device_width=num("dram_structure", "device_width", kind=int),
        burst_length=num("dram_structure", "BL", kind=int),
        bus_width=num("system", "bus_width", kind=int),
        tCK_ns=num(t, "tCK"),
        tCCD_L=num(t, "tCCD_L", num(t, "tCCD_S", 4, int), int),
        tRCD=num(t, "tRCD", num(t, "tRCDRD", 14, int), int),
        tRP=num(t, "tRP", kind=int),
        channel_size_MB=num("system", "channel_size", kind=int),
        data_rate_MTps=num("other", "data_rate", 0.0) or None if cp.has_section("other") else None,
    )


def pim_search_dirs() -> list[Path]:
    return [profiles_root() / "pim", shared_data_root() / "llmservingsim-configs" / "pim"]


def resolve_pim(name_or_path: str, source: str | None = None) -> Path:
    """The .ini file a ``pim_config`` names: a path to a DRAMSim3 .ini, or the name of one
    in profiles/pim/ or ../shared's pim folder; InputError naming ``source`` otherwise.
    Only the name is checked here (LLMServingSim reads the file only with attention
    offloading on; :func:`load_pim` parses it then)."""
    p = Path(name_or_path)
    if p.suffix == ".ini" and is_file(p):
        return p
    known = {}
    for d in pim_search_dirs():
        for f in sorted(d.glob("*.ini")):
            known.setdefault(f.stem, f)
    stem = p.stem if p.suffix == ".ini" else name_or_path
    if stem not in known:
        if p.suffix == ".ini" or len(p.parts) > 1:
            why = "is a folder" if is_dir(p) else "no such file"
            raise InputError(f"{name_or_path!r}: {why}; give the path of a DRAMSim3 .ini "
                             "file (relative to the working folder) or one of the names "
                             + (", ".join(sorted(known)) or "(none)"), source=source)
        raise unknown_name("PIM config", name_or_path, known, source)
    return known[stem]


def load_pim(name_or_path: str, source: str | None = None) -> PimDevice:
    """A PIM device by name (an .ini in profiles/pim/ or ../shared's pim folder) or path."""
    return parse_pim_ini(resolve_pim(name_or_path, source))


class PimAttention:
    """Decode attention of one instance offloaded to its node's PIM devices."""

    def __init__(self, device: PimDevice, num_devices: int, model, tp: int, link) -> None:
        self.device = device
        self.channels = max(1, device.channels * num_devices)
        self.model = model
        self.tp = tp
        self.kv_bytes_per_token_layer = 2 * model.num_key_value_heads * model.head_dim * \
            model.kv_dtype_bytes()
        #: the NPU-PIM link (a sim.topology.Link) the queries and outputs cross
        self.link = link

    @property
    def capacity_GiB(self) -> float:
        return self.device.capacity_GiB * self.channels / self.device.channels

    def attention_ns(self, num_decode: int, kv_sum: int, kv_max: int) -> int:
        """One layer's decode attention on the PIM units (score and attend GEMVs)."""
        if num_decode == 0:
            return 0
        dev = self.device
        total = kv_sum * self.kv_bytes_per_token_layer
        longest = kv_max * self.kv_bytes_per_token_layer
        per_req_channels = min(self.channels, self.model.num_key_value_heads)
        return int(max(dev.stream_ns(total, self.channels),
                       dev.stream_ns(longest, per_req_channels)))

    def q_bytes(self, num_decode: int) -> int:
        """Bytes of the decode queries sent to PIM (and of the outputs sent back)."""
        return num_decode * self.model.q_size * self.model.dtype_bytes

