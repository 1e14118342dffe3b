"""A real two-node Ray cluster on this machine: a head and a worker node (``ray start``,
one CPU each, token authentication as Ray 2.60 sets it up by default), a search joined
through ``--ray-address``, the worker node killed mid-study. The study must complete with
n_trials trials, none lost or run twice, and trials on both nodes.

Every wait has a timeout; both nodes are torn down by killing exactly the processes this
test started (never ``ray stop``, which would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import optuna
import pytest
from dse_testkit import write_space
from optuna.trial import TrialState

from dse.store import open_storage

RAY = str(Path(sys.executable).with_name("ray"))
N_TRIALS = 8
WORKLOAD = {"generate": {"num_requests": 1200, "rate": 40, "seed": 0,
                         "input": {"kind": "uniform", "low": 256, "high": 2048},
                         "output": {"kind": "uniform", "low": 64, "high": 256}}}
KNOBS = {"tp": [1, 2], "max_num_seqs": {"low": 8, "high": 512, "log": True}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pids: set[int]) -> set[int]:
    """``pids`` and all their descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def _group(pgid: int) -> set[int]:
    out = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.getpgid(int(p.name)) == pgid:
                    out.add(int(p.name))
            except OSError:
                continue
    return out


def _kill_node(pgid: int) -> None:
    """SIGKILL the processes one ``ray start`` left (its session) and their children."""
    for pid in _tree(_group(pgid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _ray_start(args: list[str], env: dict, timeout: float = 180) -> int:
    """Run ``ray start`` in a session of its own; returns that session's id (its pgid)."""
    proc = subprocess.Popen([RAY, "start", *args, "--disable-usage-stats",
                             "--object-store-memory", str(100 * 1024 * 1024)],
                            env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_node(proc.pid)
        raise
    if proc.returncode != 0:
        _kill_node(proc.pid)
        pytest.fail(f"ray start {' '.join(args)} failed:\n{out[-3000:]}")
    return proc.pid


@pytest.fixture
def two_nodes():
    temp = tempfile.mkdtemp(prefix="dse-ray-", dir="/tmp")  # short: socket paths are limited
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    nodes: dict[str, int] = {}
    try:
        nodes["head"] = _ray_start(["--head", "--port", str(port), "--num-cpus", "1",
                                    "--include-dashboard", "false", "--temp-dir", temp], env)
        nodes["worker"] = _ray_start(["--address", f"127.0.0.1:{port}", "--num-cpus", "1",
                                      "--resources", json.dumps({"dse_test_worker": 1})], env)
        yield f"127.0.0.1:{port}", env, nodes
    finally:
        for pgid in nodes.values():
            _kill_node(pgid)
        shutil.rmtree(temp, ignore_errors=True)


def _trials(out: Path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()
    except Exception:  # noqa: BLE001 - journal not there yet
        return []


def test_search_on_two_nodes_survives_losing_the_worker_node(tmp_path, two_nodes):
    address, env, nodes = two_nodes
    path = write_space(tmp_path, workload=WORKLOAD, knobs=KNOBS,
                       budget={"total_devices": 2, "devices_per_node": 2},
                       search={"sampler": "random", "n_trials": N_TRIALS, "seed": 11})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dse.cli", "search", str(path), "--out", str(out),
           "--ray-address", address, "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    killed_at = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            done = [t for t in _trials(out) if t.state == TrialState.COMPLETE]
            if len({t.user_attrs.get("node_id") for t in done}) >= 2:
                _kill_node(nodes.pop("worker"))  # the worker node dies mid-study
                killed_at = len(done)
                break
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed_at is not None, f"never saw trials on both nodes:\n{stderr[-3000:]}"
    assert killed_at < N_TRIALS, "the study ended before the worker node could be killed"
    assert proc.returncode == 0, stderr[-3000:]
    assert "ray (2 workers)" in stdout

    trials = _trials(out)
    counted = [t for t in trials if t.state == TrialState.COMPLETE
               and "repeat_of" not in t.user_attrs]
    assert len(counted) == N_TRIALS  # none lost
    assert not [t for t in trials if t.state == TrialState.FAIL]
    node_ids = {t.user_attrs["node_id"] for t in counted}
    assert len(node_ids) == 2  # both nodes ran trials
    # none run twice: one MLflow child run per counted trial, each trial number once
    from mlflow.tracking import MlflowClient

    meta = json.loads((out / "study.json").read_text())
    runs = MlflowClient(meta["tracking_uri"]).search_runs([meta["experiment_id"]],
                                                          max_results=1000)
    kids = [r.data.tags["dse.trial_number"] for r in runs
            if r.data.tags.get("mlflow.parentRunId")]
    assert sorted(kids) == sorted(str(t.number) for t in counted)
    assert {r.data.tags.get("node_id") for r in runs
            if r.data.tags.get("mlflow.parentRunId")} == node_ids
