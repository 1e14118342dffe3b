"""The study journal's commit records (dse.journal): append-only, so the bytes a search
writes grow linearly with its trials (the whole file was rewritten at every commit
before: 0.84 MB after 121 trials, O(trials^2) bytes); readers take whole commits only; a
commit cut short by a killed driver is ignored by readers and cut off by the next driver;
a damaged record is reported, not repaired; a journal of the earlier format (plain JSON
lines) is read, resumed, and rewritten once in the record format."""

from __future__ import annotations

import hashlib
import os
import shutil

import optuna
import pytest
from dse_testkit import write_space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

import dse.journal
from dse.cli import main
from dse.journal import MAGIC, DriverJournal, JournalReader, encode_record, parse
from dse.store import JOURNAL, open_storage
from sim.errors import InputError


def _log(i: int) -> dict:
    return {"op_code": 0, "worker_id": "w", "n": i, "blob": "x" * 200}


def _ns(logs) -> list[int]:
    return [x["n"] for x in logs]


def _wchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc")
def test_bytes_written_grow_linearly_with_the_commits(tmp_path):
    """Each commit writes what it adds: the last 100 of 400 equal commits write as many
    bytes as the first 100 (a whole-file rewrite writes 7x as many), counted by the
    kernel (the process's write bytes), not by the journal."""
    j = DriverJournal(tmp_path / JOURNAL)
    n, per_block = 0, []
    for _ in range(4):
        w0 = _wchar()
        for _ in range(100):
            j.append_logs([_log(n + k) for k in range(25)])
            n += 25
            j.commit()
        per_block.append(_wchar() - w0)
    size = j.path.stat().st_size
    assert per_block[3] < 1.1 * per_block[0], per_block
    assert sum(per_block) < 1.1 * size  # about the file's size, once
    assert j.bytes_written == size and j.writes == 400
    assert _ns(JournalReader(j.path).read_logs(0)) == list(range(n))


def _three_commits(path) -> DriverJournal:
    j = DriverJournal(path)
    for c in range(3):
        j.append_logs([_log(3 * c + k) for k in range(3)])
        j.commit()
    return j


def test_a_torn_last_record_is_ignored_by_readers_and_cut_by_the_next_driver(tmp_path):
    """Every cut of a fourth record (inside its header, inside its lines): readers see
    the three whole commits; the next driver truncates the tail and appends after it."""
    p = tmp_path / JOURNAL
    _three_commits(p)
    whole = p.read_bytes()
    rec = encode_record([f'{{"op_code":0,"n":{9 + k}}}\n'.encode() for k in range(3)])
    for cut in range(1, len(rec)):
        p.write_bytes(whole + rec[:cut])
        assert _ns(JournalReader(p).read_logs(0)) == list(range(9)), cut
        assert p.stat().st_size == len(whole) + cut  # a reader leaves it as it is
        j = DriverJournal(p)
        assert _ns(j.read_logs(0)) == list(range(9)), cut
        assert p.read_bytes() == whole  # the driver cut it off
        j.append_logs([_log(9)])
        j.commit()
        assert _ns(JournalReader(p).read_logs(0)) == list(range(10)), cut


def test_a_reader_kept_open_skips_a_record_being_written(tmp_path):
    """A reader that polls while a record is half written takes it once it is whole."""
    p = tmp_path / JOURNAL
    _three_commits(p)
    r = JournalReader(p)
    assert len(r.read_logs(0)) == 9
    rec = encode_record([b'{"op_code":0,"n":9}\n', b'{"op_code":0,"n":10}\n'])
    with open(p, "ab") as f:
        f.write(rec[:len(rec) // 2])
        f.flush()
        assert _ns(r.read_logs(0)) == list(range(9))
        f.write(rec[len(rec) // 2:])
        f.flush()
    assert _ns(r.read_logs(7)) == [7, 8, 9, 10]


@pytest.mark.parametrize("damage", [
    lambda b: b + b"garbage\xff\n",  # not a record after the last one
    lambda b: b.replace(b'"n":4', b'"n":5'),  # a flipped byte inside a commit
    lambda b: b.replace(b"\n@", b"\n#", 2),  # a header overwritten
    lambda b: b"x" + b[1:],  # the first line overwritten
    lambda b: b + b"@" + b"9" * 60,  # a header far too long
    # the second commit's length damaged to reach past the end: not a torn tail (the
    # commits after it would have been cut off)
    lambda b: b[:b.index(b"\n@", len(MAGIC)) + 2] + b"9"
    + b[b.index(b"\n@", len(MAGIC)) + 2:],
])
def test_a_damaged_record_is_reported_and_left_as_it_is(tmp_path, damage):
    p = tmp_path / JOURNAL
    _three_commits(p)
    p.write_bytes(damage(p.read_bytes()))
    before = hashlib.sha256(p.read_bytes()).hexdigest()
    for read in (lambda: JournalReader(p).read_logs(0), lambda: DriverJournal(p),
                 lambda: open_storage(tmp_path)):
        with pytest.raises(InputError, match="study.journal: the study journal is corrupt"):
            read()
    assert hashlib.sha256(p.read_bytes()).hexdigest() == before


def test_a_failed_append_leaves_no_part_of_a_commit(tmp_path, monkeypatch):
    """A write that fails half-way (disk full) is cut back, so the commits after it
    still follow the last whole one."""
    p = tmp_path / JOURNAL
    j = _three_commits(p)
    whole = p.read_bytes()
    real = os.write

    def half_then_full(fd, data):
        real(fd, bytes(data[:len(data) // 2]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dse.journal.os, "write", half_then_full)
    j.append_logs([_log(9)])
    with pytest.raises(OSError):
        j.commit()
    assert p.read_bytes() == whole
    monkeypatch.setattr(dse.journal.os, "write", real)
    j.append_logs([_log(10)])
    j.commit()
    assert _ns(JournalReader(p).read_logs(0)) == list(range(11))


def test_an_old_format_journal_is_read_and_rewritten_once(tmp_path):
    p = tmp_path / JOURNAL
    p.write_bytes(b"".join(b'{"op_code":0,"n":%d}\n' % i for i in range(5)) + b'{"op_co')
    assert _ns(JournalReader(p).read_logs(0)) == list(range(5))  # torn last line dropped
    j = DriverJournal(p)
    assert _ns(j.read_logs(2)) == [2, 3, 4]
    j.append_logs([_log(5)])
    j.commit()
    data = p.read_bytes()
    assert data.startswith(MAGIC) and parse(data, p)[1] == len(data)
    j.append_logs([_log(6)])
    j.commit()
    assert _ns(JournalReader(p).read_logs(0)) == list(range(7))
    assert _ns(DriverJournal(p).read_logs(0)) == list(range(7))


def _trials(out):
    return optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()


def test_a_study_written_in_the_old_format_resumes(tmp_path, capsys):
    """A study whose journal is plain JSON lines (what the previous version wrote) is
    reported and resumed: its trials are kept, the search goes on to the new budget, and
    the journal is in the record format afterwards."""
    space = write_space(tmp_path, search={"sampler": "grid", "n_trials": 2, "seed": 0})
    out = tmp_path / "out"
    args = ["search", str(space), "--out", str(out), "--workers", "0", "--no-progress"]
    assert main(args) == 0
    new = _trials(out)
    lines, _, v2 = parse((out / JOURNAL).read_bytes(), out / JOURNAL)
    assert v2
    (out / JOURNAL).write_bytes(b"".join(lines))  # as the previous version wrote it
    old = _trials(out)
    assert [(t.number, t.state, t.params) for t in old] == \
        [(t.number, t.state, t.params) for t in new]
    assert main(["report", str(out)]) == 0
    shutil.rmtree(out / "best")
    assert main([*args, "--n-trials", "4"]) == 0, capsys.readouterr().err
    after = _trials(out)
    done = [t for t in old if t.state.is_finished()]
    assert done and [(t.number, t.state, t.params) for t in done] == \
        [(t.number, t.state, t.params) for t in (after[t.number] for t in done)]
    assert sum(t.state == TrialState.COMPLETE for t in after) >= 4
    assert (out / JOURNAL).read_bytes().startswith(MAGIC)


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(how=st.sampled_from(["cut", "flip", "append"]), at=st.integers(0, 10**6),
       junk=st.binary(min_size=1, max_size=40), flip=st.integers(1, 255))
def test_fuzz_damaged_journal_reads_whole_commits_or_says_corrupt(tmp_path, how, at, junk,
                                                                 flip):
    """Any damage: the readers return whole commits, or raise the one-line InputError,
    nothing else; a cut (what kill -9 leaves) always reads as the commits before it."""
    p = tmp_path / JOURNAL
    p.unlink(missing_ok=True)
    j, ends = DriverJournal(p), []
    for c in range(3):
        j.append_logs([_log(3 * c + k) for k in range(3)])
        j.commit()
        ends.append(p.stat().st_size)
    whole = p.read_bytes()
    at %= len(whole)
    data = {"cut": whole[:max(at, len(MAGIC))],
            "flip": whole[:at] + bytes([whole[at] ^ flip]) + whole[at + 1:],
            "append": whole + junk}[how]
    for read in (lambda: JournalReader(p).read_logs(0), lambda: DriverJournal(p).read_logs(0)):
        p.write_bytes(data)
        try:
            ns = _ns(read())
        except InputError as exc:
            assert "\n" not in str(exc) and "the study journal is corrupt" in str(exc)
            assert how != "cut"
            continue
        assert ns == list(range(len(ns))) and len(ns) % 3 == 0  # whole commits only
        if how == "flip" and at >= len(MAGIC):  # no commit before the damage lost
            assert len(ns) >= 3 * sum(e <= at for e in ends)
        if how == "cut":
            assert len(ns) == 3 * sum(e <= len(data) for e in ends)
