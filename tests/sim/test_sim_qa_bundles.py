"""QA: a profile bundle's times are bounded. A layer time of 1e17 us (or 1e300) is
finite and was accepted; cast to integer nanoseconds it overflowed (numpy printed a
RuntimeWarning) and the single-NPU fast path took it as 1 ns: the run came out *faster*
than with the real bundle (TPOT 1.48 ms instead of 17.27 ms on the RTX 4090 trace)."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from sim.cli import main
from sim.paths import shared_data_root

DATA = shared_data_root()
BUNDLE = DATA / "profiles/RTX4090/meta-llama/Llama-3.1-8B/bf16"
CLUSTER = DATA / "llmservingsim-configs/cluster/rtx4090_single_instance.json"
WL = DATA / "workloads/example_trace.jsonl"

pytestmark = pytest.mark.skipif(not BUNDLE.exists(), reason="shared data not present")


def _bundle(tmp_path: Path) -> Path:
    dst = tmp_path / "profiles/RTX4090/meta-llama/Llama-3.1-8B/bf16"
    shutil.copytree(BUNDLE, dst)
    for p in [dst, *dst.rglob("*")]:  # the shared copy is read-only
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def _run(tmp_path: Path) -> int:
    return main(["run", "--cluster", str(CLUSTER), "--dataset", str(WL), "--output",
                 str(tmp_path / "o.csv"), "--profiles", str(tmp_path / "profiles"),
                 "--latency-provider", "measured"])


@pytest.mark.parametrize("csv_name,value", [("dense.csv", "1e17"), ("dense.csv", "1e300"),
                                            ("attention.csv", "1e17"),
                                            ("per_sequence.csv", "1e300")])
def test_time_beyond_any_layer_is_refused(tmp_path, capsys, monkeypatch, csv_name, value):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    path = _bundle(tmp_path) / "tp1" / csv_name
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + "," + value
    path.write_text("\n".join(lines) + "\n")
    with _no_warning():
        rc = _run(tmp_path)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    for needle in (csv_name, "line 4", "'time_us'", "1e+09", value):
        assert needle in err, (needle, err)


def test_large_but_plausible_time_still_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    path = _bundle(tmp_path) / "tp1" / "dense.csv"
    path.write_text(path.read_text().replace(",2.592\n", ",250000.0\n"))  # 0.25 s: slow, allowed
    assert _run(tmp_path) == 0, capsys.readouterr().err


class _no_warning:
    """No Python warning (numpy's RuntimeWarning on an overflowing cast) while inside."""

    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


# ----------------------------------------------------------------- MoE bundle
MOE_BUNDLE = DATA / "profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
MOE_CLUSTER = DATA / "llmservingsim-configs/cluster/single_node_moe_dp_ep_instance.json"


def _moe_bundle(tmp_path: Path) -> Path:
    dst = tmp_path / "profiles/RTXPRO6000/Qwen/Qwen3-30B-A3B-Instruct-2507/bf16"
    shutil.copytree(MOE_BUNDLE, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return dst


def _drop_column(path: Path, name: str) -> None:
    lines = [ln.split(",") for ln in path.read_text().splitlines()]
    k = lines[0].index(name)
    path.write_text("\n".join(",".join(c for i, c in enumerate(ln) if i != k)
                              for ln in lines) + "\n")


@pytest.mark.parametrize("mutate,needles", [
    # moe.csv with its header and no rows: an IndexError traceback in the first MoE step
    (lambda v: (v / "tp1/moe.csv").write_text("tokens,activated_experts,time_us\n"),
     ["tp1/moe.csv", "no rows"]),
    # a skew-fit bucket table without a label column: a KeyError traceback at load
    (lambda v: _drop_column(v / "tp1/skew_fit.csv", "n_label"),
     ["tp1/skew_fit.csv", "expected columns", "n_label"]),
    (lambda v: _drop_column(v / "tp1/skew_fit.csv", "kp_label"),
     ["tp1/skew_fit.csv", "expected columns", "kp_label"]),
])
def test_moe_bundle_damage_is_one_line(tmp_path, capsys, monkeypatch, mutate, needles):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    mutate(_moe_bundle(tmp_path))
    rc = main(["run", "--cluster", str(MOE_CLUSTER), "--dataset", str(WL), "--output",
               str(tmp_path / "o.csv"), "--profiles", str(tmp_path / "profiles"),
               "--latency-provider", "measured"])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
