"""A killed driver resumes without lost or repeated trials; a killed worker is retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest
from dse_testkit import write_space
from optuna.trial import TrialState

from dse.pool import RayPool
from dse.space import load_space
from dse.study import Driver, open_storage

SLOW_WORKLOAD = {"generate": {"num_requests": 3000, "rate": 40, "seed": 0,
                              "input": {"kind": "uniform", "low": 256, "high": 2048},
                              "output": {"kind": "uniform", "low": 64, "high": 256}}}
KNOBS = {"tp": [1, 2, 4], "replicas": [1, 2, 4],
         "max_num_seqs": {"low": 8, "high": 512, "log": True},
         "max_num_batched_tokens": [1024, 2048, 4096]}


def _trials(out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()
    except Exception:  # noqa: BLE001 - journal not there yet
        return []


def _counted(t) -> bool:
    """COMPLETE and simulated itself: what counts toward n_trials (a draw rejected before
    simulating is told FAIL and not counted)."""
    return t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs


def dump_of(trials) -> list:
    return [(t.number, t.state.name, t.params, dict(t.user_attrs)) for t in trials]


def test_dse_resume_after_sigkill_no_lost_or_repeated_trials(tmp_path):
    n = 10
    path = write_space(tmp_path, workload=SLOW_WORKLOAD, knobs=KNOBS,
                       search={"sampler": "random", "n_trials": n, "seed": 3})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dse.cli", "search", str(path), "--out", str(out),
           "--workers", "2", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ts = _trials(out)
            done = sum(t.state == TrialState.COMPLETE for t in ts)
            running = sum(t.state == TrialState.RUNNING for t in ts)
            if done >= 2 and running >= 1:
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        else:
            pytest.fail("study never had running trials")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the Ray processes this driver started
        except ProcessLookupError:
            pass
    before = _trials(out)
    # what each interrupted trial knew of its configuration: the parameters drawn so far,
    # or those it was enqueued with
    interrupted = {t.number: dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
                   for t in before if t.state == TrialState.RUNNING}
    complete_before = sum(_counted(t) for t in before)
    assert interrupted and complete_before < n

    rerun = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "re-enqueued" in rerun.stdout

    after = _trials(out)
    complete = [t for t in after if _counted(t)]
    assert len(complete) == n
    # a draw that repeats an evaluated configuration is told its stored result, not run
    firsts = {t.number for t in complete} | {t.number for t in after if t.user_attrs.get(
        "rejected") and "repeat_of" not in t.user_attrs}
    for t in after:
        if "repeat_of" in t.user_attrs:
            assert t.user_attrs["repeat_of"] in firsts, dump_of(after)
    # interrupted trials are failed and their parameters re-run at most once, as many as
    # the remaining budget of n trials allows (a trial may complete in the instant before
    # the kill, leaving fewer slots than interrupted trials)
    slots = n - complete_before
    dump = [(t.number, t.state.name, t.params, dict(t.user_attrs)) for t in after]
    for num, params in interrupted.items():
        assert after[num].state == TrialState.FAIL, (num, dump)
        reruns = [t for t in complete if t.user_attrs.get("requeued_from") == num]
        # (a kill between ask and the last suggest leaves partial parameters: those are kept
        # and the rest drawn anew)
        assert len(reruns) <= 1, (num, dump)
        assert all(r.params.items() >= params.items() for r in reruns), (num, params, dump)
    # nothing that finished before the kill was run again
    # (a re-run whose parameters, partial ones completed anew, the budget check rejects is
    # told FAIL and not counted: still the one re-run of that trial)
    requeued = [t.user_attrs["requeued_from"] for t in after if "requeued_from" in t.user_attrs
                and (_counted(t) or t.user_attrs.get("rejected"))]
    # (a trial killed before its first suggest has no parameters and nothing to re-run)
    redrawable = [num for num, params in interrupted.items() if params]
    assert len(requeued) == len(set(requeued)) == min(len(redrawable), slots)
    for num, params in interrupted.items():
        if not params:
            assert "drawn anew" in after[num].user_attrs["reason"], (num, dump)
    assert set(requeued) <= set(interrupted)

    import json

    from mlflow.tracking import MlflowClient

    meta = json.loads((out / "study.json").read_text())
    client = MlflowClient(meta["tracking_uri"])
    runs = client.search_runs([meta["experiment_id"]], max_results=1000)
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    nums = [r.data.tags["dse.trial_number"] for r in kids]
    # one child per COMPLETE trial and per first rejection of a configuration, no duplicates
    first_rejections = [t for t in after if t.user_attrs.get("rejected")
                        and "repeat_of" not in t.user_attrs]
    assert len(nums) == len(set(nums)) == n + len(first_rejections)
    assert len(runs) - len(kids) == 1


def test_dse_worker_killed_mid_trial_is_retried(tmp_path, ray_session):
    n = 4
    path = write_space(tmp_path, workload=SLOW_WORKLOAD, knobs=KNOBS,
                       search={"sampler": "random", "n_trials": n, "seed": 1})
    driver = Driver(load_space(path), tmp_path / "out", workers=2, progress=False)
    box: dict = {}

    def run():
        try:
            box["summary"] = driver.run()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    th = threading.Thread(target=run, daemon=True)
    th.start()
    killed = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and killed is None and th.is_alive():
        pool = driver.pool
        if isinstance(pool, RayPool) and pool._running:
            time.sleep(0.2)
            pids = pool.pids()
            if pids:
                trial, pid = next(iter(pids.items()))
                os.kill(pid, signal.SIGKILL)
                killed = trial
        time.sleep(0.05)
    th.join(timeout=300)
    assert "error" not in box, box.get("error")
    assert killed is not None, "no trial was running to kill"
    s = box["summary"]
    assert s.complete == n and s.failed == 0
    trials = _trials(tmp_path / "out")
    retried = [t for t in trials if t.user_attrs.get("attempts") == 2 and _counted(t)]
    assert [t.number for t in retried] == [killed]
    assert retried[0].state == TrialState.COMPLETE


def test_recover_handles_every_point_a_trial_can_be_killed_at(tmp_path):
    """Trials left RUNNING by a killed driver: one with drawn parameters, one enqueued
    with fixed ones (killed before its first suggest), one with nothing drawn yet. All are
    failed; the first two are re-enqueued with what they knew, the last gives its slot to
    a fresh draw."""
    path = write_space(tmp_path, knobs=KNOBS, search={"sampler": "random", "n_trials": 4})
    driver = Driver(load_space(path), tmp_path / "out", workers=1, progress=False)
    driver._prepare_dir()
    study = driver._open_study()
    drawn = study.ask()
    drawn.suggest_categorical("tp", [1, 2, 4])
    study.enqueue_trial({"tp": 4, "replicas": 2})
    fixed = study.ask()  # picks up the enqueued parameters, none suggested yet
    empty = study.ask()

    assert sorted(driver._recover(study)) == sorted([drawn.number, fixed.number])
    trials = study.get_trials(deepcopy=False)
    for t in (drawn, fixed, empty):
        assert trials[t.number].state == TrialState.FAIL
    assert "drawn anew" in trials[empty.number].user_attrs["reason"]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted((t.user_attrs["requeued_from"], t.system_attrs["fixed_params"])
                  for t in waiting) == sorted([(drawn.number, {"tp": drawn.params["tp"]}),
                                               (fixed.number, {"tp": 4, "replicas": 2})])
