"""The report's "Validation error" names what is known for each latency provider used.
Before, results from aiconfigurator's database (``aic``, what ``auto`` picks on H100)
were labelled "end-to-end error of measured profiles: `make validate` ... against a real
vLLM run", a validation that covers the measured bundles only."""

from __future__ import annotations

from dse.report_html import validation_text


def test_aic_is_not_labelled_with_the_measured_validation():
    text = validation_text(["aic"], ("H100-SXM",))
    assert "measured profiles" not in text and "make validate" not in text, text
    assert "aic" in text and "not validated" in text, text


def test_measured_keeps_its_validation():
    text = validation_text(["measured"], ("RTX4090",))
    assert "make validate" in text and "aic" not in text, text


def test_each_provider_used_is_named():
    text = validation_text(["aic", "measured", "roofline"], ("H100-SXM",))
    assert text.count("; ") >= 2 and "roofline:" in text and "aic:" in text, text


def test_pareto_table_names_the_trial_count_plainly():
    """The front's ``repeats`` column counts the trials that evaluated the configuration
    (1: evaluated once); its header read "repeats", so 1 read as "repeated once"."""
    from dse.report_html import label

    assert label("repeats") == "trials of this configuration"
