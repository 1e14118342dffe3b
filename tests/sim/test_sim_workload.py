"""Workloads: the JSONL loader (flat requests and sessions, errors) and the generators."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_testkit import make_cluster, opts_for

import sim
from sim.errors import InputError
from sim.workload import LengthDist, WorkloadSpec, generate, load_jsonl, parse_jsonl_lines


def write_jsonl(path, objs_or_lines):
    lines = [o if isinstance(o, str) else json.dumps(o) for o in objs_or_lines]
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------- loader
def test_flat_and_session_lines_mix(tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [
        {"input_toks": 10, "output_toks": 3, "arrival_time_ns": 5_000},
        {"session_id": "s1", "arrival_time_ns": 1_000, "sub_requests": [
            {"input_toks": 20, "output_toks": 2},
            {"input_toks": 30, "output_toks": 4, "tool_duration_ns": 7_000},
            {"input_toks": 40, "output_toks": 5, "tool_duration_ns": 9_000}]},
        "",
        {"input_toks": 11, "output_toks": 1, "arrival_time_ns": 0,
         "input_tok_ids": list(range(11))},
    ])
    w = load_jsonl(p)
    assert w.source == str(p)
    assert w.num_requests == 5
    # heads sorted by arrival; ids follow file order
    assert [(r.rid, r.arrival_ns) for r in w.requests] == [(4, 0), (1, 1_000), (0, 5_000)]
    head = w.requests[1]
    chain = []
    r = head
    while r is not None:
        chain.append(r)
        r = r.next_sub
    assert [c.rid for c in chain] == [1, 2, 3]
    assert [c.sub_index for c in chain] == [0, 1, 2]
    assert {c.session_id for c in chain} == {"s1"}
    assert [c.input_len for c in chain] == [20, 30, 40]
    assert [c.tool_ns for c in chain] == [0, 7_000, 9_000]
    assert w.requests[0].input_ids == list(range(11))
    assert w.requests[2].session_id is None


def test_session_without_id_gets_one_per_line(tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [
        {"arrival_time_ns": 0, "sub_requests": [{"input_toks": 5, "output_toks": 1}]},
        {"arrival_time_ns": 0, "sub_requests": [{"input_toks": 5, "output_toks": 1}]}])
    w = load_jsonl(p)
    assert len({r.session_id for r in w.requests}) == 2


def test_session_turns_chained_with_tool_duration(bundle_root, tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [
        {"session_id": "a", "arrival_time_ns": 0, "sub_requests": [
            {"input_toks": 64, "output_toks": 5},
            {"input_toks": 80, "output_toks": 5, "tool_duration_ns": 3_000_000},
            {"input_toks": 96, "output_toks": 2, "tool_duration_ns": 0}]},
        {"input_toks": 50, "output_toks": 10, "arrival_time_ns": 1_000_000},
        {"session_id": "b", "arrival_time_ns": 500_000, "sub_requests": [
            {"input_toks": 32, "output_toks": 3},
            {"input_toks": 48, "output_toks": 3, "tool_duration_ns": 12_345}]},
    ])
    w = load_jsonl(p)
    r = sim.simulate(make_cluster(300), w, opts_for(bundle_root))
    t = r.requests_table().set_index("request_id")
    assert len(t) == 6 and r.summary["num_finished"] == 6
    tools = {1: 3_000_000, 2: 0, 5: 12_345}
    for rid, tool in tools.items():
        assert t.loc[rid, "arrival_ns"] == t.loc[rid - 1, "last_token_ns"] + tool
        assert t.loc[rid, "sub_request_index"] == t.loc[rid - 1, "sub_request_index"] + 1
    assert t.loc[0, "arrival_ns"] == 0 and t.loc[4, "arrival_ns"] == 500_000
    assert r.summary["num_sessions"] == 2
    # the workload is not modified by the simulation: later turns are still unreleased
    assert [x.arrival_ns for x in w.all_requests() if x.sub_index > 0] == [-1, -1, -1]
    e2e_a = (t.loc[2, "last_token_ns"] - 0) / 1e6
    e2e_b = (t.loc[5, "last_token_ns"] - 500_000) / 1e6
    assert r.summary["session_e2e_ms"]["mean"] == pytest.approx((e2e_a + e2e_b) / 2)


def test_malformed_line_names_file_and_line(tmp_path):
    p = write_jsonl(tmp_path / "bad.jsonl", [
        {"input_toks": 10, "output_toks": 3}, "", '{"input_toks": 5, "output_toks": }'])
    with pytest.raises(InputError) as ei:
        load_jsonl(p)
    assert str(ei.value).startswith(f"{p}:3: malformed JSON")


@pytest.mark.parametrize("line, message", [
    ({"input_toks": -5, "output_toks": 3}, "field 'input_toks' must be >= 0"),
    ({"input_toks": 5, "output_toks": -1}, "field 'output_toks' must be >= 0"),
    ({"input_toks": 0, "output_toks": 3}, "field 'input_toks' must be >= 1"),
    ({"input_toks": 5, "output_toks": 0}, "field 'output_toks' must be >= 1"),
    ({"input_toks": 5}, "missing field 'output_toks'"),
    ({"input_toks": 5.5, "output_toks": 2}, "field 'input_toks' must be an integer"),
    ({"input_toks": True, "output_toks": 2}, "field 'input_toks' must be an integer"),
    ({"input_toks": "5", "output_toks": 2}, "field 'input_toks' must be an integer"),
    ({"input_toks": 5, "output_toks": 2, "arrival_time_ns": -1},
     "field 'arrival_time_ns' must be >= 0"),
    ({"input_toks": 3, "output_toks": 2, "input_tok_ids": [1, 2]},
     "field 'input_tok_ids' has 2 ids but the count field says 3"),
    ({"input_toks": 3, "output_toks": 2, "output_tok_ids": [1, 2, 3]},
     "field 'output_tok_ids' has 3 ids but the count field says 2"),
    ({"input_toks": 3, "output_toks": 2, "input_tok_ids": "abc"},
     "field 'input_tok_ids' must be a list"),
    ([1, 2, 3], "each line must be a JSON object"),
    ({"sub_requests": []}, "field 'sub_requests' must be a non-empty list"),
])
def test_bad_fields_name_file_line_and_field(tmp_path, line, message):
    p = write_jsonl(tmp_path / "w.jsonl", [{"input_toks": 1, "output_toks": 1}, line])
    with pytest.raises(InputError) as ei:
        load_jsonl(p)
    assert str(ei.value).startswith(f"{p}:2")
    assert message in str(ei.value)


def test_bad_sub_request_names_its_index(tmp_path):
    p = write_jsonl(tmp_path / "w.jsonl", [{"sub_requests": [
        {"input_toks": 1, "output_toks": 1}, {"input_toks": -3, "output_toks": 1}]}])
    with pytest.raises(InputError, match=r"w\.jsonl:1: sub_requests\[1\]: field 'input_toks'"):
        load_jsonl(p)


def test_empty_and_missing_files_are_errors(tmp_path):
    p = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(InputError, match="no requests"):
        load_jsonl(p)
    with pytest.raises(InputError, match="cannot read workload"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_limit_counts_sessions_as_one_entry():
    lines = [json.dumps({"sub_requests": [{"input_toks": 2, "output_toks": 1}] * 3}),
             json.dumps({"input_toks": 2, "output_toks": 1}),
             json.dumps({"input_toks": 2, "output_toks": 1})]
    w = parse_jsonl_lines(lines, limit=2)
    assert len(w.requests) == 2 and w.num_requests == 4


# ----------------------------------------------------------------- generators
def gaps_of(w):
    a = np.array(sorted(r.arrival_ns for r in w.requests), dtype=np.float64) / 1e9
    return a, np.diff(a)


def test_poisson_mean_rate_and_first_arrival_at_zero():
    w = generate(WorkloadSpec(num_requests=4000, arrival="poisson", rate=50.0, seed=1))
    a, g = gaps_of(w)
    assert a[0] == 0.0
    assert 1 / g.mean() == pytest.approx(50.0, rel=0.06)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.1)  # exponential: CV 1


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_mean_rate_and_burstiness(cv):
    w = generate(WorkloadSpec(num_requests=4000, arrival="gamma", rate=20.0, cv=cv, seed=2))
    _, g = gaps_of(w)
    assert 1 / g.mean() == pytest.approx(20.0, rel=0.08)
    assert g.std() / g.mean() == pytest.approx(cv, rel=0.15)


def test_generator_is_reproducible_per_seed():
    spec = {"num_requests": 50, "arrival": "gamma", "rate": 5.0, "cv": 1.5,
                "input": LengthDist("uniform", low=10, high=500),
                "output": LengthDist("zipf", low=1, high=100, theta=1.2)}

    def sig(w):
        return [(r.rid, r.arrival_ns, r.input_len, r.output_len) for r in w.requests]

    a = generate(WorkloadSpec(seed=3, **spec))
    b = generate(WorkloadSpec(seed=3, **spec))
    c = generate(WorkloadSpec(seed=4, **spec))
    assert sig(a) == sig(b)
    assert sig(a) != sig(c)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert (LengthDist("fixed", 77).sample(rng, 100, "input") == 77).all()
    u = LengthDist("uniform", low=5, high=9).sample(rng, 2000, "input")
    assert u.min() == 5 and u.max() == 9 and set(u.tolist()) == {5, 6, 7, 8, 9}
    z = LengthDist("zipf", low=10, high=60, theta=1.1).sample(rng, 5000, "output")
    assert z.min() >= 10 and z.max() <= 60
    counts = np.bincount(z - 10, minlength=51)
    assert counts[0] == counts.max()  # rank 1 (the low end) is the most frequent
    assert counts[0] > counts[1] > counts[5] > counts[40]


def test_file_length_distribution_samples_the_files_lengths(tmp_path):
    p = write_jsonl(tmp_path / "src.jsonl", [
        {"input_toks": 111, "output_toks": 7}, {"input_toks": 222, "output_toks": 8},
        {"sub_requests": [{"input_toks": 333, "output_toks": 9}]}])
    rng = np.random.default_rng(0)
    ins = LengthDist("file", path=str(p)).sample(rng, 300, "input")
    outs = LengthDist("file", path=str(p)).sample(rng, 300, "output")
    assert set(ins.tolist()) == {111, 222, 333}
    assert set(outs.tolist()) == {7, 8, 9}
    w = generate(WorkloadSpec(num_requests=40, sample_file=str(p), seed=0))
    pairs = {(r.input_len, r.output_len) for r in w.requests}
    assert pairs <= {(111, 7), (222, 8), (333, 9)} and len(pairs) > 1


@pytest.mark.parametrize("spec, message", [
    (WorkloadSpec(num_requests=0), "num_requests must be >= 1"),
    (WorkloadSpec(rate=0), "arrival rate must be > 0"),
    (WorkloadSpec(arrival="weibull"), "unknown arrival process 'weibull'"),
    (WorkloadSpec(arrival="gamma", cv=0), "gamma cv must be > 0"),
    (WorkloadSpec(input=LengthDist("lognormal")), "unknown length distribution 'lognormal'"),
    (WorkloadSpec(input=LengthDist("file")), "needs a path"),
    # sim.generate(sim.WorkloadSpec(...)) as the README shows it: these were ValueErrors
    # (NaN passed the `<= 0` checks; numpy refused the rest) or a MemoryError
    (WorkloadSpec(rate=float("nan")), "arrival rate must be > 0, got nan"),
    (WorkloadSpec(arrival="gamma", cv=float("nan")), "gamma cv must be > 0, got nan"),
    (WorkloadSpec(seed=-1), r"seed must be an integer >= 0, got -1"),
    (WorkloadSpec(num_requests=10**12), "num_requests must be <= 10,000,000"),
    (WorkloadSpec(input=LengthDist("uniform", low=10, high=5)),
     r"input: low \(10\) must be <= high \(5\)"),
    (WorkloadSpec(output=LengthDist("zipf", low=1, high=10, theta=float("nan"))),
     "output: zipf theta must be > 0, got nan"),
])
def test_generator_errors(spec, message):
    with pytest.raises(InputError, match=message):
        generate(spec)


def test_workload_from_mapping():
    spec = sim.workload_from_mapping({"num_requests": 7, "input": 300,
                                      "output": {"kind": "uniform", "low": 2, "high": 4},
                                      "arrival": "gamma", "cv": 2, "seed": 9})
    assert spec.input == LengthDist("fixed", 300)
    assert spec.output.kind == "uniform" and spec.num_requests == 7 and spec.seed == 9
    with pytest.raises(InputError, match=r"unknown field\(s\) \['mean'\]"):
        sim.workload_from_mapping({"input": {"kind": "fixed", "mean": 3}}, source="spec.yaml")


@pytest.mark.parametrize("n_clients", [1, 3, 8])
def test_closed_loop_never_exceeds_concurrency(bundle_root, n_clients):
    spec = WorkloadSpec(num_requests=30, concurrency=n_clients, seed=5,
                        input=LengthDist("uniform", low=20, high=400),
                        output=LengthDist("uniform", low=1, high=30))
    w = generate(spec)
    assert w.closed_loop_clients == n_clients
    r = sim.simulate(make_cluster(400), w, opts_for(bundle_root))
    t = r.requests_table()
    assert len(t) == 30 and r.summary["num_finished"] == 30
    starts = t.arrival_ns.to_numpy()
    ends = t.last_token_ns.to_numpy()
    for s in starts:
        in_flight = int(((starts <= s) & (ends > s)).sum())
        assert in_flight <= n_clients
    # the first N start together, and each later one starts exactly when another finishes
    assert int((starts == 0).sum()) == min(n_clients, 30)
    assert set(starts[starts > 0].tolist()) <= set(ends.tolist())
