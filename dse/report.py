"""Results of a study: trials.csv, pareto.csv, an HTML report and exported best configs.

Everything here is re-made from the Optuna journal (``dse report DIR``), so it never
depends on the driver having finished cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dse import metrics as M
from dse.canonical import config_key, inert_knobs
from dse.config import make_trial_config, space_workload
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
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name,
                               "config": config_key(space, params)}
        inert = inert_knobs(space, params)
        for k in params:
            if not k.startswith("_"):
                # A knob that cannot change this configuration's result shows as '-'.
                row[k] = None if k in inert else params[k]
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
    """Non-dominated FEASIBLE trials, one row per distinct configuration (canonical form:
    knobs with no effect never make two rows), the lowest trial number standing for it;
    ``repeats`` counts the trials that evaluated the same configuration."""
    if df.empty:
        return df
    names = [o.name for o in space.objectives]
    feas = df[(df["state"] == "COMPLETE") & df["feasible"]].dropna(subset=names)
    if feas.empty:
        return feas
    repeats = feas.groupby("config").size()
    feas = feas.sort_values("trial").drop_duplicates(subset="config")
    mask = M.pareto_mask(feas[names].to_numpy(float), [o.direction for o in space.objectives])
    front = feas[mask].copy()
    front["repeats"] = front["config"].map(repeats).astype(int)
    # best first by the objectives in their order (the first decides, ties go to the next:
    # dse.sampling.objective_rank, the summary's and the polish's best), then trial number
    return front.sort_values([*names, "trial"], ascending=[
        *(o.direction == "minimize" for o in space.objectives), True]).reset_index(drop=True)


def write_results(space: Space, study, out: Path, latency: dict[int, dict] | None = None,
                  before_reading=None) -> dict[str, Any]:
    """trials.csv, pareto.csv, best/ and the report. ``latency``: trial -> its TTFT/TPOT
    quantiles (:func:`dse.metrics.latency_quantiles`) as the driver kept them; the front's
    trials not in it are read from their MLflow runs' per-request tables (after
    ``before_reading()``, e.g. waiting for the MLflow writer)."""
    df = trials_frame(space, study)
    df.to_csv(out / "trials.csv", index=False)
    front = pareto_frame(space, df)
    front.to_csv(out / "pareto.csv", index=False)
    exported = export_best(space, front, out / "best")
    _write_plotlyjs(out)
    wanted = [int(t) for t in front["trial"]] if len(front) else []
    latency = latency or {}
    cdf = {t: latency[t] for t in wanted if t in latency}
    missing = [t for t in wanted if t not in cdf]
    if missing:
        if before_reading is not None:
            before_reading()
        cdf.update(request_tables(out, missing))
    from dse.report_html import render_html

    best_note = best_neighbourhood_text(space, study.get_trials(deepcopy=False)) \
        if len(front) else None
    (out / REPORT).write_text(render_html(space, df, front, exported, cdf,
                                          best_note=best_note))
    return {"trials": len(df), "pareto_count": len(front), "exported": len(exported),
            "best_note": best_note}


def best_neighbourhood_text(space: Space, trials) -> str | None:
    """Whether a single knob change could still beat the best configuration: how many of
    its one-knob neighbours (those that pass the pre-simulation check) were simulated
    (``dse.sampling.best_neighbourhood``); None where that is not known."""
    from dse.sampling import best_neighbourhood

    info = best_neighbourhood(space, trials)
    if info is None:
        return None
    head = f"Best by {space.objectives[0].name}: trial {info['trial']};"
    n, tried = info["neighbours"], info["tried"]
    if n == 0:
        return (f"{head} none of its one-knob neighbours passes the check: no single knob "
                "change improves it")
    if tried == n:
        return (f"{head} all {n} of its one-knob neighbours that pass the check were "
                "simulated, none better: no single knob change improves it")
    return (f"{head} {tried} of its {n} one-knob neighbours that pass the check were "
            f"simulated, none better; {n - tried} were not (to search on, rerun with more "
            "--n-trials: the search resumes)")


def export_best(space: Space, front: pd.DataFrame, best_dir: Path) -> dict[int, dict]:
    """Every distinct Pareto configuration as cluster JSON, deploy script and benchmark."""
    from dse.export import export_config

    best_dir.mkdir(parents=True, exist_ok=True)
    for old in best_dir.glob("trial_*"):
        old.unlink()
    out: dict[int, dict] = {}
    names = [o.name for o in space.objectives]
    workload = None
    rows = []
    for _, row in front.iterrows():
        params = {k: _py(row[k]) for k in row.index
                  if k in KNOBS and row[k] is not None and not _isnan(row[k])}
        cfg = make_trial_config(space, int(row["trial"]), params)
        if workload is None:
            workload = space_workload(space)
        objs = {n: float(row[n]) for n in names}
        rate = row.get("capacity_rps") if space.capacity.enabled else None
        rate = float(rate) if rate is not None and not _isnan(rate) else None
        out[cfg.number] = export_config(space, cfg, objs, best_dir, workload, rate)
        rows.append({"trial": cfg.number, **objs, "config": row["config"],
                     "serve": f"{out[cfg.number]['stem']}.serve.sh",
                     "bench": f"{out[cfg.number]['stem']}.bench.sh",
                     "cluster": f"{out[cfg.number]['stem']}.cluster.json"})
    pd.DataFrame(rows).to_csv(best_dir / "index.csv", index=False)
    return out


REPORT = "report.html"
PLOTLY_JS = "plotly.min.js"


def _write_plotlyjs(out: Path) -> None:
    """plotly.js once, beside the report (the page loads it by relative path)."""
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
    dst = out / PLOTLY_JS
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        dst.write_bytes(src.read_bytes())


def request_tables(out: Path, trials: list[int], max_points: int = 400) -> dict[int, dict]:
    """TTFT and TPOT (ms, sorted) of the given trials from their per-request tables, which
    the study logs as MLflow artifacts (``requests.csv`` of each trial's run). At most
    ``max_points`` quantiles per series keep the page small. Empty when there is no store."""
    meta_path = out / "study.json"
    if not trials or not meta_path.exists():
        return {}
    meta = json.loads(meta_path.read_text())
    uri, parent = meta.get("tracking_uri"), meta.get("mlflow_parent_run_id")
    if not uri or not parent:
        return {}
    import os
    import tempfile

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    wanted = {str(t) for t in trials}
    try:
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([meta["experiment_id"]], max_results=50000,
                                  filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    except Exception as exc:  # noqa: BLE001 - MlflowException, sqlite/sqlalchemy errors
        from sim.errors import InputError

        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"{meta_path}: its tracking_uri {uri!r}: cannot read the MLflow "
                         f"store ({first[:300]}); the report needs the runs of trials "
                         f"{sorted(trials)[:5]} from it") from None
    tables: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dse-req-") as tmp:
        for r in runs:
            num = r.data.tags.get("dse.trial_number")
            if num not in wanted or int(num) in tables:
                continue
            path = _artifact(client, r, "requests.csv", tmp)
            if path is None:
                continue
            req = pd.read_csv(path, usecols=["ttft_ns", "tpot_ns", "output_tokens"])
            tables[int(num)] = M.latency_quantiles(req, max_points)
    return tables


def _artifact(client, run, name: str, tmp: str) -> str | None:
    """A run's artifact file: read in place from a local store, else downloaded."""
    from urllib.parse import unquote, urlparse

    uri = run.info.artifact_uri or ""
    if uri.startswith("file:"):
        local = Path(unquote(urlparse(uri).path)) / name
        return str(local) if local.exists() else None
    try:
        return client.download_artifacts(run.info.run_id, name, tmp)
    except Exception:  # noqa: BLE001 - a trial without its table is left out
        return None


def _py(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _isnan(v) -> bool:
    return isinstance(v, float) and np.isnan(v)


def load_study(out: Path):
    """The space and the Optuna study stored in a search output folder."""
    import optuna

    from dse.space import load_space
    from dse.store import JOURNAL, SPACE_COPY, STUDY_JSON, open_storage, read_meta
    from sim.errors import InputError

    meta_path = out / STUDY_JSON
    if not meta_path.exists():
        raise InputError(f"{out}: not a dse search folder (no {STUDY_JSON}); run "
                         "`dse search SPACE.yaml --out DIR` first")
    meta = read_meta(out)
    name = meta.get("study_name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{meta_path}: no study_name; not a study file written by `dse "
                         "search` (rerun the search with --fresh to start over)")
    copy = out / SPACE_COPY
    orig = Path(str(meta.get("space_path") or ""))
    if copy.exists():
        space = _space_copy(copy, orig, out)
    else:
        space = load_space(orig)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(out)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise InputError(f"{out / JOURNAL}: holds no study named {name!r} (the name in "
                         f"{STUDY_JSON}); rerun the search with --fresh to start over") \
            from None
    return space, study, meta


def _space_copy(copy: Path, orig: Path, out: Path):
    """The space as stored beside the study (``space.yaml``), read as ``dse search`` read
    the original, errors named by the copy."""
    import yaml

    from dse.space import parse_space
    from sim.errors import InputError, read_text_input
    from sim.yamlio import strict_load, yaml_problem

    text = read_text_input(copy, "a search space", "a YAML")
    try:
        data = strict_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{copy}: YAML syntax error: {yaml_problem(exc)}") from None
    except (RecursionError, ValueError) as exc:
        raise InputError(f"{copy}: malformed YAML ({exc or 'nested too deeply'})") from None
    return parse_space(data, str(orig if orig.name else copy),
                       base_dir=orig.parent if orig.name else out, text=text)
