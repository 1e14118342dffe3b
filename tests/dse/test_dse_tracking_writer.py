"""MLflow written from the driver's writer thread: flushed when the search ends or is
interrupted, and after a killed driver every finished trial is in MLflow once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import optuna
import pytest
from dse_testkit import write_space
from optuna.trial import TrialState

import dse.tracking
from dse.pool import LocalPool
from dse.space import load_space
from dse.store import SPOOL
from dse.study import Driver, open_storage
from dse.tracking import TrackingWriter

SPACE = {"search": {"sampler": "random", "n_trials": 8, "seed": 2}}


def _trials(out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()
    except Exception:  # noqa: BLE001 - journal not there yet
        return []


def _first_evaluations(trials) -> set[int]:
    """Trials that have an MLflow run of their own: COMPLETE ones and first rejections
    (repeats have none)."""
    return {t.number for t in trials if "repeat_of" not in t.user_attrs
            and (t.state == TrialState.COMPLETE or t.user_attrs.get("rejected"))}


def _children(out) -> list[int]:
    from mlflow.tracking import MlflowClient

    meta = json.loads((out / "study.json").read_text())
    client = MlflowClient(meta["tracking_uri"])
    runs = client.search_runs([meta["experiment_id"]], max_results=5000)
    return sorted(int(r.data.tags["dse.trial_number"]) for r in runs
                  if r.data.tags.get("mlflow.parentRunId") == meta["mlflow_parent_run_id"])


def _slow_log_trial(monkeypatch, seconds: float) -> list[int]:
    logged: list[int] = []
    real = dse.tracking.Tracker.log_trial

    def slow(self, number, *a, **k):
        time.sleep(seconds)
        rid = real(self, number, *a, **k)
        logged.append(number)
        return rid

    monkeypatch.setattr(dse.tracking.Tracker, "log_trial", slow)
    return logged


class _FakeTracker:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.parent_id = "p"
        self.logged: list[int] = []
        self.deleted: list[int] = []
        self.calls: list[str] = []

    def log_trial(self, number, params, metrics, tags, files):
        time.sleep(0.02)
        self.logged.append(number)

    def delete_trial_runs(self, numbers):
        self.deleted += numbers


def test_writer_close_drains_the_queue_in_order(tmp_path):
    fake = _FakeTracker()
    synced = []
    w = TrackingWriter(tmp_path / "spool", lambda: fake,
                       before_log=lambda: synced.append(len(fake.logged))).start()
    for n in range(15):
        w.log_trial(n, {"a": n}, {"m": 1.0}, {}, {})
    w.call(lambda tr: tr.calls.append("parent closed"))
    assert len(fake.logged) < 15  # still writing: the driver did not wait for it
    w.close()
    assert fake.logged == list(range(15))
    assert fake.calls == ["parent closed"]
    assert synced == list(range(15))  # the journal is synced before each trial's run
    assert not list((tmp_path / "spool").iterdir())  # nothing left to replay
    assert w.logged == 15 and w.wait_s > 0


def test_writer_keeps_what_it_could_not_log_and_replays_it(tmp_path):
    class Failing(_FakeTracker):
        def log_trial(self, number, *a):
            if number == 3:
                raise OSError("disk full")
            super().log_trial(number, *a)

    w = TrackingWriter(tmp_path / "spool", Failing).start()
    for n in range(5):
        w.log_trial(n, {}, {}, {}, {})
    w.close()
    assert w.tracker.logged == [0, 1, 2, 4] and w.failed == 1
    assert sorted(w.spooled()) == [3]
    # the next run replays it: any half-written run of that trial is deleted first
    fake = _FakeTracker()
    w2 = TrackingWriter(tmp_path / "spool", lambda: fake)
    for n in w2.spooled():
        w2.replay(n)
    w2.start().close()
    assert fake.deleted == [3] and fake.logged == [3] and not w2.spooled()


def test_writer_that_cannot_open_the_store_stops_the_search_with_its_error(tmp_path):
    from sim.errors import InputError

    def refuse():
        raise InputError("--tracking-uri 'x': cannot open the MLflow store")

    w = TrackingWriter(tmp_path / "spool", refuse).start()
    w.log_trial(0, {}, {}, {}, {})
    w.close()
    with pytest.raises(InputError, match="cannot open"):
        w.check()
    assert sorted(w.spooled()) == [0]  # kept for a later run


def test_search_returns_with_every_trial_in_mlflow(tmp_path, monkeypatch):
    """The search's end waits for the writer: once run() returns, MLflow holds a run for
    every evaluated trial and the spool is empty, although each run took 0.15 s to write.
    The report does not wait for it: the front's latency distributions are the ones the
    driver kept, none is read back from MLflow."""
    logged = _slow_log_trial(monkeypatch, 0.15)
    import dse.report
    import dse.report_html

    seen = []
    monkeypatch.setattr(dse.report, "request_tables",
                        lambda out_dir, trials, *a, **k: seen.append(trials) or {})
    rendered = {}
    real_render = dse.report_html.render_html

    def render(space, df, front, exported, cdf, **kw):
        rendered.update(front=sorted(int(t) for t in front["trial"]), cdf=sorted(cdf))
        return real_render(space, df, front, exported, cdf, **kw)

    monkeypatch.setattr(dse.report_html, "render_html", render)
    path = write_space(tmp_path, **SPACE)
    out = tmp_path / "out"
    driver = Driver(load_space(path), out, workers=0, progress=False)
    s = driver.run()
    assert not seen  # nothing read back from MLflow
    assert rendered["front"] and rendered["cdf"] == rendered["front"]
    assert s.complete == 8
    firsts = _first_evaluations(_trials(out))
    assert sorted(logged) == sorted(firsts)
    assert _children(out) == sorted(firsts)
    assert not list((out / SPOOL).iterdir())
    assert s.timings["mlflow_flush_wait_s"] > 0 and s.timings["mlflow_logged"] == len(firsts)


class _InterruptingPool(LocalPool):
    """The in-process pool, with Ctrl-C pressed at its ``at``-th poll."""

    def __init__(self, space, at: int) -> None:
        super().__init__(space)
        self.at = at
        self.polls = 0

    def poll(self, timeout: float = 0.5):
        self.polls += 1
        if self.polls == self.at:
            raise KeyboardInterrupt
        return super().poll(timeout)


def test_interrupted_search_has_every_finished_trial_in_mlflow_after_resume(tmp_path,
                                                                           monkeypatch):
    _slow_log_trial(monkeypatch, 0.1)  # the writer is behind when Ctrl-C comes
    path = write_space(tmp_path, **SPACE)
    out = tmp_path / "out"
    space = load_space(path)
    with pytest.raises(KeyboardInterrupt):
        Driver(space, out, workers=0, progress=False, pool=_InterruptingPool(space, 5)).run()
    told = _first_evaluations(_trials(out))
    assert 0 < len([t for t in _trials(out) if t.state == TrialState.COMPLETE]) < 8
    # flushed on interruption: every told trial is in MLflow, once
    assert _children(out) == sorted(told)
    assert not list((out / SPOOL).iterdir())

    s = Driver(space, out, workers=0, progress=False).run()
    assert s.resumed and s.complete == 8
    firsts = _first_evaluations(_trials(out))
    assert told <= firsts
    assert _children(out) == sorted(firsts)  # every one, none twice


KILLED_DRIVER = textwrap.dedent("""
    import sys, time
    import dse.tracking
    from dse.space import load_space
    from dse.study import Driver
    from pathlib import Path

    real = dse.tracking.Tracker.log_trial
    calls = []

    def log_then_hang(self, number, *a, **k):
        rid = real(self, number, *a, **k)
        calls.append(number)
        if len(calls) == 2:  # the run is written, its spool file not yet removed
            Path(sys.argv[2], "hung").write_text(str(number))
            time.sleep(600)
        return rid

    dse.tracking.Tracker.log_trial = log_then_hang
    Driver(load_space(sys.argv[1]), Path(sys.argv[2]), workers=0, progress=False).run()
""")


def test_killed_driver_mlflow_is_completed_on_resume_without_duplicates(tmp_path):
    """kill -9 while the writer is behind (one run written but not yet marked done, more
    told and waiting): the next run logs the waiting ones and does not double the one in
    flight."""
    path = write_space(tmp_path, **SPACE)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, str(path), str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            told = _first_evaluations(_trials(out))
            if (out / "hung").exists() and len(told) >= 4:
                break
            if proc.poll() is not None:
                pytest.fail("driver ended early: " + proc.stderr.read().decode()[-2000:])
            time.sleep(0.1)
        else:
            pytest.fail("the driver never got ahead of its writer")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    told = _first_evaluations(_trials(out))
    hung = int((out / "hung").read_text())
    spooled = {int(p.stem.split("_")[1]) for p in (out / SPOOL).glob("trial_*.pkl")}
    assert hung in spooled and len(spooled) >= 2  # behind, and the hung one written twice
    assert hung in _children(out)
    assert not set(_children(out)) >= told  # MLflow is missing told trials now

    s = Driver(load_space(path), out, workers=0, progress=False).run()
    assert s.complete == 8
    firsts = _first_evaluations(_trials(out))
    assert told <= firsts
    assert _children(out) == sorted(firsts)  # every finished trial, none twice
    assert not list((out / SPOOL).iterdir())


def test_writer_thread_is_not_left_running(tmp_path):
    path = write_space(tmp_path, **SPACE)
    Driver(load_space(path), tmp_path / "out", workers=0, progress=False).run()
    assert not [t for t in threading.enumerate() if t.name == "dse-mlflow-writer"]


def test_store_that_cannot_be_opened_exits_2_in_one_line(tmp_path, capsys):
    """The store opens in the writer thread; its failure still ends `dse search` with one
    line and status 2 (even when the trials are done before the store gives up)."""
    from dse.cli import main

    path = write_space(tmp_path, **SPACE)
    rc = main(["search", str(path), "--out", str(tmp_path / "out"), "--workers", "0",
               "--no-progress", "--tracking-uri", "sqlite:////proc/no/such/dir/m.db"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "cannot open the MLflow store" in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("dse: error")]) == 1
    # what was told is kept for the next run, which logs it to a store that works
    told = _first_evaluations(_trials(tmp_path / "out"))
    spooled = {int(p.stem.split("_")[1]) for p in (tmp_path / "out" / SPOOL).glob("*.pkl")}
    assert spooled == told
