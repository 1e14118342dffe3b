"""A space none of whose configurations can be simulated is refused by ``dse check`` and
``dse search`` with one line and exit 2, naming why. Before, ``dse check`` said "ok: 32
distinct configuration(s)" and ``dse search`` drew until 500 draws in a row were rejected
(150 s and 1,384 MLflow runs for an explicit ``latency_provider: measured`` without a
measured bundle), then exited 0 with "0 trials simulated"."""

from __future__ import annotations

import pytest
import yaml
from dse_testkit import BASE_SPACE, assert_one_line

import dse.study
from dse.cli import main


class _NoDriver:
    def __init__(self, *a, **k):
        raise AssertionError("the search started: the input was not checked first")


CASES = [
    ("batch-tokens-below-seqs",
     {"knobs": {"tp": [1, 2], "max_num_seqs": [16], "max_num_batched_tokens": [8]}},
     ["every one of the 2 configuration(s)", "rejected before simulation",
      "max_num_batched_tokens (8) must be >= max_num_seqs (16)"]),
    ("measured-without-bundle",
     {"simulator": {"latency_provider": "measured"}},
     ["every one of the", "measured", "no bf16 bundle"]),
]


@pytest.mark.parametrize("over,needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_space_with_no_runnable_configuration_is_refused(tmp_path, over, needles, capsys,
                                                         monkeypatch):
    monkeypatch.setattr(dse.study, "Driver", _NoDriver)
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump({**BASE_SPACE, **over}, sort_keys=False))
    assert_one_line(capsys, main(["check", str(p)]), [str(p), *needles])
    assert_one_line(capsys, main(["search", str(p), "--out", str(tmp_path / "o")]),
                    [str(p), *needles])


def test_measured_provider_rejects_only_the_tp_its_bundle_lacks(tmp_path, capsys):
    """The RTX 4090 bundle of Llama-3.1-8B measures tp1 only: a space over tp 1 and 2
    runs, with tp2 rejected before simulation (not drawn, simulated and failed)."""
    from dse.sampling import feasible_set
    from dse.space import load_space

    space = {**BASE_SPACE, "hardware": "RTX4090",
             "budget": {"total_devices": 2, "devices_per_node": 2},
             "knobs": {"tp": [1, 2], "replicas": [1]},
             "simulator": {"latency_provider": "measured"}}
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space, sort_keys=False))
    assert main(["check", str(p)]) == 0, capsys.readouterr().err
    assert "1 distinct configuration(s)" in capsys.readouterr().out
    assert feasible_set(load_space(p)) == [{"tp": 1}]
