"""``dse``: search the serving design space, then look at the results.

    dse search SPACE.yaml [--out DIR] [--n-trials N] [--workers N] [--ray-address A]
               [--tracking-uri U] [--resume | --fresh] [--deterministic] [--seed S]
               [--backend inproc|subprocess]
    dse check SPACE.yaml  validate a space (and the files it names) without running it
    dse report DIR        re-render trials.csv, pareto.csv, report.html, best/
    dse show DIR          the Pareto table in the terminal
    dse ui DIR            start the MLflow UI on the study's store and print its URL

User mistakes (a bad space file, an unknown name) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from dse.vocab import BACKENDS
from sim.errors import EXIT_INPUT_ERROR, InputError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dse", description="Design-space explorer for LLM "
                                "serving (Optuna + Ray + MLflow over the sim simulator).")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    s = sub.add_parser("search", help="run (or resume) a search study")
    s.add_argument("space", help="search-space YAML file")
    s.add_argument("--out", help="output folder (default runs/<space name>)")
    s.add_argument("--n-trials", type=int, help="COMPLETE trials to reach (overrides the YAML)")
    s.add_argument("--workers", type=int, help="Ray actors (default: one per free CPU of the "
                   "Ray cluster); 0 runs trials in this process without Ray")
    s.add_argument("--ray-address", help="join this Ray cluster, HOST:PORT of its head "
                   "(also RAY_ADDRESS); default: start a local Ray")
    s.add_argument("--backend", choices=BACKENDS,
                   help="system simulator of each worker: subprocess = one long-lived "
                        "astra-sim process per worker, inproc = in the worker's process, "
                        "auto (default) = subprocess on Ray actors, inproc with --workers 0 "
                        "(overrides the space's simulator.backend)")
    s.add_argument("--tracking-uri", help="MLflow tracking URI (default sqlite:///OUT/mlflow.db)")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--resume", dest="fresh", action="store_false", default=False,
                   help="continue the study in --out if there is one (default)")
    g.add_argument("--fresh", dest="fresh", action="store_true",
                   help="delete the study in --out and start over")
    s.add_argument("--deterministic", action="store_true",
                   help="ask a batch, wait for all, tell in order: same seed, same trials")
    s.add_argument("--seed", type=int, help="sampler seed (overrides the YAML)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = sub.add_parser("check", help="validate a search space without running it")
    c.add_argument("space", help="search-space YAML file")
    r = sub.add_parser("report", help="re-render the report of a search folder")
    r.add_argument("dir")
    sh = sub.add_parser("show", help="print the Pareto table")
    sh.add_argument("dir")
    sh.add_argument("--all", action="store_true", help="every trial, not just the front")
    u = sub.add_parser("ui", help="start the MLflow UI on a search folder")
    u.add_argument("dir")
    u.add_argument("--port", type=int, default=5000)
    u.add_argument("--host", default="127.0.0.1")
    return p


def _positive(name: str, v: int | None, minimum: int = 1, maximum: int | None = None) -> None:
    if v is not None and v < minimum:
        raise InputError(f"{name}: must be >= {minimum}, got {v}")
    if v is not None and maximum is not None and v > maximum:
        raise InputError(f"{name}: must be <= {maximum}, got {v}")


def load_checked(path: str, backend: str | None = None):
    """Load a space and check what every trial would share (its cluster block, the files it
    names), so no mistake is left for the trials to find."""
    import dataclasses

    from dse.config import check_space_cluster
    from dse.space import load_space

    space = load_space(path)
    if backend is not None:
        space = dataclasses.replace(space, simulator={**space.simulator, "backend": backend})
    check_space_cluster(space)
    from dse.sampling import refuse_empty_space

    refuse_empty_space(space)
    return space


def cmd_check(a) -> int:
    from dse.study import _distinct_configurations

    space = load_checked(a.space)
    n = _distinct_configurations(space)
    print(f"{a.space}: ok: {space.model} on {', '.join(space.hardware)}, "
          f"{len(space.knobs)} knob(s), "
          + (f"{n} distinct configuration(s)" if n is not None else "an unbounded space"))
    return 0


def _check_ray_address(flag: str | None, workers: int | None) -> None:
    """A Ray address given for a run that uses Ray must answer now (not after minutes of
    Ray's own retries); given for an in-process run it would be ignored: refuse that."""
    from dse.pool import CONNECT_TIMEOUT_S, _probe_address

    address = flag or os.environ.get("RAY_ADDRESS")
    if not address:
        return
    if workers == 0:
        if flag:
            raise InputError(f"--ray-address {flag!r} with --workers 0: an in-process run uses "
                             "no Ray; drop one of the two")
        return
    if address != "auto":
        _probe_address(address, CONNECT_TIMEOUT_S)


def _uncounted_draws(rejected: int, repeats: int) -> str:
    """The draws that did not count toward n_trials, worded for the summary line."""
    parts = [f"{rejected} draw(s) rejected before simulation"] if rejected else []
    if repeats:
        parts.append(f"{repeats} repeated configuration(s) answered from stored results")
    return f"; not counted: {' and '.join(parts)}" if parts else ""


def _sigterm_interrupts() -> None:
    """SIGTERM (a scheduler's or ``kill``'s stop) ends a search as Ctrl-C does: the
    running trials are recorded as interrupted, the workers shut down, the MLflow run
    closed, and the same command resumes (without this Python dies at once, leaving the
    parent run RUNNING and the workers to be reaped)."""
    import threading

    def _stop(*_):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)


def cmd_search(a) -> int:
    from rich.console import Console

    from dse.store import check_out_dir, check_tracking_uri
    from dse.study import Driver

    _positive("--n-trials", a.n_trials)
    _positive("--workers", a.workers, 0)
    _positive("--seed", a.seed, 0, 2**32 - 1)  # Optuna's samplers (numpy RandomState)
    if a.tracking_uri is not None:
        check_tracking_uri(a.tracking_uri)
    space = load_checked(a.space, a.backend)
    _check_ray_address(a.ray_address, a.workers if a.workers is not None
                       else space.search.workers)
    out = check_out_dir(Path(a.out or Path("runs") / space.name))
    console = Console(stderr=True)
    _sigterm_interrupts()
    driver = Driver(space, out, n_trials=a.n_trials, workers=a.workers,
                    ray_address=a.ray_address, tracking_uri=a.tracking_uri, fresh=a.fresh,
                    deterministic=a.deterministic, seed=a.seed,
                    progress=not a.no_progress, console=console)
    res = driver.run()
    now = res.complete - res.complete_before
    where = (f"in {res.wall_s:.1f}s (nothing left to run: no workers started)"
             if res.nothing_to_run else f"in {res.wall_s:.1f}s on {res.pool}")
    print(f"{res.complete} trials simulated ({res.feasible} feasible, "
          f"{res.complete - res.feasible} outside the SLOs)"
          + (f", {now} of them in this run" if res.resumed else "")
          + f", {res.failed} failed, {where}"
          + _uncounted_draws(res.rejected, res.repeats)
          + (f"; n_trials {res.capped[0]} capped at the {res.capped[1]} distinct "
             "configuration(s) of the space" if res.capped else "")
          + (f"; resumed, {res.requeued} interrupted trial(s) re-enqueued" if res.resumed
             else ""))
    for line in driver.timing_lines():
        print("  " + line)
    print(f"Pareto front: {res.pareto} configuration(s) -> {out / 'pareto.csv'}")
    if res.best_note:
        print(res.best_note)
    print(f"Report: {out / 'report.html'}   all trials: {out / 'trials.csv'}   "
          f"configs: {out / 'best'}/")
    print(f"MLflow: dse ui {out}")
    if res.pareto:
        _show(out, console=Console(), limit=10)
    return 0


def cmd_report(a) -> int:
    from dse.report import load_study, write_results

    out = Path(a.dir)
    space, study, _ = load_study(out)
    info = write_results(space, study, out)
    print(f"{info['trials']} trials, Pareto front {info['pareto_count']}: "
          f"{out / 'report.html'}, {out / 'pareto.csv'}, {out / 'trials.csv'}, {out / 'best'}/")
    return 0


def _show(out: Path, console=None, limit: int | None = None, show_all: bool = False) -> int:
    import pandas as pd
    from rich.console import Console
    from rich.table import Table

    from dse.store import STUDY_JSON, read_meta

    path = out / ("trials.csv" if show_all else "pareto.csv")
    meta = read_meta(out)
    if not meta:
        raise InputError(f"{out}: not a dse search folder (no {STUDY_JSON}); run `dse search "
                         "SPACE.yaml --out DIR` first")
    if not path.exists():
        raise InputError(f"{out}: no {path.name}; run `dse search` (or `dse report {out}`)")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        df = pd.DataFrame()
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
        raise InputError(f"{path}: unreadable ({str(exc).splitlines()[0][:200]}); rerun "
                         f"`dse report {out}`") from None
    console = console or Console()
    if not console.is_terminal:
        console = Console(width=200, file=console.file)
    if df.empty:
        console.print(f"[yellow]{path}: no {'trials' if show_all else 'feasible Pareto trials'}")
        return 0
    objs = _meta_names(meta, "objectives", out)
    dirs = dict(zip(objs, _meta_names(meta, "directions", out)))
    from dse.space import KNOB_ORDER
    knobs = [c for c in KNOB_ORDER if c in df.columns
             and (df[c].nunique() > 1 or c in ("tp", "replicas"))]
    cols = ["trial", *objs, *knobs, "devices_used", "capacity_rps", "attainment", "ttft_ms.p99",
            "tpot_ms.p99"]
    if "p99_ttft" in objs:
        cols.remove("ttft_ms.p99")
    if "p99_tpot" in objs:
        cols.remove("tpot_ms.p99")
    if show_all:
        cols += ["feasible", "reason"]
    cols = [c for c in dict.fromkeys(cols) if c in df.columns]
    title = f"{'All trials' if show_all else 'Pareto front (feasible)'}: {meta.get('study_name', out)}"
    t = Table(title=title)
    for c in cols:
        arrow = {"maximize": " ↑", "minimize": " ↓"}.get(dirs.get(c, ""), "")
        t.add_column(_SHORT.get(c, c) + arrow, justify="right" if c != "reason" else "left")
    for _, row in (df.head(limit) if limit else df).iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if v is None or (isinstance(v, float) and v != v):
                cells.append("-")  # a knob with no effect on this configuration, or no value
            else:
                cells.append(f"{v:.4g}" if isinstance(v, float) and c != "trial" else str(v))
        t.add_row(*cells)
    console.print(t)
    return 0


def _meta_names(meta: dict, key: str, out: Path) -> list[str]:
    """study.json's ``key`` (objectives, directions): a list of names, or InputError."""
    from dse.store import STUDY_JSON

    v = meta.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise InputError(f"{out / STUDY_JSON}: field {key!r} must be a list of names, got "
                         f"{v!r}; rerun the search with --fresh to start over")
    return v


_SHORT = {"throughput_per_device": "tok/s/dev", "goodput_per_device": "good tok/s/dev",
          "p99_ttft": "p99 TTFT ms", "p99_tpot": "p99 TPOT ms", "cost_per_million_tokens":
          "$/Mtok", "energy_per_token": "J/tok", "devices_used": "devices",
          "max_num_seqs": "max seqs", "max_num_batched_tokens": "batch tokens",
          "long_prefill_token_threshold": "long prefill", "enable_prefix_caching": "prefix cache",
          "enable_chunked_prefill": "chunked", "routing_policy": "routing",
          "ttft_ms.p99": "p99 TTFT ms", "tpot_ms.p99": "p99 TPOT ms",
          "capacity_rps": "capacity req/s"}


def cmd_show(a) -> int:
    return _show(Path(a.dir), show_all=a.all)


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on (the UI would die after its start-up)."""
    import socket

    if not 0 < port < 65536:
        raise InputError(f"--port: must be in 1..65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise InputError(f"--port {port}: cannot listen on {host}:{port} "
                             f"({exc.strerror or exc}); choose another --port") from None


def cmd_ui(a) -> int:
    from dse.store import STUDY_JSON, default_tracking_uri, read_meta

    out = Path(a.dir)
    meta = read_meta(out)
    if not meta:
        raise InputError(f"{out}: not a dse search folder (no {STUDY_JSON})")
    from dse.tracking import runs_url

    uri = meta.get("tracking_uri") or default_tracking_uri(out)
    if not str(uri).startswith("sqlite"):
        print(f"This study logs to a tracking server: "
              f"{runs_url(uri, meta.get('experiment_id', '0'))}")
        return 0
    _check_port_free(a.host, a.port)
    cmd = _mlflow_ui_cmd(uri, a.host, a.port)
    url = runs_url(f"http://{a.host}:{a.port}", meta.get("experiment_id", "0"))
    print(f"MLflow UI for {out}: {url}  (starting; it takes ~20 s to come up; Ctrl-C stops it)",
          flush=True)
    # its own process group: the server's workers and job consumers stop with it
    proc = subprocess.Popen(cmd, start_new_session=True)

    def _stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)  # stop the UI with us, not just on Ctrl-C
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop_group(proc)
        return 0


#: seconds the MLflow UI's process group has to stop after SIGTERM before it is killed
UI_STOP_GRACE_S = 10.0


def _mlflow_ui_cmd(uri: str, host: str, port: int) -> list[str]:
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    return [str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "ui", "--backend-store-uri",
            uri, "--host", host, "--port", str(port), "--workers", "1"]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the UI's process group, SIGKILL to what is left after the grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=UI_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
        try:  # the server is gone: its workers and job consumers go with their group
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    a = parser.parse_args(argv)
    try:
        if a.cmd == "search":
            return cmd_search(a)
        if a.cmd == "check":
            return cmd_check(a)
        if a.cmd == "report":
            return cmd_report(a)
        if a.cmd == "show":
            return cmd_show(a)
        if a.cmd == "ui":
            return cmd_ui(a)
    except InputError as exc:
        print(f"dse: error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except OSError as exc:  # a file or folder that cannot be written (or read) now
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"dse: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except MemoryError:
        print(f"dse: error: out of memory running `dse {a.cmd}`: the space or its workload "
              "asks for more than this machine holds", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("dse: interrupted; rerun the same command to resume", file=sys.stderr)
        if argv is None and "ray" in sys.modules:
            _exit_now(130)
        return 130
    return 0


def _exit_now(code: int) -> None:
    """End the command-line process without the interpreter's final clean-up. The study is
    closed by then (journal synced, MLflow run closed, workers shut down), but a Ray
    interrupted in a call of its own can crash in that clean-up: about one Ctrl-C in
    eight during the workers' start-up ended in a segmentation fault (exit 139)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
