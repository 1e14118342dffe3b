"""Where the project's data lives, resolved from this file (never from the cwd)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def profiles_root() -> Path:
    """The project's ``profiles/`` folder (override with LLMSIM_PROFILES_ROOT)."""
    return Path(os.environ.get("LLMSIM_PROFILES_ROOT", REPO_ROOT / "profiles"))


def shared_data_root() -> Path:
    """``../shared/data`` beside the checkout (override with LLMSIM_SHARED_DATA)."""
    return Path(os.environ.get("LLMSIM_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
