"""The compiled simulator modules (sim.native): when they load, and that they compute
what the pure-Python modules compute."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sim.native as native
from sim.paths import shared_data_root

REPO = Path(__file__).resolve().parents[2]


def _manifest(folder: Path, **changes) -> dict:
    files = {m: f"{m}.so" for m in native.NATIVE_MODULES}
    files["abc__mypyc"] = "abc__mypyc.so"
    manifest = {"fingerprint": native.fingerprint(), "mypyc": "9.9", "files": files, **changes}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / native.MANIFEST_NAME).write_text(json.dumps(manifest))
    for fname in files.values():
        (folder / fname).write_bytes(b"")
    return manifest


def test_a_matching_build_is_loaded(tmp_path):
    _manifest(tmp_path)
    files, status = native.plan_activation(tmp_path, {})
    assert set(files) == {*native.NATIVE_MODULES, "abc__mypyc"}
    assert files["sim.leap"] == tmp_path / "sim.leap.so"
    assert status.startswith("compiled with mypyc 9.9")


@pytest.mark.parametrize("env", [{"LLMSIM_PURE_PYTHON": "1"}, {"LLMSIM_PURE_PYTHON": "yes"}])
def test_the_environment_forces_pure_python(tmp_path, env):
    _manifest(tmp_path)
    files, status = native.plan_activation(tmp_path, env)
    assert files is None and "LLMSIM_PURE_PYTHON" in status
    assert native.plan_activation(tmp_path, {"LLMSIM_PURE_PYTHON": "0"})[0] is not None


def test_no_build_or_an_unreadable_manifest_runs_pure_python(tmp_path):
    files, status = native.plan_activation(tmp_path, {})
    assert files is None and "llmsim native build" in status
    (tmp_path / native.MANIFEST_NAME).write_text("{not json")
    files, status = native.plan_activation(tmp_path, {})
    assert files is None and "unreadable" in status


def test_an_edited_source_or_another_interpreter_is_never_loaded(tmp_path):
    stale = native.fingerprint()
    stale["sources"]["sim.scheduler"] = "0" * 64
    _manifest(tmp_path, fingerprint=stale)
    files, status = native.plan_activation(tmp_path, {})
    assert files is None and "does not match the sources" in status
    other = {**native.fingerprint(), "ext_suffix": ".cpython-312-x86_64-linux-gnu.so"}
    _manifest(tmp_path, fingerprint=other)
    assert native.plan_activation(tmp_path, {})[0] is None


def test_a_build_missing_a_module_is_not_loaded(tmp_path):
    _manifest(tmp_path)
    (tmp_path / "sim.kv_cache.so").unlink()
    files, status = native.plan_activation(tmp_path, {})
    assert files is None and "incomplete" in status


def test_a_failed_build_is_recorded_and_runs_pure_python(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mypy")

    def no_compiler(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "error: command 'gcc' failed: "
                                                       "No such file or directory\n")

    monkeypatch.setattr(native.subprocess, "run", no_compiler)
    folder = tmp_path / "_native"
    assert native.build(folder) == 1
    files, status = native.plan_activation(folder, {})
    assert files is None
    assert status == ("pure Python (the compiled build failed: error: command 'gcc' failed: "
                      "No such file or directory)")
    assert "gcc" in (folder / "build.log").read_text()
    assert "runs as pure Python" in capsys.readouterr().err


def test_the_suite_runs_the_reference_modules():
    # (this suite's tests patch functions and methods of these modules)
    assert native.status().startswith("pure Python")
    for name in native.NATIVE_MODULES:
        assert importlib.import_module(name).__file__.endswith(".py")


# A session of two turns (the second linked from the first), with runtime state set, through
# pickle and copy: every field comes back (a Workload travels to Ray workers this way).
ROUND_TRIP = """
import copy, pickle, sys
import sim
from sim.request import FIELDS, Request
first = Request(7, 1_000, 12, 5, [1, 2, 3], None, "s1", 0, 0)
first.next_sub = Request(8, 2_000, 20, 6, None, None, "s1", 1, 500)
first.num_output, first.block_ids, first.priority = 3, [4, 5], -2
for other in (pickle.loads(pickle.dumps(first)), copy.copy(first), copy.deepcopy(first)):
    assert [getattr(other, f) for f in FIELDS if f != "next_sub"] == [
        getattr(first, f) for f in FIELDS if f != "next_sub"]
    assert other.next_sub.rid == 8 and other.next_sub.tool_ns == 500
print(sim.native_status())
"""


def _env(pure: bool) -> dict:
    """A subprocess's environment: this checkout's code, compiled (where built) or not."""
    return {**os.environ, "LLMSIM_PURE_PYTHON": "1" if pure else "0",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "astra-sim")])}


def _round_trip(pure: bool) -> str:
    proc = subprocess.run([sys.executable, "-c", ROUND_TRIP], cwd=REPO, env=_env(pure),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_requests_pickle_and_copy_field_by_field():
    assert _round_trip(pure=True).startswith("pure Python")


@pytest.mark.skipif(native.plan_activation(native.NATIVE_DIR, {})[0] is None,
                    reason="no compiled build matching the sources (llmsim native build)")
def test_compiled_requests_pickle_and_copy_field_by_field():
    assert _round_trip(pure=False).startswith("compiled with mypyc")


def _digests(tmp_path: Path, pure: bool) -> tuple[dict, str]:
    out = tmp_path / f"digests-{int(pure)}.json"
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / "sim_digest.py"),
                           "--quick", "--save", str(out)], cwd=REPO, env=_env(pure),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout.splitlines()[0]


@pytest.mark.shared
@pytest.mark.skipif(native.plan_activation(native.NATIVE_DIR, {})[0] is None,
                    reason="no compiled build matching the sources (llmsim native build)")
@pytest.mark.skipif(not (shared_data_root() / "workloads").is_dir(), reason="needs ../shared")
def test_compiled_modules_give_byte_identical_outputs(tmp_path):
    """Every output (per-request rows, summary, time series) of a third of sim_digest's
    scenarios, leaping and stepping, from the compiled build and from the sources."""
    compiled, first = _digests(tmp_path, pure=False)
    assert first.startswith("modules: compiled with mypyc")
    pure, first = _digests(tmp_path, pure=True)
    assert first.startswith("modules: pure Python")
    assert len(compiled) >= 40
    assert compiled == pure
