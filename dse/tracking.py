"""MLflow tracking: one parent run per study, one child run per trial.

Only the driver writes here, from one thread of its own (:class:`TrackingWriter`), so the
search does not wait for it. Each child is one ``create_run`` (with its tags) + one
``log_batch`` (metrics and parameters) + its artifact files (per-request table, cluster
config, summary, time series, a TTFT/TPOT histogram image; written straight into the run's
artifact folder of a local store) + ``set_terminated``: a few tens of ms, small beside a
trial. Per-instance KV-cache figures are in ``summary.json``, not metrics. Metric names are grouped by prefix
(``objective/``, ``ttft/``, ``constraint/``...), the experiment is tagged as a training-style
one so MLflow 3's UI opens on its runs table, and the parent run carries the Pareto table,
the report and the exported configurations. The store defaults to
``sqlite:///<out>/mlflow.db`` with artifacts under ``<out>/mlartifacts``.
"""

from __future__ import annotations

import collections
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MAX_PARAM_LEN = 6000
#: MLflow 3's UI picks its layout by experiment kind: this one shows the runs table first
#: (the UI's own toggle is the ``workflowType`` URL parameter, see :func:`runs_url`)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
HISTOGRAM = "latency_hist.png"
#: flat study metrics -> the group they are shown under
_GROUPS = {"attainment": "slo", "capacity_rps": "slo", "throughput_rps": "throughput",
           "gen_tps": "throughput", "preemptions": "scheduler", "prefix_hit_ratio": "scheduler",
           "simulated_s": "run", "wall_s": "run", "attempts": "run"}


def metric_name(key: str) -> str:
    """A metric's name grouped by prefix, as MLflow's UI groups charts by the part before
    '/': ``objective.p99_ttft`` -> ``objective/p99_ttft``, ``ttft_ms.p99`` ->
    ``ttft/p99_ms``, ``constraint.p99_ttft_ms`` -> ``constraint/p99_ttft_ms``,
    ``gen_tps`` -> ``throughput/gen_tps``; study totals (``trials_complete``) -> ``study/..``."""
    if "." in key:
        head, rest = key.split(".", 1)
        rest = rest.replace(".", "_")  # nested summaries (kv_cache.0.blocks): one group level
        if head.endswith("_ms"):
            return f"{head[:-3]}/{rest}_ms"
        return f"{head}/{rest}"
    group = _GROUPS.get(key) or ("study" if key.startswith(("trials_", "pareto", "tracking"))
                                 else "run")
    return f"{group}/{key}"


def runs_url(base: str, experiment_id: str) -> str:
    """The MLflow UI page of the experiment's runs table (in the machine-learning view)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


# A 3x5 pixel font for the few characters the histogram writes (rows top to bottom).
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111",
    "9": "111101111001111", ".": "000000000000010", " ": "000000000000000",
    "=": "000111000111000", "-": "000000111000000", "T": "111010010010010",
    "F": "111100110100100", "P": "111101111100100", "O": "111101101101111",
    "M": "101111111101101", "S": "111100111001111", "N": "000110101101101",
}
_BLUE, _RED, _GREY, _INK = (31, 119, 180), (214, 39, 40), (190, 190, 190), (40, 40, 40)


_GLYPH_MASKS: dict[tuple[str, int], np.ndarray] = {}


def _glyph(ch: str, scale: int) -> np.ndarray:
    """A character's pixels (bool, 5*scale x 3*scale), built once."""
    g = _GLYPH_MASKS.get((ch, scale))
    if g is None:
        bits = _GLYPHS.get(ch, _GLYPHS[" "])
        g = np.array([int(b) for b in bits], dtype=bool).reshape(5, 3)
        g = _GLYPH_MASKS[(ch, scale)] = np.kron(g, np.ones((scale, scale), dtype=bool))
    return g


def _text(img: np.ndarray, x: int, y: int, text: str, color, scale: int = 2) -> None:
    for ch in text.upper():
        g = _glyph(ch, scale)
        h, w = g.shape
        if 0 <= y and y + h <= img.shape[0] and 0 <= x and x + w <= img.shape[1]:
            img[y:y + h, x:x + w][g] = color
        x += 4 * scale


def _panel(img: np.ndarray, x0: int, vals: np.ndarray, name: str) -> None:
    """One histogram into img[:, x0:x0+W]: title with p99 and count, bars, min/max ticks."""
    h, w = img.shape[0], 300
    top, bottom, left, right = 22, h - 20, x0 + 10, x0 + w - 10
    img[bottom, left:right] = _GREY
    if not len(vals):
        _text(img, left, 4, f"{name} MS  N=0", _INK)
        return
    lo, hi = float(vals.min()), float(vals.max())
    counts, edges = np.histogram(vals, bins=30, range=(lo, hi if hi > lo else lo + 1))
    bw = (right - left) / len(counts)
    for i, c in enumerate(counts):
        bar = int(round((bottom - top) * c / counts.max()))
        img[bottom - bar:bottom, int(left + i * bw):max(int(left + i * bw) + 1,
                                                         int(left + (i + 1) * bw) - 1)] = _BLUE
    p99 = float(np.percentile(vals, 99))
    px = int(left + (p99 - edges[0]) / (edges[-1] - edges[0]) * (right - left - 1))
    img[top:bottom:4, px] = _RED
    img[top + 1:bottom:4, px] = _RED
    _text(img, left, 4, f"{name} MS  N={len(vals)}", _INK)
    _text(img, right - 4 * 2 * len(f"P99 {p99:.3g}"), 4, f"P99 {p99:.3g}", _RED)
    _text(img, left, bottom + 5, f"{lo:.3g}", _INK)
    _text(img, right - 8 * len(f"{hi:.3g}"), bottom + 5, f"{hi:.3g}", _INK)


def latency_histogram_png(requests, path: Path) -> bool:
    """A small TTFT/TPOT histogram of one trial's requests (the red dashes mark the p99),
    drawn with numpy and written as a PNG with zlib: a few ms, no plotting library. False
    when the table lacks the columns or has no rows."""
    import struct
    import zlib

    if requests is None or not len(requests) or "ttft_ns" not in requests:
        return False
    ttft = np.asarray(requests["ttft_ns"], dtype=float) / 1e6
    tpot = (np.asarray(requests["tpot_ns"], dtype=float)[
        np.asarray(requests["output_tokens"]) > 1] / 1e6
        if "tpot_ns" in requests and "output_tokens" in requests else np.array([]))
    img = np.full((160, 600, 3), 255, dtype=np.uint8)
    _panel(img, 0, ttft[np.isfinite(ttft)], "TTFT")
    _panel(img, 300, tpot[np.isfinite(tpot)], "TPOT")
    # each row after its filter byte (0: none); zlib level 3 is ~4x faster than 6 here
    # for a file of 2 kB instead of 1
    raw = np.concatenate([np.zeros((img.shape[0], 1), np.uint8),
                          img.reshape(img.shape[0], -1)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 600, 160, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 3)) + chunk(b"IEND", b""))
    path.write_bytes(png)
    return True

def local_artifact_dir(artifact_uri: str | None) -> Path | None:
    """The folder of a run's artifacts when the store keeps them on this machine
    (``file:`` URI or a plain path), else None. MLflow's UI lists whatever files are in
    that folder, so writing them there is the same as ``log_artifacts``."""
    from urllib.parse import unquote, urlparse

    if not artifact_uri:
        return None
    if artifact_uri.startswith("file:"):
        return Path(unquote(urlparse(artifact_uri).path))
    if "://" not in artifact_uri and ":" not in artifact_uri.split("/", 1)[0]:
        return Path(artifact_uri)
    return None


def _write_files(folder: Path, files: dict[str, Any]) -> None:
    for name, obj in files.items():
        path = folder / name
        if hasattr(obj, "to_csv"):
            obj.to_csv(path, index=False)
        elif isinstance(obj, (dict, list)):
            path.write_text(json.dumps(obj, indent=2))
        else:
            path.write_text(str(obj))
    if "requests.csv" in files:
        latency_histogram_png(files["requests.csv"], folder / HISTOGRAM)


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
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_location=art, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        else:
            self.experiment_id = exp.experiment_id
            if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG,
                                               EXPERIMENT_KIND)
        self.parent_id: str | None = None
        self.seconds = 0.0  # time spent tracking, reported at the end
        #: store calls made for trials (create_run, log_batch, set_terminated, ...)
        self.calls: collections.Counter = collections.Counter()

    # ------------------------------------------------------------ parent
    def open_parent(self, run_id: str | None, name: str, params: dict, tags: dict) -> str:
        from mlflow.entities import Param

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
                                     tags={"dse.role": "study",
                                           **{k: _param(v) for k, v in tags.items()}})
        self.parent_id = run.info.run_id
        self.client.log_batch(self.parent_id,
                              params=[Param(k, _param(v)) for k, v in params.items()])
        self.seconds += time.perf_counter() - t0
        return self.parent_id

    def close_parent(self, metrics: dict[str, float], artifacts: list[Path],
                     status: str = "FINISHED") -> None:
        from mlflow.entities import Metric

        t0 = time.perf_counter()
        ts = int(time.time() * 1000)
        self.client.log_batch(self.parent_id, metrics=[Metric(metric_name(k), float(v), ts, 0)
                                                       for k, v in metrics.items()])
        for p in artifacts:
            if p.is_dir():
                self.client.log_artifacts(self.parent_id, str(p), artifact_path=p.name)
            elif p.name == "report.html" and (p.parent / "plotly.min.js").exists():
                self._log_standalone_report(p)
            elif p.exists():
                self.client.log_artifact(self.parent_id, str(p))
        self.client.set_terminated(self.parent_id, status=status)
        self.seconds += time.perf_counter() - t0

    def _log_standalone_report(self, page: Path) -> None:
        """The report with plotly.js inlined, so it renders inside MLflow's artifact view
        (which cannot follow the page's relative script)."""
        text = page.read_text()
        js = (page.parent / "plotly.min.js").read_text()
        tag = "<script src='plotly.min.js' charset='utf-8'></script>"
        with tempfile.TemporaryDirectory(prefix="dse-rep-") as tmp:
            out = Path(tmp) / page.name
            out.write_text(text.replace(tag, f"<script>{js}</script>", 1) if tag in text
                           else text)
            self.client.log_artifact(self.parent_id, str(out))

    # ------------------------------------------------------------ children
    def log_trial(self, number: int, params: dict, metrics: dict[str, float], tags: dict,
                  files: dict[str, Any]) -> str:
        """One child run: ``create_run`` with every tag, one ``log_batch`` of its metrics
        and parameters, its artifact files, ``set_terminated``: three store transactions.
        ``files``: name -> DataFrame / dict / str, written as artifacts: straight into the
        run's artifact folder when the store keeps artifacts in a local folder (the
        default), else through ``log_artifacts``."""
        from mlflow.entities import Metric, Param

        t0 = time.perf_counter()
        run = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number:04d}",
            tags={"mlflow.parentRunId": self.parent_id, "dse.trial_number": str(number),
                  **{k: _param(v) for k, v in tags.items()}})
        rid = run.info.run_id
        self.calls["create_run"] += 1
        ts = int(time.time() * 1000)
        self.client.log_batch(
            rid,
            metrics=[Metric(metric_name(k), float(v), ts, 0) for k, v in metrics.items()],
            params=[Param(k, _param(v)) for k, v in params.items()])
        self.calls["log_batch"] += 1
        if files:
            self._write_artifacts(rid, run.info.artifact_uri, files)
        self.client.set_terminated(rid, status="FINISHED" if tags.get("state") != "FAIL"
                                   else "FAILED")
        self.calls["set_terminated"] += 1
        self.seconds += time.perf_counter() - t0
        return rid

    def _write_artifacts(self, rid: str, artifact_uri: str, files: dict[str, Any]) -> None:
        folder = local_artifact_dir(artifact_uri)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            _write_files(folder, files)
            self.calls["artifacts_direct"] += 1
            return
        with tempfile.TemporaryDirectory(prefix="dse-art-") as tmp:
            _write_files(Path(tmp), files)
            self.client.log_artifacts(rid, tmp)
        self.calls["log_artifacts"] += 1

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


class TrackingWriter:
    """The driver's MLflow writer: a background thread of the driver process (so the
    driver is still the only writer), fed through a queue, so a trial's MLflow run (a few
    store transactions and its artifact files, ~0.1 s) is written while the search goes on.

    Nothing is lost when the driver stops: :meth:`log_trial` first writes the trial's
    payload to a spool file under ``spool`` (pickled, renamed into place: ~1 ms) and the
    thread removes it only once the run is in MLflow. :meth:`close` drains the queue and
    joins the thread (the driver calls it at the end and on interruption); a driver killed
    outright leaves spool files, which the next run of the same command logs again
    (:meth:`replay`), first deleting any run of that trial a killed writer left half
    written, so no trial is missing or doubled. ``connect`` opens the store (and the
    parent run) in the thread, so opening MLflow overlaps the start of the workers;
    ``before_log`` runs before each trial is logged (the driver forces its journal to disk
    there, so MLflow is never ahead of the study)."""

    def __init__(self, spool: Path, connect, before_log=None) -> None:
        import queue
        import threading

        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)
        self._connect = connect
        self._before_log = before_log
        self._q: queue.Queue = queue.Queue()
        self._idle = threading.Condition()
        self._unfinished = 0  # items queued and not yet handled
        self._thread = threading.Thread(target=self._run, name="dse-mlflow-writer",
                                        daemon=True)
        self.tracker: Tracker | None = None
        self.error: BaseException | None = None
        self.logged = 0
        self.failed = 0
        self.wait_s = 0.0  # how long close() waited for the queue to drain
        self.cpu_s = 0.0  # CPU seconds of the thread (store opening included)

    # ------------------------------------------------------------ the driver's side
    @property
    def seconds(self) -> float:
        return self.tracker.seconds if self.tracker is not None else 0.0

    @property
    def parent_id(self) -> str | None:
        return self.tracker.parent_id if self.tracker is not None else None

    def spooled(self) -> dict[int, Path]:
        """Trial number -> spool file, of trials not yet in MLflow."""
        out = {}
        for p in self.spool.glob("trial_*.pkl"):
            try:
                out[int(p.stem.split("_", 1)[1])] = p
            except ValueError:
                continue
        return out

    def start(self) -> TrackingWriter:
        self._thread.start()
        return self

    def replay(self, number: int) -> None:
        """Log a spooled trial a stopped driver left behind (after deleting its partial
        run, if any)."""
        self._put(("replay", self.spool / f"trial_{number:06d}.pkl"))

    def log_trial(self, number: int, params: dict, metrics: dict, tags: dict,
                  files: dict) -> None:
        import os
        import pickle

        path = self.spool / f"trial_{number:06d}.pkl"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump((number, params, metrics, tags, files), f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        self._put(("trial", path))

    def call(self, fn) -> None:
        """Run ``fn(tracker)`` in the writer, after everything queued before it."""
        self._put(("call", fn))

    def check(self) -> None:
        """Raise, in the driver, the error that stopped the writer (the store would not
        open)."""
        if self.error is not None:
            raise self.error

    def flush(self) -> None:
        """Wait until everything queued so far is written (or given up on)."""
        if not self._thread.is_alive():
            return
        t0 = time.perf_counter()
        try:
            with self._idle:
                while self._unfinished and self._thread.is_alive():
                    self._idle.wait(0.2)
        finally:
            self.wait_s += time.perf_counter() - t0

    def _put(self, item) -> None:
        with self._idle:
            self._unfinished += 1
        self._q.put(item)

    def _task_done(self) -> None:
        with self._idle:
            self._unfinished -= 1
            if not self._unfinished:
                self._idle.notify_all()

    def close(self) -> None:
        """Drain the queue and join the thread."""
        if not self._thread.is_alive():
            return
        t0 = time.perf_counter()
        self._put(("stop", None))
        try:
            self._thread.join()
        finally:
            self.wait_s += time.perf_counter() - t0

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        t0 = time.thread_time()
        try:
            self._serve()
        finally:
            self.cpu_s = time.thread_time() - t0

    def _serve(self) -> None:
        import logging

        log = logging.getLogger(__name__)
        try:
            self.tracker = self._connect()
        except BaseException as exc:  # noqa: BLE001 - handed to the driver by check()
            self.error = exc
            while True:  # payloads stay spooled for the next run
                kind, _ = self._q.get()
                self._task_done()
                if kind == "stop":
                    return
        while True:
            kind, item = self._q.get()
            if kind == "stop":
                self._task_done()
                return
            try:
                if kind == "call":
                    item(self.tracker)
                else:
                    self._log_spooled(item, replay=kind == "replay")
            except Exception as exc:  # noqa: BLE001 - tracking must not kill the study
                self.failed += 1
                what = f"trial {item.stem.split('_', 1)[1].lstrip('0') or '0'}" \
                    if isinstance(item, Path) else "the study run"
                log.warning("MLflow logging failed for %s: %s%s", what, exc,
                            " (kept in %s; logged when the search is run again)"
                            % self.spool if isinstance(item, Path) else "")
            finally:
                self._task_done()

    def _log_spooled(self, path: Path, replay: bool) -> None:
        import pickle

        with open(path, "rb") as f:
            number, params, metrics, tags, files = pickle.load(f)
        if self._before_log is not None:
            self._before_log()
        if replay:
            self.tracker.delete_trial_runs([number])
        self.tracker.log_trial(number, params, metrics, tags, files)
        path.unlink()
        self.logged += 1
