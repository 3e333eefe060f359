"""Measuring models: ``audit`` (a model's init and norms), ``analyze`` (one model), ``compare`` (two, token by
token), ``coordcheck`` (scales over γ) and ``report`` (the HTML report of run, sweep or recipe folders)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from smallinit.cli.args import (
    budget,
    config_args,
    device_arg,
    floats,
    ints,
    load_config,
    model_sets,
    out_arg,
    out_file,
    set_arg,
)
from smallinit.cli.base import Command
from smallinit.cli.deprecated import old, to_set

TOKENIZER_HELP = (
    "the tokenizer of a Hugging Face folder that has none or another (a folder saved by "
    "save_pretrained, a tokenizer.json, or 'default' / 'bytes': smallinit's builtin 8,192- and "
    "257-token ones)"
)


def _window_args(p: argparse.ArgumentParser, keys: dict[str, tuple[type, object]], help: str) -> None:
    """--set for the windows a measurement reads (the config keys that size training's own windows), and the
    old flags they replace."""
    set_arg(p, help)
    for key, flag in (
        ("train.eval_batches", "--batches"),
        ("train.batch_size", "--batch-size"),
        ("data.seq_len", "--seq-len"),
    ):
        if key in keys:
            old(p, flag, metavar="N", new=f"--set {key}={{}}", then=to_set(key))


ANALYZE_KEYS = {"train.eval_batches": (int, 4), "train.batch_size": (int, 8), "data.seq_len": (int, None)}


def add_analyze(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="run folder (its newest checkpoint), checkpoint folder, "
        "or Hugging Face model folder (config.json + safetensors)",
    )
    p.add_argument(
        "--hf", action="store_true", help="read the folder as a Hugging Face model (else detected)"
    )
    p.add_argument(
        "--data",
        metavar="CORPUS",
        help="text to measure on (default: the run's validation split; "
        "the builtin corpus for a Hugging Face model)",
    )
    out_arg(p, "output folder (default: RUN/analysis)")
    _window_args(
        p,
        ANALYZE_KEYS,
        "the held-out windows measured: train.eval_batches=N batches (default 4) of "
        "train.batch_size=N sequences (default 8) of data.seq_len=N tokens (default: the run's; 256 for a "
        "Hugging Face model); progress and the time left go to stderr",
    )
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    device_arg(p)


def cmd_analyze(args: argparse.Namespace) -> int:
    from smallinit.analysis import analyze_checkpoint, check_norm_saturation
    from smallinit.analysis.measure import default_output_dir, loss_note
    from smallinit.report import analysis_lines, write_analysis

    sets = model_sets(args, ANALYZE_KEYS)
    batches, batch_size, seq_len = sets["train.eval_batches"], sets["train.batch_size"], sets["data.seq_len"]
    result = analyze_checkpoint(
        args.checkpoint,
        data=args.data,
        batches=batches,
        batch_size=batch_size,
        seq_len=seq_len,
        device=args.device,
        hf=args.hf,
        tokenizer=args.tokenizer,
        progress=sys.stderr,
    )
    cfg = result.run_config
    if cfg is not None:
        check_norm_saturation(cfg.model)
    out = Path(args.out) if args.out else default_output_dir(result.checkpoint)
    paths = write_analysis(result, out)
    if result.note:
        print(result.note)
    print("\n".join(analysis_lines(result, seq_len or (cfg.data.seq_len if cfg else None))))
    print(f"measured on {result.data}")
    if cfg:
        print(loss_note(cfg, args.data, (batches, batch_size, seq_len or cfg.data.seq_len)))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


COMPARE_KEYS = {"train.batch_size": (int, 8), "data.seq_len": (int, None)}


def add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint_a", metavar="CKPT_A", help="model A (Δ_sym > 0 where A is better)")
    p.add_argument(
        "checkpoint_b", metavar="CKPT_B", help="model B (runs, checkpoints or Hugging Face folders)"
    )
    p.add_argument(
        "--hf", action="store_true", help="read both folders as Hugging Face models (else detected)"
    )
    p.add_argument(
        "--data",
        metavar="CORPUS",
        help="text to compare on, streamed (default: A's validation split; "
        "the builtin corpus with a Hugging Face model)",
    )
    out_arg(p, "output folder (default: A's run folder, analysis/compare-B)")
    p.add_argument("--labels", metavar="A,B", help="names for the two models (default: their run folders)")
    p.add_argument(
        "--max-tokens",
        type=budget,
        metavar="N|all",
        help="stop after about N tokens (default 32,768; "
        "progress and the time left go to stderr; what it costs: benchmarks/README.md); all: the whole "
        "text",
    )
    p.add_argument("--bins", type=int, default=10, help="difficulty quantile bins (default 10)")
    p.add_argument("--top-k", type=int, default=20, help="largest gaps to list each way (default 20)")
    _window_args(
        p,
        COMPARE_KEYS,
        "the windows compared: train.batch_size=N sequences per forward (default 8) of "
        "data.seq_len=N tokens (default: the runs' data.seq_len)",
    )
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    device_arg(p)


def cmd_compare(args: argparse.Namespace) -> int:
    from smallinit.analysis.measure import compare_checkpoints
    from smallinit.report import write_compare

    sets = model_sets(args, COMPARE_KEYS)
    labels = tuple(args.labels.split(",", 1)) if args.labels else None
    budget = (
        {}
        if args.max_tokens is None
        else {"max_tokens": None if args.max_tokens == "all" else args.max_tokens}
    )
    r = compare_checkpoints(
        args.checkpoint_a,
        args.checkpoint_b,
        data=args.data,
        batch_size=sets["train.batch_size"],
        seq_len=sets["data.seq_len"],
        bins=args.bins,
        top_k=args.top_k,
        labels=labels,
        device=args.device,
        hf=args.hf,
        tokenizer=args.tokenizer,
        progress=sys.stderr,
        **budget,
    )
    for note in r.meta.get("notes", []):
        print(note)
    print(f"measured on {r.meta['data']}")
    print(
        f"{r.tokens:,} tokens: mean Δ_sym {r.mean_delta_sym:+.4f} (> 0: {r.meta['label_a']} better); "
        f"loss {r.mean_loss_a:.4f} vs {r.mean_loss_b:.4f}"
    )
    print("wrote " + ", ".join(str(p) for p in write_compare(r, args.out)))
    return 0


def add_coordcheck(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--gammas", type=floats, default=[0.5, 0.75, 1.0, 1.25], help="comma-separated γ values")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per γ (default 5)")
    out_arg(p, "output folder (default runs/coordcheck, beside the runs)", default="runs/coordcheck")
    p.add_argument(
        "--residual-flow",
        action="store_true",
        help="also fit the residual-flow exponent over widths (the paper predicts 1 − γ)",
    )
    p.add_argument("--widths", type=ints, default=[64, 128, 256, 512], help="widths for --residual-flow")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2], help="seeds for --residual-flow")
    old(p, "--batch-size", metavar="N", new="--set train.batch_size={}", then=to_set("train.batch_size"))


def cmd_coordcheck(args: argparse.Namespace) -> int:
    from smallinit.analysis import coord_check, residual_flow_sweep
    from smallinit.report import write_coordcheck, write_sweep

    # its few steps need no more; inserted before --set, which may change it
    args.overrides.insert(0, "train.batch_size=8")
    cfg = load_config(args)
    cc = coord_check(
        cfg.model,
        args.gammas,
        args.steps,
        train=cfg.train,
        batch_size=cfg.train.batch_size,
        seq_len=cfg.data.seq_len,
        seed=cfg.train.seed,
    )
    paths = write_coordcheck(cc, args.out)
    if args.residual_flow:
        sweep = residual_flow_sweep(args.gammas, args.widths, base_config=cfg.model, seeds=args.seeds)
        paths += write_sweep(sweep, args.out)
        for g, s in zip(sweep.gammas, sweep.slopes):
            print(f"γ = {g:g}: residual-flow exponent {s:+.3f} (predicted {1 - g:+.3f})")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dirs", nargs="+", metavar="DIR", help="run, sweep or recipe folders; everything below them is read"
    )
    out_arg(p, "folder to write report.html into (default: the folder given; needed for several folders)")
    p.add_argument(
        "--include-unfinished",
        action="store_true",
        help="draw runs that have not finished in the "
        "figures too (they are always listed, marked, in the runs table)",
    )


def cmd_report(args: argparse.Namespace) -> int:
    from smallinit.report import build_report

    out = out_file(args.out, "report.html", "report")
    print(f"wrote {build_report(args.dirs, out, include_unfinished=args.include_unfinished)}")
    return 0


def _fail_on(text: str) -> tuple[str, ...]:
    from smallinit.auditing import FAIL_ON

    wanted = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [w for w in wanted if w not in FAIL_ON]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check {unknown[0]!r}; choose from {', '.join(FAIL_ON)}")
    return wanted


def add_audit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        metavar="TARGET",
        help="a Hugging Face folder, a smallinit run or checkpoint folder, a model.safetensors beside its "
        "config.json, or a preset name (built on meta: what shapes and the config tell)",
    )
    p.add_argument(
        "--data", metavar="CORPUS", help="text the norm factors are measured on (default: the builtin corpus)"
    )
    p.add_argument(
        "--trained",
        action="store_true",
        help="the weights claim to be trained (a run past step 0 does): fresh-random matrices are a re-init",
    )
    p.add_argument(
        "--fail-on",
        type=_fail_on,
        default=(),
        metavar="CHECKS",
        help="exit 1 when the model meets any of these comma-separated checks: saturated, fresh-random",
    )
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    out_arg(p, "folder for audit.json (default: the current folder)")


def cmd_audit(args: argparse.Namespace) -> int:
    from smallinit.auditing import audit_path

    result = audit_path(
        args.target, data=args.data, trained=True if args.trained else None, tokenizer=args.tokenizer
    )
    print(result.table(), end="")
    path = result.save(Path(args.out or ".") / "audit.json")
    print(f"wrote {path}")
    failures = result.failures(args.fail_on)
    for line in failures:
        print(f"audit failed: {line}", file=sys.stderr)
    return 1 if failures else 0


COMMANDS = (
    Command(
        "audit",
        "init and norm forensics of a model: per matrix σ, d_in, γ, fresh-random; the recipe; every norm's ε "
        "and factor (table + JSON)",
        add_audit,
        cmd_audit,
    ),
    Command(
        "analyze",
        "all single-model measurements of a run, checkpoint or Hugging Face model (JSON + figures)",
        add_analyze,
        cmd_analyze,
    ),
    Command(
        "compare",
        "token-level comparison of two models: Δ_sym by token difficulty",
        add_compare,
        cmd_compare,
    ),
    Command(
        "coordcheck",
        "activation and update scales over γ in the first steps (fresh models); "
        "train.batch_size is 8 here unless --set; --set train.optimizer=muon for Muon's updates",
        add_coordcheck,
        cmd_coordcheck,
    ),
    Command(
        "report",
        "one self-contained HTML report for run, sweep or recipe folders",
        add_report,
        cmd_report,
    ),
)
