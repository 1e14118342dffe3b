"""The study folder: its file names, the Optuna journal, the MLflow store and the lock.

One module owns the layout of ``dse search --out DIR`` so that the driver, the report and
the CLI read the same names without importing each other:

- ``study.journal``  Optuna's journal log, one record per commit of the driver (the
  study itself, resumable; format in :mod:`dse.journal`)
- ``study.json``     what was searched, with which seed, tracking URI and versions
- ``space.yaml``     a copy of the search space as it was when the study started
- ``mlflow.db`` + ``mlartifacts/``  the default MLflow store
- ``mlflow-pending/`` trials told to Optuna whose MLflow run the driver's writer thread
  has not written yet (empty after a search that ended; replayed by the next run after a
  killed one)
- ``.dse.lock``      held (``flock``) by the one driver writing the folder; it names that
  driver (pid, host, start time) so a second search can say who holds it. The kernel drops
  the lock when its holder dies, so a lock left by a killed driver is simply taken over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from dse.journal import DriverJournal, JournalReader, corrupt
from sim.errors import InputError
from sim.paths import writable_dir

JOURNAL = "study.journal"
STUDY_JSON = "study.json"
SPACE_COPY = "space.yaml"
MLFLOW_DB = "mlflow.db"
ARTIFACTS = "mlartifacts"
LOCK = ".dse.lock"
#: trials told to Optuna whose MLflow run is not written yet (see dse.tracking.TrackingWriter)
SPOOL = "mlflow-pending"
#: what ``--fresh`` deletes (never the lock: it is held while deleting)
STUDY_FILES = (JOURNAL, JOURNAL + ".tmp", STUDY_JSON, SPACE_COPY, MLFLOW_DB, ARTIFACTS, SPOOL,
               "trials.csv", "pareto.csv", "report.html", "best")
#: tracking-URI schemes MLflow 2/3 can open
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql",
                    "databricks")


# ---------------------------------------------------------------- the folder
def check_out_dir(out: Path, flag: str = "--out") -> Path:
    """Create the output folder (or refuse, naming why) before anything else runs."""
    return writable_dir(out, flag, " for the study")


#: names a study writes that a folder of the user's may hold files of (a study of ours
#: is known by its study.json or journal)
_USER_NAMES = (SPACE_COPY, MLFLOW_DB, ARTIFACTS, "trials.csv", "pareto.csv", "report.html",
               "best")


def check_not_foreign(out: Path, space_file: Path | None = None, flag: str = "--out") -> None:
    """Refuse a folder that holds no study but has files a study would overwrite (or
    --fresh delete): they are the user's (``space_file`` itself, the search's own space
    kept there as space.yaml, is not copied over)."""
    if (out / STUDY_JSON).exists() or (out / JOURNAL).exists():
        return
    own = space_file is not None and (out / SPACE_COPY).resolve() == Path(space_file).resolve()
    clash = [n for n in _USER_NAMES if (out / n).exists() and not (own and n == SPACE_COPY)]
    if clash:
        raise InputError(f"{flag} {str(out)!r} holds no dse study but has {', '.join(clash)}, "
                         "which a study writes: choose a new or empty folder, or move them")


def read_meta(out: Path) -> dict:
    """``study.json`` of a folder ({} when there is none), or InputError when unreadable."""
    p = out / STUDY_JSON
    if not p.exists():
        return {}
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = str(exc) or "nested too deeply"
        raise InputError(f"{p}: not a readable study file ({why}); rerun the search with "
                         "--fresh to start over") from None
    if not isinstance(meta, dict):
        raise InputError(f"{p}: not a study file (a JSON object is expected); rerun the "
                         "search with --fresh to start over")
    return meta


def save_meta(out: Path, meta: dict) -> None:
    tmp = out / (STUDY_JSON + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    tmp.replace(out / STUDY_JSON)


# ---------------------------------------------------------------- the lock
class StudyLock:
    """An exclusive lock on a study folder for the lifetime of one driver."""

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK
        self._fd: int | None = None

    def acquire(self) -> StudyLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise InputError(f"{self.path.parent}: another search is writing this folder "
                             f"({holder}); wait for it, stop it, or choose another --out") \
                from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StudyLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return (f"pid {info.get('pid')} on {info.get('host')}, started "
                f"{info.get('started')} UTC")
    except (OSError, ValueError):
        return "holder unknown"


# ---------------------------------------------------------------- storage
def open_storage(out: Path, backend=None):
    """The Optuna journal storage of a study folder (over ``backend``, e.g. the driver's
    :func:`driver_journal`; by default a read-only :class:`dse.journal.JournalReader`,
    which takes only whole commits, for readers such as ``dse report``)."""
    from optuna.storages import JournalStorage

    if backend is None:
        backend = JournalReader(out / JOURNAL)
    try:  # the journal is replayed here: a corrupt one fails now
        return JournalStorage(backend)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise corrupt(out / JOURNAL, f"{type(exc).__name__}: "
                      f"{' '.join(str(exc).split())[:160]}") from None


def check_study_there(storage, out: Path, name: str) -> None:
    """A folder whose ``study.json`` records a study (written only after the journal's
    first commit) but whose journal does not hold it lost its journal (emptied, replaced):
    refuse to start a new study over the old one's MLflow runs and files."""
    if any(s.study_name == name for s in storage.get_all_studies()):
        return
    raise InputError(f"{out / JOURNAL}: holds no study named {name!r}, but {out / STUDY_JSON} "
                     "records one: the journal was emptied or replaced; restore it, or rerun "
                     "with --fresh (which deletes the study)")


def driver_journal(out: Path) -> DriverJournal:
    """The driver's journal backend (see :class:`dse.journal.DriverJournal`)."""
    return DriverJournal(out / JOURNAL)


def default_tracking_uri(out: Path) -> str:
    return f"sqlite:///{out.resolve() / MLFLOW_DB}"


def check_tracking_uri(uri: str, flag: str = "--tracking-uri") -> str:
    """Refuse a URI whose scheme MLflow cannot open, before anything runs."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ("file" if uri else "")
    if scheme.split("+", 1)[0] not in TRACKING_SCHEMES:
        raise InputError(f"{flag} {uri!r}: unknown scheme {scheme!r}; allowed: "
                         + ", ".join(f"{s}://" for s in TRACKING_SCHEMES))
    return uri


def open_tracker(uri: str, out: Path, experiment: str, flag: str = "--tracking-uri"):
    """Connect to the MLflow store (a server gets a short timeout and few retries), or
    InputError naming the URI."""
    from dse.tracking import Tracker

    check_tracking_uri(uri, flag)
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    try:
        seed_sqlite_store(uri)
        return Tracker(uri, out, experiment)
    except Exception as exc:  # noqa: BLE001 - MlflowException, connection errors, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{flag} {uri!r}: cannot open the MLflow store ({first[:300]})") \
            from None


def seed_sqlite_store(uri: str) -> bool:
    """A new SQLite MLflow store starts as a copy of an empty one made once per MLflow
    version in the user's cache folder (``sim.cache.cache_dir``): MLflow creates its tables
    by running each of its ~50 schema migrations, 1.5 s of CPU and a few seconds of disk
    syncs, which a search's driver would otherwise pay at every fresh start. True if the
    store was seeded; False (MLflow creates it as usual) when the URI is not a SQLite file
    that is still missing, or the cache is off or cannot be written."""
    import shutil
    from importlib.metadata import version

    from sim.cache import cache_dir

    if not uri.startswith("sqlite:///"):
        return False
    target = Path(uri[len("sqlite:///"):])
    cache = cache_dir()
    if target.exists() or cache is None or not target.parent.is_dir():
        return False
    template = cache / f"mlflow-{version('mlflow')}-empty.db"
    try:
        if not template.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cache / f"{template.name}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            from mlflow.tracking import MlflowClient

            MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()
            os.replace(tmp, template)
        copy = target.with_name(target.name + ".seed")
        shutil.copyfile(template, copy)
        os.replace(copy, target)
    except (OSError, ImportError):
        return False
    return True
