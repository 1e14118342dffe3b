"""The study journal's file format: Optuna's journal log lines, grouped into commits.

A journal written by this version starts with the line :data:`MAGIC`; after it, each
commit of the driver is one *record*::

    @<length> <crc32>\\n<length bytes: one or more JSON log lines, each newline-terminated>

written with a single ``write`` at the end of the file (append-only: a commit costs what
it adds, not the size of the study). A reader takes a record only when all its bytes are
there and their CRC-32 matches, so it never sees part of a commit, even while the driver
is appending one; a record cut short at the end of the file (a driver killed in the
middle of a write) is ignored by readers and truncated by the next driver.

A file that does not start with :data:`MAGIC` is the earlier format (Optuna's
``JournalFileBackend``: one JSON log line each, the whole file replaced at each commit);
it is read as such (a torn last line is ignored), and the first commit of a driver of
this version rewrites it once in the record format.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import zlib
from pathlib import Path

from sim.errors import InputError

#: the first line of a journal in the record format
MAGIC = b"#dse-journal v2: records of '@<bytes> <crc32>' + JSON log lines\n"
_HEADER_MAX = 40  # '@' + 20 digits + ' ' + 8 hex digits + '\n' fits well inside


def corrupt(path: Path, why: str) -> InputError:
    return InputError(f"{path}: the study journal is corrupt ({why}); move the folder "
                      "away, or rerun with --fresh (which deletes the study)")


def encode_record(lines: list[bytes]) -> bytes:
    """One commit: the header and the log lines."""
    payload = b"".join(lines)
    return b"@%d %08x\n" % (len(payload), zlib.crc32(payload)) + payload


def parse(data: bytes, path: Path) -> tuple[list[bytes], int, bool]:
    """The log lines of the complete commits of a whole journal file, the offset where
    they end, and whether the file is in the record format. A cut-short last record (or
    last line, in the earlier format) is left out; a record that is damaged otherwise
    raises :func:`corrupt`."""
    if not data.startswith(MAGIC):
        return _parse_lines(data) + (False,)
    lines, used = parse_records(data[len(MAGIC):], path, len(MAGIC))
    return lines, len(MAGIC) + used, True


def parse_records(data: bytes, path: Path, base: int) -> tuple[list[bytes], int]:
    """The log lines of the whole records at the start of ``data`` (which begins at the
    file's offset ``base``, on a record boundary) and the bytes they take."""
    lines: list[bytes] = []
    pos = 0
    while pos < len(data):
        rec = _record_at(data, pos, path, base)
        if rec is None:  # cut short: the last write of a killed driver
            break
        payload, pos = rec
        lines.extend(payload.splitlines(keepends=True))
    return lines, pos


_HEADER_PREFIX = re.compile(rb"@[0-9]*( [0-9a-f]*)?")


def _record_at(data: bytes, pos: int, path: Path, base: int) -> tuple[bytes, int] | None:
    """The payload of the record at ``pos`` and the offset after it; None if the data
    ends inside it (a prefix of a record); :func:`corrupt` if it is not one."""
    where = f"byte {base + pos}"
    nl = data.find(b"\n", pos, pos + _HEADER_MAX)
    if nl < 0:
        if len(data) - pos < _HEADER_MAX and _HEADER_PREFIX.fullmatch(data, pos):
            return None
        raise corrupt(path, f"{where}: not a commit record")
    head = _HEADER.fullmatch(data, pos, nl)
    if head is None:
        raise corrupt(path, f"{where}: not a commit record")
    length, crc = int(head[1]), int(head[2], 16)
    end = nl + 1 + length
    if end > len(data):
        # a write cut short is the last thing in the file; log lines start with "{", so a
        # header after this one means this header's length is damaged, not the tail torn
        if data.find(b"\n@", nl + 1) >= 0:
            raise corrupt(path, f"{where}: a commit of {length} bytes runs past another "
                          "commit")
        return None
    payload = data[nl + 1:end]
    if zlib.crc32(payload) != crc or not payload.endswith(b"\n"):
        raise corrupt(path, f"{where}: a commit of {length} bytes whose checksum does not "
                      "match")
    return payload, end


_HEADER = re.compile(rb"@([0-9]{1,20}) ([0-9a-f]{8})")


def _parse_lines(data: bytes) -> tuple[list[bytes], int]:
    """The earlier format: JSON lines; a last line without its newline is dropped (the
    lines are parsed when they are read)."""
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(keepends=True), end


def _loads(lines: list[bytes], path: Path) -> list[dict]:
    out = []
    for line in lines:
        try:
            log = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise corrupt(path, f"a log line that is not JSON ({type(exc).__name__})") \
                from None
        if not isinstance(log, dict) or "op_code" not in log:
            raise corrupt(path, "a log line that is not an Optuna journal operation")
        out.append(log)
    return out


class JournalReader:
    """A read-only Optuna journal backend over a study journal in either format, for
    ``dse report`` / ``dse show`` and any reader beside a running driver: it reads only
    whole commits, and on each call only the bytes added since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lines: list[bytes] = []
        self._end = 0  # the offset where the complete commits read so far end
        self._ino: int | None = None
        self._v2 = False

    def read_logs(self, log_number_from: int) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self._v2 and st.st_ino == self._ino and st.st_size >= self._end:
                    f.seek(self._end)  # appended to since the last call
                    lines, used = parse_records(f.read(), self.path, self._end)
                    self._lines += lines
                    self._end += used
                else:  # new, replaced (an earlier-format file rewritten), or cut
                    self._lines, self._end, self._v2 = parse(f.read(), self.path)
                    self._ino = st.st_ino
        except FileNotFoundError:
            self._lines, self._end, self._v2 = [], 0, False
            return []
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read the study journal "
                             f"({exc.strerror or exc})") from None
        return _loads(self._lines[log_number_from:], self.path)

    def append_logs(self, logs: list[dict]) -> None:
        raise InputError(f"{self.path}: the study journal is read-only here; only `dse "
                         "search` writes it")


class DriverJournal:
    """The driver's Optuna journal, kept in memory and appended to the file at the points
    the driver chooses (:meth:`commit`: once a round of its loop, after it has told the
    trials that came back and asked and submitted the next ones: about one write per
    trial, instead of a locked append for each of the ~25 log lines of a trial). Each
    commit is one record (see the module's doc) written with one ``write`` at the end of
    the file, so a commit costs what it adds and a reader never takes part of one; a
    driver killed between two commits loses only what it did since the last one: trials
    asked but not yet written there are drawn again, a trial whose result came back but
    was not yet committed is re-run (re-enqueued from the journal if its parameters were
    written, drawn anew otherwise). :meth:`sync` also forces the file to disk (fsync);
    the MLflow writer calls it before logging a trial, so MLflow is never ahead of the
    study on disk, even after a power loss.

    Readers in other processes use :class:`JournalReader`. The single-writer rule is the
    study lock's (``dse.store.StudyLock``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lines: list[bytes] = []  # every log line, serialised, newline-terminated
        self._written = 0  # lines in the file on disk
        self._size = 0  # bytes of whole commits in the file
        self._v2 = False  # the file is in the record format (else rewritten at 1st commit)
        self._created = False  # the file was created or replaced since the last fsync
        self._lock = threading.Lock()  # the lines, and writing the file
        self._sync_lock = threading.Lock()
        self._synced = 0  # the write (count) that the last fsync made durable
        self.write_s = 0.0  # time spent writing the file, reported by the driver
        self.sync_s = 0.0
        self.writes = 0  # commits written (those that had something new)
        self.syncs = 0
        self.bytes_written = 0  # bytes written to the journal by this object
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read the study journal "
                             f"({exc.strerror or exc})") from None
        lines, end, self._v2 = parse(data, self.path)
        if not self._v2:  # the earlier format has no checksum: every line must parse
            _loads(lines, self.path)
        if self._v2 and end < len(data):  # a torn last commit: cut it off
            with open(self.path, "r+b") as f:
                f.truncate(end)
        self._lines, self._written, self._size = lines, len(lines), end

    # Optuna's BaseJournalBackend interface (duck-typed: its ABC is not needed)
    def read_logs(self, log_number_from: int):
        with self._lock:
            lines = self._lines[log_number_from:]
        return [json.loads(line) for line in lines]

    def append_logs(self, logs: list[dict]) -> None:
        # serialised now, as the file backend does: what Optuna reads back is a copy,
        # never the caller's objects
        data = [(json.dumps(x, separators=(",", ":")) + "\n").encode("utf-8") for x in logs]
        with self._lock:
            self._lines.extend(data)

    @property
    def pending(self) -> int:
        """Log lines not yet in the file."""
        return len(self._lines) - self._written

    def commit(self) -> bool:
        """Append what was added since the last write as one commit record; True if it
        wrote."""
        with self._lock:
            return self._write()

    def sync(self) -> None:
        """:meth:`commit`, then force the file (and, when it was just created, its folder
        entry) to disk. The fsyncs run outside the lock that appends take, so the driver
        does not wait on the disk (the MLflow writer thread calls this)."""
        with self._sync_lock:
            with self._lock:
                self._write()
                written, created, self._created = self.writes, self._created, False
            if written == self._synced:
                return
            t0 = time.perf_counter()
            for target in (self.path, self.path.parent) if created else (self.path,):
                fd = os.open(target, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            self._synced = written
            self.syncs += 1
            self.sync_s += time.perf_counter() - t0

    def _write(self) -> bool:
        if self._written == len(self._lines) and self.path.exists():
            return False
        t0 = time.perf_counter()
        if self._v2 and self.path.exists():
            self._append(encode_record(self._lines[self._written:]))
        else:  # a new file, or one in the earlier format: written whole, once
            self._replace(MAGIC + (encode_record(self._lines) if self._lines else b""))
        self._written = len(self._lines)
        self.writes += 1
        self.write_s += time.perf_counter() - t0
        return True

    def _append(self, record: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(record)
            while view:
                n = os.write(fd, view)
                self.bytes_written += n
                view = view[n:]
        except BaseException:
            os.ftruncate(fd, self._size)  # never leave a part of a commit behind
            raise
        finally:
            os.close(fd)
        self._size += len(record)

    def _replace(self, data: bytes) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self.path)
        self.bytes_written += len(data)
        self._size, self._v2, self._created = len(data), True, True
