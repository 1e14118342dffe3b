"""Results of a study: trials.csv, pareto.csv, an HTML report and exported best configs.

Everything here is re-made from the Optuna journal (``dse report DIR``), so it never
depends on the driver having finished cleanly.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dse import metrics as M
from dse.config import make_trial_config, vllm_command
from dse.space import KNOBS, Space


def trials_frame(space: Space, study) -> pd.DataFrame:
    """One row per finished trial: knobs, objectives, feasibility, reason, key metrics.
    Draws that repeated an evaluated configuration (``repeat_of``) are left out: each
    configuration is one row."""
    from optuna.trial import TrialState

    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state not in (TrialState.COMPLETE, TrialState.FAIL) \
                or t.user_attrs.get("repeat_of") is not None:
            continue
        ua = t.user_attrs
        params = space.complete(dict(t.params))
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name}
        for k in params:
            if not k.startswith("_"):
                row[k] = params[k]
        objs = ua.get("objectives") or {}
        for o in space.objectives:
            row[o.name] = objs.get(o.name, np.nan)
        row["feasible"] = bool(ua.get("feasible", False)) and t.state == TrialState.COMPLETE
        row["rejected"] = bool(ua.get("rejected", False))
        row["reason"] = ua.get("reason", "")
        row["devices_used"] = ua.get("devices_used")
        row["attainment"] = ua.get("attainment", np.nan)
        if "capacity_rps" in ua:
            row["capacity_rps"] = ua["capacity_rps"]
        for k, v in (t.constraints or {}).items():
            row[f"constraint.{k}"] = v
        m = ua.get("metrics") or {}
        for key in ("throughput_rps", "gen_tps", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50",
                    "tpot_ms.p99", "itl_ms.p99", "latency_ms.p99", "preemptions",
                    "prefix_hit_ratio", "simulated_s"):
            if key in m:
                row[key] = m[key]
        row["latency_provider"] = ua.get("latency_provider", "")
        row["latency_source"] = ua.get("latency_source", "")
        row["wall_s"] = ua.get("wall_s", np.nan)
        row["attempts"] = ua.get("attempts", np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values("trial").reset_index(drop=True)
    return df


def pareto_frame(space: Space, df: pd.DataFrame) -> pd.DataFrame:
    """Non-dominated FEASIBLE trials only."""
    if df.empty:
        return df
    names = [o.name for o in space.objectives]
    feas = df[(df["state"] == "COMPLETE") & df["feasible"]].dropna(subset=names)
    if feas.empty:
        return feas
    mask = M.pareto_mask(feas[names].to_numpy(float), [o.direction for o in space.objectives])
    front = feas[mask]
    # one row per distinct configuration (repeats of a config give the same point)
    knob_cols = [c for c in front.columns if c in KNOBS]
    front = front.drop_duplicates(subset=knob_cols + names)
    o = space.objectives[0]
    return front.sort_values(o.name, ascending=o.direction == "minimize").reset_index(drop=True)


def write_results(space: Space, study, out: Path) -> dict[str, Any]:
    df = trials_frame(space, study)
    df.to_csv(out / "trials.csv", index=False)
    front = pareto_frame(space, df)
    front.to_csv(out / "pareto.csv", index=False)
    best_dir = out / "best"
    exported = export_best(space, front, best_dir)
    (out / "report.html").write_text(render_html(space, df, front, exported))
    return {"trials": len(df), "pareto_count": len(front)}


def export_best(space: Space, front: pd.DataFrame, best_dir: Path, limit: int = 10) -> dict:
    """Each Pareto configuration as cluster JSON and as a ``vllm serve`` command."""
    best_dir.mkdir(parents=True, exist_ok=True)
    for old in best_dir.glob("trial_*"):
        old.unlink()
    out = {}
    knob_names = set(KNOBS)
    for _, row in front.head(limit).iterrows():
        params = {k: _py(row[k]) for k in row.index if k in knob_names and not _isnan(row[k])}
        cfg = make_trial_config(space, int(row["trial"]), params)
        stem = f"trial_{int(row['trial']):04d}"
        (best_dir / f"{stem}.cluster.json").write_text(json.dumps(cfg.cluster, indent=2))
        cmd = vllm_command(space, cfg.params)
        n = cfg.summary["num_instances"]
        note = (f"# {n} replica(s) of this instance on {cfg.devices_used} x "
                f"{cfg.params['hardware']}; put a load balancer in front.\n")
        if cfg.params.get("pd"):
            note += ("# PD disaggregation: "
                     f"{cfg.summary.get('prefill_instances')} prefill / "
                     f"{n - cfg.summary.get('prefill_instances', 0)} decode instances.\n")
        (best_dir / f"{stem}.vllm.sh").write_text("#!/bin/sh\n" + note + cmd + "\n")
        out[int(row["trial"])] = cmd
    return out


def _py(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _isnan(v) -> bool:
    return isinstance(v, float) and np.isnan(v)


# ------------------------------------------------------------------ HTML
_STYLE = ("<style>body{font-family:sans-serif;margin:2em;max-width:1400px}"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
          "padding:3px 6px}code{font-size:12px}</style></head><body>")
def render_html(space: Space, df: pd.DataFrame, front: pd.DataFrame, exported: dict) -> str:
    import plotly.express as px
    import plotly.graph_objects as go

    figs: list[tuple[str, Any]] = []
    names = [o.name for o in space.objectives]
    dirs = {o.name: o.direction for o in space.objectives}
    if not df.empty:
        done = df[df["state"] == "COMPLETE"].copy()
        done["status"] = np.where(done["rejected"], "rejected",
                                  np.where(done["feasible"], "feasible", "violates SLO"))
        done["pareto"] = done["trial"].isin(front["trial"]) if len(front) else False
        shown = done[~done["rejected"]]
        hover = ["trial"] + space.searched_knobs
        if len(names) >= 2 and len(shown):
            fig = px.scatter(shown, x=names[0], y=names[1], color="status",
                             symbol="pareto", hover_data=hover,
                             title=f"Pareto front: {names[0]} ({dirs[names[0]]}) vs "
                                   f"{names[1]} ({dirs[names[1]]})")
            if len(front) > 1:
                f2 = front.sort_values(names[0])
                fig.add_trace(go.Scatter(x=f2[names[0]], y=f2[names[1]], mode="lines",
                                         name="front", line={"dash": "dot"}))
            figs.append(("Pareto front", fig))
            if len(names) > 2:
                figs.append(("All objectives", px.scatter_matrix(
                    shown, dimensions=names, color="status", title="Objectives, pairwise")))
        elif len(shown):
            figs.append(("Objective by trial", px.scatter(shown, x="trial", y=names[0],
                                                          color="status")))
        for knob in space.searched_knobs:
            if len(shown) and knob in shown:
                for name in names:
                    figs.append((f"{name} vs {knob}", px.strip(
                        shown, x=knob, y=name, color="status", hover_data=["trial"],
                        title=f"{name} vs {knob}")))
        slo_cols = [c for c in done.columns if c.startswith("constraint.")
                    and c != f"constraint.{M.VALID_KEY}"]
        if slo_cols and len(shown):
            long = shown.melt(id_vars=["trial", "status"], value_vars=slo_cols,
                              var_name="slo", value_name="violation")
            long["slo"] = long["slo"].str.removeprefix("constraint.")
            fig = px.scatter(long, x="trial", y="violation", color="slo",
                             title="SLO constraints per trial (<= 0 meets the SLO; "
                                   "value/limit - 1)")
            fig.add_hline(y=0, line_dash="dash")
            figs.append(("SLO attainment", fig))
        if space.attainment is not None and len(shown):
            fig = px.histogram(shown, x="attainment", color="status", nbins=20,
                               title=f"Per-request SLO attainment (target "
                                     f"{space.attainment.target:.0%})")
            fig.add_vline(x=space.attainment.target, line_dash="dash")
            figs.append(("Attainment", fig))
    providers = sorted(set(df.get("latency_provider", pd.Series(dtype=str)).dropna()) - {""})
    sources = sorted(set(df.get("latency_source", pd.Series(dtype=str)).dropna()) - {""})
    n_done = int((df["state"] == "COMPLETE").sum()) if len(df) else 0
    n_feas = int(df["feasible"].sum()) if len(df) else 0
    n_rej = int(df["rejected"].sum()) if len(df) else 0
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>dse report: {html.escape(space.name)}</title>",
        _STYLE,
        f"<h1>Search: {html.escape(space.name)}</h1>",
        (f"<p>Model <b>{html.escape(space.model)}</b> on "
         f"<b>{html.escape(', '.join(space.hardware))}</b>, budget {space.total_devices} devices "
         f"({space.devices_per_node} per node). Trials: {n_done} complete, {n_feas} feasible, "
         f"{n_rej} rejected before simulation; Pareto front: {len(front)}.</p>"),
        (f"<p><b>Latency source:</b> {html.escape(', '.join(providers) or 'n/a')} "
         f"({html.escape('; '.join(sources) or 'n/a')}).</p>"),
        f"<p>SLOs: {html.escape(json.dumps(space.slo))}"
        + (f"; attainment target {space.attainment.target:.0%} of requests within "
           f"{html.escape(json.dumps({k: v for k, v in vars(space.attainment).items() if k != 'target' and v}))}"
           if space.attainment else "") + "</p>",
        f"<p>Objectives: {html.escape(', '.join(f'{o.name} ({o.direction})' for o in space.objectives))}</p>",
        "<h2>Best configurations (Pareto front, feasible only)</h2>",
    ]
    if len(front):
        cols = ["trial", *names, *space.searched_knobs, "devices_used", "attainment",
                "ttft_ms.p99", "tpot_ms.p99"]
        cols = [c for c in dict.fromkeys(cols) if c in front.columns]
        parts.append(front[cols].to_html(index=False, float_format=lambda v: f"{v:.4g}"))
        parts.append("<h3>Equivalent vLLM commands</h3><ul>")
        for n, cmd in exported.items():
            parts.append(f"<li>trial {n}: <code>{html.escape(cmd)}</code></li>")
        parts.append("</ul><p>Cluster configs: <code>best/trial_*.cluster.json</code></p>")
    else:
        parts.append("<p><b>No feasible configuration.</b> Relax the SLOs or widen the "
                     "knobs; see the reasons in trials.csv.</p>")
    first = True
    for title, fig in figs:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
        first = False
    if n_rej:
        rej = df[df["rejected"]].groupby("reason").size().sort_values(ascending=False)
        parts.append("<h2>Rejected before simulation</h2><table><tr><th>reason</th>"
                     "<th>trials</th></tr>")
        for reason, count in rej.items():
            parts.append(f"<tr><td>{html.escape(str(reason))}</td><td>{count}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def load_study(out: Path):
    """The space and the Optuna study stored in a search output folder."""
    import optuna

    from dse.space import load_space, parse_space
    from dse.store import SPACE_COPY, STUDY_JSON, open_storage
    from sim.errors import InputError

    meta_path = out / STUDY_JSON
    if not meta_path.exists():
        raise InputError(f"{out}: not a dse search folder (no {STUDY_JSON}); run "
                         "`dse search SPACE.yaml --out DIR` first")
    meta = json.loads(meta_path.read_text())
    copy = out / SPACE_COPY
    orig = Path(meta.get("space_path", ""))
    if copy.exists():
        import yaml

        text = copy.read_text()
        space = parse_space(yaml.safe_load(text), str(orig if orig.name else copy),
                            base_dir=orig.parent if orig.name else out, text=text)
    else:
        space = load_space(orig)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=meta["study_name"], storage=open_storage(out))
    return space, study, meta
