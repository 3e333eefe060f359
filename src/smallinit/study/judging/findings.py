"""The findings of each recipe (its findings.json): read its finished runs, measure, judge the claims it covers.

Each takes the recipe's output folder and the scale's ``options`` and returns a JSON-able dict
with ``claims`` (see :mod:`.claims`) and the numbers behind the figures. Options (all optional):

* ``flow_gammas``, ``flow_widths``, ``flow_seeds``, ``flow_layers`` — the residual-flow sweep on fresh models
* ``gap_batches``, ``gap_batch_size`` — validation windows for the token-level comparison
* ``anchor_probes`` — questions of each kind for the anchor probe
* ``n_boot`` — bootstrap replicates of the effective-size interval
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smallinit.analysis.measure import held_out_batches, run_settings
from smallinit.analysis.tokens import bigram_loss, token_gap
from smallinit.config import Config, ModelConfig
from smallinit.data import load_token_data, load_tokenizer
from smallinit.data.anchor import AnchorTask
from smallinit.data.sink import SinkData, SinkTask, is_sink_spec
from smallinit.errors import ConfigError
from smallinit.measures.norm_factor import relative_factor
from smallinit.measures.residual_flow import residual_flow_sweep
from smallinit.measures.sink import attention_roles
from smallinit.monitor.records import AnalysisRecord
from smallinit.study.judging.anchor import anchor_scores
from smallinit.study.judging.claims import (
    BASELINE,
    FIXED,
    ClaimResult,
    Run,
    Runs,
    claim_c4,
    judge,
    judge_table,
    reference_lr,
    registered,
    sink_layers,
)
from smallinit.study.judging.emulation import Emulation, pooled, run_emulation
from smallinit.study.judging.scaling import fit_power_law
from smallinit.train import load_model

FINDINGS_FILE = "findings.json"  # a recipe's claims with their verdicts and the numbers behind the figures
Say = Callable[[str], None]  # receives one progress line per stage of a findings step
FindingsStep = Callable[[Path, list[str], dict[str, Any], Say], dict[str, Any]]

# Each findings step measures what its figures show (and its claims need) and judges the recipe's claims; it
# registers itself under the name a recipe's ``findings =`` gives, as a claim does in the claims' registry.
FINDINGS: dict[str, FindingsStep] = {}


def findings_step(name: str) -> Callable[[FindingsStep], FindingsStep]:
    """Register the decorated function as the findings step ``name`` (once, where it is defined)."""

    def register(fn: FindingsStep) -> FindingsStep:
        if FINDINGS.get(name, fn) is not fn:
            raise ValueError(f"findings step {name} is registered twice")
        FINDINGS[name] = fn
        return fn

    return register


def _quiet(_line: str) -> None:
    pass


def _load(out: Path, say: Say) -> Runs:
    say("reading the finished runs")
    return Runs.load(out)


def _group_key(run: Run) -> tuple:
    """The size and arm of a run, which its seeds share: γ, ε and the width it is emulated at, the gate, the lr,
    the optimizer and its weight decay."""
    c = run.config
    return (
        run.size,
        float(c["model.gamma"]),
        float(c["model.norm_eps"]),
        int(c.get("model.norm_eps_width") or 0),
        c["model.gate"],
        float(c["train.lr"]),
        c.get("train.optimizer", "adamw"),  # runs from before Muon trained with AdamW
        float(c.get("train.weight_decay", 0.1)),
    )


def _arm_fields(arm: tuple) -> dict[str, Any]:
    """A group key without its size, as named fields."""
    return dict(zip(("gamma", "norm_eps", "norm_eps_width", "gate", "lr", "optimizer", "weight_decay"), arm))


def _size_fields(size: tuple) -> dict[str, Any]:
    return {"d_model": size[0], "n_layers": size[1], "n_heads": size[2], "d_ff": size[3], "experts": size[4]}


def loss_table(runs: Runs) -> list[dict[str, Any]]:
    """Final val loss per size and arm (γ, ε, ε width, gate, lr): mean, sd and n over seeds."""
    groups: dict[tuple, list[float]] = {}
    for r in runs:
        if r.val_loss is not None:
            groups.setdefault(_group_key(r), []).append(r.val_loss)
    return [
        {
            **_size_fields(k[0]),
            **_arm_fields(k[1:]),
            "mean": float(np.mean(v)),
            "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
            "n": len(v),
        }
        for k, v in sorted(groups.items())
    ]


def sink_table(runs: Runs) -> list[dict[str, Any]]:
    """Sink score per layer and Sink_ε (ε 0.3, 0.8) at the end of training, averaged over seeds, per size and arm."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if sink_layers(r) is not None:
            groups.setdefault(_group_key(r), []).append(r)
    return [
        {
            **_size_fields(k[0]),
            **_arm_fields(k[1:]),
            "per_layer": np.mean([sink_layers(r)[0] for r in v], axis=0).tolist(),
            "share_above": _mean_shares([r.analysis[-1] for r in v]),
            "n": len(v),
        }
        for k, v in sorted(groups.items())
    ]


def _mean_shares(records: list[AnalysisRecord]) -> dict[str, float]:
    """Sink_ε per ε ("0.3" → share), averaged over analysis records (of several seeds)."""
    shares = [rec.sink.share_above for rec in records if rec.sink and rec.sink.share_above]
    return {str(eps): float(np.mean([s[eps] for s in shares])) for eps in (shares[0] if shares else {})}


def sink_along_training(runs: Runs) -> list[dict[str, Any]]:
    """Per size and arm: at every analysis step all its seeds share, the sink per layer and Sink_ε (mean over
    seeds), from init (step 0) to the end, so the moment a sink forms is visible."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.analysis and r.analysis[0].sink:
            groups.setdefault(_group_key(r), []).append(r)
    rows = []
    for k, group in sorted(groups.items()):
        by_step = [{rec.step: rec for rec in r.analysis} for r in group]
        steps = sorted(set.intersection(*[set(b) for b in by_step]))
        per_layer = [np.mean([b[t].sink.per_layer for b in by_step], axis=0) for t in steps]
        rows.append(
            {
                **_size_fields(k[0]),
                **_arm_fields(k[1:]),
                "n": len(group),
                "steps": steps,
                "per_layer": [p.tolist() for p in per_layer],
                "max_layer": [float(p.max()) for p in per_layer],
                "share_above": [_mean_shares([b[t] for b in by_step]) for t in steps],
            }
        )
    return rows


def norm_factor_table(runs: Runs) -> dict[str, Any]:
    """Analytic factor (relative to 1/σ) over γ for the run widths and the paper's d = 2048, and the measured
    mean factor per size and arm at the start and end of training."""
    widths = sorted({int(r.config["model.d_model"]) for r in runs} | {2048})
    gammas = [round(g, 3) for g in np.arange(0.25, 1.5001, 0.05)]
    analytic = {
        f"d{d}_eps{eps:g}": [float(relative_factor(g, eps, d)) for g in gammas]
        for d in widths
        for eps in (1e-5, 1e-12)
    }
    measured: dict[tuple, dict[str, list[float]]] = {}
    saturated: dict[tuple, list[Emulation]] = {}
    for r in runs:
        recs = r.analysis
        if recs and recs[0].norm_factor:
            m = measured.setdefault(_group_key(r), {"start": [], "end": []})
            m["start"].append(float(np.mean(list(recs[0].norm_factor.values()))))
            m["end"].append(float(np.mean(list(recs[-1].norm_factor.values()))))
        e = run_emulation(r)
        if e is not None:
            saturated.setdefault(_group_key(r), []).append(e)
    rows = []
    for k in sorted(measured.keys() | saturated.keys()):
        v = measured.get(k)
        at = (
            {"start": float(np.mean(v["start"])), "end": float(np.mean(v["end"])), "n": len(v["start"])}
            if v
            else {}
        )
        rows.append(
            {
                **_size_fields(k[0]),
                **_arm_fields(k[1:]),
                **at,
                **(_saturated(pooled(saturated[k])) if k in saturated else {}),
            }
        )
    return {"gammas": gammas, "analytic": analytic, "measured": rows}


def _saturated(e: Emulation) -> dict[str, Any]:
    """Shares of training below factor 0.5 (brackets over the seeds): the embedding's norm, the mean over the
    norms, and the d = 2048 formula's range."""
    return {
        "saturated_embedding": [e.first.lo, e.first.hi],
        "saturated_mean": [e.measured.lo, e.measured.hi],
        "saturated_paper_scale": list(e.paper),
    }


def flow_design(options: dict[str, Any]) -> tuple[list[float], list[int], list[int]]:
    """The residual-flow sweep's γ, widths and seeds (the plan asks this too)."""
    return (
        list(options.get("flow_gammas", [0.5, 0.75, 1.0, 1.25])),
        list(options.get("flow_widths", [64, 128, 256])),
        list(options.get("flow_seeds", [0, 1, 2])),
    )


def flow_sweep(options: dict[str, Any], out: Path, say: Say = _quiet) -> dict[str, Any]:
    """The residual-flow exponent on fresh models (nothing trained); also OUT/residual_flow/ for the report."""
    base = dataclasses.replace(ModelConfig.preset("cpu-1m"), n_layers=int(options.get("flow_layers", 4)))
    gammas, widths, seeds = flow_design(options)
    say(f"residual flow of fresh models: {len(gammas)} γ × {len(widths)} widths × {len(seeds)} seeds")
    sweep = residual_flow_sweep(gammas, widths, base_config=base, seeds=seeds)
    sweep.save(out / "residual_flow")
    return sweep.to_dict()


def token_gap_pairs(runs: Runs) -> tuple[dict[int, Run], dict[int, Run]]:
    """The models the token comparison pairs, by seed: γ = 1 (A) and γ = 0.5 (B) of the fixed arm at the largest
    size that has both, at the reference learning rate (the plan asks this too)."""
    runs = reference_lr(runs)
    n = _largest_paired_size(runs, FIXED)
    if n is None:
        return {}, {}
    sel = runs.where(FIXED).where(size=n)
    a, b = sel.where({"model.gamma": 1.0}).run_by_seed(), sel.where({"model.gamma": 0.5}).run_by_seed()
    return {s: a[s] for s in sorted(set(a) & set(b))}, {s: b[s] for s in sorted(set(a) & set(b))}


def _largest_paired_size(runs: Runs, arm: dict[str, Any]) -> tuple | None:
    sel = runs.where(arm)
    ok = [
        n
        for n in sel.values("size")
        if set(sel.where({"model.gamma": 1.0, "size": n}).run_by_seed())
        & set(sel.where({"model.gamma": 0.5, "size": n}).run_by_seed())
    ]
    return max(ok) if ok else None


def token_gaps(
    runs: Runs, options: dict[str, Any], out: Path, say: Say = _quiet
) -> dict[int, dict[str, Any]] | None:
    """Δ_sym of γ = 1 (A) against γ = 0.5 (B), same seed, fixed arm, at the largest size that has both;
    also OUT/tokens/seed<s>/compare.json for the report."""
    a, b = token_gap_pairs(runs)
    if not a:
        return None
    gaps, shared = {}, {}  # shared: tokenizer, held-out batches and bigram loss, once per data config
    seeds = list(a)
    for i, seed in enumerate(seeds, 1):
        say(f"token-level comparison γ = 1 vs γ = 0.5, seed {seed} ({i} of {len(seeds)})")
        cfg = Config.from_json_file(a[seed].path / "config.json")
        key = repr(sorted(cfg.to_dict()["data"].items()))
        if key not in shared:
            tok = load_tokenizer(cfg.data.tokenizer)
            batches = list(
                held_out_batches(
                    cfg,
                    tok,
                    batches=int(options.get("gap_batches", 16)),
                    batch_size=int(options.get("gap_batch_size", 16)),
                )
            )
            train = load_token_data(
                cfg.data.corpus, tok, val_fraction=cfg.data.val_fraction, text_field=cfg.data.text_field
            ).train
            shared[key] = tok, batches, bigram_loss(train, batches, tok.vocab_size)
        tok, batches, bigram = shared[key]
        res = token_gap(
            load_model(a[seed].path), load_model(b[seed].path), batches, tokenizer=tok, bins=10, top_k=10
        )
        res.meta.update(
            label_a=f"γ=1 ({a[seed].name})",
            label_b=f"γ=0.5 ({b[seed].name})",
            settings_a=run_settings(a[seed].config),
            settings_b=run_settings(b[seed].config),
        )
        res.save(out / "tokens" / f"seed{seed}")
        gaps[seed] = {
            **res.to_dict(),
            **_size_fields(a[seed].size),
            "a": a[seed].name,
            "b": b[seed].name,
            "bigram_loss": bigram,
        }
    return gaps


def _claims(results: list[ClaimResult], design: float | None = None) -> list[dict[str, Any]]:
    """The claims of one table, their primaries judged together (Holm over the table); ``design`` the recipe's
    design effect (nats), at which a loss primary says the power it had."""
    judge_table(results, design=design)
    return [c.to_dict() for c in results]


@findings_step("claims")
def claims_findings(
    out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet
) -> dict[str, Any]:
    """The recipe's claims (the demo's: C1–C7), with the residual flow and the token gaps where they need them."""
    runs = _load(out, say)
    dropped = options.get("dropped", {})  # measure only what the claims this design runs read
    needs = {need for key in claims if key not in dropped for need in registered(key).needs}
    flow = flow_sweep(options, out, say) if "flow" in needs else None
    gaps = token_gaps(runs, options, out, say) if "gaps" in needs else None
    say(f"judging the claims ({int(options.get('n_boot', 1000))} bootstrap resamples for C4)")
    return {
        "claims": _claims(
            judge(claims, runs, {"flow": flow, "gaps": gaps}, options), options.get("design_effect")
        ),
        "losses": loss_table(runs),
        "sinks": sink_table(runs),
        "norm_factors": norm_factor_table(runs),
        "n_runs": len(runs),
    }


@findings_step("fig1")
def fig1_findings(out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet) -> dict[str, Any]:
    runs = _load(out, say)
    return {
        "claims": _claims(judge(claims, runs, {}, options)),
        "losses": loss_table(runs),
        "sinks": sink_table(runs),
        "norm_factors": norm_factor_table(runs),
        "n_runs": len(runs),
    }


def scaling_fits(runs: Runs) -> list[dict[str, Any]]:
    """L(N) = a·N^(−b) + c per arm (γ, ε, ε width, gate, lr) over the sizes (N = parameters without embeddings)."""
    arms: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.val_loss is not None:
            arms.setdefault(_group_key(r)[1:], []).append(r)
    fits = []
    for arm, rs in sorted(arms.items()):
        entry: dict[str, Any] = {
            **_arm_fields(arm),
            "points": [[r.params_nonembed, r.val_loss, r.seed] for r in rs],
        }
        if len({r.params_nonembed for r in rs}) >= 3:
            try:
                entry["fit"] = fit_power_law(
                    [r.params_nonembed for r in rs], [r.val_loss for r in rs]
                ).to_dict()
            except ConfigError as e:
                entry["fit_error"] = str(e)
        fits.append(entry)
    return fits


@findings_step("fig2")
def fig2_findings(out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet) -> dict[str, Any]:
    runs = _load(out, say)
    c4_base = claim_c4(runs, arm=BASELINE, n_boot=int(options.get("n_boot", 1000)))  # contrast: no fixes
    return {
        "claims": _claims(judge(claims, runs, {}, options)),
        "fits": scaling_fits(runs),
        "losses": loss_table(runs),
        "effective_size_without_fixes": c4_base.extra.get("effective_size_gain"),
        "n_runs": len(runs),
    }


@findings_step("fig3")
def fig3_findings(out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet) -> dict[str, Any]:
    runs = _load(out, say)
    flow = flow_sweep(options, out, say)
    return {
        "claims": _claims(judge(claims, runs, {"flow": flow}, options)),
        "residual_flow": flow,
        "losses": loss_table(runs),
        "n_runs": len(runs),
    }


def trajectories(runs: Runs) -> list[dict[str, Any]]:
    """Per run: steps and, per logged matrix, stable rank and mean |cos| over training."""
    out = []
    for r in runs:
        recs = r.analysis
        if not recs or not recs[0].matrices:
            continue
        ranks, cos = ([x.by_matrix(stat) for x in recs] for stat in ("stable_rank", "mean_abs_cos"))
        out.append(
            {
                "cell": r.name,
                "dir": str(r.path),
                **_size_fields(r.size),
                "gamma": float(r.config["model.gamma"]),
                "seed": r.seed,
                "steps": [x.step for x in recs],
                "stable_rank": {m: [x[m] for x in ranks] for m in ranks[0]},
                "mean_abs_cos": {m: [x[m] for x in cos] for m in cos[0]},
            }
        )
    return out


def weight_rms(runs: Runs) -> list[dict[str, Any]]:
    """Per run whose Monitor recorded matrix RMS: its arm, and at each analysis step the median over the recorded
    matrices of the RMS and of RMS / √(η/λ) (None where no matrix decays)."""
    out = []
    for r in runs:
        recs = [x for x in r.analysis if x.by_matrix("rms")]
        if not recs:
            continue
        ratios = [x.by_matrix("rms_ratio") for x in recs]
        out.append(
            {
                "cell": r.name,
                **_size_fields(r.size),
                **_arm_fields(_group_key(r)[1:]),
                "seed": r.seed,
                "steps": [x.step for x in recs],
                "rms": [float(np.median(list(x.by_matrix("rms").values()))) for x in recs],
                "rms_ratio": [float(np.median(list(v.values()))) if v else None for v in ratios],
            }
        )
    return out


@findings_step("muon")
def muon_findings(out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet) -> dict[str, Any]:
    """smallinit's questions Q1 and Q2 (not claims of the paper), with each run's weight RMS along training."""
    runs = _load(out, say)
    return {
        "claims": _claims(judge(claims, runs, {}, options)),
        "losses": loss_table(runs),
        "weight_rms": weight_rms(runs),
        "n_runs": len(runs),
    }


@findings_step("condensation")
def condensation_findings(
    out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet
) -> dict[str, Any]:
    runs = _load(out, say)
    return {
        "claims": _claims(judge(claims, runs, {}, options)),
        "trajectories": trajectories(runs),
        "losses": loss_table(runs),
        "n_runs": len(runs),
    }


@findings_step("tokens")
def tokens_findings(
    out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet
) -> dict[str, Any]:
    runs = _load(out, say)
    gaps = token_gaps(runs, options, out, say)
    return {
        "claims": _claims(judge(claims, runs, {"gaps": gaps}, options)),
        "losses": loss_table(runs),
        "n_runs": len(runs),
    }


@findings_step("reasoning")
def reasoning_findings(
    out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet
) -> dict[str, Any]:
    """Anchor probe per run, summarised by γ; judged against Zhang et al.: small init favours reasoning."""
    runs = _load(out, say)
    n = int(options.get("anchor_probes", 256))
    per_run, scores = [], {}
    by_arm: dict[tuple, list[dict]] = {}  # per size and γ: a recipe may vary the depth too
    for i, r in enumerate(runs, 1):
        corpus = str(r.config["data.corpus"])
        if not corpus.startswith("builtin:anchor"):
            continue
        say(f"anchor probe of {r.name} ({i} of {len(runs)})")
        s = anchor_scores(
            load_model(r.path),
            load_tokenizer(str(r.config["data.tokenizer"])),
            AnchorTask.from_params(corpus),
            n=n,
        )
        scores[r.path], gamma = s, float(r.config["model.gamma"])
        by_arm.setdefault((r.size, gamma), []).append(s)
        per_run.append(
            {
                "cell": r.name,
                **_size_fields(r.size),
                "gamma": gamma,
                "seed": r.seed,
                "val_loss": r.val_loss,
                **{k: v for k, v in s.items() if k != "per_pair"},
                "per_pair": s["per_pair"],
            }
        )
    summary = [
        {
            **_size_fields(size),
            "gamma": g,
            "n": len(rows),
            **{
                k: float(np.mean([x[k] for x in rows]))
                for k in ("in_distribution", "heldout_reasoning", "heldout_memorising", "heldout_other")
            },
        }
        for (size, g), rows in sorted(by_arm.items())
    ]
    judged = judge(claims, runs, {"anchor": scores}, options)
    if per_run:
        acc = [row["in_distribution"] for row in per_run]
        for claim in judged:  # beside the claims that read the probe
            if "anchor" in registered(claim.claim.split()[0]).needs:
                claim.notes.append(f"in-distribution accuracy {min(acc):.2f}–{max(acc):.2f}")
    return {
        "claims": _claims(judged),
        "anchor": per_run,
        "anchor_by_gamma": summary,
        "losses": loss_table(runs),
        "n_runs": len(runs),
    }


@findings_step("sink")
def sink_findings(out: Path, claims: list[str], options: dict[str, Any], say: Say = _quiet) -> dict[str, Any]:
    """C3 on the sink task: its comparisons and precondition as everywhere, with the sink of every arm (headwise
    gate included) along training, where each final model's heads attend on trigger and other queries (first
    token, self, previous token: which no-op a head found), and the task's Bayes-optimal loss beside the losses."""
    runs = _load(out, say)
    optimal, roles = {}, []
    for i, r in enumerate(runs, 1):
        corpus = str(r.config["data.corpus"])
        if not is_sink_spec(corpus):
            continue
        cfg = Config.from_json_file(r.path / "config.json")
        data = SinkData(SinkTask.from_params(corpus), load_tokenizer(cfg.data.tokenizer), bos=cfg.data.bos)
        if corpus not in optimal:
            rows = cfg.train.eval_batches * cfg.train.batch_size  # the sequences the val loss is measured on
            optimal[corpus] = data.task.optimal_loss(data.val_symbols(cfg.data.seq_len)[:rows])
        say(f"where the heads attend, {r.name} ({i} of {len(runs)})")
        symbols = data.val_symbols(cfg.data.seq_len)[
            : cfg.analysis.batch_size, :-1
        ]  # the sink's probe sequences
        trigger = torch.from_numpy(np.isin(symbols, data.task.trigger_set))
        found = attention_roles(load_model(r.path), torch.from_numpy(data.tokens(symbols)), trigger)
        roles.append(
            {
                "cell": r.name,
                **_size_fields(r.size),
                **_arm_fields(_group_key(r)[1:]),
                "seed": r.seed,
                "roles": found,
            }
        )
    return {
        "claims": _claims(judge(claims, runs, {}, options)),
        "losses": loss_table(runs),
        "sinks": sink_table(runs),
        "sink_along_training": sink_along_training(runs),
        "attention_roles": roles,
        "optimal_loss": optimal,
        "n_runs": len(runs),
    }
