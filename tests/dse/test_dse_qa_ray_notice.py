"""The local Ray that ``dse search`` starts itself keeps Ray's token authentication but
not its "Token authentication is enabled" notice on the user's console."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import os, ray
from dse.pool import init_ray
assert init_ray(num_cpus=1) is True
from ray._raylet import AuthenticationMode, get_authentication_mode
print("MODE", get_authentication_mode() == AuthenticationMode.TOKEN, os.environ.get("RAY_AUTH_MODE"))
ray.shutdown()
"""


def test_local_ray_start_keeps_token_auth_without_its_notice():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "astra-sim")])
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MODE True token" in proc.stdout  # auth as Ray sets it for a new local cluster
    assert "Token authentication is enabled" not in proc.stderr + proc.stdout
