"""experiments/tp_replay_audit.py: the likely unseen RTX PRO 6000 runs. At TP 1 a step is
the bundle's rows; at TP 2 the rest is exactly vLLM's TP collectives on the file's link."""

from __future__ import annotations

import pytest

import sim
from sim.paths import shared_data_root

audit = pytest.importorskip("experiments.tp_replay_audit")

pytestmark = pytest.mark.skipif(
    not (shared_data_root() / audit.VISIBLE).is_file()
    or not (shared_data_root() / "profiles" / "RTXPRO6000" / "Qwen" / "Qwen3-32B").is_dir(),
    reason="needs ../shared/data (validation and profiles)")


class _Args:
    max_num_seqs = 256
    max_num_batched_tokens = 2048


def test_tp1_steps_are_the_bundle_rows_summed_by_hand():
    for model in ("meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B"):
        for row in audit.step_rows(model, 1, _Args):
            assert abs(float(row[4])) < 0.001, row  # ms; int ns per layer truncated


def test_tp2_steps_add_exactly_the_tp_collectives():
    from sim.backend import _act_bytes, _logits_bytes, custom_all_reduce_below
    from sim.graph_generator import tp_collective_graphs

    s = sim.Simulator(audit.cluster_for("Qwen/Qwen3-32B", 2), audit.options(_Args))
    inst = s.instances[0]
    engine = s.backend._engine(inst)

    def cycles(graphs):
        return max(r.cycles for r in engine.run(graphs).values())

    rows = {r[1]: r for r in audit.step_rows("Qwen/Qwen3-32B", 2, _Args)}
    for label, shape, *_ in audit.STEPS:
        ar = cycles(tp_collective_graphs(2, "all_reduce", _act_bytes(inst, shape),
                                         one_shot_below=custom_all_reduce_below(inst)))
        ag = cycles(tp_collective_graphs(2, "all_gather", _logits_bytes(inst, shape)))
        comm_ms = ((2 * inst.model.num_hidden_layers + 1) * ar + ag) / 1e6
        assert abs(float(rows[label][4]) - comm_ms) < 0.001 + 64e-6, label
