"""Fixtures shared by every test package; the helpers they wrap live in ``sim_testkit``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite checks the reference modules (pure Python), whose functions and methods its
# tests patch; tests/sim/test_native.py compares a compiled build (sim.native) with them.
os.environ.setdefault("LLMSIM_PURE_PYTHON", "1")

import sim  # noqa: E402
from sim_testkit import make_bundle, opts_for  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _llmsim_cache_dir(tmp_path_factory):
    """The on-disk cache (sim.cache) in a folder of the test session, not the user's."""
    old = os.environ.get("LLMSIM_CACHE_DIR")
    os.environ["LLMSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("llmsim-cache"))
    yield
    if old is None:
        os.environ.pop("LLMSIM_CACHE_DIR", None)
    else:
        os.environ["LLMSIM_CACHE_DIR"] = old


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
