"""The profile-bundle cache (sim.cache): a cache hit gives the provider a fresh parse
would, an edited source or a corrupt entry is rebuilt, entries live only in the cache
folder, and processes filling one entry at once leave a whole file."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from sim_testkit import make_bundle

from sim import cache
from sim.latency.base import BatchShape
from sim.latency.measured import MeasuredProvider
from sim.model import load_model
from sim.paths import shared_data_root

SHARED = shared_data_root() / "profiles"


def _shapes(seed: int = 0, n: int = 300) -> list[BatchShape]:
    """Batch shapes across and beyond the grids (extrapolation included), with skewed
    decode lengths so a skew fit is exercised where the bundle has one."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pc = rng.choice([0, 0, rng.randint(1, 4096), rng.randint(1, 30000)])
        nd = rng.choice([0, rng.randint(1, 300), rng.randint(1, 2000)])
        lo = rng.randint(0, 4000)
        hi = lo + rng.randint(0, 20000)
        kd_sum = sum(rng.randint(lo, hi) for _ in range(min(nd, 4))) * max(1, nd // 4)
        kp = rng.randint(0, 20000) if pc else 0
        nseq = nd + (1 if pc else 0)
        if nseq == 0:
            nd, nseq, kd_sum, lo, hi = 1, 1, 100, 100, 100
        out.append(BatchShape(pc + nd, nseq, prefill_tokens=pc, prefill_kv=kp, num_decode=nd,
                              decode_kv_sum=kd_sum if nd else 0,
                              decode_kv_max=hi if nd else 0, decode_kv_min=lo if nd else 0))
    return out


def _answers(p: MeasuredProvider, moe: bool = False) -> list:
    out = []
    for s in _shapes():
        lt = p.layer_times(s)
        out.append((p.iteration_ns(s), lt.prologue, lt.block, lt.head, lt.num_blocks,
                    p.attention_ns(s)))
        if moe:
            out.append(p.moe_ns(s.num_tokens, 1 + s.num_tokens % 128))
    out.append(sorted(p.extrapolations().items()))
    out.append(p.meta)
    return out


def _provider(model, hw, root, monkeypatch, cache_dir, tp: int = 1) -> MeasuredProvider:
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(cache_dir))
    return MeasuredProvider(model, hw, tp, profiles_dirs=(str(root),))


def _entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("measured-bundle-*.bin"))


def _no_parse(monkeypatch) -> None:
    """Make any parse of a bundle fail: what runs afterwards must come from the cache."""
    def refuse(self, *a, **k):
        raise AssertionError("the bundle was parsed although a valid cache entry exists")
    monkeypatch.setattr(MeasuredProvider, "_build", refuse)


@pytest.fixture
def model():
    return load_model("meta-llama/Llama-3.1-8B")


def test_cache_hit_gives_the_fresh_parse(tmp_path, monkeypatch, model):
    root = tmp_path / "profiles"
    make_bundle(root)
    fresh = _answers(_provider(model, "TESTHW", root, monkeypatch, "off"))
    first = _answers(_provider(model, "TESTHW", root, monkeypatch, tmp_path / "c"))
    assert len(_entries(tmp_path / "c")) == 1
    _no_parse(monkeypatch)
    hit = _answers(_provider(model, "TESTHW", root, monkeypatch, tmp_path / "c"))
    assert first == fresh
    assert hit == fresh


@pytest.mark.skipif(not (SHARED / "RTXPRO6000").is_dir(), reason="no shared measured bundles")
@pytest.mark.parametrize("model_name,hw,tp", [
    ("meta-llama/Llama-3.1-8B", "RTX4090", 1),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "RTXPRO6000", 2),  # MoE table and skew fit
])
def test_cache_hit_gives_the_fresh_parse_on_measured_bundles(tmp_path, monkeypatch, model_name,
                                                            hw, tp):
    m = load_model(model_name)
    fresh = _answers(_provider(m, hw, SHARED, monkeypatch, "off", tp), m.is_moe)
    _provider(m, hw, SHARED, monkeypatch, tmp_path / "c", tp)
    _no_parse(monkeypatch)
    hit = _provider(m, hw, SHARED, monkeypatch, tmp_path / "c", tp)
    assert hit._skew is not None or not m.is_moe  # the MoE bundle's skew fit is enabled
    assert _answers(hit, m.is_moe) == fresh


def test_an_edited_csv_invalidates_the_entry(tmp_path, monkeypatch, model):
    root = tmp_path / "profiles"
    variant = make_bundle(root)
    c = tmp_path / "c"
    before = _answers(_provider(model, "TESTHW", root, monkeypatch, c))
    dense = variant / "tp1" / "dense.csv"
    st = dense.stat()
    # Same size and the same modification time: only the content says it changed.
    text = dense.read_text()
    edited = text.replace(",3.048", ",4.048")
    assert edited != text and len(edited) == len(text)
    dense.write_text(edited)
    os.utime(dense, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = _answers(_provider(model, "TESTHW", root, monkeypatch, c))
    assert after != before
    assert after == _answers(_provider(model, "TESTHW", root, monkeypatch, "off"))
    assert len(_entries(c)) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "other-key"])
def test_a_corrupt_entry_is_rebuilt(tmp_path, monkeypatch, model, damage):
    root = tmp_path / "profiles"
    make_bundle(root)
    c = tmp_path / "c"
    fresh = _answers(_provider(model, "TESTHW", root, monkeypatch, "off"))
    _provider(model, "TESTHW", root, monkeypatch, c)
    (entry,) = _entries(c)
    data = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = len(data) - 1000
        entry.write_bytes(data[:i] + bytes([data[i] ^ 0x55]) + data[i + 1:])
    elif damage == "garbage":
        entry.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a whole, valid entry of another key under this name
        other = cache.entry_key("measured-bundle", [], ("something else",))
        entry.unlink()
        cache._write(entry, other, {"not": "this"})
    assert _answers(_provider(model, "TESTHW", root, monkeypatch, c)) == fresh
    # ... and the rebuilt entry is whole again: the next provider reads it without parsing
    _no_parse(monkeypatch)
    assert _answers(_provider(model, "TESTHW", root, monkeypatch, c)) == fresh


def test_entries_go_to_the_cache_folder_only(tmp_path, monkeypatch, model):
    root = tmp_path / "profiles"
    make_bundle(root)
    before = sorted(p for p in root.rglob("*"))
    monkeypatch.delenv("LLMSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "llm-serving-dse"
    MeasuredProvider(model, "TESTHW", 1, profiles_dirs=(str(root),))
    assert sorted(p for p in root.rglob("*")) == before
    assert len(_entries(tmp_path / "xdg" / "llm-serving-dse")) == 1
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "llm-serving-dse"


def test_an_unwritable_cache_folder_is_skipped(tmp_path, monkeypatch, model):
    root = tmp_path / "profiles"
    make_bundle(root)
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder would be")
    fresh = _answers(_provider(model, "TESTHW", root, monkeypatch, "off"))
    assert _answers(_provider(model, "TESTHW", root, monkeypatch, blocker / "c")) == fresh


def test_cached_value_follows_params_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(tmp_path / "c"))
    src = tmp_path / "a.txt"
    src.write_text("one")
    calls = []

    def build(tag):
        def f():
            calls.append(tag)
            return {"text": src.read_text(), "tag": tag, "t": (1, 2.5, [None, True])}
        return f

    assert cache.cached("k", [src], build(1), params=(1,))["tag"] == 1
    assert cache.cached("k", [src], build(2), params=(1,))["tag"] == 1   # a hit
    assert cache.cached("k", [src], build(3), params=(2,))["tag"] == 3   # other params
    src.write_text("two")
    v = cache.cached("k", [src], build(4), params=(1,))
    assert v == {"text": "two", "tag": 4, "t": (1, 2.5, [None, True])}
    assert calls == [1, 3, 4]
    # a value marshal cannot store is returned, just not cached
    assert cache.cached("k2", [src], lambda: {"p": tmp_path})["p"] == tmp_path
    assert not list((tmp_path / "c").glob("k2-*"))
    # a source that vanished: built, not cached
    assert cache.cached("k3", [tmp_path / "gone"], lambda: 7) == 7


_WRITER = r"""
import sys
from sim.latency.measured import MeasuredProvider
from sim.latency.base import BatchShape
from sim.model import load_model
p = MeasuredProvider(load_model("meta-llama/Llama-3.1-8B"), "TESTHW", 1,
                     profiles_dirs=(sys.argv[1],))
print(p.iteration_ns(BatchShape(300, 3, 256, 0, 2, 2000, 1000, 1000)))
"""


def test_concurrent_writers_leave_one_whole_entry(tmp_path, monkeypatch, model):
    root = tmp_path / "profiles"
    make_bundle(root)
    c = tmp_path / "c"
    env = {**os.environ, "LLMSIM_CACHE_DIR": str(c)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert len({o for o, _ in outs}) == 1
    assert len(_entries(c)) == 1
    assert not [p for p in c.iterdir() if p.name.endswith(".tmp")]
    _no_parse(monkeypatch)  # the entry they left is whole: read without parsing
    p = _provider(model, "TESTHW", root, monkeypatch, c)
    assert str(p.iteration_ns(BatchShape(300, 3, 256, 0, 2, 2000, 1000, 1000))) == outs[0][0].strip()
