"""The measured provider: LLMServingSim-format profile bundles measured with vLLM.

Bundle layout: ``<root>/<HW>/<org>/<model>/<variant>/meta.yaml`` and ``tp<N>/`` with
dense.csv (layer,tokens,time_us), per_sequence.csv (layer,sequences,time_us),
attention.csv (prefill_chunk,kv_prefill,n_decode,kv_decode,time_us), moe.csv
(tokens,activated_experts,time_us) and optionally skew_fit.csv.

The tables below are built from the CSVs once per bundle, tp and table size, and kept in
the on-disk cache (``sim.cache``, keyed by the files' paths, sizes and times and by this
module's own): a later run with the same inputs loads them instead of parsing the CSVs,
with identical results, and without importing numpy or PyYAML.

Lookup rules (all tables are built once, at construction):
- dense / per-sequence: 1-D linear interpolation over tokens / sequences; the whole
  block's dense layers are pre-summed into one array indexed by token count, so a
  lookup is a list index.
- attention: multilinear over the 4-D grid; ``kv_decode`` is the batch's mean decode KV
  (a uniform batch at the mean reads the same total KV). Where meta.yaml enables a skew fit
  (``skew_fit.csv``), batches with unequal decode lengths are corrected towards the lookup
  at the longest KV by the measured per-bucket alpha.
- moe: bilinear over (tokens, activated_experts).
Queries above the grid extrapolate monotonically (never cheaper as work grows) from the
top grid point with a slope fitted on the upper half of the axis: least squares over the
points at or above half the largest key, floored at zero; for token and sequence axes
(GEMM-like work) also at least the top point's time per token, so a flat last step
(wave quantisation) does not flatten the line. A prefill chunk above the attention grid
runs as pieces of the top measured chunk, each over the chunk rows before it (its causal
work, quadratic in the chunk). Such lookups are counted and reported
(``extrapolations()``); a missing layer is an error, never zero.
"""

from __future__ import annotations

import bisect
import csv
import math
from array import array
from itertools import accumulate
from pathlib import Path

from sim.cache import cached
from sim.errors import InputError, read_text_input
from sim.latency.base import (LATENCY_PROVIDERS, BatchShape, DecodeStretch, LatencyProvider,
                              LayerTimes)
from sim.latency.grid import AttentionGrid, Axis, beyond, line, upper_slope
from sim.latency.lines import stretch_step_times
from sim.model import HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec, expert_shard_ranks
from sim.paths import is_dir, is_file, profiles_root, shared_data_root
from sim.yamlio import strict_load, yaml_problem

VARIANT_BY_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8": "fp8"}
#: provider attributes :meth:`MeasuredProvider._build` makes that are plain data as they are
#: (the grid axes and slices are converted; see ``_build`` and ``_set_state``)
_STATE = ("meta", "_seq", "_dense_slope", "_seq_slope", "_dense_max", "_seq_max",
          "_max_tokens", "_max_seqs", "_grid_tokens", "_grid_seqs", "_dense_total",
          "_seq_total", "_attn_path", "_skew", "_moe")


def bundle_search_dirs(extra: tuple[str, ...] | list[str] = ()) -> list[Path]:
    dirs = [Path(p) for p in extra]
    dirs += [profiles_root() / "bundles", shared_data_root() / "profiles"]
    return dirs


def bundle_variant(model: ModelSpec) -> str:
    """The bundle variant folder named for the served precision: the weights' precision
    (``fp8`` under FP8 quantization, else the dtype's short name), plus ``-kvfp8`` with an
    FP8 KV cache, e.g. ``bf16``, ``fp8``, ``fp8-kvfp8``."""
    base = "fp8" if model.is_fp8 else VARIANT_BY_DTYPE.get(model.dtype, model.dtype)
    return base + ("-kvfp8" if model.kv_is_fp8 else "")


def _bundle_folders(hardware: str, model: ModelSpec, extra_dirs=()):
    for d in bundle_search_dirs(extra_dirs):
        for name in dict.fromkeys([model.name, *model.aliases]):
            yield d / hardware / name


def find_bundle(hardware: str, model: ModelSpec, extra_dirs=()) -> Path | None:
    """The variant folder of a bundle for (hardware, model at its precision), or None."""
    variant = bundle_variant(model)
    for folder in _bundle_folders(hardware, model, extra_dirs):
        p = folder / variant
        if is_file(p / "meta.yaml"):
            return p
    return None


def other_variants(hardware: str, model: ModelSpec, extra_dirs=()) -> list[str]:
    """Variants measured for (hardware, model) at other precisions (for error notes)."""
    return sorted({p.parent.name for f in _bundle_folders(hardware, model, extra_dirs)
                   if is_dir(f) for p in f.glob("*/meta.yaml")} - {bundle_variant(model)})


_KEY_MAX = 2**53  # a grid key (tokens, sequences, KV length) exact as a double
#: the longest time one layer call may take (1000 s): far past any measurement, and its
#: integer nanoseconds summed over every layer of a step stay far inside int64 (a time of
#: 1e17 us overflowed the step tables' int64 cast and read as 1 ns)
_TIME_MAX_US = 1e9


def _check_cell(row: dict, c: str) -> str | None:
    """Why the value of column ``c`` is not allowed (None when it is): a time is a finite
    number in 0.._TIME_MAX_US, a skew fit's alpha any finite number, a grid key an integer
    >= 0."""
    try:
        v = float(row[c])
    except (TypeError, ValueError):
        return f"is not a number: {row[c]!r}"
    if c == "alpha":
        return None if math.isfinite(v) else f"must be a finite number, got {row[c]!r}"
    if c == "time_us":
        return None if math.isfinite(v) and 0 <= v <= _TIME_MAX_US else \
            f"must be a finite time >= 0 and at most {_TIME_MAX_US:g} (microseconds), got "\
            f"{row[c]!r}"
    if not (math.isfinite(v) and v.is_integer() and 0 <= v <= _KEY_MAX):
        return f"must be an integer >= 0, got {row[c]!r}"
    return None


def _read_csv(path: Path, columns: tuple[str, ...]) -> list[dict]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or any(c not in reader.fieldnames for c in columns):
                raise InputError(f"malformed profile CSV: expected columns {list(columns)}, "
                                 f"got {reader.fieldnames}", source=str(path))
            rows = list(reader)
    except OSError as exc:
        raise InputError(f"cannot read profile: {exc.strerror}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (undecodable byte {exc.object[exc.start]:#04x}); "
                         "a profile is a CSV text file", source=str(path)) from None
    except csv.Error as exc:
        raise InputError(f"malformed profile CSV ({exc})", source=str(path)) from None
    numeric = [c for c in columns if c != "layer" and not c.endswith("_label")]
    for lineno, row in enumerate(rows, start=2):
        for c in numeric:
            why = _check_cell(row, c)
            if why:
                raise InputError(f"line {lineno}: column {c!r} {why}", source=str(path))
    return rows


def _meta_mapping(d: dict, key, where: str, prefix: str = "") -> dict:
    """``d[key]`` of a bundle's meta.yaml: a mapping (absent or null: empty)."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"field '{prefix}{key}' must be a mapping, got {v!r}", source=where)
    return v


_SKEW_AXES = ("n", "skew_rate", "kv_big", "kp")


def _skew_axes(axes: dict, where: str) -> dict:
    """meta.yaml's skew_fit.bucket_axes, checked: per axis ``<axis>_bins`` (increasing
    numbers) and ``<axis>_labels`` (one fewer)."""
    missing = [f"{a}_{k}" for a in _SKEW_AXES for k in ("bins", "labels")
               if f"{a}_{k}" not in axes]
    if missing:
        raise InputError(f"skew_fit.bucket_axes is missing {missing}", source=where)
    for a in _SKEW_AXES:
        bins, labels = axes[f"{a}_bins"], axes[f"{a}_labels"]
        ok = isinstance(bins, list) and isinstance(labels, list) and labels \
            and len(bins) == len(labels) + 1 \
            and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bins) \
            and all(x < y for x, y in zip(bins, bins[1:]))
        if not ok:
            raise InputError(f"skew_fit.bucket_axes.{a}_bins must be increasing numbers, one "
                             f"more than {a}_labels (got {bins!r} and {labels!r})",
                             source=where)
    return axes


def work_slope(keys, vals) -> float:
    """Extrapolation slope of a token/sequence axis: the upper-half fit, but at least the
    top point's time per unit of work (scaling from the largest measured step)."""
    per_unit = vals[-1] / keys[-1] if keys and keys[-1] > 0 else 0.0
    return max(upper_slope(keys, vals), per_unit)


def _interp_table(keys: list[int], vals: list[float], upto: int):
    """Values at 0..upto by linear interpolation, clamped below the grid, and above it the
    top point plus :func:`work_slope` per unit; returns the table (an array) and that slope."""
    import numpy as np

    k = np.asarray(keys, dtype=np.float64)
    v = np.asarray(vals, dtype=np.float64)
    x = np.arange(upto + 1, dtype=np.float64)
    out = np.interp(x, k, v)
    slope = work_slope(keys, vals)
    hi = x > k[-1]
    out[hi] = v[-1] + slope * (x[hi] - k[-1])
    return out, slope


def skew_rate(shape: BatchShape, kv_mean: int) -> float:
    """The skew rate the bundle's skew fit is keyed on, for a batch of decode KV lengths.

    The profile measures two-point batches: a share ``p`` of the sequences at the longest
    KV, the rest at one shorter length; their skew rate is ``p`` = (mean - min) / (max -
    min). A served batch's lengths spread between its shortest and longest, so the rate is
    that of the two-point batch with the same mean, variance and longest KV: ``p = var /
    (var + (max - mean)^2)``. Without the squared sum (``decode_kv_sq_sum`` 0) the rate is
    read from the shortest and longest lengths as for a two-point batch."""
    nd = shape.num_decode
    top = shape.decode_kv_max
    if shape.decode_kv_sq_sum and nd:
        # in integers, times nd^2: var -> nd * sq - sum^2, max - mean -> nd * max - sum
        total = shape.decode_kv_sum
        var = max(0, nd * shape.decode_kv_sq_sum - total * total)
        d = nd * top - total
        return var / (var + d * d) if var + d * d > 0 else 0.5
    gap = top - shape.decode_kv_min
    return (kv_mean - shape.decode_kv_min) / gap if gap > 0 else 0.5


class _PackedTables(dict):
    """Per-layer tables kept as packed doubles, each unpacked into a list (for fast scalar
    indexing) the first time it is read; ``packed`` maps every layer name to its bytes."""

    def __init__(self, packed: dict[str, bytes]) -> None:
        super().__init__()
        self.packed = packed

    def __missing__(self, name: str) -> list[float]:
        table = self[name] = array("d", self.packed[name]).tolist()
        return table


def _piecewise(keys: list[int], vals: list[float], slope: float) -> tuple:
    """A decode-KV line (``grid.line`` over integer keys) as linear pieces
    for ``_line_run``: (the first KV of each piece after the first, each piece's
    constants, ...). Piece 0 is the clamp at or below the first key, piece r (1 <= r <
    n) the interval from key r - 1 (exclusive for r = 1) to key r (inclusive for the
    last), piece n the extrapolation past the top key."""
    n = len(keys)
    top = keys[-1]
    starts = [keys[0] + 1, *keys[1:n - 1], top + 1] if n > 1 else [top + 1]
    pieces: list[tuple] = [("const", vals[0] + 0.0 * (vals[0] - vals[0]))]
    for lo in range(n - 1):
        pieces.append(("lerp", vals[lo], vals[lo + 1] - vals[lo], keys[lo], keys[lo + 1] - keys[lo]))
    pieces.append(("extra", vals[-1], slope, top))
    return starts, pieces, n, keys, top


def _book_nothing(k: int) -> None:
    """``DecodeStretch.record`` of a stretch that looks nothing up off the grid."""


def _book_off_grid(extrap: dict, grid_notes: tuple[str, ...], k: int, kv_decode: int) -> None:
    """Count the off-grid lookups of a stretch's first ``k`` steps: one per step on each axis
    of ``grid_notes`` and ``kv_decode`` on the decode-KV axis."""
    for axis in grid_notes:
        extrap[axis] = extrap.get(axis, 0) + k
    if kv_decode:
        extrap["kv_decode"] = extrap.get("kv_decode", 0) + kv_decode


def _line_run(line: tuple, q0: int, q1: int) -> list[float]:
    """``grid.line`` at q0 .. q1 - 1, a linear piece at a time (the same
    float operations: t = (q - k_lo) / (k_hi - k_lo), v_lo + t * (v_hi - v_lo); past the
    top, v_top + slope * (q - top))."""
    starts, pieces, n, _, _ = line
    out: list[float] = []
    q = q0
    r = bisect.bisect_right(starts, q)
    while q < q1:
        e = starts[r] if r < n else q1
        if e > q1:
            e = q1
        piece = pieces[r]
        kind = piece[0]
        if kind == "lerp":
            _, v, dv, k, dk = piece
            out += [v + (x - k) / dk * dv for x in range(q, e)]
        elif kind == "extra":
            _, v, slope, top = piece
            out += [v + slope * (x - top) for x in range(q, e)]
        else:
            out += [piece[1]] * (e - q)
        q = e
        r += 1
    return out


class MeasuredProvider(LatencyProvider):
    """Profile bundles measured with vLLM, looked up by the variant named for the served
    precision (:func:`bundle_variant`); a bundle of another precision is never used."""

    kind = "measured"

    def __init__(self, model: ModelSpec, hardware: str, tp: int, *, bundle: Path | None = None,
                 profiles_dirs=(), max_tokens: int = 16384, max_seqs: int = 1024,
                 ep_size: int = 1, **_ignored) -> None:
        self.model = model
        self.hardware = hardware
        self.tp = tp
        #: how many ranks share each expert (its intermediate width sharded over them)
        self.moe_tp = expert_shard_ranks(tp, ep_size)
        root = bundle or find_bundle(hardware, model, profiles_dirs)
        if root is None:
            searched = ", ".join(str(d) for d in bundle_search_dirs(profiles_dirs))
            others = other_variants(hardware, model, profiles_dirs)
            has = f" (has only {', '.join(others)}: other precisions are not used)" if others else ""
            raise InputError(f"no measured profile bundle for hardware={hardware!r} "
                             f"model={model.name!r} variant {bundle_variant(model)!r}{has}; "
                             f"searched {searched}. Use --latency-provider auto, aic or "
                             "roofline, or profile one with `llmsim profile`")
        self.root = Path(root)
        self.source = str(self.root)
        tp_dir = self.root / f"tp{tp}"
        if not tp_dir.is_dir():
            have = sorted(p.name for p in self.root.glob("tp*"))
            raise InputError(f"bundle has no tp{tp} folder (has: {have})", source=str(self.root))
        self._extrap: dict[str, int] = {}
        #: per decode count, what a decode stretch's steps share (``_stretch_setup``)
        self._stretch_by_nd: dict[int, tuple | None] = {}
        params = (tp, max_tokens, max_seqs, model.architecture, model.block_sequence,
                  model.num_hidden_layers, model.is_moe, self.moe_tp, PROLOGUE, HEAD_DENSE,
                  HEAD_PER_SEQUENCE)
        self._set_state(cached("measured-bundle", self._sources(tp_dir),
                               lambda: self._build(tp_dir, max_tokens, max_seqs), params))

    # ------------------------------------------------------------------ construction
    def _sources(self, tp_dir: Path) -> list[Path]:
        """Every file the tables are built from (and this module and the grid's, whose code
        builds them):
        what the bundle cache's key covers. meta.yaml's skew-fit tables are named relative
        to the variant folder (``tp<N>/skew_fit.csv``): the CSVs of that folder and of the
        tp folder cover them."""
        files = [Path(__file__), Path(__file__).with_name("grid.py"), self.root / "meta.yaml",
                 *sorted(self.root.glob("*.csv")), *sorted(tp_dir.glob("*.csv"))]
        if self.model.is_moe:
            files.append(self._moe_table()[0])
        return [f for f in dict.fromkeys(files) if f.is_file()]

    def _moe_table(self) -> tuple[Path, float]:
        """The moe.csv for this rank's expert layout and the factor its times take.

        A bundle's ``tp<N>/moe.csv`` is measured with every expert sharded over N ranks
        (the fused-MoE kernel at intermediate width / N); ``tp1`` has whole experts. An
        expert-parallel rank runs whole experts (tp1's table); a TP rank without expert
        parallelism runs a 1/tp shard of each (its own tp folder's table). Where the
        bundle has only the other one (the shared bundles measure MoE at tp1 only), its
        times are scaled by the ratio of the widths: the kernel's weight bytes and FLOPs
        both scale with the intermediate width, as the DP group's flattened experts are
        scaled in sim.moe_wave."""
        own = self.root / f"tp{self.moe_tp}" / "moe.csv"
        if own.is_file():
            return own, 1.0
        other_tp = self.tp if self.moe_tp == 1 else 1
        other = self.root / f"tp{other_tp}" / "moe.csv"
        if not other.is_file():
            raise InputError("MoE model but the bundle has no moe.csv (looked for "
                             f"{own.relative_to(self.root)} and {other.relative_to(self.root)})",
                             source=str(self.root))
        return other, other_tp / self.moe_tp

    def _build(self, tp_dir: Path, max_tokens: int, max_seqs: int) -> dict:
        """Parse the bundle and build every lookup table; returns them as plain data
        (what the bundle cache stores, see :meth:`_set_state`)."""
        import yaml

        meta_path = self.root / "meta.yaml"
        text = read_text_input(meta_path, "bundle metadata", "a YAML")
        try:
            self.meta = strict_load(text) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"malformed YAML ({yaml_problem(exc)})",
                             source=str(meta_path)) from None
        if not isinstance(self.meta, dict):
            raise InputError(f"bundle metadata is a mapping of fields, got "
                             f"{type(self.meta).__name__}", source=str(meta_path))
        self._build_dense(tp_dir, max_tokens, max_seqs)
        self._build_attention(tp_dir / "attention.csv")
        self._moe = self._build_moe() if self.model.is_moe else None
        self._skew = self._build_skew(self.tp)
        state = {name: getattr(self, name) for name in _STATE}
        # the per-layer tables as packed doubles: only the multi-NPU path reads them
        state["_dense"] = {name: array("d", t).tobytes() for name, t in self._dense.items()}
        state["_pc_axis"] = self._pc_axis.vals
        state["_nd_axis"] = self._nd_axis.vals
        state["_attn"] = {key: (kp_axis.vals, [(kd.vals, vals, slope) for kd, vals, slope in rows])
                          for key, (kp_axis, rows) in self._attn.items()}
        if self._moe is not None:
            ae_axis, rows = self._moe
            state["_moe"] = (ae_axis.vals, [(t.vals, vals, slope) for t, vals, slope in rows])
        return state

    def _set_state(self, state: dict) -> None:
        """Install the tables :meth:`_build` returned (fresh or from the cache)."""
        for name in _STATE:
            setattr(self, name, state[name])
        self._dense = _PackedTables(state["_dense"])
        self._pc_axis = Axis(state["_pc_axis"])
        self._nd_axis = Axis(state["_nd_axis"])
        self._attn = {tuple(key): (Axis(kp), [(Axis(kd), vals, slope) for kd, vals, slope in rows])
                      for key, (kp, rows) in state["_attn"].items()}
        self._grid = AttentionGrid(self._pc_axis, self._nd_axis, self._attn, self._extrap)
        if state["_moe"] is not None:
            ae, rows = state["_moe"]
            self._moe = (Axis(ae), [(Axis(t), vals, slope) for t, vals, slope in rows])

    def _build_dense(self, tp_dir: Path, max_tokens: int, max_seqs: int) -> None:
        dense_path = tp_dir / "dense.csv"
        rows = _read_csv(dense_path, ("layer", "tokens", "time_us"))
        by_layer: dict[str, dict[int, float]] = {}
        for r in rows:
            by_layer.setdefault(r["layer"], {})[int(float(r["tokens"]))] = float(r["time_us"]) * 1e3
        seq_path = tp_dir / "per_sequence.csv"
        srows = _read_csv(seq_path, ("layer", "sequences", "time_us"))
        by_seq: dict[str, dict[int, float]] = {}
        for r in srows:
            by_seq.setdefault(r["layer"], {})[int(float(r["sequences"]))] = float(r["time_us"]) * 1e3

        dense_needed = [n for n in self.model.block_sequence if n not in ("attention", "moe")]
        for name in (*PROLOGUE, *HEAD_DENSE, *dense_needed):
            if name not in by_layer:
                raise InputError(f"missing layer {name!r} needed by architecture "
                                 f"{self.model.architecture!r}; has {sorted(by_layer)}",
                                 source=str(dense_path))
        for name in HEAD_PER_SEQUENCE:
            if name not in by_seq:
                raise InputError(f"missing layer {name!r}; has {sorted(by_seq)}",
                                 source=str(seq_path))

        import numpy as np

        def table(d: dict[int, float], upto: int):
            ks = sorted(d)
            return _interp_table(ks, [d[k] for k in ks], upto)

        self._dense_max = {name: max(d) for name, d in by_layer.items()}
        self._seq_max = {name: max(d) for name, d in by_seq.items()}
        self._max_tokens = max_tokens
        self._max_seqs = max_seqs
        # Per-layer arrays (ns) indexed by token/sequence count, as Python lists for fast
        # scalar indexing.
        dense = {name: table(by_layer[name], max_tokens)
                 for name in {*PROLOGUE, *HEAD_DENSE, *dense_needed}}
        seq = {name: table(by_seq[name], max_seqs) for name in HEAD_PER_SEQUENCE}
        self._dense = {name: t.tolist() for name, (t, _) in dense.items()}
        self._seq = {name: t.tolist() for name, (t, _) in seq.items()}
        # slopes past the precomputed tables (the same line the tables end on)
        self._dense_slope = {name: s for name, (_, s) in dense.items()}
        self._seq_slope = {name: s for name, (_, s) in seq.items()}
        self._grid_tokens = min(self._dense_max[n] for n in self._dense)
        self._grid_seqs = min(self._seq_max.values())
        # Whole-iteration sums for the single-NPU fast path, of the same per-layer integer
        # nanoseconds layer_times reports, so iteration_ns == layer_times(...).total_ns().
        def ints(name: str, table: dict):
            return np.maximum(1, np.asarray(table[name]).astype(np.int64))

        n_blocks = self.model.num_hidden_layers
        dense_total = sum(ints(n, self._dense) for n in dense_needed) * n_blocks
        for n in (*PROLOGUE, *HEAD_DENSE):
            dense_total = dense_total + ints(n, self._dense)
        self._dense_total = dense_total.tolist()
        self._seq_total = sum(ints(n, self._seq) for n in HEAD_PER_SEQUENCE).tolist()

    def _build_attention(self, path: Path) -> None:
        rows = _read_csv(path, ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
        grid: dict[tuple[int, int], dict[int, dict[int, float]]] = {}
        for r in rows:
            pc, kp = int(float(r["prefill_chunk"])), int(float(r["kv_prefill"]))
            nd, kd = int(float(r["n_decode"])), int(float(r["kv_decode"]))
            grid.setdefault((pc, nd), {}).setdefault(kp, {})[kd] = float(r["time_us"]) * 1e3
        if not grid:
            raise InputError("attention profile is empty", source=str(path))
        self._pc_axis = Axis({k[0] for k in grid})
        self._nd_axis = Axis({k[1] for k in grid})
        # slice -> (kp axis, [ (kd axis, values) per kp ])
        self._attn = {}
        for key, by_kp in grid.items():
            kp_axis = Axis(by_kp)
            rows_ = []
            for kp in kp_axis.vals:
                kd_axis = Axis(by_kp[kp])
                vals = [by_kp[kp][k] for k in kd_axis.vals]
                rows_.append((kd_axis, vals, upper_slope(kd_axis.vals, vals)))
            self._attn[key] = (kp_axis, rows_)
        self._attn_path = str(path)

    def _build_skew(self, tp: int):
        """The bundle's skew fit, when meta.yaml enables one for this tp: a per-bucket alpha
        table (tp<N>/skew_fit.csv) and its bucket edges, plus the pooled default alpha."""
        where = str(self.root / "meta.yaml")
        fit = _meta_mapping(self.meta, "skew_fit", where)
        if not fit.get("enabled"):
            return None
        per_tp = _meta_mapping(fit, "per_tp", where, "skew_fit.")
        entry = per_tp.get(tp) or per_tp.get(str(tp))
        if not entry:
            return None
        entry = _meta_mapping(per_tp, tp if tp in per_tp else str(tp), where, "skew_fit.per_tp.")
        axes = _skew_axes(_meta_mapping(fit, "bucket_axes", where, "skew_fit."), where)
        table: dict[tuple, float] = {}
        pcs: set[int] = set()
        rel = entry.get("bucket_table")
        if isinstance(rel, str) and rel:
            path = self.root / rel
            for r in _read_csv(path, ("pc", *(f"{a}_label" for a in _SKEW_AXES), "alpha")):
                pc = int(float(r["pc"]))
                pcs.add(pc)
                table[(pc, r["n_label"], r["skew_rate_label"], r["kv_big_label"],
                       r["kp_label"])] = float(r["alpha"])
        default = entry.get("alpha_default", 0.0)
        if isinstance(default, bool) or not isinstance(default, int | float) \
                or not math.isfinite(default):
            raise InputError(f"skew_fit.per_tp.{tp}.alpha_default must be a finite number, "
                             f"got {default!r}", source=where)
        if rel is not None and not isinstance(rel, str):
            raise InputError(f"skew_fit.per_tp.{tp}.bucket_table must be a file name "
                             f"(relative to the bundle folder), got {rel!r}", source=where)
        return {"axes": axes, "table": table, "pcs": sorted(pcs) or [0],
                "default": float(default)}

    @staticmethod
    def _label(bins, labels, v) -> str:
        """The bucket of ``v``; buckets are (bins[i], bins[i+1]], inclusive on the right."""
        for i, label in enumerate(labels):
            if v <= bins[i + 1]:
                return label
        return labels[-1]

    def _skew_alpha(self, shape: BatchShape, kv_mean: int) -> float:
        """The measured correction for a batch whose decode KV lengths differ: attention
        costs t_mean + alpha * (t_max - t_mean), with alpha looked up by (prefill chunk,
        decode count, skew rate, longest KV, prefill KV); the pooled alpha otherwise."""
        sk = self._skew
        ax = sk["axes"]
        rate = skew_rate(shape, kv_mean)
        pc = min(sk["pcs"], key=lambda p: abs(p - shape.prefill_tokens))
        key = (pc, self._label(ax["n_bins"], ax["n_labels"], shape.num_decode),
               self._label(ax["skew_rate_bins"], ax["skew_rate_labels"], min(1.0, max(0.0, rate))),
               self._label(ax["kv_big_bins"], ax["kv_big_labels"], shape.decode_kv_max),
               self._label(ax["kp_bins"], ax["kp_labels"], shape.prefill_kv))
        return sk["table"].get(key, sk["default"])

    def _build_moe(self):
        path, scale = self._moe_table()
        rows = _read_csv(path, ("tokens", "activated_experts", "time_us"))
        if not rows:
            raise InputError("MoE profile has no rows (a header alone)", source=str(path))
        by_ae: dict[int, dict[int, float]] = {}
        for r in rows:
            by_ae.setdefault(int(float(r["activated_experts"])), {})[int(float(r["tokens"]))] = \
                float(r["time_us"]) * 1e3 * scale
        ae_axis = Axis(by_ae)
        rows_ = []
        for a in ae_axis.vals:
            t_axis = Axis(by_ae[a])
            vals = [by_ae[a][t] for t in t_axis.vals]
            rows_.append((t_axis, vals, work_slope(t_axis.vals, vals)))
        return ae_axis, rows_

    # ------------------------------------------------------------------ lookups
    def _note(self, axis: str) -> None:
        self._extrap[axis] = self._extrap.get(axis, 0) + 1

    @staticmethod
    def _line_many(axis: Axis, vals: list[float], qs: range, slope: float) -> list[float]:
        """``grid.line`` at each of the increasing ``qs``: the same float operations, with the
        bracket found by walking the axis instead of bisecting for each."""
        keys = axis.vals
        n = axis.n
        top = keys[-1]
        out: list[float] = []
        append = out.append
        i = bisect.bisect_right(keys, qs[0]) if qs else 0
        for q in qs:
            if q > top:
                append(vals[-1] + slope * (q - top))
                continue
            if n == 1 or q <= keys[0]:
                append(vals[0] + 0.0 * (vals[0] - vals[0]))
                continue
            while i < n and keys[i] <= q:
                i += 1
            lo = i - 1 if i < n else n - 2
            t = (q - keys[lo]) / (keys[lo + 1] - keys[lo])
            append(vals[lo] + t * (vals[lo + 1] - vals[lo]))
        return out

    def attention_ns(self, shape: BatchShape) -> float:
        """Attention at the batch's mean decode KV, skew-corrected where the bundle has a
        skew fit and the decode lengths differ."""
        nd = shape.num_decode
        kd = shape.decode_kv_sum // nd if nd else 0
        t_mean = self._attention_at(shape, kd)
        if self._skew is None or nd < 2 or shape.decode_kv_max == kd:
            return t_mean
        alpha = self._skew_alpha(shape, kd)
        if alpha == 0.0:
            return t_mean
        t_max = self._attention_at(shape, shape.decode_kv_max)
        return t_mean + alpha * (t_max - t_mean) if t_max > t_mean else t_mean

    def _attention_at(self, shape: BatchShape, kd: int) -> float:
        """Several prompts in one step run as one FlashAttention varlen kernel whose work is
        the sum over requests of c_i (kv_i + c_i/2), not (sum c) x (sum kv): the grid (one
        prompt per point) is read at the total chunk (the kernel's query rows) and the
        cached KV that gives that one prompt the same work; when the work is below even
        a fresh prompt of that size, the prefill part of that lookup is scaled down by the
        work ratio over the fixed overhead."""
        pc, nd = shape.prefill_tokens, shape.num_decode
        two_w = shape.prefill_work
        if not (pc and two_w):
            return self._grid.at(pc, shape.prefill_kv, nd, kd)
        excess = two_w - pc * pc
        if excess >= 0:
            return self._grid.at(pc, excess // (2 * pc), nd, kd)
        base = self._grid.at(0, 0, nd, kd)
        return base + (self._grid.at(pc, 0, nd, kd) - base) * two_w / (pc * pc)

    def moe_ns(self, tokens: int, activated_experts: int) -> int:
        if self._moe is None:
            raise InputError(f"{self.model.name} is not an MoE model")
        ae_axis, rows = self._moe
        lo, hi, t, ex = ae_axis.bracket(activated_experts)
        if ex:
            self._note("activated_experts")
            v = beyond(ae_axis, lambda i: line(rows[i][0], rows[i][1], tokens, rows[i][2]),
                       activated_experts)
            return max(1, int(v))
        a_axis, vals, slope = rows[lo]
        if tokens > a_axis.vals[-1]:
            self._note("moe_tokens")
        v = line(a_axis, vals, tokens, slope)
        if hi != lo:
            b_axis, bvals, bslope = rows[hi]
            v += t * (line(b_axis, bvals, tokens, bslope) - v)
        return max(1, int(v))

    def _dense_at(self, name: str, tokens: int) -> float:
        table = self._dense[name]
        if tokens < len(table):
            return table[tokens]
        self._note("tokens")
        # Beyond the precomputed table: the table's own extrapolation line, continued.
        return table[-1] + self._dense_slope[name] * (tokens - len(table) + 1)

    def _seq_at(self, name: str, seqs: int) -> float:
        table = self._seq[name]
        if seqs < len(table):
            return table[seqs]
        self._note("sequences")
        return table[-1] + self._seq_slope[name] * (seqs - len(table) + 1)

    def layer_times(self, shape: BatchShape) -> LayerTimes:
        t = self.dense_tokens(shape.num_tokens)
        if t > self._grid_tokens:
            self._note("tokens")
        if shape.num_seqs > self._grid_seqs:
            self._note("sequences")
        block = []
        for name in self.model.block_sequence:
            if name == "attention":
                ns = self.attention_ns(shape)
            elif name == "moe":
                ns = self.moe_ns(t, self.expected_active_experts(t))
            else:
                ns = self._dense_at(name, t)
            block.append((name, max(1, int(ns))))
        prologue = tuple((n, max(1, int(self._dense_at(n, t)))) for n in PROLOGUE)
        head = tuple((n, max(1, int(self._dense_at(n, t)))) for n in HEAD_DENSE) + tuple(
            (n, max(1, int(self._seq_at(n, shape.num_seqs)))) for n in HEAD_PER_SEQUENCE)
        return LayerTimes(prologue, tuple(block), head, self.model.num_hidden_layers)

    def iteration_ns(self, shape: BatchShape) -> int:
        """Whole-iteration compute time on one NPU: ``layer_times(shape).total_ns()``,
        from pre-summed tables (the tp=1, pp=1 fast path)."""
        t, s = shape.num_tokens, shape.num_seqs
        dt = self.dense_tokens(t)
        if dt >= len(self._dense_total) or s >= len(self._seq_total):
            return self.layer_times(shape).total_ns()
        if dt > self._grid_tokens:
            self._note("tokens")
        if s > self._grid_seqs:
            self._note("sequences")
        per_block = max(1, int(self.attention_ns(shape)))
        if self._moe is not None:
            per_block += self.moe_ns(dt, self.expected_active_experts(dt))
        return self._dense_total[dt] + self._seq_total[s] + per_block * self.model.num_hidden_layers

    def extrapolations(self) -> dict[str, int]:
        return dict(self._extrap)

    # ------------------------------------------------------------------ decode stretches
    def set_cudagraph_padding(self, padded: list[int] | None) -> None:
        super().set_cudagraph_padding(padded)
        self._stretch_by_nd = {}  # (their dense token counts change)

    def decode_stretch(self, shape: BatchShape, steps: int) -> DecodeStretch | None:
        """``iteration_ns`` of a stretch of decode steps: the step's prefill chunk, prefill
        KV and decode count are fixed, so the lookups along the decode-count and chunk
        axes are made once (per decode count) and only the decode-KV lines are read per
        step, a linear piece of each at a time (with the same float operations as the
        scalar path, so every value is identical)."""
        nd = shape.num_decode
        if shape.prefill_tokens or nd < 1 or nd != shape.num_tokens or nd != shape.num_seqs:
            return None
        setup = self._stretch_by_nd.get(nd, False)
        if setup is False:
            setup = self._stretch_by_nd[nd] = self._stretch_setup(nd)
        if setup is None:
            return None
        kd0 = shape.decode_kv_sum // nd
        if self._skew is not None and nd >= 2 and shape.decode_kv_max != kd0:
            return self._skewed_stretch(shape, steps, setup)
        base, grid_notes, line0, line1, nt = setup
        q1 = kd0 + steps
        layers = self.model.num_hidden_layers
        durations = stretch_step_times(base, layers, kd0, q1, line0, line1, nt)
        if durations is not None:
            # Each line one interval of its grid throughout (most stretches): one pass
            # (the same operations as below; no lookup off the grid).
            return DecodeStretch(durations, self._stretch_record(grid_notes, ()))
        attn = _line_run(line0, kd0, q1)
        if line1 is not None:
            attn = [a + nt * (b - a) for a, b in zip(attn, _line_run(line1, kd0, q1))]
        # (lookups past a line's top are booked per line, as _slice_many counts them)
        offs = [line[4] + 1 - kd0 for line in (line0, line1) if line is not None
                and kd0 + steps > line[4] + 1]
        return DecodeStretch([base + (x if (x := int(a)) > 1 else 1) * layers for a in attn],
                             self._stretch_record(grid_notes, offs))

    def _stretch_record(self, grid_notes: tuple[str, ...], offs):
        """``DecodeStretch.record``: the off-grid lookups of the first k steps (``offs``:
        per line read off its grid, the first step that reads it so)."""
        if not grid_notes and not offs:
            return _book_nothing
        extrap = self._extrap

        def record(k: int) -> None:
            if k > 0:
                _book_off_grid(extrap, grid_notes, k,
                               sum(k - (j if j > 0 else 0) for j in offs if k > j))

        return record

    def _stretch_setup(self, nd: int):
        """What every stretch of ``nd`` decodes shares, or None where it has no fast path:
        the dense and per-sequence time, the off-grid axes they read, the decode-KV lines
        of the two profiled decode counts around ``nd`` (prefill chunk and KV 0) and the
        weight between them."""
        td = self.dense_tokens(nd)
        if self._moe is not None or td >= len(self._dense_total) or nd >= len(self._seq_total):
            return None
        nlo, nhi, nt, nex = self._nd_axis.bracket(nd)
        plo, phi, _, pex = self._pc_axis.bracket(0)
        if nex or pex or plo != phi:
            return None
        pc = self._pc_axis.vals[plo]
        nds = self._nd_axis.vals
        lines = []
        for n in dict.fromkeys((nds[nlo], nds[nhi])):
            kp_axis, rows = self._grid.nearest(pc, n)
            if kp_axis.bracket(0)[3]:
                return None
            kd_axis, vals, slope = rows[0]  # (prefill KV 0 is at or below the axis: row 0)
            if not all(type(k) is int for k in kd_axis.vals):
                return None
            lines.append(_piecewise(kd_axis.vals, vals, slope))
        grid_notes = tuple(axis for axis, off in (("tokens", td > self._grid_tokens),
                                                  ("sequences", nd > self._grid_seqs)) if off)
        return (self._dense_total[td] + self._seq_total[nd], grid_notes, lines[0],
                lines[1] if len(lines) > 1 else None, nt)

    def _skewed_stretch(self, shape: BatchShape, steps: int, setup) -> DecodeStretch | None:
        """``decode_stretch`` of a batch whose decode lengths differ, with the bundle's
        skew fit: each step's attention corrected towards the one at its longest KV."""
        nd = shape.num_decode
        nlo, nhi, nt, _ = self._nd_axis.bracket(nd)
        pc = self._pc_axis.vals[self._pc_axis.bracket(0)[0]]
        kd0 = shape.decode_kv_sum // nd
        kv_notes = [0] * steps
        attn = self._over_nd_many(pc, nlo, nhi, nt, range(kd0, kd0 + steps), kv_notes)
        kv_max = range(shape.decode_kv_max, shape.decode_kv_max + steps)
        max_notes = [0] * steps
        t_max = self._over_nd_many(pc, nlo, nhi, nt, kv_max, max_notes)
        if attn is None or t_max is None:
            return None
        for j, alpha in enumerate(self._skew_alpha_many(shape, kd0, steps)):
            if alpha != 0.0:  # the scalar path reads t_max only then
                kv_notes[j] += max_notes[j]
                tm, tx = attn[j], t_max[j]
                attn[j] = tm + alpha * (tx - tm) if tx > tm else tm
        base, grid_notes = setup[0], setup[1]
        layers = self.model.num_hidden_layers
        kv_booked = list(accumulate(kv_notes))
        extrap = self._extrap

        def record(k: int) -> None:
            if k > 0:
                _book_off_grid(extrap, grid_notes, k, kv_booked[k - 1])

        return DecodeStretch([base + max(1, int(a)) * layers for a in attn], record)

    def _over_nd_many(self, pc: int, nlo: int, nhi: int, nt: float, kds: range,
                      notes: list[int]) -> list[float] | None:
        """``AttentionGrid.over_nd`` (decode count inside the grid, no prefill KV) at many
        decode KVs."""
        nds = self._nd_axis.vals
        c0 = self._slice_many(pc, nds[nlo], kds, notes)
        if nhi == nlo or c0 is None:
            return c0
        c1 = self._slice_many(pc, nds[nhi], kds, notes)
        return None if c1 is None else [a + nt * (b - a) for a, b in zip(c0, c1)]

    def _slice_many(self, pc: int, nd: int, kds: range, notes: list[int]) -> list[float] | None:
        """``AttentionGrid.slice`` at prefill KV 0 at many decode KVs (``notes`` counts
        off-grid ones)."""
        kp_axis, rows = self._grid.nearest(pc, nd)
        lo, hi, t, ex = kp_axis.bracket(0)
        if ex:
            return None
        line_many = self._line_many
        kd_axis, vals, slope = rows[lo]
        top = kd_axis.vals[-1]
        if kds[-1] > top:
            for j, q in enumerate(kds):
                if q > top:
                    notes[j] += 1
        v_lo = line_many(kd_axis, vals, kds, slope)
        if lo == hi:
            return v_lo
        kd_axis, vals, slope = rows[hi]
        return [a + t * (b - a) for a, b in zip(v_lo, line_many(kd_axis, vals, kds, slope))]

    def _skew_alpha_many(self, shape: BatchShape, kv_mean: int, steps: int) -> list[float]:
        """``_skew_alpha`` along a stretch: every bucket but the longest KV's is fixed
        (the skew rate keeps its value as mean, min and max all grow by one)."""
        ax = self._skew["axes"]
        bins, labels = ax["kv_big_bins"], ax["kv_big_labels"]
        by_label: dict[str, float] = {}
        out = []
        for j in range(steps):
            kv_max = shape.decode_kv_max + j
            label = self._label(bins, labels, kv_max)
            alpha = by_label.get(label)
            if alpha is None:
                nd, kv_sum = shape.num_decode, shape.decode_kv_sum
                probe = BatchShape(shape.num_tokens, shape.num_seqs, 0, 0, nd,
                                   kv_sum + nd * j, kv_max, shape.decode_kv_min + j, 0,
                                   shape.decode_kv_sq_sum + 2 * j * kv_sum + nd * j * j
                                   if shape.decode_kv_sq_sum else 0)
                alpha = by_label[label] = self._skew_alpha(probe, kv_mean + j)
            out.append(alpha)
        return out




    @classmethod
    def covers(cls, model: ModelSpec, hardware: str, tp: int, profiles_dirs=()) -> str | None:
        root = find_bundle(hardware, model, profiles_dirs)
        if root is None:
            others = other_variants(hardware, model, profiles_dirs)
            return (f"no {bundle_variant(model)} bundle"
                    + (f" (only {', '.join(others)})" if others else ""))
        if not (root / f"tp{tp}").is_dir():
            return f"bundle {root} has no tp{tp}"
        return None


LATENCY_PROVIDERS.register("measured", MeasuredProvider)
