"""QA: ``llmsim bench`` with single-token outputs prints and saves what ``vllm bench serve``
does (ITL 0.00, as its ``np.mean(itls or 0)``), not ``nan`` in the table and a bare ``NaN``
in the result JSON (not JSON: strict parsers refuse the file)."""

from __future__ import annotations

import json

from sim.cli import main


def _strict(text: str) -> dict:
    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_single_token_outputs_give_zero_itl_not_nan(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "H100-SXM",
                 "--latency-provider", "roofline", "--num-prompts", "5",
                 "--random-input-len", "64", "--random-output-len", "1",
                 "--metric-percentiles", "50,99", "--save-result",
                 "--result-filename", str(out)]) == 0
    table = capsys.readouterr().out
    assert "nan" not in table.lower(), table
    res = _strict(out.read_text())
    for key in ("mean_itl_ms", "median_itl_ms", "p50_itl_ms", "p99_itl_ms",
                "mean_tpot_ms", "p99_tpot_ms"):
        assert res[key] == 0.0, (key, res[key])
    assert res["completed"] == 5 and res["total_output_tokens"] == 5
    assert res["mean_ttft_ms"] > 0
