"""``dse ui`` stopped (SIGTERM, Ctrl-C) stops the MLflow UI and everything it started,
without a traceback, even when the server takes longer than the grace to stop. Before,
a server still stopping after 10 s gave a ``subprocess.TimeoutExpired`` traceback, exit 1,
and its job consumers were left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: dse ui with a stand-in server that ignores SIGTERM and has a child of its own
CHILD = r"""
import sys
import dse.cli as cli
cli.UI_STOP_GRACE_S = 1.0
stub = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
        "open(sys.argv[1], 'w').write(f'{os.getpid()} {c.pid}'); time.sleep(120)")
cli._mlflow_ui_cmd = lambda uri, host, port: [sys.executable, "-c", stub, sys.argv[2]]
sys.exit(cli.main(["ui", sys.argv[1], "--port", "5931"]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().split(")")[-1].split()[0] != "Z"


def test_ui_stops_its_server_group_without_a_traceback(tmp_path):
    (tmp_path / "study.json").write_text(json.dumps({"study_name": "t"}))
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'astra-sim'}"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(pids_file)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not pids_file.exists() or not pids_file.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    server, child = (int(p) for p in pids_file.read_text().split())
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert not _alive(server) and not _alive(child)
