"""Malformed input to ``llmsim``, table-driven: every case exits 2 with one line naming the
file, field or flag and what is allowed, and nothing is simulated first (``sim.simulate``
is replaced by a function that fails the test). Also a hypothesis fuzz of the cluster and
JSONL loaders through the CLI's error handling: exit 2 or success, never a traceback."""

from __future__ import annotations

import copy
import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_testkit import cluster_dict

import sim
from sim.cli import main

GOOD = cluster_dict(300, hardware="H100-SXM")


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "c.json").write_text(json.dumps(GOOD))
    (d / "w.jsonl").write_text("\n".join(json.dumps(
        {"input_toks": 20 + i, "output_toks": 3, "arrival_time_ns": i * 1000})
        for i in range(5)) + "\n")
    (d / "binary.jsonl").write_bytes(b"\x00\x01\xff\xfe\x80garbage\n")
    (d / "latin1.jsonl").write_bytes('{"input_toks": 5, "output_toks": 2, "n": "caf\xe9"}\n'
                                     .encode("latin-1"))
    (d / "nan.jsonl").write_text('{"input_toks": 20, "output_toks": 3, "arrival_time_ns": NaN}\n')
    (d / "inf.jsonl").write_text('{"input_toks": 20, "output_toks": 3, '
                                 '"arrival_time_ns": Infinity}\n')
    (d / "ids.jsonl").write_text('{"input_toks": 2, "output_toks": 1, '
                                 '"input_tok_ids": ["a", "b"]}\n')
    (d / "binary.json").write_bytes(b"\xff\xfe{\x00}")
    (d / "a_file").write_text("x")
    return d


def _cluster(d, name, mutate):
    c = copy.deepcopy(GOOD)
    mutate(c)
    p = d / name
    p.write_text(yaml.safe_dump(c) if p.suffix == ".yaml" else json.dumps(c))
    return str(p)


def _tp2(c):
    c["nodes"][0]["instances"][0].update(num_npus=2, tp_size=2)


def _inst(**kw):
    return lambda c: c["nodes"][0]["instances"][0].update(**kw)


def _mem(**kw):
    return lambda c: c["nodes"][0]["instances"][0]["npu_mem"].update(**kw)


# (case id, {flag: value} replacing the good run's, or a callable d -> dict, needles)
RUN_CASES = [
    ("binary-jsonl", lambda d: {"--dataset": d / "binary.jsonl"}, ["binary.jsonl", "UTF-8"]),
    ("latin1-jsonl", lambda d: {"--dataset": d / "latin1.jsonl"}, ["latin1.jsonl", "UTF-8"]),
    ("nan-arrival", lambda d: {"--dataset": d / "nan.jsonl"}, ["nan.jsonl:1", "NaN"]),
    ("inf-arrival", lambda d: {"--dataset": d / "inf.jsonl"}, ["inf.jsonl:1", "Infinity"]),
    ("token-ids-not-ints", lambda d: {"--dataset": d / "ids.jsonl"},
     ["ids.jsonl:1", "input_tok_ids", "integer token ids"]),
    ("binary-cluster", lambda d: {"--cluster": d / "binary.json"}, ["binary.json", "UTF-8"]),
    ("output-is-folder", lambda d: {"--output": d}, ["--output", "is a folder"]),
    ("output-under-a-file", lambda d: {"--output": d / "a_file" / "o.csv"},
     ["--output", "cannot write there"]),
    ("summary-unwritable", lambda d: {"--summary": d / "a_file" / "s.json"},
     ["--summary", "cannot write there"]),
    ("summary-is-folder", lambda d: {"--summary": d}, ["--summary", "is a folder"]),
    ("timeseries-interval-0", {"--timeseries-interval-s": "0"},
     ["--timeseries-interval-s", "positive"]),
    ("timeseries-interval-nan", {"--timeseries-interval-s": "nan"},
     ["--timeseries-interval-s", "positive"]),
    ("link-bw-0-tp2", lambda d: {"--cluster": _cluster(
        d, "lb0.json", lambda c: (_tp2(c), c.update(link_bw=0)))}, ["link_bw", "> 0"]),
    ("link-latency-negative-tp2", lambda d: {"--cluster": _cluster(
        d, "ll.json", lambda c: (_tp2(c), c.update(link_latency=-1)))},
     ["link_latency", ">= 0"]),
    ("link-bw-negative-one-npu", lambda d: {"--cluster": _cluster(
        d, "lbn.json", lambda c: c.update(link_bw=-16))}, ["link_bw", "> 0"]),
    ("link-bw-list-with-nan", lambda d: {"--cluster": _cluster(
        d, "lbl.yaml", lambda c: c.update(link_bw=[16, float("nan")]))},
     ["lbl.yaml", "link_bw", "must be a number, got nan"]),
    ("mem-size-1e40", lambda d: {"--cluster": _cluster(d, "mem.json", _mem(mem_size=1e40))},
     ["npu_mem", "mem_size", "<= 1048576"]),
    ("cxl-mem-negative", lambda d: {"--cluster": _cluster(
        d, "cxl.json", lambda c: c.update(cxl_mem={"mem_size": -1, "mem_bw": 1}))},
     ["cxl_mem", "mem_size"]),
    ("profiles-missing", {"--profiles": "/nonexistent/profiles"},
     ["--profiles", "/nonexistent/profiles", "no such folder"]),
    ("budget-below-max-seqs", {"--max-num-batched-tokens": "8", "--max-num-seqs": "256"},
     ["max_num_batched_tokens (8)", "max_num_seqs (256)"]),
    ("block-size-7", {"--block-size": "7"}, ["block_size 7", "16, 32"]),
    ("instance-block-size-24", lambda d: {"--cluster": _cluster(
        d, "bs.json", _inst(block_size=24))}, ["instance 0", "block_size 24"]),
    ("seed-negative", {"--seed": "-1"}, ["--seed", ">= 0"]),
]


def _args(d, change) -> list[str]:
    flags = {"--cluster": d / "c.json", "--dataset": d / "w.jsonl",
             "--output": d / "out" / "o.csv"}
    flags.update(change(d) if callable(change) else change)
    return ["run", *(str(x) for kv in flags.items() for x in kv)]


def _no_simulation(*a, **k):
    raise AssertionError("sim.simulate was called: the input was not checked first")


def assert_one_line(capsys, rc, prog, needles):
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])


@pytest.mark.parametrize("change,needles", [c[1:] for c in RUN_CASES],
                         ids=[c[0] for c in RUN_CASES])
def test_llmsim_run_refuses_before_simulating(d, change, needles, capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    assert_one_line(capsys, main(_args(d, change)), "llmsim", needles)


def test_llmsim_run_good_input_still_runs(d, capsys):
    assert main(_args(d, {})) == 0, capsys.readouterr().err
    assert (d / "out" / "o.summary.json").is_file()


def test_astra_config_out_is_a_file(d, capsys):
    rc = main(["astra-config", "--cluster", str(d / "c.json"), "--out", str(d / "a_file")])
    assert_one_line(capsys, rc, "llmsim", ["--out", "is a file"])


def test_astra_config_out_empty_writes_nothing(d, capsys, tmp_path, monkeypatch):
    """--out '' wrote network.yml, system.json, ... into the working folder."""
    monkeypatch.chdir(tmp_path)
    rc = main(["astra-config", "--cluster", str(d / "c.json"), "--out", ""])
    assert_one_line(capsys, rc, "llmsim", ["--out ''", "give a folder"])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("out,needles", [
    ("", ["--out ''", "give a folder"]),   # a bundle was written under the working folder
    ("a_file", ["--out", "a_file", "is a file"]),  # "<out>/H100/...: Not a directory"
], ids=["empty", "a-file"])
def test_profile_out_refused_before_profiling(d, capsys, tmp_path, monkeypatch, out, needles):
    import sim.profiler

    def no_profiling(*a, **k):
        raise AssertionError("profiled before --out was checked")

    monkeypatch.setattr(sim.profiler, "profile_bundle", no_profiling, raising=False)
    monkeypatch.chdir(tmp_path)
    rc = main(["profile", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "H100",
               "--out", str(d / out) if out else "", "--tiny", "--device", "cpu"])
    assert_one_line(capsys, rc, "llmsim", needles)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags,needles", [
    (["--iterations", "-1"], ["--iterations", ">= 1", "-1"]),   # no flag was named
    (["--hardware", "A" * 300], ["--hardware", "1-255 bytes"]),  # "File name too long"
    (["--hardware", ".."], ["--hardware", "'..'"]),
], ids=["iterations-negative", "hardware-too-long", "hardware-dotdot"])
def test_profile_flags_refused_before_profiling(capsys, tmp_path, monkeypatch, flags, needles):
    import sim.profiler

    def no_profiling(*a, **k):
        raise AssertionError("profiled before the flags were checked")

    monkeypatch.setattr(sim.profiler, "profile_bundle", no_profiling, raising=False)
    args = {"--model": "meta-llama/Llama-3.1-8B", "--hardware": "H100",
            "--out": str(tmp_path / "out"), "--device": "cpu"}
    args.update(dict(zip(flags[::2], flags[1::2])))
    rc = main(["profile", *[x for kv in args.items() for x in kv], "--tiny"])
    assert_one_line(capsys, rc, "llmsim", needles)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- fuzzing
def _guarded(fn, *args) -> int:
    """The CLI's contract for a loader: InputError -> 2, success -> 0; anything else
    propagates (a traceback) and fails the test."""
    try:
        fn(*args)
    except sim.InputError:
        return 2
    return 0


_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
_json = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(string.ascii_lowercase + "_", max_size=12),
                                       kids, max_size=5), max_leaves=20)


def _mutated_cluster(draw):
    """A valid cluster with some fields replaced by arbitrary values (so the fuzz reaches
    deep fields, not just the top-level shape check)."""
    c = copy.deepcopy(GOOD)
    inst = c["nodes"][0]["instances"][0]
    targets = [(c, k) for k in ("num_nodes", "link_bw", "link_latency", "cxl_mem", "nodes")]
    targets += [(c["nodes"][0], k) for k in ("num_instances", "cpu_mem", "power")]
    targets += [(inst, k) for k in ("model_name", "hardware", "num_npus", "tp_size", "pp_size",
                                    "ep_size", "pd_type", "npu_mem", "max_num_seqs",
                                    "block_size", "dp_group")]
    targets += [(inst["npu_mem"], k) for k in ("mem_size", "mem_bw", "mem_latency", "mem_util")]
    for _ in range(draw(st.integers(1, 3))):
        obj, key = draw(st.sampled_from(targets))
        obj[key] = draw(_json)
    return c


@st.composite
def cluster_texts(draw):
    """(suffix, bytes): JSON (where NaN/Infinity are refused by the parser) or YAML (where
    .nan/.inf reach the field checks), mutated from a valid cluster, any JSON, or bytes."""
    kind = draw(st.sampled_from(["mutated", "mutated", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.sampled_from([".json", ".yaml"])), draw(st.binary(max_size=200))
    doc = _mutated_cluster(draw) if kind == "mutated" else draw(_json)
    if draw(st.booleans()):
        return ".yaml", yaml.safe_dump(doc).encode()
    return ".json", json.dumps(doc, allow_nan=True).encode()


def _load_and_validate_cluster(path):
    cluster = sim.load_cluster(path)
    sim.validate_cluster(cluster, sim.SimOptions(latency_provider="roofline"))


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=cluster_texts())
def test_fuzz_cluster_loader_exit_2_or_success(tmp_path, data):
    suffix, text = data
    p = tmp_path / f"fuzz{suffix}"
    p.write_bytes(text)
    assert _guarded(_load_and_validate_cluster, p) in (0, 2)


_request = st.fixed_dictionaries({}, optional={
    "input_toks": _scalars, "output_toks": _scalars, "arrival_time_ns": _scalars,
    "input_tok_ids": st.lists(_scalars, max_size=3), "tool_duration_ns": _scalars,
    "sub_requests": st.lists(st.dictionaries(st.sampled_from(
        ["input_toks", "output_toks", "tool_duration_ns"]), _scalars), max_size=3),
    "session_id": _scalars})


@st.composite
def jsonl_texts(draw):
    kind = draw(st.sampled_from(["requests", "requests", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    items = draw(st.lists(_request if kind == "requests" else _json, min_size=0, max_size=4))
    return "\n".join(json.dumps(i, allow_nan=True) for i in items).encode()


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=jsonl_texts())
def test_fuzz_jsonl_loader_exit_2_or_success(tmp_path, data):
    p = tmp_path / "fuzz.jsonl"
    p.write_bytes(data)
    assert _guarded(sim.load_jsonl, p) in (0, 2)
