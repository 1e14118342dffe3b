"""The report's pieces without a browser: the front in focus, one row per configuration,
grouped MLflow metric names, the per-trial histogram."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from dse_testkit import write_space

from dse.canonical import config_key
from dse.report import pareto_frame
from dse.report_html import pareto_figure, render_html
from dse.space import load_space
from dse.tracking import latency_histogram_png, metric_name, runs_url


@pytest.fixture
def space(tmp_path):
    return load_space(write_space(tmp_path, knobs={"tp": [1, 2, 4], "replicas": [1, 2, 4],
                                                   "routing_policy": ["LOAD", "RR"]}))


def _trials(space, rows):
    out = []
    for i, (params, thr, ttft, feas) in enumerate(rows):
        p = space.complete(params)
        out.append({"trial": i, "state": "COMPLETE", "config": config_key(space, p), **p,
                    "throughput_per_device": thr, "p99_ttft": ttft, "feasible": feas,
                    "rejected": False, "reason": "" if feas else "violates p99_ttft_ms",
                    "devices_used": p["tp"] * p["replicas"]})
    return pd.DataFrame(out)


def test_configs_differing_only_in_no_effect_knobs_are_one_pareto_row(space):
    df = _trials(space, [({"tp": 4, "replicas": 1, "routing_policy": "LOAD"}, 900, 20, True),
                         ({"tp": 4, "replicas": 1, "routing_policy": "RR"}, 900, 20, True),
                         ({"tp": 1, "replicas": 4, "routing_policy": "RR"}, 1600, 40, True),
                         ({"tp": 1, "replicas": 4, "routing_policy": "LOAD"}, 1600, 38, True)])
    front = pareto_frame(space, df)
    assert sorted(front["trial"]) == [0, 3]  # 1 repeats 0; 2 is dominated by 3
    assert front.set_index("trial").loc[0, "repeats"] == 2
    assert front["config"].is_unique


def test_pareto_panel_is_scaled_to_the_feasible_points(space):
    rows = [({"tp": t, "replicas": r}, 800 + 100 * i, 18 + 4 * i, True)
            for i, (t, r) in enumerate([(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)])]
    rows += [({"tp": 1, "replicas": 4}, 1700, 6500, False), ({"tp": 4, "replicas": 2},
                                                               500, 3000, False)]
    df = _trials(space, rows)
    front = pareto_frame(space, df)
    fig = pareto_figure(space, df, front)
    lo, hi = fig.layout.yaxis.range
    feas = df[df.feasible]["p99_ttft"]
    assert lo <= feas.min() and feas.max() <= hi
    assert (feas.max() - feas.min()) / (hi - lo) >= 0.8
    grey = next(t for t in fig.data if t.name.startswith("violates"))
    assert max(grey.y) <= hi  # drawn at the edge, not stretching the axis
    assert "6500" in "".join(grey.hovertext)  # the true value is in the hover
    assert "ms" in fig.layout.yaxis.title.text and "tokens/s/device" in \
        fig.layout.xaxis.title.text
    page = render_html(space, df, front, {}, {})
    assert page.count("plotly.min.js") == 1 and len(page) < 200_000
    assert "replicas = 2" in page  # hover carries the configuration


def test_metric_names_are_grouped():
    assert metric_name("objective.p99_ttft") == "objective/p99_ttft"
    assert metric_name("ttft_ms.p99") == "ttft/p99_ms"
    assert metric_name("constraint.p99_ttft_ms") == "constraint/p99_ttft_ms"
    assert metric_name("gen_tps") == "throughput/gen_tps"
    assert metric_name("trials_complete") == "study/trials_complete"
    assert runs_url("http://h:5000/", "3").endswith(
        "/#/experiments/3/runs?workflowType=machine_learning")


def test_latency_histogram_is_a_png(tmp_path):
    rng = np.random.default_rng(0)
    req = pd.DataFrame({"ttft_ns": rng.uniform(1e7, 5e7, 50), "tpot_ns": rng.uniform(3e6, 9e6, 50),
                        "output_tokens": rng.integers(1, 100, 50)})
    assert latency_histogram_png(req, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG"
    assert not latency_histogram_png(req.iloc[:0], tmp_path / "e.png")
