"""QA: a session's id names one session. Two lines with the same session_id (or 5 and
"5", or an id equal to the default 'session-<line>' of another line) were merged into
one session in the summary (num_sessions 1 instead of 2, session_e2e_ms measured from
the first one's arrival to the other's end); a session_id that is a list was written as
its Python repr ("['a']"); a line with both sub_requests and input_toks ran as a session,
its input_toks ignored."""

from __future__ import annotations

import pytest

import sim
from sim.workload import parse_jsonl_lines

S = '{{"session_id": {sid}, "sub_requests": [{{"input_toks": 2, "output_toks": 2}}]}}'


@pytest.mark.parametrize("lines,needles", [
    ([S.format(sid='"a"'), S.format(sid='"a"')], ["w.jsonl:2", "session_id 'a'", "line 1"]),
    ([S.format(sid="5"), S.format(sid='"5"')], ["w.jsonl:2", "session_id '5'", "line 1"]),
    # line 2 without an id gets 'session-2', which line 1 took
    ([S.format(sid='"session-2"'), '{"sub_requests": [{"input_toks": 2, "output_toks": 2}]}'],
     ["w.jsonl:2", "'session-2'", "line 1"]),
    ([S.format(sid='["a"]')], ["w.jsonl:1", "'session_id'", "a string or an integer"]),
    ([S.format(sid="true")], ["w.jsonl:1", "'session_id'", "a string or an integer"]),
    (['{"input_toks": 5, "output_toks": 1, "sub_requests": '
      '[{"input_toks": 2, "output_toks": 2}]}'],
     ["w.jsonl:1", "'input_toks'", "sub_requests", "not both"]),
])
def test_session_line_refused(lines, needles):
    with pytest.raises(sim.InputError) as exc:
        parse_jsonl_lines([ln + "\n" for ln in lines], source="w.jsonl")
    msg = str(exc.value)
    for n in needles:
        assert n in msg, (n, msg)


def test_distinct_sessions_still_load():
    wl = parse_jsonl_lines([S.format(sid='"a"') + "\n", S.format(sid="7") + "\n",
                            '{"sub_requests": [{"input_toks": 2, "output_toks": 2}]}\n',
                            '{"input_toks": 3, "output_toks": 1}\n'], source="w.jsonl")
    assert sorted(r.session_id or "-" for r in wl.requests) == ["-", "7", "a", "session-3"]


def test_negative_priority_runs_first_as_in_vllm(tmp_path):
    # vLLM's priority is any int (lower runs first); -5 was refused ("must be >= 0")
    from pathlib import Path

    lines = ['{"input_toks": 40, "output_toks": 4, "priority": 0}\n',
             '{"input_toks": 40, "output_toks": 4, "priority": -5}\n',
             '{"input_toks": 40, "output_toks": 4, "priority": 3}\n']
    wl = parse_jsonl_lines(lines, source="w.jsonl")
    assert sorted(r.priority for r in wl.requests) == [-5, 0, 3]
    cluster = sim.load_cluster(Path(__file__).resolve().parents[2] / "../shared/data/"
                               "llmservingsim-configs/cluster/single_node_single_instance.json")
    res = sim.simulate(cluster, wl, sim.SimOptions(scheduling_policy="priority", max_num_seqs=1,
                                                   latency_provider="roofline"))
    first = {r.priority: r.first_token_ns for r in res.requests}
    assert first[-5] < first[0] < first[3], first


@pytest.mark.parametrize("value", ["-9223372036854775809", "1e30", "\"high\""])
def test_priority_out_of_int64_still_refused(value):
    with pytest.raises(sim.InputError, match="'priority'"):
        parse_jsonl_lines(['{"input_toks": 4, "output_toks": 1, "priority": %s}\n' % value])
