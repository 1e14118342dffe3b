"""BatchShape is built every step (and every step of an event leap): a plain slotted
dataclass, not a frozen one, yet compared and hashed by value as before."""

from __future__ import annotations

import dataclasses

from sim.latency.base import BatchShape


def test_batch_shape_compares_and_hashes_by_value():
    a = BatchShape(10, 4, 6, 100, 4, 400, 120, 80, 700, 41000)
    b = BatchShape(10, 4, 6, 100, 4, 400, 120, 80, 700, 41000)
    c = dataclasses.replace(a, decode_kv_max=121)
    assert a == b and hash(a) == hash(b) and a != c
    assert {a: 1}[b] == 1
    assert not hasattr(a, "__dict__")  # slotted


def test_batch_shape_is_not_frozen_so_building_one_is_cheap():
    # A frozen dataclass's __init__ goes through object.__setattr__ per field.
    assert not BatchShape.__dataclass_params__.frozen
