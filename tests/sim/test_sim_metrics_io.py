"""The run result's files: the CSVs the CLI writes without pandas equal pandas' own output,
and the `llmsim` import path does not pull pandas in (start-up time)."""

from __future__ import annotations

import subprocess
import sys

from sim_testkit import flat_workload, make_cluster

import sim


def test_csv_writer_matches_pandas(tmp_path, sim_opts):
    wl = flat_workload([(i * 5_000_000, 40 + 17 * i, 1 + (i % 4) * 9) for i in range(24)])
    res = sim.simulate(make_cluster(num_blocks=60), wl, sim_opts(max_num_seqs=8,
                                                                  max_num_batched_tokens=128))
    res.write(tmp_path / "a.csv", None, tmp_path / "a_ts.csv")
    res.requests_table().to_csv(tmp_path / "b.csv", index=False)
    res.timeseries_table().to_csv(tmp_path / "b_ts.csv", index=False)
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert (tmp_path / "a_ts.csv").read_text() == (tmp_path / "b_ts.csv").read_text()
    ids = [row[0] for row in res.request_rows()]
    assert ids == sorted(ids) and len(ids) == 24


def test_llmsim_import_path_leaves_pandas_out():
    code = "import sys, sim.cli; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
