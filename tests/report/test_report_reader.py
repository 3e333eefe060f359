"""What a reader of the report sees: a one-line reason beside each verdict with the detail folded, each figure's
caveat beside it (the residual-flow points are not C5's test; the token bars are descriptive, as C7 says), legends
in words, and figures drawn at a width a person reads. Cheap: planted folders, no training."""

from __future__ import annotations

import base64
import io
import json
import re

from PIL import Image

from smallinit.cli import main
from support.report import fake_run, gap_result

REASON = (
    "descriptive: the bins are chosen by the same models whose profile is judged; and γ=1 is not better on "
    "average here (mean Δ_sym interval [-0.06, -0.03] not above 0)"
)


def _claim(key: str, verdict: str, reason: str, labels: tuple[str, ...]) -> dict:
    comparisons = [
        {"label": label, "text": f"{label}: +0.1 ± 0.02 (n=9)", "verdict": verdict, "reason": reason}
        for label in labels
    ]
    comparisons[0]["role"] = "primary"
    return {"claim": key, "statement": f"{key} says", "verdict": verdict, "comparisons": comparisons}


def _findings(folder, *claims: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "findings.json").write_text(
        json.dumps({"recipe": "demo", "title": "t", "claims": list(claims)})
    )


def _report(folder) -> str:
    assert main(["report", str(folder)]) == 0
    return (folder / "report.html").read_text(encoding="utf-8")


def _section(page: str, heading: str) -> str:
    return page.split(heading, 1)[1].split("<h2>", 1)[0]


def test_a_verdict_has_one_line_of_reason_and_its_detail_folded(tmp_path):
    """C7's two comparisons fail the same precondition: the reason is said once, in one line beside the verdict
    (up to its first clause), and the comparisons are folded beneath it."""
    _findings(tmp_path, _claim("C7", "not testable here", REASON, ("mid−easy", "mid−noisiest")))
    page = _report(tmp_path)
    row = re.search(r"<tr><td>C7</td>(.*?)</tr>", page, re.S)[1]
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    why, _, folded = cells[-1].partition("<details>")
    assert why == "mid−easy: descriptive: the bins are chosen by the same models whose profile is judged"
    assert "<li>primary: mid−easy" in folded and "<li>mid−noisiest" in folded
    assert page.count("not better on average here") == 1  # the full reason once, in the fold


def test_the_flow_figure_says_it_is_not_c5s_test(tmp_path):
    """Fig. 3a's fit over γ at one width reads like a refutation of k = 1; C5 is judged from the width sweep,
    and its verdict stands beside the figure."""
    for gamma in (0.5, 1.0):
        folder = tmp_path / f"g{gamma}"
        fake_run(folder, 3.0, f"model.gamma={gamma}")
        with open(folder / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"event": "analysis", "step": 0, "residual_flow": 2.0 / gamma}) + "\n")
    _findings(tmp_path, _claim("C5", "inconclusive", "95% t-interval [-0.17, -0.01]; p = 0.11", ("exp γ1",)))
    flow = _section(_report(tmp_path), "<h2>Residual flow (Fig. 3a)</h2>")
    figure = flow.index('alt="residual flow against gamma"')
    caveat = re.search(r'<p class="caveat">(.*?)</p>', flow[figure:], re.S)[1]
    assert caveat.startswith("Not C5&#x27;s test") and "at width 32" in caveat
    assert (
        '<span class="v v-inconclusive">inconclusive</span> exp γ1: 95% t-interval [-0.17, -0.01]; p = 0.11'
        in (caveat)
    )


def test_the_token_bars_carry_c7s_caveat(tmp_path):
    for seed, shift in ((0, 0.0), (1, 0.1), (2, 0.2)):
        gap_result(seed, shift).save(tmp_path / f"seed{seed}")
    _findings(tmp_path, _claim("C7", "not testable here", REASON, ("mid−easy",)))
    tokens = _section(_report(tmp_path), "<h2>Token level: γ = 1 vs γ = 0.5 (3 seeds pooled)</h2>")
    figure = tokens.index('alt="token gap by difficulty, seeds pooled"')
    caveat = re.search(r'<p class="caveat">(.*?)</p>', tokens[figure:], re.S)
    assert caveat and caveat.start() < tokens[figure:].index("<table")  # beside the bars, before their table
    assert caveat[1].startswith("Descriptive, not a test") and "C7: <span" in caveat[1]


def test_figures_are_drawn_at_a_width_a_person_reads(tmp_path):
    """A one-panel figure was 450 px wide on a 1,150 px column (≈ 330 px in a 1,400 px screenshot's scale)."""
    traj = {"tokens_per_param": [0, 5, 10, 20], "gaps": [[0.1, 0.05, 0.02, 0.01], [0.2, 0.1, 0.0, -0.01]]}
    claim = _claim("C1", "inconclusive", "p = 0.3", ("gap",))
    claim["comparisons"][0]["trajectory"] = traj
    _findings(tmp_path, claim)
    data = re.search(
        r'alt="loss gaps along training" src="data:image/png;base64,([^"]+)"', _report(tmp_path)
    )[1]
    width = Image.open(io.BytesIO(base64.b64decode(data))).width
    assert 600 <= width <= 1150, width


def test_legends_name_settings_in_words():
    from smallinit.report.arrange import describe

    baseline = {
        "model.gamma": 1.0,
        "model.norm_eps": 1e-05,
        "model.norm_eps_width": 2048,
        "model.gate": "none",
    }
    fixed = {
        "model.gamma": 1.0,
        "model.norm_eps": 1e-12,
        "model.norm_eps_width": 0,
        "model.gate": "elementwise",
    }
    keys = ["model.gate", "model.norm_eps", "model.norm_eps_width"]
    assert describe(baseline, keys) == "no gate, emulated ε = 1e-5 (d = 2048)"
    assert describe(fixed, keys) == "elementwise gate, ε = 1e-12"
    assert describe(fixed, ["model.norm_eps_width"]) == "ε not emulated"  # never an internal key=value
    assert (
        describe({"train.steps": None, "train.lr": 0.003}, ["train.steps", "train.lr"])
        == "steps unset, lr = 0.003"
    )
