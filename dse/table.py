"""A table as plain named columns: what a worker sends back for a trial's per-request and
time-series tables instead of a pandas DataFrame, so the actors never import pandas (half
a second of each one's start) and no frame is built, pickled and unpickled per trial.

It answers what the driver and dse.metrics ask of those tables (``len``, ``in``, a column
by name as a numpy array, ``columns``) and writes CSV the way the simulator writes its own
(``llmsim run``: Python's csv module, a missing value as an empty field). ``to_frame()``
gives a DataFrame where one is wanted.
"""

from __future__ import annotations

import csv
from typing import Any, Iterable

import numpy as np


class Columns:
    """Named columns of equal length (each a numpy array; a column holding None stays an
    object array)."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = {str(k): _array(v) for k, v in data.items()}
        lengths = {len(v) for v in self._data.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")

    @classmethod
    def from_rows(cls, names: Iterable[str], rows: list[tuple]) -> Columns:
        names = list(names)
        cols = list(zip(*rows)) if rows else [()] * len(names)
        return cls(dict(zip(names, cols)))

    @property
    def columns(self) -> list[str]:
        return list(self._data)

    def __len__(self) -> int:
        return len(next(iter(self._data.values()))) if self._data else 0

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self):
        return iter(self._data)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._data[name]

    def __getstate__(self):
        return self._data

    def __setstate__(self, state) -> None:
        self._data = state

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Columns) or self.columns != other.columns:
            return NotImplemented if not isinstance(other, Columns) else False
        return all(np.array_equal(self[c], other[c]) for c in self.columns)

    def __repr__(self) -> str:
        return f"Columns({len(self)} rows: {', '.join(self.columns)})"

    def rows(self) -> Iterable[tuple]:
        """Rows of Python values (numpy scalars converted), in column order."""
        return zip(*(v.tolist() for v in self._data.values()))

    def to_csv(self, path, index: bool = False) -> None:
        """Write as CSV: a header, then one line per row (``index`` is accepted for the
        DataFrame method's signature; there is none to write)."""
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(self.columns)
            writer.writerows(self.rows())

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({c: v for c, v in self._data.items()})


def _array(values: Any) -> np.ndarray:
    """A column as a numpy array: numbers as numbers, anything holding None as objects."""
    if isinstance(values, np.ndarray):
        return values
    values = list(values)
    if any(v is None for v in values):
        return np.array(values, dtype=object)
    return np.asarray(values)


__all__ = ["Columns"]
