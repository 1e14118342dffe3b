"""aiconfigurator's list of databases (system -> backend -> versions) is read once and kept
in the user cache, keyed by the installed package's RECORD and version: the package parses
~230 YAML files to answer, ~0.6 s in every process (each Ray actor) that asks aic."""

from __future__ import annotations

import pytest

pytest.importorskip("aiconfigurator_core",
                    reason="aiconfigurator-core not installed (pip install -e '.[aic]')")

from sim.latency import aic  # noqa: E402


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A fresh cache folder, a copy of the package's RECORD as the key's source, and a
    count of the package's own (slow) reads."""
    monkeypatch.setenv("LLMSIM_CACHE_DIR", str(tmp_path / "cache"))
    record = tmp_path / "RECORD"
    record.write_bytes(aic._installed_record().read_bytes())
    monkeypatch.setattr(aic, "_installed_record", lambda: record)
    perf_database, _ = aic._import_aic()
    real = perf_database.get_supported_databases
    calls = []

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(perf_database, "get_supported_databases", counting)
    return calls, record


def read():
    return aic._databases.__wrapped__()  # past the per-process memo


def test_read_once_then_from_the_cache(counted):
    calls, _ = counted
    first = read()
    assert calls == [1]
    second = read()
    assert calls == [1] and second == first
    assert "h100_sxm" in first and "vllm" in first["h100_sxm"]


def test_a_reinstalled_package_is_read_again(counted):
    calls, record = counted
    first = read()
    record.write_bytes(record.read_bytes() + b"aiconfigurator_core/new_file.yaml,,\n")
    assert read() == first and calls == [1, 1]


def test_no_cache_when_turned_off_or_not_installed_from_a_wheel(counted, monkeypatch):
    calls, _ = counted
    monkeypatch.setenv("LLMSIM_CACHE_DIR", "off")
    read(), read()
    assert calls == [1, 1]
    monkeypatch.delenv("LLMSIM_CACHE_DIR")
    monkeypatch.setattr(aic, "_installed_record", lambda: None)
    read()
    assert calls == [1, 1, 1]
