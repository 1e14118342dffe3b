"""What `llmsim run` loads: no heavy library it does not use, and summary statistics
computed without numpy that are numpy's numbers bit for bit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from sim_testkit import cluster_dict, make_bundle

from sim.metrics import PERCENTILES, GapRuns, stats_ms

# Never on the `llmsim run` path (the DSE driver's and the reports' libraries).
HEAVY = ("pandas", "plotly", "mlflow", "ray", "optuna", "scipy", "torch", "aiconfigurator_core")
# Not needed by a run of a dense model whose profile bundle and cluster file are in the
# cache (the first run validates the cluster file with pydantic: sim/cluster_schema.py).
NOT_NEEDED = ("numpy", "yaml", "google.protobuf", "pydantic", "pydantic_core")

_MODULES = r"""
import json, sys
{body}
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(body: str, env: dict | None = None) -> set[str]:
    out = subprocess.run([sys.executable, "-c", _MODULES.format(body=body)], check=True,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})}).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def _loaded(mods: set[str], names) -> list[str]:
    return [n for n in names if n in mods or any(m.startswith(n + ".") for m in mods)]


def test_import_of_the_cli_loads_nothing_heavy():
    mods = _modules_after("import sim.cli\nimport sim")
    assert _loaded(mods, HEAVY + NOT_NEEDED) == []


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("startup")
    make_bundle(d / "profiles")
    (d / "cluster.json").write_text(json.dumps(cluster_dict(300)))
    (d / "w.jsonl").write_text("\n".join(json.dumps(
        {"input_toks": 20 + i, "output_toks": 3, "arrival_time_ns": i * 1000,
         "input_tok_ids": list(range(i, i + 20 + i))}) for i in range(5)) + "\n")
    return d


def test_llmsim_run_loads_nothing_it_does_not_use(run_files, tmp_path):
    d = run_files
    args = ["run", "--cluster", str(d / "cluster.json"), "--dataset", str(d / "w.jsonl"),
            "--profiles", str(d / "profiles"), "--latency-provider", "measured",
            "--output", str(tmp_path / "o.csv")]
    body = f"from sim.cli import main\nassert main({args!r}) == 0"
    env = {"LLMSIM_CACHE_DIR": str(tmp_path / "cache")}
    first = _modules_after(body, env)   # parses the bundle and the cluster, fills the cache
    assert _loaded(first, HEAVY) == [] and "pydantic" in first
    warm = _modules_after(body, env)
    assert _loaded(warm, HEAVY + NOT_NEEDED) == []
    assert (tmp_path / "o.csv").read_text().count("\n") == 6


def test_the_chakra_enums_do_not_need_protobuf():
    mods = _modules_after("import astrasim\nfrom astrasim.chakra import NodeType\n"
                          "assert NodeType.COMP_NODE == 4")
    assert _loaded(mods, ("google.protobuf",)) == []
    mods = _modules_after("from astrasim import chakra\nassert chakra.Node(id=3).id == 3")
    assert "google.protobuf" in mods


def _sizes():
    return [*range(1, 40), 127, 128, 129, 255, 256, 1000, 8191, 8192, 8193, 20001, 100003]


@pytest.mark.parametrize("use_numpy", [False, True])
@pytest.mark.parametrize("n", _sizes())
def test_stats_are_numpys_bit_for_bit(n, use_numpy):
    rng = random.Random(n)
    cases = [
        [rng.randint(0, 10**12) for _ in range(n)],                      # ns as ints
        [rng.random() * 10 ** rng.randint(0, 12) for _ in range(n)],     # mixed magnitudes
        [rng.choice([5_000_000, 7_250_001, 31_999_999]) for _ in range(n)],  # many ties
    ]
    for values in cases:
        a = np.asarray(values, dtype=np.float64) / 1e6
        want = {"mean": float(a.mean()),
                **{f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES))}}
        got = stats_ms(values, use_numpy)
        assert got == want  # exact: not approx
        assert all(type(v) is float for v in got.values())


@pytest.mark.parametrize("use_numpy", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 129, 1000, 20001])
def test_gap_runs_give_the_stats_of_every_gap(n, use_numpy):
    """The inter-token gaps kept as runs: the same statistics, bit for bit, as the list of
    every gap (through numpy and through pure Python)."""
    rng = random.Random(n)
    runs = GapRuns()
    every: list[int] = []
    while len(every) < n:
        gap = rng.choice([rng.randint(1, 10**9), 5_000_000, 7_250_001])
        count = min(n - len(every), rng.choice([1, 1, 3, 16, 200]))
        runs.add(gap, count)
        every += [gap] * count
    assert runs.expanded() == every and len(runs) == n
    got, want = runs.stats_ms(use_numpy), stats_ms(every, use_numpy=False)
    assert got.keys() == want.keys()
    assert all(got[k] == want[k] or (got[k] != got[k] and want[k] != want[k]) for k in got)
    assert len(runs.values) <= n  # equal neighbours share a run
    assert all(a != b for a, b in zip(runs.values, runs.values[1:]))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 127, 128, 129, 255, 1000, 4099, 20001])
@pytest.mark.parametrize("zero_runs", [False, True])
def test_run_reader_sums_runs_as_numpy_sums_every_value(n, zero_runs):
    """The compiled path's mean (``_RunReader``: numpy's pairwise sum read straight from
    the runs) and the Python path's (``_pairwise_sum`` of every value) are
    ``np.add.reduce``'s bits, with runs of any length (empty ones too)."""
    from sim.metrics import _pairwise_sum, _RunReader

    rng = random.Random(n)
    values: list[float] = []
    counts: list[int] = []
    total = 0
    while total < n:
        if zero_runs and rng.random() < 0.2:
            values.append(rng.random())
            counts.append(0)
        c = min(n - total, rng.choice([1, 2, 5, 8, 31, 200]))
        values.append(rng.randint(0, 10**9) / 1e6)
        counts.append(c)
        total += c
    every = [v for v, c in zip(values, counts) for _ in range(c)]
    want = float(np.add.reduce(np.asarray(every, dtype=np.float64)))
    assert _RunReader(values, counts).sum(n) == want
    assert _pairwise_sum(every, 0, n) == want


def test_stats_of_nothing_are_nan():
    s = stats_ms([])
    assert all(v != v for v in s.values()) and set(s) == {"mean", *(f"p{p}" for p in PERCENTILES)}
    assert stats_ms(iter([2_000_000, 4_000_000]))["mean"] == 3.0


@pytest.mark.parametrize("ids", [[1, -1, 2], [1, 2**63, 2], [1, 2.0, 3], [1, "2", 3],
                                 [1, None, 3], [1, True, 3], [False, 1, 2], [1, [2], 3]])
def test_token_ids_are_checked_element_by_element(ids):
    from sim.errors import InputError
    from sim.workload import parse_jsonl_lines

    line = json.dumps({"input_toks": 3, "output_toks": 1, "input_tok_ids": ids})
    with pytest.raises(InputError, match="input_tok_ids.*integer token ids >= 0"):
        parse_jsonl_lines([line], "w.jsonl")
    # and the largest id there is
    ok = json.dumps({"input_toks": 3, "output_toks": 1, "input_tok_ids": [0, 2**63 - 1, 5]})
    assert parse_jsonl_lines([ok], "w.jsonl").requests[0].input_ids == [0, 2**63 - 1, 5]
