"""Fixtures for the dse tests: one local Ray for the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every test that needs it (never attach to an outside cluster)."""
    os.environ.pop("RAY_ADDRESS", None)
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
