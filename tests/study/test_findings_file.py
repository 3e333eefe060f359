"""findings.json read once into the types beside its writer, and the analyses that write it registering
themselves, as the claims do."""

from __future__ import annotations

import pytest

from smallinit.study.judging.claims import ClaimResult, Comparison, judge_table
from smallinit.study.judging.verdicts import INCONCLUSIVE


def test_a_judged_claim_reads_back_as_it_was_written():
    from smallinit.study.judging.findings_file import Findings

    claim = ClaimResult("C4", "γ = 1 beats γ = 0.5", "+0.05 nats")
    claim.comparisons.append(
        Comparison.by_seed("L(γ.5)−L(γ1)", {0: 0.1, 1: 0.12, 2: 0.09}, "> 0", role="primary")
    )
    claim.comparisons.append(Comparison.missing("effective size", "needs ≥ 3 sizes"))
    claim.notes.append("a note")
    judge_table([claim])
    written = {"recipe": "demo", "scale": "quick", "title": "t", "losses": [1], "claims": [claim.to_dict()]}
    f = Findings.from_dict(written)
    (c,) = f.claims
    assert (f.recipe, f.scale, f.title, f.numbers) == ("demo", "quick", "t", {"losses": [1]})
    assert (c.key, c.verdict, c.notes) == ("C4", claim.verdict, ("a note",))
    primary, other = c.primary_first()
    assert primary.primary and primary.label == "L(γ.5)−L(γ1)" and primary.samples == [0.1, 0.12, 0.09]
    assert primary.text == claim.comparisons[0].text() and primary.reason == claim.comparisons[0].reason
    assert other.reason == "needs ≥ 3 sizes" and not other.primary


def test_findings_from_another_version_read_with_defaults_and_other_files_are_refused():
    from smallinit.study.judging.findings_file import Findings

    old = Findings.from_dict({"claims": [{"claim": "C1", "comparisons": [{"label": "x", "extra_field": 1}]}]})
    assert old.claims[0].verdict == INCONCLUSIVE and old.claims[0].comparisons[0].label == "x"
    assert old.recipe is None and old.title == ""
    with pytest.raises(KeyError):
        Findings.from_dict({"claims": "C1"})  # not findings.json: the report skips it
    with pytest.raises(TypeError):
        Findings.from_dict({"claims": [{"claim": "C1", "comparisons": "none"}]})


def test_every_findings_step_registers_itself_once():
    from smallinit.study.judging.findings import FINDINGS, findings_step

    assert list(FINDINGS) == [
        "claims",
        "fig1",
        "fig2",
        "fig3",
        "muon",
        "condensation",
        "tokens",
        "reasoning",
        "sink",
    ]
    assert all(fn.__name__ == f"{name}_findings" for name, fn in FINDINGS.items())
    with pytest.raises(ValueError, match="fig1 is registered twice"):
        findings_step("fig1")(lambda out, claims, options, say: {})
    assert FINDINGS["fig1"].__name__ == "fig1_findings"
