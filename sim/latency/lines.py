"""Step times of a decode stretch along one linear piece of the attention lines.

``MeasuredProvider.decode_stretch`` calls ``stretch_step_times`` where every step's
decode-KV lookup stays in one interval of the grid (most stretches). The float
operations are those of the scalar path (``sim.latency.grid.line``), step by step, so
each value is identical. The module is compiled with the simulator's hot modules where a
compiler is at hand (``sim/native.py``): the loop is most of a stretch's timing.
"""

from __future__ import annotations

import bisect
from typing import Any


def lerp_piece(line: tuple, q0: int, q1: int) -> tuple | None:
    """The interval piece of ``line`` (``measured._piecewise``) that holds all of q0 ..
    q1 - 1, or None where they are not in one."""
    starts, pieces, n, _, _ = line
    r = bisect.bisect_right(starts, q0)
    return pieces[r] if 0 < r < n and starts[r] >= q1 else None


def stretch_step_times(base: Any, layers: int, q0: int, q1: int, line0: tuple,
                       line1: tuple | None, weight: float) -> list | None:
    """Per step (decode KV q0 .. q1 - 1), where each line is one interval piece of its
    grid throughout: ``base`` plus ``layers`` times the attention (line0's, or line0's
    blended towards line1's by ``weight``), at least 1; None where a line is not."""
    p0 = lerp_piece(line0, q0, q1)
    if p0 is None:
        return None
    _, v0, dv0, k0, dk0 = p0
    if line1 is None:
        return piece_step_times(base, layers, q0, q1, v0, dv0, k0, dk0)
    p1 = lerp_piece(line1, q0, q1)
    if p1 is None:
        return None
    _, v1, dv1, k1, dk1 = p1
    return blended_step_times(base, layers, q0, q1, v0, dv0, k0, dk0, weight, v1, dv1, k1, dk1)


def piece_step_times(base: Any, layers: int, q0: int, q1: int,
                     v0: float, dv0: float, k0: float, dk0: float) -> list:
    """Per step (decode KV q0 .. q1 - 1): ``base`` plus ``layers`` times the line's value
    (at least 1) on the piece through (k0, v0) with slope dv0 / dk0."""
    out = []
    for q in range(q0, q1):
        x = int(v0 + (q - k0) / dk0 * dv0)
        out.append(base + (x if x > 1 else 1) * layers)
    return out


def blended_step_times(base: Any, layers: int, q0: int, q1: int,
                       v0: float, dv0: float, k0: float, dk0: float, weight: float,
                       v1: float, dv1: float, k1: float, dk1: float) -> list:
    """``piece_step_times`` of two lines blended: a + weight * (b - a) per step."""
    out = []
    for q in range(q0, q1):
        a = v0 + (q - k0) / dk0 * dv0
        x = int(a + weight * (v1 + (q - k1) / dk1 * dv1 - a))
        out.append(base + (x if x > 1 else 1) * layers)
    return out
