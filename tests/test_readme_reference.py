"""The README's field reference is generated (python -m dse.reference --write) and current."""

from __future__ import annotations

from dse.reference import README, main, render


def test_readme_field_reference_is_current():
    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "run: python -m dse.reference --write"
    assert main(["--check"]) == 0


def test_a_stale_reference_is_caught_and_rewritten():
    text = README.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `max_num_seqs` |"))
    stale = text.replace(row, row.replace("`256`", "`128`"))
    assert stale != text and render(stale) == text
    assert "`search.n_trials` | integer >= 1 | `50`" in text


def test_a_new_routing_policy_or_provider_leaves_the_reference_as_is(monkeypatch):
    """Registries are named, not listed, so adding a policy or provider stays one file."""
    from dse.reference import sections
    from sim.latency.base import LATENCY_PROVIDERS
    from sim.router import ROUTING_POLICIES

    before = sections()
    monkeypatch.setitem(ROUTING_POLICIES._factories, "NEWEST", lambda seed: None)
    monkeypatch.setitem(LATENCY_PROVIDERS._factories, "newprov", object)
    assert "NEWEST" in ROUTING_POLICIES.names()
    assert sections() == before
