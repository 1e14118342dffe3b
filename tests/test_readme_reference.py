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
