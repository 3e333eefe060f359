"""Token-level comparisons in the report: Δ_sym by difficulty, comparisons of the same two settings on several
seeds pooled (a bar is the mean over seeds), each seed's own figure, bins and largest gaps folded below."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import numpy as np

from smallinit.analysis.tokens import TokenGapResult
from smallinit.report import model_figures
from smallinit.report.arrange import describe
from smallinit.report.claims import caveat
from smallinit.report.markup import esc, h2, img, note, num, table, token_text
from smallinit.study.judging.findings_file import JudgedClaim

Named = tuple[str, TokenGapResult]  # a comparison and the file it came from


def _pools(compares: list[Named]) -> list[list[Named]]:
    """Comparisons of the same two settings on different seeds, together (in order of first appearance); one
    without recorded settings stands alone."""
    pools: dict[str, list[Named]] = {}
    for name, res in compares:
        a, b = res.meta.get("settings_a"), res.meta.get("settings_b")
        key = (
            json.dumps(
                [{k: v for k, v in s.items() if k != "train.seed"} for s in (a, b)],
                sort_keys=True,
                default=str,
            )
            if isinstance(a, dict) and isinstance(b, dict)
            else name
        )
        pools.setdefault(key, []).append((name, res))
    return list(pools.values())


def _pool_labels(res: TokenGapResult) -> tuple[str, str]:
    """The two settings of a pool, named by what differs between them (γ=1 vs γ=0.5)."""
    a, b = res.meta["settings_a"], res.meta["settings_b"]
    keys = [k for k in a if k != "train.seed" and a.get(k) != b.get(k)] or ["model.gamma"]
    la, lb = (describe(s, keys) for s in (a, b))
    return la, lb


@dataclass(frozen=True)
class TokenPool:
    """One pair of settings: its comparisons (one per seed) and, with several, the per-bin means over seeds."""

    label_a: str
    label_b: str
    comparisons: list[Named]
    bins: list[
        list[float]
    ]  # per bin: tokens over all seeds, mean Δ_sym, its SE, loss B − A, its SE (over seeds)


def token_pools(compares: list[Named]) -> list[TokenPool]:
    out = []
    for pool in _pools(compares):
        if len(pool) == 1:
            res = pool[0][1]
            out.append(TokenPool(res.meta.get("label_a", "A"), res.meta.get("label_b", "B"), pool, []))
            continue
        results = [res for _, res in pool]
        k = min(len(r.bins) for r in results)
        cols = []  # per bin: mean over seeds and its SE, of Δ_sym and of the loss difference
        for key in ("mean_delta_sym", "mean_loss_diff"):
            per_seed = np.array([[getattr(b, key) for b in r.bins[:k]] for r in results])
            cols += [per_seed.mean(axis=0), per_seed.std(axis=0, ddof=1) / math.sqrt(len(results))]
        bins = [[sum(r.bins[i].count for r in results), *(c[i] for c in cols)] for i in range(k)]
        out.append(TokenPool(*_pool_labels(results[0]), pool, bins))
    return out


DESCRIPTIVE = (
    "Descriptive, not a test: the difficulty bins come from the losses of the same two models whose gap the bars "
    "show, so a bar leaning either way is selected on their own differences."
)


@dataclass(frozen=True)
class TokenSection:
    pools: list[TokenPool]
    c7: JudgedClaim | None  # the claim these bars illustrate, where it was judged


def token_section(compares: list[Named], c7: JudgedClaim | None) -> TokenSection:
    return TokenSection(token_pools(compares), c7)


def _detail(name: str, res: TokenGapResult, heading: str, told: str = "") -> str:
    """One comparison: its numbers, figure, bins and largest gaps (``heading``: h2 alone, h3 inside a pool)."""
    la, lb = res.meta.get("label_a", "A"), res.meta.get("label_b", "B")
    text = (
        f"{res.tokens:,} tokens; mean Δ_sym {res.mean_delta_sym:+.4f}; mean loss {la} {res.mean_loss_a:.4f}, "
        f"{lb} {res.mean_loss_b:.4f}. Δ_sym = (p_A − p_B)/(p_A + p_B) on the true next token, A = {la}, B = {lb}; "
        f"difficulty = mean of the two losses, quantile bins. ({name})"
    )
    parts = [
        f"<{heading}>Token level: {esc(la)} vs {esc(lb)}</{heading}>",
        note(text),
        img(model_figures.token_gap_figure(res, la, lb), "token gap by difficulty"),
        told,
        table(
            ["bin", "difficulty from", "to", "tokens", "mean Δ_sym", "Δ_sym SE", "loss B − A", "loss SE"],
            [
                [
                    i + 1,
                    b.lo,
                    b.hi,
                    b.count,
                    b.mean_delta_sym,
                    b.se_delta_sym,
                    b.mean_loss_diff,
                    b.se_loss_diff,
                ]
                for i, b in enumerate(res.bins)
            ],
        ),
    ]
    for title, items in (
        (f"largest gaps where {la} is better", res.top_a),
        (f"largest gaps where {lb} is better", res.top_b),
    ):
        if not items:
            continue
        rows = "".join(
            f'<tr><td><code class="tok">{token_text(t.context_text, spaces=False)}</code></td>'
            f'<td><code class="tok">{token_text(t.target_text)}</code></td><td>{num(t.p_a)}</td>'
            f"<td>{num(t.p_b)}</td><td>{num(t.delta_sym)}</td></tr>"
            for t in items
        )
        parts.append(
            f"<details><summary>{esc(title)} ({len(items)} tokens)</summary>"
            + f"<table><thead><tr><th>context</th><th>true token (⏎ newline, ␠ space)</th><th>p {esc(la)}</th>"
            f"<th>p {esc(lb)}</th><th>Δ_sym</th></tr></thead><tbody>{rows}</tbody></table>" + "</details>"
        )
    return "".join(parts)


def render_tokens(s: TokenSection) -> list[str]:
    parts = []
    told = caveat(DESCRIPTIVE, s.c7)
    for pool in s.pools:
        if len(pool.comparisons) == 1:
            parts.append(_detail(*pool.comparisons[0], heading="h2", told=told))
            continue
        la, lb, n = pool.label_a, pool.label_b, len(pool.comparisons)
        results = [res for _, res in pool.comparisons]
        gaps = [r.mean_delta_sym for r in results]
        parts += [
            h2(f"Token level: {la} vs {lb} ({n} seeds pooled)"),
            note(
                f"{sum(r.tokens for r in results):,} tokens over {n} seeds; mean Δ_sym "
                f"{statistics.fmean(gaps):+.4f} (seeds {min(gaps):+.4f} to {max(gaps):+.4f}); Δ_sym = "
                f"(p_A − p_B)/(p_A + p_B) on the true next token, A = {la}, B = {lb}. Difficulty = mean of the two "
                "losses, in each seed's own quantile bins; a bar is the mean over seeds, ± 2 SE over seeds (the "
                "seeds are the independent samples), a dot one seed."
            ),
            img(
                model_figures.token_gap_pooled_figure(results, la, lb),
                "token gap by difficulty, seeds pooled",
            ),
            told,
            table(
                [
                    "bin",
                    "tokens (all seeds)",
                    "mean Δ_sym",
                    "Δ_sym SE over seeds",
                    "loss B − A",
                    "loss SE over seeds",
                ],
                [[i + 1, *row] for i, row in enumerate(pool.bins)],
            ),
            f"<details><summary>each seed on its own: {n} comparisons (figure, bins, largest gaps)"
            f"</summary>{''.join(_detail(name, res, heading='h3') for name, res in pool.comparisons)}</details>",
        ]
    return parts
