"""What a search costs the driver per trial: journal writes, MLflow store calls, what it
reads back; and that the cheaper bookkeeping loses nothing (a killed driver resumes, the
artifacts are where MLflow's UI looks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pandas as pd
import pytest
from dse_testkit import write_space
from optuna.trial import TrialState

import dse.report
from dse.journal import JournalReader, parse
from dse.space import load_space
from dse.store import JOURNAL, DriverJournal
from dse.study import PER_INSTANCE_METRICS, Driver, open_storage

SPACE = {"search": {"sampler": "random", "n_trials": 8, "seed": 2}}
#: 4 replicas: a trial has per-instance KV-cache figures in its summary
KNOBS = {"tp": [1], "replicas": [2, 4], "max_num_seqs": [16, 64, 128],
         "max_num_batched_tokens": [512, 1024, 2048]}


def _study(out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="t", storage=open_storage(out))


def _client_runs(out):
    from mlflow.tracking import MlflowClient

    meta = json.loads((out / "study.json").read_text())
    client = MlflowClient(meta["tracking_uri"])
    runs = client.search_runs([meta["experiment_id"]], max_results=5000)
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId")
            == meta["mlflow_parent_run_id"]]
    return client, kids


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One in-process search of 8 trials, with a spy on the MLflow client's calls."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("cost")
    calls: list[str] = []
    names = ("create_run", "log_batch", "set_terminated", "log_artifacts", "log_artifact",
             "set_tag", "log_metric", "log_param")
    real = {n: getattr(MlflowClient, n) for n in names}

    def spy(name):
        def call(self, *a, **k):
            if threading.current_thread() is not threading.main_thread():
                calls.append(name)
            return real[name](self, *a, **k)
        return call

    mp = pytest.MonkeyPatch()
    for n in names:
        mp.setattr(MlflowClient, n, spy(n))
    try:
        out = tmp / "out"
        driver = Driver(load_space(write_space(tmp, knobs=KNOBS, **SPACE)), out, workers=0,
                        progress=False)
        summary = driver.run()
    finally:
        mp.undo()
    return driver, summary, out, calls


def test_journal_is_written_about_once_per_trial(finished):
    driver, s, out, _ = finished
    trials = _study(out).get_trials()
    lines = (out / JOURNAL).read_bytes().count(b"\n")
    assert lines > 10 * len(trials)  # Optuna logs ~25 lines a trial ...
    # ... written out once a round of the loop: the trials told and those asked (+ setup)
    assert s.timings["journal_writes"] <= len(trials) + 2
    assert not (out / (JOURNAL + ".tmp")).exists()


def test_mlflow_three_store_calls_per_trial_and_no_per_instance_metrics(finished):
    driver, s, out, calls = finished
    client, kids = _client_runs(out)
    n = len(kids)
    assert n == s.timings["mlflow_logged"] > 0
    # the parent: create_run + log_batch (params) + at the end log_batch (metrics),
    # log_artifact(s) of the report files and set_terminated
    per_trial = {k: calls.count(k) for k in set(calls)}
    assert per_trial["create_run"] == n + 1
    assert per_trial["log_batch"] == n + 2
    assert per_trial["set_terminated"] == n + 1
    assert not {"set_tag", "log_metric", "log_param"} & set(calls)
    assert per_trial.get("log_artifacts", 0) <= 1  # the parent's best/ folder only
    # every child's files written straight into its artifact folder
    assert s.timings["mlflow_artifacts_direct"] == n
    simulated = [r for r in kids if r.data.tags.get("rejected") == "False"]
    assert simulated
    for r in simulated:
        # tags came with create_run
        assert {"feasible", "state", "latency_provider", "dse.trial_number"} <= set(r.data.tags)
        assert not [k for k in r.data.metrics if k.startswith(("kv_cache/", "kv_blocks/"))]
        assert "objective/throughput_per_device" in r.data.metrics


def test_artifacts_are_where_mlflow_lists_them(finished):
    _, _, out, _ = finished
    client, kids = _client_runs(out)
    r = next(r for r in kids if r.data.tags.get("rejected") == "False")
    names = {f.path for f in client.list_artifacts(r.info.run_id)}
    assert {"requests.csv", "summary.json", "cluster.json", "latency_hist.png"} <= names
    local = client.download_artifacts(r.info.run_id, "summary.json", str(out / "dl"))
    summary = json.loads(open(local).read())
    # the per-instance KV figures left out of the metrics are in the summary
    assert any(k.startswith(PER_INSTANCE_METRICS[0].rstrip(".")) for k in summary)
    png = client.download_artifacts(r.info.run_id, "latency_hist.png", str(out / "dl"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_timing_lines_name_driver_cpu(finished):
    driver, s, _, _ = finished
    text = "\n".join(driver.timing_lines())
    assert "CPU after the workers are up: driver" in text
    assert s.timings["driver_cpu_s"] >= s.timings["driver_main_cpu_s"] > 0


def test_report_reads_back_only_the_trials_the_driver_did_not_run(tmp_path, monkeypatch):
    """A resumed study's front may hold trials of the earlier run: their latency
    distributions are read from MLflow (after the writer has logged them); the trials
    this run evaluated come from the driver's memory."""
    path = write_space(tmp_path, knobs=KNOBS, **SPACE)
    out = tmp_path / "out"
    Driver(load_space(path), out, workers=0, progress=False, n_trials=4).run()
    read: list[list[int]] = []
    real = dse.report.request_tables

    def tables(out_dir, trials, *a, **k):
        read.append(sorted(trials))
        return real(out_dir, trials, *a, **k)

    monkeypatch.setattr(dse.report, "request_tables", tables)
    drv = Driver(load_space(path), out, workers=0, progress=False, n_trials=8)
    drv.run()
    front = [int(x) for x in pd.read_csv(out / "pareto.csv")["trial"]]
    earlier = sorted(t for t in front if t not in drv._latency)
    assert read == ([earlier] if earlier else [])
    if earlier:  # they were found in MLflow
        assert sorted(real(out, earlier)) == earlier


# ---------------------------------------------------------------- the journal itself
def _log(i: int) -> dict:
    return {"op_code": 0, "worker_id": "w", "n": i, "blob": "x" * 50}


def test_driver_journal_file_is_always_a_committed_state(tmp_path):
    """The file holds exactly what was committed (never a part of a commit), even read
    by other readers (a new one each time, and one kept, which reads only what was
    appended) while commits are appended."""
    j = DriverJournal(tmp_path / JOURNAL)
    commits = {0}
    stop = threading.Event()
    seen: list[int] = []
    bad: list[str] = []

    kept = JournalReader(j.path)

    def reader():
        while not stop.is_set():
            if not j.path.exists():
                continue
            try:
                logs = list(JournalReader(j.path).read_logs(0))
                seen.append(len(kept.read_logs(0)))
            except Exception as exc:  # noqa: BLE001
                bad.append(repr(exc))
                continue
            seen.append(len(logs))
            if [x["n"] for x in logs] != list(range(len(logs))):
                bad.append(f"out of order: {[x['n'] for x in logs][:5]}")

    t = threading.Thread(target=reader)
    t.start()
    n = 0
    try:
        for i in range(200):
            for _ in range(7):
                j.append_logs([_log(n)])
                n += 1
            j.commit()
            commits.add(n)
            if i % 20 == 19:
                # appending is fast: let the reader read between commits (on a loaded
                # machine its thread might otherwise not run before the last one)
                before = len(seen)
                deadline = time.monotonic() + 10
                while len(seen) <= before and time.monotonic() < deadline:
                    time.sleep(0.001)
    finally:
        stop.set()
        t.join()
    assert not bad and seen
    assert set(seen) <= commits  # never a torn or partial commit
    j.append_logs([_log(n)])  # appended, not committed: not in the file
    assert len(list(JournalReader(j.path).read_logs(0))) == n
    j.sync()
    assert len(list(JournalReader(j.path).read_logs(0))) == n + 1
    assert j.syncs == 1 and not (tmp_path / (JOURNAL + ".tmp")).exists()
    # what Optuna reads back is a copy: changing it does not change the journal
    got = j.read_logs(0)
    got[0]["n"] = 99
    assert j.read_logs(0)[0]["n"] == 0
    # reopened: the same lines
    assert [x["n"] for x in DriverJournal(j.path).read_logs(0)] == list(range(n + 1))


def test_driver_journal_drops_a_torn_last_line(tmp_path):
    p = tmp_path / JOURNAL
    p.write_bytes(b'{"op_code":0,"n":0}\n{"op_code":0,"n"')  # an old appender, killed
    j = DriverJournal(p)
    assert [x["n"] for x in j.read_logs(0)] == [0]


SLOW = {"generate": {"num_requests": 1500, "rate": 40, "seed": 0,
                     "input": {"kind": "uniform", "low": 256, "high": 2048},
                     "output": {"kind": "uniform", "low": 64, "high": 256}}}


def test_killed_in_process_driver_resumes_without_lost_or_doubled_trials(tmp_path):
    """kill -9 of a driver that simulates in-process (workers 0) at a random point: the
    journal on disk is complete (every line parses), and the rerun ends with n counted
    trials, each with one MLflow run."""
    n = 6
    path = write_space(tmp_path, workload=SLOW, knobs=KNOBS,
                       search={"sampler": "random", "n_trials": n, "seed": 5})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dse.cli", "search", str(path), "--out", str(out),
           "--workers", "0", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if (out / JOURNAL).exists():
            done = [t for t in _study(out).get_trials() if t.state == TrialState.COMPLETE]
            if len(done) >= 2:
                break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    else:
        pytest.fail("no trial completed")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    raw = (out / JOURNAL).read_bytes()
    lines, end, v2 = parse(raw, out / JOURNAL)  # whole commits, at most a torn last one
    assert v2 and lines and all(json.loads(x) for x in lines)
    before = {t.number: t.state for t in _study(out).get_trials()}

    rerun = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = _study(out).get_trials()
    counted = [t for t in after if t.state == TrialState.COMPLETE
               and "repeat_of" not in t.user_attrs]
    assert len(counted) == n
    for num, state in before.items():  # what was finished before the kill stays so
        if state == TrialState.COMPLETE:
            assert after[num].state == TrialState.COMPLETE
    keys = [tuple(sorted(t.params.items())) for t in counted]
    assert len(keys) == len(set(keys))  # no configuration simulated twice
    _, kids = _client_runs(out)
    nums = [r.data.tags["dse.trial_number"] for r in kids]
    firsts = [t for t in after if "repeat_of" not in t.user_attrs
              and (t.state == TrialState.COMPLETE or t.user_attrs.get("rejected"))]
    assert len(nums) == len(set(nums)) == len(firsts)


def test_new_sqlite_store_is_a_copy_of_a_cached_empty_one(tmp_path, monkeypatch):
    from dse.store import open_tracker, seed_sqlite_store

    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert seed_sqlite_store(f"sqlite:///{a / 'mlflow.db'}")  # makes the template first
    assert list((tmp_path / "cache").glob("mlflow-*-empty.db"))
    assert not seed_sqlite_store(f"sqlite:///{a / 'mlflow.db'}")  # exists: left alone
    assert not seed_sqlite_store(f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}")
    assert not seed_sqlite_store("http://127.0.0.1:5000")
    t0 = time.perf_counter()
    tracker = open_tracker(f"sqlite:///{b / 'mlflow.db'}", b, "seeded")  # seeded here
    assert time.perf_counter() - t0 < 5
    parent = tracker.open_parent(None, "study", {"x": 1}, {"y": "z"})
    run = tracker.client.get_run(parent)
    assert run.data.params == {"x": "1"} and run.data.tags["y"] == "z"
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    c = tmp_path / "c"
    c.mkdir()
    assert not seed_sqlite_store(f"sqlite:///{c / 'mlflow.db'}")
