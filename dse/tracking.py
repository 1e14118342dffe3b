"""MLflow tracking: one parent run per study, one child run per trial.

Only the driver writes here. Each child is one ``create_run`` + one ``log_batch`` + one
``log_artifacts`` (per-request table, cluster config, time series): a few tens of ms,
small beside a trial. The store defaults to ``sqlite:///<out>/mlflow.db`` with artifacts
under ``<out>/mlartifacts``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_PARAM_LEN = 6000


def default_tracking_uri(out_dir: Path) -> str:
    return f"sqlite:///{out_dir.resolve() / 'mlflow.db'}"


def _param(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (dict, list, tuple)) else str(v)
    return s[:MAX_PARAM_LEN]


class Tracker:
    def __init__(self, uri: str, out_dir: Path, experiment: str) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            art = (out_dir.resolve() / "mlartifacts").as_uri() if uri.startswith("sqlite") \
                else None
            self.experiment_id = self.client.create_experiment(experiment,
                                                               artifact_location=art)
        else:
            self.experiment_id = exp.experiment_id
        self.parent_id: str | None = None
        self.seconds = 0.0  # time spent tracking, reported at the end

    # ------------------------------------------------------------ parent
    def open_parent(self, run_id: str | None, name: str, params: dict, tags: dict) -> str:
        from mlflow.entities import Param, RunTag

        t0 = time.perf_counter()
        if run_id:
            try:
                run = self.client.get_run(run_id)
                if run.info.lifecycle_stage == "active":
                    self.client.update_run(run_id, status="RUNNING")
                    self.parent_id = run_id
                    self.seconds += time.perf_counter() - t0
                    return run_id
            except Exception:  # noqa: BLE001, S110 - missing run: make a new one
                pass
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={"dse.role": "study"})
        self.parent_id = run.info.run_id
        self.client.log_batch(self.parent_id,
                              params=[Param(k, _param(v)) for k, v in params.items()],
                              tags=[RunTag(k, _param(v)) for k, v in tags.items()])
        self.seconds += time.perf_counter() - t0
        return self.parent_id

    def close_parent(self, metrics: dict[str, float], artifacts: list[Path],
                     status: str = "FINISHED") -> None:
        from mlflow.entities import Metric

        t0 = time.perf_counter()
        ts = int(time.time() * 1000)
        self.client.log_batch(self.parent_id, metrics=[Metric(k, float(v), ts, 0)
                                                       for k, v in metrics.items()])
        for p in artifacts:
            if p.is_dir():
                self.client.log_artifacts(self.parent_id, str(p), artifact_path=p.name)
            elif p.exists():
                self.client.log_artifact(self.parent_id, str(p))
        self.client.set_terminated(self.parent_id, status=status)
        self.seconds += time.perf_counter() - t0

    # ------------------------------------------------------------ children
    def log_trial(self, number: int, params: dict, metrics: dict[str, float], tags: dict,
                  files: dict[str, Any]) -> str:
        """One child run. ``files``: name -> DataFrame / dict / str, written as artifacts."""
        from mlflow.entities import Metric, Param, RunTag

        t0 = time.perf_counter()
        run = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number:04d}",
            tags={"mlflow.parentRunId": self.parent_id, "dse.trial_number": str(number)})
        rid = run.info.run_id
        ts = int(time.time() * 1000)
        self.client.log_batch(
            rid,
            metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items()],
            params=[Param(k, _param(v)) for k, v in params.items()],
            tags=[RunTag(k, _param(v)) for k, v in tags.items()])
        if files:
            with tempfile.TemporaryDirectory(prefix="dse-art-") as tmp:
                for name, obj in files.items():
                    path = Path(tmp) / name
                    if hasattr(obj, "to_csv"):
                        obj.to_csv(path, index=False)
                    elif isinstance(obj, (dict, list)):
                        path.write_text(json.dumps(obj, indent=2))
                    else:
                        path.write_text(str(obj))
                self.client.log_artifacts(rid, tmp)
        self.client.set_terminated(rid, status="FINISHED" if tags.get("state") != "FAIL"
                                   else "FAILED")
        self.seconds += time.perf_counter() - t0
        return rid

    def delete_trial_runs(self, numbers: list[int]) -> int:
        """Remove children of trials that are being re-run (a driver killed mid-record)."""
        if not numbers or self.parent_id is None:
            return 0
        n = 0
        for num in numbers:
            runs = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{self.parent_id}' and "
                              f"tags.dse.trial_number = '{num}'")
            for r in runs:
                self.client.delete_run(r.info.run_id)
                n += 1
        return n

    def children(self) -> list:
        return self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{self.parent_id}'", max_results=50000)
