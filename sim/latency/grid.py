"""The measured attention grid and its scalar lookups.

``MeasuredProvider`` (``sim.latency.measured``) builds the grid from a bundle's
attention.csv; an iteration's attention time is read here: multilinear over (prefill
chunk, decode count, prefill KV, decode KV), each axis bracketed by ``Axis``, extended
past its top by ``beyond`` and counted off the grid in ``extrap`` (the provider's
``extrapolations()``). Every grid key is an integer (token counts), and so is every
query, as in the provider's other lookups.

The module is compiled with the simulator's hot modules where a C compiler is at hand
(``sim/native.py``): an iteration's lookup is a chain of a dozen small calls, each a
Python frame otherwise. Compiled, integer differences and quotients are those of C
doubles, which for integers below 2**53 are Python's own: the values are identical.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable


def upper_slope(keys: list[int], vals: list[float]) -> float:
    """Least-squares slope through the upper half of a grid axis (the points whose key is
    at least half the largest; the last two where fewer), floored at zero."""
    n = len(keys)
    if n < 2:
        return 0.0
    top = keys[-1]
    idx = [i for i in range(n) if keys[i] * 2 >= top]
    if len(idx) < 2:
        idx = [n - 2, n - 1]
    xs = [float(keys[i]) for i in idx]
    ys = [float(vals[i]) for i in idx]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum([(x - mx) ** 2 for x in xs])
    if sxx <= 0:
        return 0.0
    return max(0.0, sum([(x - mx) * (y - my) for x, y in zip(xs, ys)]) / sxx)


class Axis:
    """A sorted grid axis with linear bracketing (clamped below, extrapolated above)."""

    def __init__(self, vals: Iterable[int]) -> None:
        self.vals: list[int] = sorted(vals)
        self.n: int = len(self.vals)

    def bracket(self, q: int) -> tuple[int, int, float, bool]:
        """The grid points around ``q`` and its weight between them; whether it is past
        the top (then the last two points, the weight above 1)."""
        vals = self.vals
        if self.n == 1 or q <= vals[0]:
            return 0, 0, 0.0, False
        i = bisect.bisect_right(vals, q)
        if i >= self.n:
            lo, hi = self.n - 2, self.n - 1
            return lo, hi, (q - vals[lo]) / (vals[hi] - vals[lo]), q > vals[-1]
        return i - 1, i, (q - vals[i - 1]) / (vals[i] - vals[i - 1]), False


def line(axis: Axis, vals: list[float], q: int, slope: float) -> float:
    """``vals`` over ``axis`` at ``q``: linear between grid points, the first value below
    them, the top value plus ``slope`` per unit above."""
    keys = axis.vals
    top = keys[-1]
    if q > top:
        return vals[-1] + slope * (q - top)
    # Axis.bracket, inline (the same operations)
    n = axis.n
    if n == 1 or q <= keys[0]:
        return vals[0] + 0.0 * (vals[0] - vals[0])
    i = bisect.bisect_right(keys, q)
    lo = i - 1 if i < n else n - 2
    t = (q - keys[lo]) / (keys[lo + 1] - keys[lo])
    return vals[lo] + t * (vals[lo + 1] - vals[lo])


def beyond(axis: Axis, at: Callable[[int], float], q: int) -> float:
    """Past the top of ``axis``: the top value plus the upper-half slope of the values
    ``at(i)`` at the axis points (monotone in ``q``)."""
    keys = axis.vals
    first = next(i for i in range(axis.n) if keys[i] * 2 >= keys[-1] or i >= axis.n - 2)
    idx = range(first, axis.n)
    vals = [at(i) for i in idx]
    return vals[-1] + upper_slope([keys[i] for i in idx], vals) * (q - keys[-1])


#: one decode-KV line of a slice: its axis, values and slope past the top
KdLine = tuple[Axis, list[float], float]
#: a (prefill chunk, decode count) slice: the prefill-KV axis, a decode-KV line per point
Slice = tuple[Axis, list[KdLine]]


class AttentionGrid:
    """Attention time (ns) at (prefill chunk, prefill KV, decode count, decode KV)."""

    def __init__(self, pc_axis: Axis, nd_axis: Axis, slices: dict[tuple[int, int], Slice],
                 extrap: dict[str, int]) -> None:
        self.pc_axis = pc_axis
        self.nd_axis = nd_axis
        self.slices = slices
        self.pairs = list(slices)
        #: lookups off the grid, per axis (the provider's own dict)
        self.extrap = extrap

    def note(self, axis: str) -> None:
        self.extrap[axis] = self.extrap.get(axis, 0) + 1

    def nearest(self, pc: int, nd: int) -> Slice:
        """The slice at (pc, nd), or at the nearest profiled pair where that grid corner
        was not profiled."""
        s = self.slices.get((pc, nd))
        if s is None:
            best = min(self.pairs, key=lambda p: (p[0] - pc) ** 2 + (p[1] - nd) ** 2)
            s = self.slices[best]
        return s

    def at(self, pc: int, kp: int, nd: int, kd: int) -> float:
        """Multilinear over the grid (extended past its top)."""
        plo, phi, pt, pex = self.pc_axis.bracket(pc)
        if pex:
            # A chunk above the grid: its query rows are independent in the kernel, so it
            # runs as pc / top pieces of the top measured chunk, each over the chunk rows
            # before it (on average (pc - top) / 2 more cached KV): the causal work, which
            # grows with the square of the chunk. (Read along the chunk axis, a linear
            # extension charged an 8,192-token prompt a third of it.) The decodes beside
            # it are counted once, with the first piece.
            self.note("prefill_chunk")
            top = self.pc_axis.vals[-1]
            kp_eq = kp + (pc - top) // 2
            return (self.over_nd(top, nd, kp_eq, kd)
                    + (pc / top - 1.0) * self.over_nd(top, 0, kp_eq, 0))
        pcs = self.pc_axis.vals
        v0 = self.over_nd(pcs[plo], nd, kp, kd)
        if phi == plo:
            return v0
        return v0 + pt * (self.over_nd(pcs[phi], nd, kp, kd) - v0)

    def over_nd(self, pc: int, nd: int, kp: int, kd: int) -> float:
        """Attention at a profiled prefill chunk, interpolated (or extended) over n_decode."""
        nlo, nhi, nt, nex = self.nd_axis.bracket(nd)
        nds = self.nd_axis.vals
        if nex:
            self.note("n_decode")
            return beyond(self.nd_axis, lambda i: self.slice(pc, nds[i], kp, kd), nd)
        c0 = self.slice(pc, nds[nlo], kp, kd)
        if nhi == nlo:
            return c0
        return c0 + nt * (self.slice(pc, nds[nhi], kp, kd) - c0)

    def slice(self, pc: int, nd: int, kp: int, kd: int) -> float:
        """A (prefill chunk, decode count) slice at (prefill KV, decode KV)."""
        kp_axis, rows = self.nearest(pc, nd)
        lo, hi, t, ex = kp_axis.bracket(kp)
        if ex:
            self.note("kv_prefill")
            return beyond(kp_axis, lambda i: line(rows[i][0], rows[i][1], kd, rows[i][2]), kp)
        kd_axis, vals, slope = rows[lo]
        if kd > kd_axis.vals[-1]:
            self.note("kv_decode")
        v_lo = line(kd_axis, vals, kd, slope)
        if lo == hi:
            return v_lo
        kd_axis, vals, slope = rows[hi]
        return v_lo + t * (line(kd_axis, vals, kd, slope) - v_lo)
