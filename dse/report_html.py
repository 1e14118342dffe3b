"""The study's HTML page: the answer first (the Pareto front and its configurations), then
the request-level latency of those configurations, then how the knobs move the objectives.

plotly.js is loaded once, from ``plotly.min.js`` beside the page. Feasible trials set every
axis range; SLO-violating trials are drawn in grey at the edge of the plotted range (their
true values in the hover), so the front is never squashed by a far-away outlier.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dse.canonical import canonical_params
from dse.export import served_model
from dse.space import KNOB_ORDER, Space

#: objective / column -> (label, unit)
LABELS = {
    "throughput_per_device": ("Output throughput per device", "tokens/s/device"),
    "goodput_per_device": ("Goodput per device (SLO-meeting requests)", "tokens/s/device"),
    "p99_ttft": ("p99 time to first token", "ms"),
    "p99_tpot": ("p99 time per output token", "ms"),
    "cost_per_million_tokens": ("Cost per million output tokens", "$"),
    "energy_per_token": ("Energy per output token", "J"),
    "devices_used": ("Devices used", "devices"),
    "avg_power": ("Average power", "W"),
    "ttft_ms.p99": ("p99 TTFT", "ms"), "tpot_ms.p99": ("p99 TPOT", "ms"),
    "attainment": ("SLO attainment", "fraction of requests"),
    "repeats": ("trials of this configuration", ""),
    "capacity_rps": ("Capacity (highest rate meeting the SLOs)", "req/s"),
}
FEASIBLE, PARETO, VIOLATES = "#1f77b4", "#d62728", "#b0b0b0"
_STYLE = """<style>
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1250px;color:#222}
h1{margin-bottom:.2em} .lead{font-size:1.05em} .box{background:#f4f6fa;border-left:4px solid
#1f77b4;padding:.5em 1em;margin:.8em 0} table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right} th{background:#eef}
details{margin:.3em 0} pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px}
.plot{width:100%} .muted{color:#666}
</style>"""


def label(name: str) -> str:
    text, unit = LABELS.get(name, (name.replace("_", " "), ""))
    return f"{text} ({unit})" if unit else text


def _fmt(v: Any) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


def hover_text(space: Space, row: pd.Series, names: list[str]) -> str:
    """The full configuration of one trial, one knob a line, for the plot's hover box."""
    lines = [f"<b>trial {int(row['trial'])}</b>"]
    lines += [f"{label(n)}: {_fmt(row[n])}" for n in names if n in row and pd.notna(row[n])]
    knobs = [k for k in KNOB_ORDER if k in row.index and pd.notna(row[k])]
    lines += [f"{k} = {_fmt(row[k])}" for k in knobs]
    if pd.notna(row.get("devices_used")):
        lines.append(f"devices used = {int(row['devices_used'])}")
    if row.get("reason"):
        lines.append(f"<i>{html.escape(str(row['reason']))}</i>")
    return "<br>".join(lines)


def _range(vals: np.ndarray, log: bool = False) -> list[float]:
    """An axis range that holds ``vals`` with a margin (ms ranges start at 0 when near)."""
    lo, hi = float(np.nanmin(vals)), float(np.nanmax(vals))
    span = hi - lo if hi > lo else max(abs(hi), 1.0) * 0.2
    return [lo - 0.08 * span, hi + 0.08 * span]


def pareto_figure(space: Space, done: pd.DataFrame, front: pd.DataFrame):
    """Objective 1 vs objective 2: feasible trials set the ranges; the front is joined."""
    import plotly.graph_objects as go

    x, y = space.objectives[0].name, space.objectives[1].name
    feas = done[done["feasible"]]
    bad = done[~done["feasible"]].dropna(subset=[x, y])
    base = feas if len(feas) else done
    xr, yr = _range(base[x].to_numpy(float)), _range(base[y].to_numpy(float))
    fig = go.Figure()
    on_front = feas["trial"].isin(front["trial"]) if len(front) else feas["trial"] < -1
    if len(bad):
        bx = bad[x].clip(xr[0], xr[1])
        by = bad[y].clip(yr[0], yr[1])
        clipped = (bx != bad[x]) | (by != bad[y])
        fig.add_trace(go.Scatter(
            x=bx, y=by, mode="markers", name=f"violates an SLO ({len(bad)})",
            marker={"color": VIOLATES, "size": 7, "symbol": np.where(clipped, "triangle-up",
                                                                     "circle-open")},
            hovertext=[hover_text(space, r, [x, y]) for _, r in bad.iterrows()],
            hoverinfo="text", cliponaxis=False))
    rest = feas[~on_front]
    fig.add_trace(go.Scatter(
        x=rest[x], y=rest[y], mode="markers", name=f"meets the SLOs ({len(feas)})",
        marker={"color": FEASIBLE, "size": 8, "opacity": 0.75},
        hovertext=[hover_text(space, r, [x, y]) for _, r in rest.iterrows()],
        hoverinfo="text"))
    if len(front):
        f = front.sort_values(x)
        fig.add_trace(go.Scatter(
            x=f[x], y=f[y], mode="lines+markers", name=f"Pareto front ({len(front)} configs)",
            marker={"color": PARETO, "size": 11, "symbol": "diamond"},
            line={"color": PARETO, "dash": "dot", "shape": "hv"},
            hovertext=[hover_text(space, r, [x, y]) for _, r in f.iterrows()],
            hoverinfo="text"))
    arrows = {"maximize": "higher is better →", "minimize": "lower is better"}
    fig.update_layout(
        title=f"Pareto front: {LABELS.get(x, (x,))[0]} vs {LABELS.get(y, (y,))[0]}",
        xaxis={"title": f"{label(x)}, {arrows[space.objectives[0].direction]}", "range": xr},
        yaxis={"title": f"{label(y)}, {arrows[space.objectives[1].direction]}", "range": yr},
        legend={"orientation": "h", "y": -0.18}, height=520, margin={"t": 60},
        hoverlabel={"align": "left"})
    if len(bad) and ((bad[y] > yr[1]) | (bad[y] < yr[0]) | (bad[x] > xr[1])
                     | (bad[x] < xr[0])).any():
        fig.add_annotation(text="▲ grey triangles: SLO-violating trials outside this range, "
                           "drawn at its edge (true values in the hover)", showarrow=False,
                           xref="paper", yref="paper", x=0, y=1.06, xanchor="left",
                           font={"size": 11, "color": "#666"})
    return fig


def cdf_figure(front: pd.DataFrame, cdf: dict[int, dict], space: Space):
    """Per-request TTFT and TPOT distributions of the front's configurations."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "Time to first token, every request", "Time per output token, every request"))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"]
    for i, (_, row) in enumerate(front.iterrows()):
        t = int(row["trial"])
        if t not in cdf:
            continue
        color = palette[i % len(palette)]
        for col, key in ((1, "ttft_ms"), (2, "tpot_ms")):
            v = np.asarray(cdf[t][key])
            if not len(v):
                continue
            fig.add_trace(go.Scatter(
                x=v, y=np.linspace(0, 1, len(v)), mode="lines", name=f"trial {t}",
                legendgroup=str(t), showlegend=col == 1, line={"color": color},
                hovertemplate=f"trial {t}<br>%{{x:.4g}} ms<br>%{{y:.0%}} of requests"
                              "<extra></extra>"), row=1, col=col)
    for col, key, slo in ((1, "ttft", "p99_ttft_ms"), (2, "tpot", "p99_tpot_ms")):
        top = max((float(np.max(c[f"{key}_ms"])) for c in cdf.values() if len(c[f"{key}_ms"])),
                  default=1.0) * 1.1
        limit = space.slo.get(slo)
        title = f"{key.upper()} (ms)"
        if limit is not None and limit <= top * 1.5:
            top = max(top, limit * 1.05)
            fig.add_vline(x=limit, line_dash="dash", line_color="#999", row=1, col=col,
                          annotation_text=f"p99 SLO {limit:g} ms")
        elif limit is not None:
            title += f"; the p99 SLO, {limit:g} ms, is far right of every curve"
        fig.update_xaxes(title_text=title, range=[0, top], row=1, col=col)
        fig.update_yaxes(title_text="fraction of requests ≤ x", range=[0, 1.02], row=1,
                         col=col)
    fig.update_layout(height=430, legend={"title": "configuration"},
                      title="Request-level latency of the Pareto configurations (CDF)")
    return fig


def knob_figure(space: Space, done: pd.DataFrame):
    """Each objective against each searched knob (feasible in colour, the rest grey)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    knobs = [k for k in space.searched_knobs if k in done]
    names = [o.name for o in space.objectives]
    if not knobs:
        return None
    fig = make_subplots(rows=len(names), cols=len(knobs), shared_yaxes="rows",
                        horizontal_spacing=0.02, vertical_spacing=0.12,
                        column_titles=knobs)
    feas = done[done["feasible"]]
    for r, name in enumerate(names, start=1):
        base = feas if len(feas) else done
        yr = _range(base[name].dropna().to_numpy(float)) if base[name].notna().any() else None
        for c, knob in enumerate(knobs, start=1):
            for part, color, nm in ((done[~done["feasible"]], VIOLATES, "violates an SLO"),
                                    (feas, FEASIBLE, "meets the SLOs")):
                yv = part[name].clip(*yr) if yr else part[name]
                fig.add_trace(go.Scatter(
                    x=part[knob].astype(str), y=yv, mode="markers", name=nm,
                    legendgroup=nm, showlegend=r == 1 and c == 1,
                    marker={"color": color, "size": 6, "opacity": 0.7},
                    hovertext=[f"trial {int(t)}" for t in part["trial"]], hoverinfo="text+y"),
                    row=r, col=c)
            order = [str(v) for v in sorted(done[knob].dropna().unique(),
                                            key=lambda v: (isinstance(v, str), v))]
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=order,
                             row=r, col=c)
            if yr:
                fig.update_yaxes(range=yr, row=r, col=c)
        fig.update_yaxes(title_text=label(name), row=r, col=1)
    fig.update_layout(height=300 * len(names) + 80, title="How each knob moves the objectives")
    return fig


def _table(space: Space, front: pd.DataFrame, exported: dict) -> str:
    names = [o.name for o in space.objectives]
    arrow = {"maximize": " ↑", "minimize": " ↓"}
    cols = ["trial", *names, *space.searched_knobs, "devices_used", "capacity_rps",
            "ttft_ms.p99", "tpot_ms.p99", "attainment", "repeats"]
    cols = [c for c in dict.fromkeys(cols) if c in front.columns]
    dirs = {o.name: o.direction for o in space.objectives}
    head = "".join(f"<th>{html.escape(label(c))}{arrow.get(dirs.get(c, ''), '')}</th>"
                   for c in cols) + "<th>same result as trial</th><th>deploy</th>"
    point = front[names].round(9).astype(str).agg("|".join, axis=1)
    rows = []
    for i, r in front.iterrows():
        shown = {c: _fmt(r[c]) if pd.notna(r[c]) else "-" for c in cols}
        if "pd_ratio" in shown and pd.notna(r.get("pd")) and bool(r.get("pd")):
            knobs = {k: r[k] for k in KNOB_ORDER if k in r.index and pd.notna(r[k])}
            split = canonical_params(space, knobs).get("pd_ratio")
            if split and split != shown.get("pd_ratio"):
                shown["pd_ratio"] = f"{shown.get('pd_ratio')} (runs as {split})"
        cells = "".join(f"<td>{html.escape(shown[c])}</td>" for c in cols)
        twins = [str(int(t)) for t in front.loc[(point == point[i]) & (front.index != i),
                                                "trial"]]
        cells += f"<td>{', '.join(twins) or '-'}</td>"
        ex = exported.get(int(r["trial"]))
        link = (f"<a href='best/{ex['stem']}.serve.sh'>serve.sh</a> · "
                f"<a href='best/{ex['stem']}.bench.sh'>bench.sh</a>") if ex else ""
        rows.append(f"<tr>{cells}<td>{link}</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _commands(exported: dict) -> str:
    parts = ["<h3>Deploy them with vLLM</h3><p class='muted'>Each configuration's "
             "<code>best/trial_N.serve.sh</code> starts its servers (and the PD proxy or "
             "the load balancer it needs); <code>best/trial_N.bench.sh</code> offers the "
             "simulated workload to it with <code>vllm bench serve</code>.</p>"]
    for n, ex in exported.items():
        parts.append(f"<details><summary>trial {n}: {html.escape(ex['url'])}</summary>"
                     f"<pre>{html.escape(ex['serve'])}\n# benchmark:\n"
                     f"{html.escape(ex['bench'])}</pre></details>")
    return "".join(parts)


def validation_text(providers: list[str], hardware: tuple[str, ...]) -> str:
    """What is known of the latency source's error, from the project's own fit records."""
    notes = []
    if "roofline" in providers:
        import yaml

        from sim.paths import profiles_root

        path = Path(profiles_root()) / "roofline_calibration.yaml"
        try:
            cal = yaml.safe_load(path.read_text()) or {}
        except OSError:
            cal = {}
        err = cal.get("fit_error") or {}
        if err:
            per = ", ".join(f"{k} {v['mean_abs_pct']:.0f}%" for k, v in err.items()
                            if isinstance(v, dict) and "mean_abs_pct" in v)
            gpus = sorted({b.split("/")[0] for b in cal.get("bundles", [])})
            off = [h for h in hardware if h not in gpus]
            notes.append(f"roofline: per-operation mean absolute error against measured vLLM "
                         f"kernels ({per}), fitted on {', '.join(gpus)}"
                         + (f"; {', '.join(off)} is extrapolated from datasheet peaks, not "
                            "validated" if off else ""))
        else:
            notes.append("roofline: uncalibrated datasheet roofline, not validated")
    for p in providers:
        if p == "measured":
            notes.append("measured: end-to-end error of measured profiles: `make validate` "
                         "(experiments/validate_vllm.py) against a real vLLM run")
        elif p == "aic":
            notes.append("aic: aiconfigurator-core's per-operation database (its own kernel "
                         "measurements), not validated end to end against vLLM here")
        elif p != "roofline":
            notes.append(f"{p}: no validation record")
    return "; ".join(notes) or "n/a"


def _header(space: Space, df: pd.DataFrame, front: pd.DataFrame) -> list[str]:
    get = df.get
    providers = sorted(set(get("latency_provider", pd.Series(dtype=str)).dropna()) - {""})
    sources = sorted(set(get("latency_source", pd.Series(dtype=str)).dropna()) - {""})
    n_done = int((df["state"] == "COMPLETE").sum()) if len(df) else 0
    n_feas = int(df["feasible"].sum()) if len(df) else 0
    n_rej = int(df["rejected"].sum()) if len(df) else 0
    n_cfg = int(df.loc[df["state"] == "COMPLETE", "config"].nunique()) if len(df) else 0
    slo = ", ".join(f"{k.replace('_ms', '')} ≤ {v:g} ms" for k, v in space.slo.items())
    if space.attainment:
        a = space.attainment
        lim = ", ".join(f"{k.replace('_ms', '').upper()} ≤ {v:g} ms" for k, v in
                        (("ttft_ms", a.ttft_ms), ("tpot_ms", a.tpot_ms), ("e2e_ms", a.e2e_ms))
                        if v)
        slo += f"; {a.target:.0%} of requests with {lim}"
    return [
        f"<h1>{html.escape(space.name)}: how to serve {html.escape(served_model(space))}</h1>",
        f"<p class='lead'><b>{len(front)} distinct configuration(s) on the Pareto front</b> "
        f"of {n_cfg} distinct configurations tried ({n_done} trials: {n_feas} meet the SLOs, "
        f"{n_rej} rejected before simulation) on {html.escape(', '.join(space.hardware))}, "
        f"budget {space.total_devices} devices ({space.devices_per_node} per node).</p>",
        f"<div class='box'><b>Latency source:</b> {html.escape(', '.join(providers) or 'n/a')}"
        f" ({html.escape('; '.join(sources) or 'n/a')}). <b>Validation error:</b> "
        f"{html.escape(validation_text(providers, space.hardware))}.<br><b>SLOs:</b> "
        f"{html.escape(slo or 'none')}. <b>Objectives:</b> "
        + html.escape(", ".join(f"{label(o.name)} ({o.direction})" for o in space.objectives))
        + "</div>"]


def render_html(space: Space, df: pd.DataFrame, front: pd.DataFrame, exported: dict,
                cdf: dict[int, dict] | None = None, best_note: str | None = None) -> str:
    """The report; ``best_note``: what the search knows of the best configuration's
    one-knob neighbourhood (``dse.report.best_neighbourhood_text``)."""
    figs: list[tuple[str, Any]] = []
    done = df[(df["state"] == "COMPLETE") & ~df["rejected"]].copy() if len(df) else df
    if len(done) and len(space.objectives) >= 2:
        figs.append(("pareto", pareto_figure(space, done, front)))
    if len(front) and cdf:
        figs.append(("cdf", cdf_figure(front, cdf, space)))
    if len(done):
        fig = knob_figure(space, done)
        if fig is not None:
            figs.append(("knobs", fig))
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>dse report: {html.escape(space.name)}</title>", _STYLE,
             "<script src='plotly.min.js' charset='utf-8'></script></head><body>",
             *_header(space, df, front)]
    div = {name: fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}",
                             config={"displaylogo": False, "responsive": True})
           for name, fig in figs}
    if "pareto" in div:
        parts.append(div["pareto"])
    parts.append("<h2>The Pareto configurations</h2>")
    if len(front):
        if best_note:
            parts.append(f"<p>{html.escape(best_note)}.</p>")
        parts.append(_table(space, front, exported))
        parts.append(_commands(exported))
    else:
        parts.append("<p><b>No configuration meets the SLOs.</b> Relax the SLOs or widen the "
                     "knobs; see the reasons in trials.csv.</p>")
    for name in ("cdf", "knobs"):
        if name in div:
            parts.append(div[name])
    parts += _rejected(df)
    parts.append(f"<script>window.dseFigures = {json.dumps(list(div))};</script>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _rejected(df: pd.DataFrame) -> list[str]:
    if not len(df) or not df["rejected"].any():
        return []
    rej = df[df["rejected"]].groupby("reason").size().sort_values(ascending=False)
    rows = "".join(f"<tr><td style='text-align:left'>{html.escape(str(r))}</td><td>{c}</td>"
                   "</tr>" for r, c in rej.items())
    return ["<h2>Rejected before simulation</h2><table><tr><th>reason</th><th>trials</th>"
            f"</tr>{rows}</table>"]


__all__ = ["render_html", "pareto_figure", "cdf_figure", "knob_figure", "hover_text", "label"]
