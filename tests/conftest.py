"""Fixtures shared by every test package; the helpers they wrap live in ``sim_testkit``."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from sim_testkit import make_bundle, opts_for


@pytest.fixture(scope="session")
def bundle_root(tmp_path_factory) -> Path:
    """A profiles folder holding the synthetic TESTHW bundle for Llama-3.1-8B (tp1)."""
    root = tmp_path_factory.mktemp("profiles")
    make_bundle(root)
    return root


@pytest.fixture
def sim_opts(bundle_root):
    """Factory: SimOptions using the synthetic bundle, with overrides."""
    def _make(**kw) -> sim.SimOptions:
        return opts_for(bundle_root, **kw)
    return _make
