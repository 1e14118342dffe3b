"""What a user sees, in a real browser: headless Chromium (Debian's ``chromium``) loads the
report of a small quickstart-like search and the MLflow UI of the same study.

The report check reads the Pareto plot's own data and axis ranges inside the page (a
script injected into a copy of the page writes them into the DOM, which ``--dump-dom``
returns), so it fails if the front is squashed by an outlier again. Skipped only where
Chromium is missing (``.ci/run`` installs it in CI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from dse_testkit import write_space

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and Path(p).exists()),
                None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium "
                                "(apt-get install chromium; .ci/run does it in CI)")

#: injected first into <head>: records script errors, failed loads and console.error
_CATCH = """<script>window.dseErrors=[];
window.addEventListener('error',function(e){window.dseErrors.push(String(e.message||
 (e.target&&(e.target.src||e.target.href))||'error'));},true);
var _ce=console.error;console.error=function(){window.dseErrors.push(
 Array.prototype.join.call(arguments,' '));_ce.apply(console,arguments);};</script>"""
#: injected last: the Pareto panel's y range and its feasible points' y values
_PROBE = """<script>window.addEventListener('load',function(){setTimeout(function(){
var out={errors:window.dseErrors,figures:[]};
(window.dseFigures||[]).forEach(function(n){var d=document.getElementById('fig-'+n);
 out.figures.push({name:n,drawn:!!(d&&d._fullLayout&&d.querySelector('.main-svg'))});});
var g=document.getElementById('fig-pareto');
if(g&&g._fullLayout){out.yrange=g._fullLayout.yaxis.range;out.height=g._fullLayout.height;
 out.feasible_y=[];g._fullData.forEach(function(t){if(/^(meets|Pareto)/.test(t.name))
 out.feasible_y=out.feasible_y.concat(Array.from(t.y));});}
var p=document.createElement('pre');p.id='dse-check';p.textContent=JSON.stringify(out);
document.body.appendChild(p);},1500);});</script>"""


def _chromium(url: str, *extra: str, budget_ms: int = 15000, timeout: float = 120) -> str:
    tmp_profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"dse-chromium-{os.getpid()}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp_profile}",
           f"--virtual-time-budget={budget_ms}", *extra, url]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(tmp_profile, ignore_errors=True)
    return res.stdout


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from dse.space import load_space
    from dse.study import Driver

    tmp = tmp_path_factory.mktemp("browser")
    # Tight TTFT SLO at a high rate: some trials violate it by far (the outliers that once
    # flattened the front), some meet it.
    path = write_space(tmp, slo={"p99_ttft_ms": 250, "p99_tpot_ms": 40},
                       knobs={"tp": [1, 2], "replicas": [1, 2], "max_num_seqs": [16, 128]},
                       search={"sampler": "grid", "n_trials": 8, "seed": 0},
                       workload={"generate": {"num_requests": 60, "arrival": "poisson",
                                              "rate": 80, "seed": 0,
                                              "input": {"kind": "uniform", "low": 256,
                                                        "high": 2048},
                                              "output": {"kind": "uniform", "low": 16,
                                                         "high": 64}}})
    out = tmp / "out"
    Driver(load_space(path), out, workers=0, deterministic=True, progress=False).run()
    return out


def test_report_renders_without_errors_and_the_front_fills_its_panel(study):
    import pandas as pd

    page = (study / "report.html").read_text()
    assert page.count("<script src='plotly.min.js'") == 1
    probe = study / "report_probe.html"
    probe.write_text(page.replace("<head>", "<head>" + _CATCH, 1)
                     .replace("</body>", _PROBE + "</body>", 1))
    dom = _chromium(probe.as_uri(), "--dump-dom")
    m = re.search(r'<pre id="dse-check">(.*?)</pre>', dom, re.S)
    assert m, "the page's check script did not run (plotly.js failed to load?)"
    check = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert check["errors"] == []
    assert check["figures"] and all(f["drawn"] for f in check["figures"]), check["figures"]
    trials = pd.read_csv(study / "trials.csv")
    done = trials[(trials.state == "COMPLETE") & ~trials.rejected]
    assert done.feasible.any() and (~done.feasible).any()  # both kinds are drawn
    lo, hi = check["yrange"]
    ys = check["feasible_y"]
    assert len(ys) == int(done.feasible.sum())
    assert lo <= min(ys) and max(ys) <= hi
    assert (max(ys) - min(ys)) / (hi - lo) >= 0.6  # the feasible points fill the panel
    # the violators are far outside the feasible range (what used to squash the front)
    assert done.loc[~done.feasible, "p99_ttft"].max() > hi


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_mlflow_ui_opens_on_the_study_runs(study):
    from dse.tracking import runs_url

    meta = json.loads((study / "study.json").read_text())
    port = _free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "ui",
                             "--backend-store-uri", meta["tracking_uri"], "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # ~20 s idle, a minute or more on a busy 2-core box
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow ui did not come up in 240 s"
                assert proc.poll() is None, "mlflow ui exited"
                time.sleep(1)
        runs = _post(base + "/api/2.0/mlflow/runs/search",
                     {"experiment_ids": [meta["experiment_id"]], "max_results": 1000})["runs"]
        names = {r["info"]["run_name"] for r in runs}
        assert "trial-0000" in names and len(runs) == 9  # 8 trials + the study run
        exp = json.loads(urllib.request.urlopen(
            f"{base}/api/2.0/mlflow/experiments/get?experiment_id={meta['experiment_id']}",
            timeout=10).read())["experiment"]
        assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} \
            in exp["tags"]
        # the URL `dse ui` prints renders the runs table with the trial runs in it
        dom = _chromium(runs_url(base, meta["experiment_id"]), "--dump-dom",
                        "--window-size=1400,900", budget_ms=30000, timeout=150)
        # the runs table (not the GenAI overview) with the study run, its trials nested
        assert re.search(r"<strong>9</strong>\s*matching runs", dom), \
            "the runs table of the study did not render"
        assert ">t study</span>" in dom
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
