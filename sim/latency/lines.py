"""Step times of a decode stretch along one linear piece of the attention lines.

``MeasuredProvider.decode_stretch`` calls these where every step's decode-KV lookup stays
in one interval of the grid (most stretches). The float operations are those of the
scalar path (``MeasuredProvider._line``), step by step, so each value is identical. The
module is compiled with the simulator's hot modules where a compiler is at hand
(``sim/native.py``): the loop is most of a stretch's timing.
"""

from __future__ import annotations

from typing import Any


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
