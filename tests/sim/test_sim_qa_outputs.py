"""QA: the files `llmsim run` writes hold no NaN, no sentinel read as a latency.

A request refused at arrival (prompt at or over --max-model-len) or one still running when
the simulation stops has no first token or no last one; its latency columns are empty
fields (pandas reads them as NaN), not ``-1 - arrival``. A summary statistic over no values
is JSON ``null`` in the file (``NaN`` is not JSON: ``jq``, JavaScript and strict parsers
refuse the whole file).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import sim
from sim.cli import main

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "../shared/data/llmservingsim-configs/cluster/single_node_single_instance.json"

pytestmark = pytest.mark.skipif(not CLUSTER.exists(), reason="shared data not present")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(tmp_path: Path, rows: list[dict], *extra: str) -> tuple[list[dict], str]:
    wl = _jsonl(tmp_path / "w.jsonl", rows)
    out = tmp_path / "o.csv"
    assert main(["run", "--cluster", str(CLUSTER), "--dataset", str(wl), "--output", str(out),
                 *extra]) == 0
    with open(out, newline="") as fh:
        table = list(csv.DictReader(fh))
    return table, (tmp_path / "o.summary.json").read_text()


def _strict_json(text: str) -> dict:
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_refused_request_has_no_negative_latency(tmp_path, capsys):
    # the refused request arrives at 5 s: its TTFT was written as -1 - 5e9 ns
    table, _ = _run(tmp_path, [
        {"input_toks": 100, "output_toks": 4, "arrival_time_ns": 0},
        {"input_toks": 2000, "output_toks": 4, "arrival_time_ns": 5_000_000_000},
    ], "--max-model-len", "1000")
    refused = table[1]
    for col in ("first_token_ns", "last_token_ns", "ttft_ns", "tpot_ns", "latency_ns",
                "queueing_ns"):
        assert refused[col] == "", (col, refused[col])
    served = table[0]
    assert int(served["ttft_ns"]) > 0 and int(served["latency_ns"]) >= int(served["ttft_ns"])
    for row in table:
        for col, v in row.items():
            if col.endswith("_ns") and v != "":
                assert int(v) >= 0, (col, v)


def test_summary_file_is_strict_json_when_no_request_finishes(tmp_path, capsys):
    _, text = _run(tmp_path, [{"input_toks": 2000, "output_toks": 4, "arrival_time_ns": 0}],
                   "--max-model-len", "1000")
    s = _strict_json(text)
    assert s["num_finished"] == 0 and s["rejected_requests"] == 1
    assert s["ttft_ms"]["mean"] is None and s["latency_ms"]["p99"] is None
    printed = capsys.readouterr().out
    assert "nan" not in printed.lower()


def test_summary_file_is_strict_json_when_every_output_is_one_token(tmp_path, capsys):
    _, text = _run(tmp_path, [{"input_toks": 50, "output_toks": 1, "arrival_time_ns": 0}])
    s = _strict_json(text)
    assert s["tpot_ms"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    assert s["ttft_ms"]["mean"] > 0
    assert "nan" not in capsys.readouterr().out.lower()


def test_unfinished_request_has_no_latency_and_library_summary_keeps_nan(tmp_path):
    cluster = sim.load_cluster(CLUSTER)
    wl = sim.load_jsonl(_jsonl(tmp_path / "w.jsonl", [
        {"input_toks": 100, "output_toks": 2000, "arrival_time_ns": 0}]))
    res = sim.simulate(cluster, wl, sim.SimOptions(max_sim_time_ns=200_000_000))
    (row,) = res.request_rows()
    cols = dict(zip(sim.metrics.REQUEST_COLUMNS, row))
    assert cols["ttft_ns"] is not None and cols["ttft_ns"] > 0  # it got its first token
    assert cols["latency_ns"] is None and cols["tpot_ns"] is None  # but never finished
    assert res.summary["num_finished"] == 0
    # in memory the statistics stay floats (NaN), as library callers compute with them
    assert res.summary["ttft_ms"]["mean"] != res.summary["ttft_ms"]["mean"]


def test_session_turns_never_sent_have_no_arrival(tmp_path, capsys):
    # the second turn is refused (prompt over --max-model-len); vLLM's client gets an
    # error and the session's third turn is never sent: its arrival was written as -1
    table, text = _run(tmp_path, [{"session_id": "s", "arrival_time_ns": 0, "sub_requests": [
        {"input_toks": 100, "output_toks": 4, "tool_duration_ns": 10**8},
        {"input_toks": 2000, "output_toks": 4, "tool_duration_ns": 10**8},
        {"input_toks": 300, "output_toks": 4}]}], "--max-model-len", "1000")
    first, refused, unsent = table
    assert int(first["arrival_ns"]) == 0 and int(refused["arrival_ns"]) > 0
    assert unsent["arrival_ns"] == "" and unsent["ttft_ns"] == ""
    s = _strict_json(text)
    assert s["num_finished"] == 1 and s["rejected_requests"] == 2


def test_max_model_len_past_the_model_context_warns(tmp_path, capsys):
    # vLLM 0.19 refuses to start ("User-specified max_model_len (200000) is greater than
    # the derived max_model_len (max_position_embeddings=131072 ...)") unless
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; the run went on without a word about it
    _run(tmp_path, [{"input_toks": 50, "output_toks": 3, "arrival_time_ns": 0}],
         "--max-model-len", "200000")
    out = capsys.readouterr().out
    assert "warning: vLLM would refuse to start: max_model_len=200,000 is more than " \
           "meta-llama/Llama-3.1-8B's max_position_embeddings=131,072" in out, out
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in out


def test_max_model_len_within_the_context_does_not_warn(tmp_path, capsys):
    _run(tmp_path, [{"input_toks": 50, "output_toks": 3, "arrival_time_ns": 0}],
         "--max-model-len", "131072")
    assert "max_position_embeddings" not in capsys.readouterr().out
