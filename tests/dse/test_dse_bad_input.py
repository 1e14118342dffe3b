"""Malformed input to ``dse``, table-driven: exit 2 with one line naming the file, field or
flag and what is allowed, before any simulation (and before Ray starts: the driver is
replaced by one that fails the test). The output-folder lock, and a hypothesis fuzz of the
space loader through ``dse check``: exit 2 or success, never a traceback."""

from __future__ import annotations

import copy
import json
import os
import socket
import string
import subprocess
import sys
import time

import pytest
import yaml
from dse_testkit import BASE_SPACE, assert_one_line, write_space
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dse.study
from dse.cli import main
from dse.config import make_trial_config, precheck
from dse.space import load_space
from dse.store import LOCK, StudyLock


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("dsebad")
    (d / "good.jsonl").write_text('{"input_toks": 20, "output_toks": 3}\n')
    (d / "binary.jsonl").write_bytes(b"\x00\xff\xfe\x80\n")
    (d / "nan.jsonl").write_text('{"input_toks": 20, "output_toks": 3, "arrival_time_ns": NaN}\n')
    (d / "broken.jsonl").write_text('{"input_toks": 20, "output_toks": 3}\n{"input_toks": \n')
    (d / "a_file").write_text("x")
    return d


def _space(d, filename, **overrides):
    p = d / filename
    p.write_text(yaml.safe_dump({**BASE_SPACE, **overrides}, sort_keys=False))
    return str(p)


def _raw(d, name, data: bytes):
    (d / name).write_bytes(data)
    return str(d / name)


_GEN = BASE_SPACE["workload"]["generate"]
# (id, argv builder d -> list, needles)
SEARCH_CASES = [
    ("binary-space", lambda d: [_raw(d, "bin.yaml", b"\x00\xff\xfe\x80name: x\n")],
     ["bin.yaml", "UTF-8"]),
    ("latin1-space", lambda d: [_raw(d, "l1.yaml", "name: caf\xe9\n".encode("latin-1"))],
     ["l1.yaml", "UTF-8"]),
    ("binary-workload-file", lambda d: [_space(d, "wb.yaml", workload={
        "file": str(d / "binary.jsonl")})], ["workload.file", "binary.jsonl", "UTF-8"]),
    ("nan-arrival-in-workload-file", lambda d: [_space(d, "wn.yaml", workload={
        "file": str(d / "nan.jsonl")})], ["workload.file", "nan.jsonl:1", "NaN"]),
    ("broken-workload-file", lambda d: [_space(d, "wbr.yaml", workload={
        "file": str(d / "broken.jsonl")})], ["workload.file", "broken.jsonl:2", "malformed"]),
    ("slo-nan", lambda d: [_space(d, "nan.yaml", slo={"p99_ttft_ms": float("nan")})],
     ["slo.p99_ttft_ms", "finite"]),
    ("generate-low-above-high", lambda d: [_space(d, "lh.yaml", workload={"generate": {
        **_GEN, "input": {"kind": "uniform", "low": 2048, "high": 128}}})],
     ["workload.generate", "input", "low (2048) must be <= high (128)"]),
    ("generate-sample-file-missing", lambda d: [_space(d, "sf.yaml", workload={"generate": {
        **_GEN, "sample_file": "nope.jsonl"}})], ["workload.generate", "nope.jsonl"]),
    ("cluster-link-bw-0", lambda d: [_space(d, "lb.yaml", cluster={"link_bw": 0})],
     ["cluster.link_bw", "> 0"]),
    ("cluster-link-latency-negative", lambda d: [_space(d, "ll.yaml",
                                                        cluster={"link_latency": -1})],
     ["cluster.link_latency", ">= 0"]),
    ("cluster-mem-1e40", lambda d: [_space(d, "m.yaml", cluster={"npu_mem_size": 1e40})],
     ["cluster.npu_mem_size", "<= 1e15"]),
    ("cluster-mem-1e9-gib", lambda d: [_space(d, "m9.yaml", cluster={"npu_mem_size": 1e9})],
     ["m9.yaml", "mem_size", "<= 1048576"]),
    ("name-escapes-runs", lambda d: [_space(d, "evil.yaml", name="../../etc/evil")],
     ["name", "../../etc/evil", "runs/<name>"]),
    ("block-size-7", lambda d: [_space(d, "bs.yaml", knobs={"block_size": [7, 16]})],
     ["knobs.block_size", "block_size 7", "16, 32"]),
    ("out-is-a-file", lambda d: [_space(d, "ok1.yaml"), "--out", str(d / "a_file")],
     ["--out", "is a file"]),
    ("out-unwritable", lambda d: [_space(d, "ok2.yaml"), "--out", str(d / "a_file" / "o")],
     ["--out", "cannot write there"]),
    ("tracking-uri-bogus", lambda d: [_space(d, "ok3.yaml"), "--tracking-uri", "bogus://x"],
     ["--tracking-uri", "bogus://x", "sqlite://"]),
    ("ray-address-unreachable", lambda d: [_space(d, "ok4.yaml"), "--ray-address",
                                           "127.0.0.1:1"], ["--ray-address", "127.0.0.1:1"]),
    ("ray-address-malformed", lambda d: [_space(d, "ok5.yaml"), "--ray-address", "nohost"],
     ["--ray-address", "HOST:PORT"]),
    ("ray-address-with-workers-0", lambda d: [_space(d, "ok6.yaml"), "--ray-address",
                                              "127.0.0.1:1", "--workers", "0"],
     ["--ray-address", "--workers 0", "uses no Ray"]),
]


class _NoDriver:
    def __init__(self, *a, **k):
        raise AssertionError("the search started: the input was not checked first")


@pytest.mark.parametrize("argv,needles", [c[1:] for c in SEARCH_CASES],
                         ids=[c[0] for c in SEARCH_CASES])
def test_dse_search_refuses_before_running(d, argv, needles, capsys, monkeypatch):
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = argv(d)
    if "--out" not in args:
        args += ["--out", str(d / "runs" / "x")]
    t0 = time.monotonic()
    assert_one_line(capsys, main(["search", *args]), needles)
    assert time.monotonic() - t0 < 30  # the unreachable address is given up quickly


def test_dse_search_refuses_unreachable_ray_address_env(d, capsys, monkeypatch):
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    rc = main(["search", _space(d, "ok7.yaml"), "--out", str(d / "runs" / "y")])
    assert_one_line(capsys, rc, ["RAY_ADDRESS='127.0.0.1:1'", "no Ray head answers"])


def test_dse_check_accepts_every_shipped_space(capsys):
    from pathlib import Path

    spaces = sorted((Path(__file__).parents[2] / "search_spaces").glob("*.yaml"))
    assert spaces
    for p in spaces:
        assert main(["check", str(p)]) == 0, capsys.readouterr().err


def test_precheck_refuses_what_vllm_refuses(tmp_path):
    space = load_space(write_space(tmp_path, knobs={"max_num_seqs": [256],
                                                    "max_num_batched_tokens": [128]}))
    cfg = make_trial_config(space, 0, {"max_num_seqs": 256, "max_num_batched_tokens": 128})
    why = precheck(space, cfg)
    assert why and "max_num_batched_tokens (128) must be >= max_num_seqs (256)" in why


def test_dse_ui_port_busy(tmp_path, capsys):
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.json").write_text(json.dumps({"tracking_uri": f"sqlite:///{out}/m.db"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = main(["ui", str(out), "--port", str(port)])
    assert_one_line(capsys, rc, [f"--port {port}", "choose another --port"])


# ---------------------------------------------------------------- the output-folder lock
def test_second_search_on_the_same_folder_exits_2_naming_the_first(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    # the running search: another process holds the lock
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path;"
         "from dse.store import StudyLock; StudyLock(Path(sys.argv[1])).acquire();"
         "print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert holder.stdout.readline().strip() == "held"
        rc = main(["search", str(write_space(tmp_path)), "--out", str(out), "--workers", "0",
                   "--no-progress"])
        assert_one_line(capsys, rc, ["another search is writing this folder",
                                     f"pid {holder.pid}", socket.gethostname(), "started"])
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # its holder is dead: the lock file is left behind and simply taken over
    info = json.loads((out / LOCK).read_text())
    assert info["pid"] == holder.pid
    with StudyLock(out):
        assert json.loads((out / LOCK).read_text())["pid"] == os.getpid()


# ---------------------------------------------------------------- fuzzing the space loader
_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
_values = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=3)
                       | st.dictionaries(st.text(string.ascii_lowercase + "_", max_size=10),
                                         kids, max_size=4), max_leaves=12)
_PATHS = [("name",), ("model",), ("hardware",), ("budget",), ("budget", "total_devices"),
          ("budget", "devices_per_node"), ("cluster",), ("cluster", "link_bw"),
          ("cluster", "npu_mem_size"), ("cluster", "mem_util"), ("workload",),
          ("workload", "generate"), ("workload", "generate", "input"),
          ("workload", "generate", "rate"), ("workload", "generate", "num_requests"),
          ("slo",), ("slo", "p99_ttft_ms"), ("slo", "attainment"), ("objectives",),
          ("knobs",), ("knobs", "tp"), ("knobs", "max_num_seqs"), ("knobs", "block_size"),
          ("knobs", "routing_policy"), ("simulator",), ("capacity",), ("search",),
          ("search", "sampler"), ("search", "n_trials")]


@st.composite
def space_texts(draw):
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "yaml", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "yaml":
        return yaml.safe_dump(draw(_values)).encode()
    data = copy.deepcopy(BASE_SPACE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_PATHS))
        node = data
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[path[-1]] = draw(_values)
    return yaml.safe_dump(data).encode()


@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=space_texts())
def test_fuzz_space_loader_exit_2_or_success(tmp_path, data):
    p = tmp_path / "fuzz.yaml"
    p.write_bytes(data)
    assert main(["check", str(p)]) in (0, 2)
