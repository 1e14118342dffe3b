"""Malformed input to ``dse`` beyond tests/dse/test_dse_bad_input.py: a space YAML with a
key given twice or an integer of thousands of digits, a space none of whose configurations
can run, and damaged study folders under ``dse report`` / ``dse show`` / ``dse search``
(resume). Each case exits 2 with one line naming the file and what is wrong, never a
traceback; a damaged journal is left as it was. Hypothesis mangles the text of a valid
space (truncation, garbage bytes, tabs, a line repeated) and asserts exit 0 or 2.
Every table row was a traceback or a silent default before its fix."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil

import pytest
import yaml
from dse_testkit import BASE_SPACE, assert_one_line, write_space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dse.report
import dse.study
from dse.cli import main
from sim.errors import InputError

_TEXT = yaml.safe_dump(BASE_SPACE, sort_keys=False)


class _NoDriver:
    def __init__(self, *a, **k):
        raise AssertionError("the search started: the input was not checked first")


def _knobs(**kw):
    return {**BASE_SPACE, "knobs": kw}


def _gen(**kw):
    gen = {**BASE_SPACE["workload"]["generate"], **kw}
    return {**BASE_SPACE, "workload": {"generate": gen}}


@pytest.mark.parametrize("line,needles", [
    ('{"input_toks": 2, "output_toks": 1, "input_tok_ids": [1, 999999999]}',
     ["workload.file", "token id 999999999", "vocab_size=128256"]),
    ('{"input_toks": 2, "output_toks": 1, "arrival_time_ns": 100000000000000000}',
     ["workload.file", "request 0 starts 1e+08 s", "at most 10,000,000"]),
])
def test_space_file_workload_refused(tmp_path, line, needles, capsys, monkeypatch):
    """A trace the model cannot replay is refused when the space is read, not by every
    trial: ids past the vocabulary, an arrival a time series cannot hold."""
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    (tmp_path / "w.jsonl").write_text(line + "\n")
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({**BASE_SPACE, "workload": {"file": "w.jsonl"}}))
    assert_one_line(capsys, main(["check", str(p)]), [str(p), *needles])


def test_space_workload_file_name_longer_than_a_file_name(tmp_path, capsys, monkeypatch):
    """A workload.file of 300 characters was "dse: error: .../AAA...: File name too long",
    naming neither the space file nor the field."""
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({**BASE_SPACE, "workload": {"file": "A" * 300}}))
    line = assert_one_line(capsys, main(["check", str(p)]),
                           [str(p), "workload.file: no such file"])
    assert "File name too long" not in line


# (id, the space file's text, needles)
SPACE_CASES = [
    ("top-level-key-twice", _TEXT + "name: other\n", ["'name' appears twice", "lines 1 and"]),
    ("knob-twice", _TEXT.replace("knobs:\n", "knobs:\n  tp: [8]\n"), ["'tp' appears twice"]),
    ("flow-mapping-key-twice", _TEXT.replace("slo:\n", "x: {a: 1, a: 2}\nslo:\n"),
     ["'a' appears twice"]),
    ("int-of-5000-digits", _TEXT.replace("n_trials: 18", "n_trials: " + "9" * 5000),
     ["out of range", "4300"]),
    ("no-tp-divides-the-heads", yaml.safe_dump(_knobs(tp=[3, 5], replicas=[1])),
     ["knobs.tp", "no value divides num_attention_heads=32", "1, 2, 4, 8, 16, 32"]),
    ("smallest-configuration-over-budget", yaml.safe_dump(_knobs(tp=[4], replicas=[2, 4])),
     ["knobs", "tp=4", "replicas=2", "needs 8 devices", "budget.total_devices (4)"]),
    # a rate that spreads the requests over centuries (1e-300: an OverflowError traceback
    # in every trial; 1e-6: a time series of 60 million rows)
    ("generate-rate-1e-300", yaml.safe_dump(_gen(rate=1e-300)),
     ["field 'rate' 1e-300", "num_requests / rate <= 10,000,000 s", "rate >= 6e-06"]),
    ("generate-rate-1e-6", yaml.safe_dump(_gen(rate=1e-6)), ["field 'rate' 1e-06"]),
    # a budget of 10**12 devices ran out of memory building each configuration's cluster
    ("budget-of-a-million-devices", yaml.safe_dump({**BASE_SPACE, "budget": {
        "total_devices": 10**6, "devices_per_node": 8}}),
     ["budget.total_devices: must be <= 65536, got 1000000"]),
    ("devices-per-node-10e12", yaml.safe_dump({**BASE_SPACE, "budget": {
        "total_devices": 8, "devices_per_node": 10**12}}),
     ["budget.devices_per_node: must be <= 65536"]),
    # Optuna's samplers take a numpy RandomState seed: 10**12 was a ValueError traceback
    ("search-seed-past-2-32", yaml.safe_dump(
        {**BASE_SPACE, "search": {**BASE_SPACE["search"], "seed": 10**12}}),
     ["search.seed: must be <= 4294967295, got 1000000000000"]),
    # no silent default length: `input: {}` gave 128 tokens, an absent input 512
    ("generate-input-empty-mapping", yaml.safe_dump(_gen(input={})),
     ["input: a fixed length needs 'value'"]),
    ("generate-uniform-without-high", yaml.safe_dump(_gen(input={"kind": "uniform", "low": 8})),
     ["input: a uniform length needs 'high'"]),
    ("generate-zipf-without-bounds", yaml.safe_dump(_gen(output={"kind": "zipf"})),
     ["output: a zipf length needs 'low' and 'high'"]),
    ("generate-uniform-high-10e12", yaml.safe_dump(_gen(input={"kind": "uniform", "low": 1,
                                                               "high": 10**12})),
     ["input", "'high' must be <= 2147483647", "1000000000000"]),
    ("generate-fixed-10e12", yaml.safe_dump(_gen(output=10**12)),
     ["output", "'value' must be <= 2147483647"]),
    # an objective's name a list or mapping: TypeError (unhashable) traceback
    ("objective-name-a-list", yaml.safe_dump({**BASE_SPACE, "objectives": [
        {"name": ["p99_ttft"]}]}), ["objectives[0]", "unknown objective", "['p99_ttft']",
                                    "throughput_per_device"]),
    ("objective-name-a-mapping", yaml.safe_dump({**BASE_SPACE, "objectives": [
        {"name": {"a": 1}}]}), ["objectives[0]", "unknown objective"]),
    # a direction that is false, empty or 0 took the objective's default
    ("objective-direction-false", yaml.safe_dump({**BASE_SPACE, "objectives": [
        {"name": "p99_ttft", "direction": False}]}),
     ["objectives[0].direction", "False", "minimize, maximize"]),
    ("objective-direction-empty", yaml.safe_dump({**BASE_SPACE, "objectives": [
        {"name": "p99_ttft", "direction": ""}]}),
     ["objectives[0].direction", "minimize, maximize"]),
    # knobs given as [], false or "" searched nothing (taken as no knobs)
    ("knobs-an-empty-list", yaml.safe_dump({**BASE_SPACE, "knobs": []}),
     ["knobs: must be a mapping of knob -> domain", "max_num_seqs"]),
    ("knobs-false", yaml.safe_dump({**BASE_SPACE, "knobs": False}),
     ["knobs: must be a mapping of knob -> domain"]),
    ("knobs-empty-string", yaml.safe_dump({**BASE_SPACE, "knobs": ""}),
     ["knobs: must be a mapping of knob -> domain"]),
]


@pytest.mark.parametrize("text,needles", [c[1:] for c in SPACE_CASES],
                         ids=[c[0] for c in SPACE_CASES])
def test_space_refused_by_check_and_search(tmp_path, text, needles, capsys, monkeypatch):
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    p = tmp_path / "space.yaml"
    p.write_text(text)
    assert_one_line(capsys, main(["check", str(p)]), [str(p), *needles])
    assert_one_line(capsys, main(["search", str(p), "--out", str(tmp_path / "o")]),
                    [str(p), *needles])


def test_search_seed_flag_past_2_32(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    p = tmp_path / "space.yaml"
    p.write_text(_TEXT)
    rc = main(["search", str(p), "--out", str(tmp_path / "o"), "--seed", str(2**32)])
    assert_one_line(capsys, rc, ["--seed: must be <= 4294967295, got 4294967296"])


def test_merge_keys_may_still_override(tmp_path, capsys):
    """A YAML merge key's values may be overridden (what merge keys are for): not a
    duplicate."""
    text = _TEXT.replace("search:\n", "search:\n  <<: {seed: 3}\n")
    p = tmp_path / "space.yaml"
    p.write_text(text)
    assert main(["check", str(p)]) == 0, capsys.readouterr().err


# ------------------------------------------------------------- damaged study folders
@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A finished two-trial study, run in this process."""
    d = tmp_path_factory.mktemp("study")
    space = write_space(d, search={"sampler": "grid", "n_trials": 2, "seed": 0})
    out = d / "out"
    assert main(["search", str(space), "--out", str(out), "--workers", "0",
                 "--no-progress"]) == 0
    return space, out


def _w(name, data):
    def m(out):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        if data == "DIR":
            p.mkdir()
        elif data is not None:
            p.write_bytes(data)
    return m


# (id, damage, needles of `dse report`'s line)
FOLDER_CASES = [
    ("study-json-nested-too-deeply", _w("study.json", b"[" * 100000),
     ["study.json", "not a readable study file"]),
    ("study-json-not-utf8", _w("study.json", b"\xff"), ["study.json", "not a readable"]),
    ("study-json-a-list", _w("study.json", b"[1]"), ["study.json", "a JSON object"]),
    ("study-json-truncated", _w("study.json", b'{"study_name": '), ["study.json"]),
    ("study-json-a-folder", _w("study.json", "DIR"), ["study.json", "Is a directory"]),
    ("study-json-without-name", _w("study.json", b'{"space_path": "x"}'),
     ["study.json", "no study_name"]),
    ("space-copy-not-yaml", _w("space.yaml", b"a: [\n"), ["space.yaml", "YAML syntax error"]),
    ("space-copy-not-utf8", _w("space.yaml", b"\xff"), ["space.yaml", "not UTF-8"]),
    ("space-copy-a-folder", _w("space.yaml", "DIR"), ["space.yaml", "Is a directory"]),
    ("journal-corrupt", _w("study.journal", b"garbage\xff\n"),
     ["study.journal", "corrupt", "--fresh"]),
    ("journal-missing", _w("study.journal", None), ["study.journal", "no study named 't'"]),
    ("journal-a-folder", _w("study.journal", "DIR"),
     ["study.journal", "cannot read the study journal", "Is a directory"]),
    ("journal-torn-record", lambda out: (out / "study.journal").open("ab").write(b"@99 00"),
     None),  # a commit cut short is left out: the report is made
    ("report-html-a-folder", _w("report.html", "DIR"), ["report.html", "Is a directory"]),
    ("best-a-file", _w("best", b"x"), ["best", "File exists"]),
]


@pytest.mark.parametrize("damage,needles", [c[1:] for c in FOLDER_CASES],
                         ids=[c[0] for c in FOLDER_CASES])
def test_report_on_a_damaged_folder(study, tmp_path, damage, needles, capsys):
    _, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    damage(copy_)
    if needles is None:
        assert main(["report", str(copy_)]) == 0, capsys.readouterr().err
        return
    assert_one_line(capsys, main(["report", str(copy_)]), needles)


def test_show_on_a_damaged_study_json(study, tmp_path, capsys):
    _, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    (copy_ / "study.json").write_bytes(b"[" * 100000)
    assert_one_line(capsys, main(["show", str(copy_)]), ["study.json", "not a readable"])


@pytest.mark.parametrize("field,value", [("objectives", None), ("objectives", True),
                                         ("directions", 5), ("directions", [["maximize"]]),
                                         ("objectives", [{"a": 1}, "p99_ttft"])])
def test_show_on_a_study_json_with_broken_names(study, tmp_path, capsys, field, value):
    """study.json's objectives or directions not a list of names: a TypeError traceback
    ('NoneType' object is not iterable, unhashable type: 'list')."""
    _, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    meta = json.loads((copy_ / "study.json").read_text())
    (copy_ / "study.json").write_text(json.dumps({**meta, field: value}))
    assert_one_line(capsys, main(["show", str(copy_)]),
                    [str(copy_ / "study.json"), f"'{field}' must be a list of names"])


def test_search_resume_on_a_corrupt_journal_exits_2_and_keeps_it(study, tmp_path, capsys):
    space, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    with (copy_ / "study.journal").open("ab") as fh:
        fh.write(b"garbage\xff\n")
    before = hashlib.sha256((copy_ / "study.journal").read_bytes()).hexdigest()
    rc = main(["search", str(space), "--out", str(copy_), "--workers", "0", "--no-progress"])
    assert_one_line(capsys, rc, ["study.journal", "corrupt", "--fresh"])
    assert hashlib.sha256((copy_ / "study.journal").read_bytes()).hexdigest() == before


@pytest.mark.parametrize("journal", [b"", b"#dse-journal"], ids=["emptied", "magic-prefix"])
def test_search_resume_on_a_lost_journal_exits_2_and_keeps_the_folder(study, tmp_path,
                                                                      journal, capsys):
    """study.json records a study (it is written after the journal's first commit) but the
    journal holds none: a new study was started silently over the old one's MLflow runs."""
    space, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    (copy_ / "study.journal").write_bytes(journal)
    def state():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else
                sorted(x.name for x in p.iterdir()) for p in copy_.iterdir()
                if p.name != ".dse.lock"}

    before = state()
    rc = main(["search", str(space), "--out", str(copy_), "--workers", "0", "--no-progress"])
    assert_one_line(capsys, rc, ["study.journal", "holds no study named 't'", "study.json",
                                 "--fresh"])
    assert state() == before


def test_report_on_a_damaged_mlflow_store(study, tmp_path, capsys):
    """The report reads earlier trials' request tables from MLflow: a damaged store was a
    sqlalchemy traceback."""
    _, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    (copy_ / "mlflow.db").write_bytes(b"garbage" * 100)
    meta = json.loads((copy_ / "study.json").read_text())
    meta["tracking_uri"] = f"sqlite:///{copy_ / 'mlflow.db'}"  # the copy's, damaged
    (copy_ / "study.json").write_text(json.dumps(meta))
    with pytest.raises(InputError) as exc:
        dse.report.request_tables(copy_, [0])
    msg = str(exc.value)
    assert "\n" not in msg
    for n in ("study.json", "cannot read the MLflow store", "file is not a database"):
        assert n in msg, msg


def test_report_on_the_undamaged_study_still_works(study, tmp_path, capsys):
    _, out = study
    copy_ = tmp_path / "copy"
    shutil.copytree(out, copy_)
    assert main(["report", str(copy_)]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------ the fuzz
@st.composite
def mangled_space_texts(draw):
    lines = _TEXT.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["truncate", "garbage", "tab", "repeat", "drop"]))
        i = draw(st.integers(0, len(lines) - 1))
        if how == "truncate":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif how == "garbage":
            at = draw(st.integers(0, len(lines[i])))
            junk = draw(st.binary(min_size=1, max_size=4)).decode("latin-1")
            lines[i] = lines[i][:at] + junk + lines[i][at:]
        elif how == "tab":
            lines[i] = lines[i].replace("  ", "\t", 1)
        elif how == "repeat":
            lines.insert(i, lines[i])
        else:
            del lines[i]
    text = "".join(lines)
    return text.encode("latin-1" if draw(st.booleans()) else "utf-8", errors="replace")


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mangled_space_texts())
def test_fuzz_mangled_space_text_exit_0_or_2(tmp_path, data, capsys):
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(data)
    rc = main(["check", str(p)])
    err = capsys.readouterr().err
    assert rc in (0, 2), err
    assert "Traceback" not in err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err


def test_base_space_is_valid(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(copy.deepcopy(BASE_SPACE)))
    assert main(["check", str(p)]) == 0, capsys.readouterr().err


def test_null_slo_is_no_limit(tmp_path, capsys):
    """An SLO given as null is no limit, as null is for every field of a space: it was kept
    as a limit of None, and every trial failed (TypeError: float / NoneType) and the report
    with it ('unsupported format string passed to NoneType.__format__'), exit 0."""
    from dse.space import load_space

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**BASE_SPACE, "slo": {"p99_ttft_ms": None, "p99_tpot_ms": 30},
                                 "search": {"sampler": "grid", "n_trials": 1, "seed": 0}}))
    assert load_space(p).slo == {"p99_tpot_ms": 30}
    assert main(["search", str(p), "--out", str(tmp_path / "o"), "--workers", "0",
                 "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "failed" not in out.err and "1 trials simulated" in out.out + out.err, out


# ------------------------------------------------------------ SIGTERM during a search
def test_sigterm_stops_a_search_cleanly_and_it_resumes(tmp_path):
    """SIGTERM ends ``dse search`` as Ctrl-C does (exit 130, one line saying how to
    resume, no traceback), and the same command then completes the study. Before, Python
    died of the signal at once (exit -15) with the MLflow parent run left RUNNING."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    from dse.store import open_storage

    def counted(out):
        try:
            trials = optuna.load_study(study_name="t", storage=open_storage(out)).get_trials()
        except Exception:  # noqa: BLE001 - the journal is not there yet
            return 0
        return sum(t.state == TrialState.COMPLETE and "repeat_of" not in t.user_attrs
                   for t in trials)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = 4
    slow = {"generate": {"num_requests": 1000, "rate": 40, "seed": 0,
                         "input": {"kind": "uniform", "low": 256, "high": 2048},
                         "output": {"kind": "uniform", "low": 64, "high": 256}}}
    path = write_space(tmp_path, workload=slow,
                       search={"sampler": "random", "n_trials": n, "seed": 3})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dse.cli", "search", str(path), "--out", str(out),
           "--workers", "0", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not counted(out):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "rerun the same command to resume" in err, err
    meta = json.loads((out / "study.json").read_text())
    runs = MlflowClient(meta["tracking_uri"]).search_runs([meta["experiment_id"]])
    parents = [r for r in runs if not r.data.tags.get("mlflow.parentRunId")]
    assert [r.info.status for r in parents] == ["KILLED"]

    rerun = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert counted(out) == n


@pytest.mark.parametrize("tp", [{"low": 1, "high": 10**9}, {"low": 33, "high": 10**9}],
                         ids=["from-1", "no-divisor"])
def test_huge_integer_range_is_never_listed(tmp_path, tp, capsys):
    """A knob range of 10^9 integers is sampled, never listed: listing it (as the
    load-time checks once did) took 22 GB and hung the fuzz test. The check answers from
    the range's ends, and a range without a divisor of the heads is still refused."""
    import tracemalloc

    p = tmp_path / "space.yaml"
    space = _knobs(tp=tp, replicas=[1])
    space["search"] = {**space.get("search", {}), "sampler": "tpe"}
    p.write_text(yaml.safe_dump(space))
    tracemalloc.start()
    rc = main(["check", str(p)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 200 * 2**20, peak
    if tp["low"] == 1:
        assert rc == 0, capsys.readouterr().err
    else:
        assert_one_line(capsys, rc, ["knobs.tp"])  # beyond devices_per_node and every divisor
