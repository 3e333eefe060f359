"""The command line: parses arguments, calls the library, maps errors to exit codes — nothing else."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import Preempted, SmallinitError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line and exit 2, like every other user error (argparse would print the usage first)."""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def add_subparsers(self, **kwargs):
        """A command that holds subcommands (smallinit, smallinit tokenizer, ...) prints its help when given alone,
        rather than argparse's "the following arguments are required"."""
        self.set_defaults(func=self._print_help)
        return super().add_subparsers(**{**kwargs, "required": False})

    def _print_help(self, _args: argparse.Namespace) -> int:
        self.print_help()
        return 0


def _key_value(text: str) -> str:
    """--set takes one word KEY=VALUE; "--set train.steps 10" would otherwise end as "unrecognized arguments: 10"."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE; write key and value as one word, e.g. --set "
                                         f"{text if '.' in text else 'train.steps'}=VALUE")
    return text


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml", help="a TOML config (sections model, train, data, analysis), "
                   "or a run folder or its config.json to take that run's config")
    p.add_argument("--preset", metavar="NAME", help="model preset, e.g. cpu-1m, cpu-5m, 0.1b, 1.5b")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                   help="override a config key, e.g. --set train.steps=200 --set model.gate=headwise")


def _load_config(args: argparse.Namespace):
    from .config import Config

    return Config.load(args.config, preset=args.preset, overrides=args.overrides)


def cmd_train(args: argparse.Namespace) -> int:
    from .analysis import check_norm_saturation
    from .config import Config
    from .train import Trainer
    from .train.distributed import shutdown

    out = Path(args.out)
    args.overrides += ["train.wandb=true"] if args.wandb else []
    if args.init_from:  # a new run from that run's weights, and from its config unless --config/--preset
        args.overrides.insert(0, f"train.init_from={json.dumps(args.init_from)}")
        args.config = args.config or (None if args.preset else args.init_from)
    if args.resume and not (args.config or args.preset):  # the run's own config; --set may change its layout
        cfg = Config.from_json_file(out / "config.json", args.overrides)  # or its length (train.steps)
    else:
        cfg = _load_config(args)
    trainer = Trainer(cfg, out, resume=args.resume)
    if trainer.finished:  # a resumed run that already reached train.steps: say so, write nothing
        trainer.close()
        shutdown()
        if trainer.runtime.is_main:
            print(f"nothing trained: {out} already reached train.steps={trainer.step}; to train longer: smallinit "
                  f"train --out {out} --resume --set train.steps=N (N > {trainer.step})")
        return 0
    if trainer.runtime.is_main:
        check_norm_saturation(trainer.cfg.model)
    summary = trainer.fit()
    shutdown()  # under torchrun: leave the process group cleanly once every rank is done
    val = "nothing left to train" if summary["val_loss"] is None else f"val loss {summary['val_loss']:.4f}"
    if trainer.runtime.is_main:
        print(f"done: step {summary['step']}, {val}; run folder {out}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    print("# smallinit config: defaults → --config → --preset → --set, resolved; every key in docs/config.md")
    print(_load_config(args).to_toml(), end="")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from .analysis import check_norm_saturation
    from .init import init_plan
    from .model import Transformer

    cfg = _load_config(args)
    check_norm_saturation(cfg.model)
    with torch.device("meta"):  # shapes only: counts and the init table without allocating the weights
        model = Transformer(cfg.model, init=False)
    total, active = model.num_params(), model.num_params(active=True)
    print(f"parameters: {total:,} total, {active:,} active, {model.num_params(embeddings=False):,} without embeddings")
    if args.memory:
        from .train.memory import describe_memory

        print(describe_memory(cfg, args.gpus))
        return 0
    plan = init_plan(model, cfg.model.gamma)
    print(plan if args.layers else plan.summary())
    return 0


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from .data import iter_documents, train_tokenizer

    tok = train_tokenizer(iter_documents(args.corpus, text_field=args.text_field), args.vocab_size, args.out)
    print(f"wrote {args.out} (vocab {tok.vocab_size})")
    return 0


def _hardware(args: argparse.Namespace):
    from .experiments.plan import Hardware

    if args.gpu is None and args.gpus is None and args.mfu is None and args.tokens_per_s is None:
        return None  # the plan's default for the scale
    devices = args.gpus if args.gpus is not None else (os.cpu_count() or 1) if args.gpu == "cpu" else 8
    return Hardware.make(args.gpu or "h100", devices, mfu=args.mfu,
                         tokens_per_s=args.tokens_per_s)


def _print_plan(plan, as_json: bool) -> int:
    from .experiments.plan import format_plan

    print(json.dumps(plan.to_dict(), indent=1) if as_json else format_plan(plan))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .experiments.plan import parse_seed_sd, plan_recipe

    presets = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    loss_sd, claim_sd = parse_seed_sd(args.seed_sd)
    return _print_plan(plan_recipe(args.name, args.scale, _hardware(args), presets=presets, overrides=args.overrides,
                                   seed_sd=loss_sd, claim_sd=claim_sd), args.json)


def cmd_sweep(args: argparse.Namespace) -> int:
    from .experiments import Sweep, format_table, run_sweep, sweep_rows

    if args.plan:
        if not args.file:
            raise SmallinitError("pass a sweep file to plan: smallinit sweep SWEEP.toml --plan")
        from .experiments.plan import parse_seed_sd, plan_sweep

        loss_sd, claim_sd = parse_seed_sd(args.seed_sd)
        return _print_plan(plan_sweep(args.file, _hardware(args), seed_sd=loss_sd, claim_sd=claim_sd), args.json)
    if args.status:
        print(format_table(sweep_rows(args.status)))
        return 0
    if not args.file:
        raise SmallinitError("pass a sweep file (smallinit sweep SWEEP.toml) or --status SWEEP_DIR")
    sweep = Sweep.load(args.file)
    out = args.out or str(Path("runs") / sweep.folder_name)
    outcome = run_sweep(sweep, out, jobs=args.jobs, retry_failed=args.retry_failed, echo=sys.stderr,
                        launcher=args.launcher)
    if outcome.interrupted:
        print(f"smallinit: sweep stopped by a signal; run the same command again to continue {out}", file=sys.stderr)
    print(format_table(outcome.rows))
    print(f"results: {Path(out) / 'results.csv'}")
    return outcome.exit_code


def cmd_export_hf(args: argparse.Namespace) -> int:
    from .export.hf import export_hf

    r = export_hf(args.checkpoint, args.out_dir)
    remote = " (load with trust_remote_code=True)" if r.remote_code else ""
    print(f"wrote {r.out_dir}: {r.architecture}{remote}, step {r.step}; {r.reason}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .errors import ConfigError
    from .generate import Sampling, generate, load_pretrained

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed).validate()
    if args.prompt is None and sys.stdin.isatty():
        raise ConfigError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    prompt = sys.stdin.read() if args.prompt is None else args.prompt
    model, tokenizer = load_pretrained(args.checkpoint, device=args.device)
    continuation = generate(model, tokenizer, prompt, args.max_new_tokens, sampling)
    print(continuation if args.no_prompt else prompt + continuation)
    return 0


def cmd_init_hf(args: argparse.Namespace) -> int:
    from .export.hf import init_hf

    norm_eps = None if args.keep_norm_eps else args.norm_eps
    print(init_hf(args.config, args.out_dir, gamma=args.gamma, norm_eps=norm_eps, seed=args.seed,
                  tokenizer=args.tokenizer))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .export.lmeval import run_eval

    limit = None if args.limit is None else (int(args.limit) if args.limit.is_integer() else args.limit)
    r = run_eval(args.checkpoint, args.tasks.split(","), limit=limit, include_path=args.include_path,
                 num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device,
                 log_samples=args.log_samples)
    print(r.table)
    print(f"results: {r.results_file}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from .analysis import analyze_checkpoint, check_norm_saturation
    from .analysis.measure import default_output_dir
    from .config import Config
    from .report import analysis_lines, write_analysis

    result = analyze_checkpoint(args.checkpoint, data=args.data, batches=args.batches, batch_size=args.batch_size,
                                seq_len=args.seq_len, device=args.device, hf=args.hf, tokenizer=args.tokenizer,
                                progress=sys.stderr)
    cfg = Config.from_dict(result["config"]) if "config" in result else None
    if cfg is not None:
        check_norm_saturation(cfg.model)
    out = Path(args.out) if args.out else default_output_dir(result["checkpoint"])
    paths = write_analysis(result, out)
    if "note" in result:
        print(result["note"])
    print("\n".join(analysis_lines(result, args.seq_len or (cfg.data.seq_len if cfg else None))))
    print(f"measured on {result['data']}")
    if cfg:
        print(_analyze_loss_note(cfg, args))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _analyze_loss_note(cfg, args: argparse.Namespace) -> str:
    """Which text the loss above is measured on, beside the windows of training's validation loss."""
    if args.data:
        return "this loss is on the --data text; training's val loss is on its validation split, so they do not compare"
    train = (cfg.train.eval_batches, cfg.train.batch_size, cfg.data.seq_len)
    here = (args.batches, args.batch_size, args.seq_len or cfg.data.seq_len)
    if here == train:
        return "this loss is on the validation windows training's val loss is measured on, so the two compare directly"
    return (f"this loss is on {here[0] * here[1]} windows of {here[2]} tokens from the start of the validation split, "
            f"training's val loss on {train[0] * train[1]} windows of {train[2]} tokens, so the two differ a little; "
            f"to measure on training's windows add --batches {train[0]} --batch-size {train[1]} --seq-len {train[2]}")


def cmd_compare(args: argparse.Namespace) -> int:
    from .analysis.measure import compare_checkpoints
    from .report import write_compare

    labels = tuple(args.labels.split(",", 1)) if args.labels else None
    budget = {} if args.max_tokens is None else {"max_tokens": None if args.max_tokens == "all" else args.max_tokens}
    r = compare_checkpoints(args.checkpoint_a, args.checkpoint_b, data=args.data, batch_size=args.batch_size,
                            seq_len=args.seq_len, bins=args.bins, top_k=args.top_k, labels=labels, device=args.device,
                            hf=args.hf, tokenizer=args.tokenizer, progress=sys.stderr, **budget)
    for note in r.meta.get("notes", []):
        print(note)
    print(f"measured on {r.meta['data']}")
    print(f"{r.tokens:,} tokens: mean Δ_sym {r.mean_delta_sym:+.4f} (> 0: {r.meta['label_a']} better); "
          f"loss {r.mean_loss_a:.4f} vs {r.mean_loss_b:.4f}")
    print("wrote " + ", ".join(str(p) for p in write_compare(r, args.out)))
    return 0


def cmd_coordcheck(args: argparse.Namespace) -> int:
    from .analysis import coord_check, residual_flow_sweep
    from .report import write_coordcheck, write_sweep

    cfg = _load_config(args)
    cc = coord_check(cfg.model, args.gammas, args.steps, train=cfg.train, batch_size=args.batch_size,
                     seq_len=cfg.data.seq_len, seed=cfg.train.seed)
    paths = write_coordcheck(cc, args.out)
    if args.residual_flow:
        sweep = residual_flow_sweep(args.gammas, args.widths, base_config=cfg.model, seeds=args.seeds)
        paths += write_sweep(sweep, args.out)
        for g, s in zip(sweep.gammas, sweep.slopes):
            print(f"γ = {g:g}: residual-flow exponent {s:+.3f} (predicted {1 - g:+.3f})")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import build_report

    print(f"wrote {build_report(args.dirs, args.out, include_unfinished=args.include_unfinished)}")
    return 0


def _budget(text: str) -> int | str:
    """--max-tokens: a positive count, or "all"."""
    if text == "all":
        return text
    try:
        n = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of tokens or 'all'")
    return n


TOKENIZER_HELP = ("the tokenizer of a Hugging Face folder that has none or another (a folder saved by "
                  "save_pretrained, a tokenizer.json, or 'default' / 'bytes': smallinit's builtin 8,192- and "
                  "257-token ones)")


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def cmd_recipe(args: argparse.Namespace) -> int:
    from .experiments.recipes import describe, load_recipe, recipe_names, run_recipe
    from .experiments.verdicts import verdict_table

    if args.list or not args.name:
        from .experiments.plan import scale_headline

        for name in recipe_names():
            recipe = load_recipe(name)
            print(describe(recipe, lambda scale, r=recipe: scale_headline(r, scale)), flush=True)
        return 0
    if args.plan:
        return cmd_plan(args)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    from .experiments.plan import plan_recipe

    plan = plan_recipe(args.name, args.scale, _hardware(args), presets=presets, overrides=args.overrides)
    print(f"[plan] {plan.headline()}", file=sys.stderr, flush=True)
    result = run_recipe(args.name, args.scale, args.out, jobs=args.jobs, presets=presets, overrides=args.overrides,
                        launcher=args.launcher)
    if result.exit_code == Preempted.exit_code:
        print(f"smallinit: stopped by a signal; run the same command again to continue {result.out}", file=sys.stderr)
    if result.analysis is not None:
        print(verdict_table(result.analysis["claims"]))
    print(f"recipe folder {result.out} ({result.wall_s / 60:.1f} min); findings {result.out / 'findings.json'}")
    return result.exit_code


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    scale = args.scale or ("quick" if args.quick else "full")
    demo = run_demo(scale=scale, out=args.out, jobs=args.jobs)
    if not demo.table:
        print(f"smallinit: demo stopped by a signal; run the same command again to continue {demo.result.out}",
              file=sys.stderr)
        return demo.result.exit_code
    a = demo.result.analysis
    cpu_min = (a["cells_cpu_s"] + a["analysis_cpu_s"]) / 60
    print(f"\nsmallinit demo ({scale}): {demo.wall_s / 60:.1f} min wall, {cpu_min:.1f} CPU-min of training and "
          "analysis; verdicts computed from the runs and their seed spread")
    print(demo.table)
    print(f"report: {demo.report}" if demo.report else f"findings: {demo.result.out / 'findings.json'}")
    return demo.result.exit_code


def _version() -> str:
    import platform

    import torch

    from .version import __version__

    return f"smallinit {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, metavar="N", help="devices to plan for (default 8 GPUs for scales that run "
                   "under torchrun, else this machine's CPU cores)")
    p.add_argument("--gpu", metavar="KIND", help="h100, h200, h800, a100, a100-40gb, l40s, b200, mi300x, or cpu")
    p.add_argument("--mfu", type=float, metavar="X", help="model FLOPs utilisation to assume (default: the measured or "
                   "stated one the plan prints)")
    p.add_argument("--tokens-per-s", type=float, metavar="X", help="training tokens/s of all devices together, "
                   "instead of an MFU")
    p.add_argument("--seed-sd", action="append", metavar="X|CLAIM=X", help="sd over seeds of a paired final-loss gap "
                   "(nats), or CLAIM=X of that claim's primary in its own unit (C6=0.06: a stable rank), for the minimum "
                   "detectable effects; repeatable (default: the recipe's pilot, else the CPU study's)")
    p.add_argument("--json", action="store_true", help="the plan as JSON")


LAUNCHER_HELP = ("command that starts each cell's '-m smallinit train' instead of this Python, e.g. "
                 "'torchrun --standalone --nproc_per_node=gpu' or a site's wrapper; replaces the file's launcher")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="smallinit", description="Small initialization for language models.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("train", help="train a model")
    _config_args(p)
    p.add_argument("--out", default="runs/train", metavar="RUN_DIR", help="run folder (default runs/train)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint; "
                       "with --set train.steps=N also extend it, where its schedule allows (docs/config.md)")
    start.add_argument("--init-from", metavar="RUN_OR_CHECKPOINT", help="start a new run from the weights of a run "
                       "(its newest checkpoint) or a checkpoint, with that run's config unless --config/--preset; "
                       "fresh optimizer, step 0")
    p.add_argument("--wandb", action="store_true", help="also log to Weights & Biases (needs the wandb package)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("config", help="print the resolved config (defaults → --config → --preset → --set) as "
                       "commented TOML")
    _config_args(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("info", help="parameter counts and the γ-init table of a config")
    _config_args(p)
    p.add_argument("--memory", action="store_true", help="estimate training memory per GPU instead of the init table")
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs for --memory (the global batch is split)")
    p.add_argument("--layers", action="store_true", help="the init table with one row per parameter of every layer "
                   "(default: one row per parameter of a block, with its count)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("sweep", help="run a grid of training runs, one process per cell (exit 1 if a cell failed)")
    p.add_argument("file", nargs="?", metavar="SWEEP.toml", help="sweep file: [base], [grid], optional [arms.NAME]")
    p.add_argument("--out", metavar="DIR", help="sweep folder (default runs/<the sweep's name>, else the file's); "
                   "re-run to continue it")
    p.add_argument("--jobs", type=int, metavar="N", help="cells side by side (default: one per core for small "
                   "CPU models, else 1)")
    p.add_argument("--retry-failed", action="store_true", help="run failed cells again (resuming where they can)")
    p.add_argument("--status", metavar="DIR", help="print the cells of a sweep folder and stop")
    p.add_argument("--launcher", metavar="CMD", help=LAUNCHER_HELP)
    p.add_argument("--plan", action="store_true", help="print what the sweep costs and which claims it can decide; "
                   "run nothing")
    _plan_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("recipe", help="run a named experiment of the paper (see --list), then judge its claims")
    p.add_argument("name", nargs="?", help="recipe name or a recipe .toml file")
    p.add_argument("--list", action="store_true", help="list the recipes and their scales")
    p.add_argument("--scale", default="cpu", help="cpu (2 cores), gpu (paper sizes; torchrun per cell) or micro")
    p.add_argument("--out", metavar="DIR", help="recipe folder (default runs/<name>-<scale>); re-run to continue")
    p.add_argument("--jobs", type=int, metavar="N", help="cells side by side (default: the sweep packing rule)")
    p.add_argument("--presets", metavar="P1,P2", help="replace the recipe's sizes by these presets (e.g. MoE ones)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                   help="override a config key in every run (not the keys the recipe sweeps)")
    p.add_argument("--launcher", metavar="CMD", help=LAUNCHER_HELP)
    p.add_argument("--plan", action="store_true", help="print the plan (as smallinit plan does) and run nothing")
    _plan_args(p)
    p.set_defaults(func=cmd_recipe)

    p = sub.add_parser("plan", help="what a recipe scale costs (tokens, FLOPs, GPU-hours, memory) and which claims it "
                       "can decide, with minimum detectable effects; trains nothing")
    p.add_argument("name", metavar="RECIPE", help="recipe name or a recipe .toml file")
    p.add_argument("--scale", default="cpu", help="the recipe's scale (see smallinit recipe --list)")
    p.add_argument("--presets", metavar="P1,P2", help="replace the recipe's sizes by these presets")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run, as smallinit recipe does")
    _plan_args(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("demo", help="the paper's claims C1–C7 at CPU scale: ≈ 1,900 CPU-seconds of training, 17 min 39 s "
                       "on 2 cores (--quick: 2 min 37 s; slowest of 4 and 9 runs), with an HTML report "
                       "and a verdict table")
    p.add_argument("--quick", action="store_true", help="a first look at d = 16 (2 min 37 s on 2 cores); it says "
                   "first what it cannot test")
    p.add_argument("--scale", choices=("full", "quick", "micro"), help=argparse.SUPPRESS)
    p.add_argument("--out", metavar="DIR", help="demo folder (default runs/demo-full or runs/demo-quick)")
    p.add_argument("--jobs", type=int, metavar="N", help="runs side by side (default: one per core)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("tokenizer", help="tokenizer tools")
    tsub = p.add_subparsers(dest="tokenizer_command")
    t = tsub.add_parser("train", help="train a byte-level BPE tokenizer on a corpus")
    t.add_argument("corpus", help="builtin corpus name, file, directory or glob")
    t.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size to reach (default 8192); a corpus "
                   "too small for it gives a smaller one, kept with a warning that names the size reached")
    t.add_argument("--text-field", default="text")
    t.add_argument("--out", required=True, metavar="TOKENIZER.json")
    t.set_defaults(func=cmd_tokenizer_train)

    p = sub.add_parser("export-hf", help="write a Hugging Face transformers folder from a run or checkpoint")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new folder for the model, config and tokenizer")
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser("generate", help="continue a prompt with a trained run or checkpoint (KV-cached decoding)")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder")
    p.add_argument("--prompt", help="text to continue (default: stdin, as is; empty = a new document)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="at most this many new tokens (default 100)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)")
    p.add_argument("--top-k", type=int, help="sample only from the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample only from the most likely tokens holding this probability, in (0, 1] (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument("--no-prompt", action="store_true", help="print only the continuation (default: the prompt, then "
                   "its continuation)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("init-hf", help="γ-init a Hugging Face architecture from its config.json and save it")
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.json or a folder holding one")
    p.add_argument("out_dir", metavar="OUT_DIR", help="new folder for the initialised model")
    p.add_argument("--gamma", type=float, default=1.0, help="σ = d_in^(−γ) (default 1, the paper's choice)")
    p.add_argument("--norm-eps", type=float, default=1e-12, help="ε of every norm (default 1e-12)")
    p.add_argument("--keep-norm-eps", action="store_true",
                   help="keep the architecture's ε (for norms that hard-code it or configs that cannot save it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help="the tokenizer to save with the model: a folder "
                   "saved by save_pretrained, a tokenizer.json, or 'default' / 'bytes' (default: the largest of "
                   "smallinit's builtin 8,192- and 257-token ones that covers the vocabulary, else none, said)")
    p.set_defaults(func=cmd_init_hf)

    p = sub.add_parser("eval", help="lm-evaluation-harness on a run or checkpoint (needs the eval extra)")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks, e.g. hellaswag,triviaqa,gsm8k")
    p.add_argument("--limit", type=float, help="at most N examples per task (a fraction if < 1)")
    p.add_argument("--include-path", metavar="DIR", help="folder of extra task YAMLs (e.g. local tasks)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--log-samples", action="store_true", help="store every example's inputs and outputs too")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("analyze", help="all single-model measurements of a run, checkpoint or Hugging Face model "
                                       "(JSON + figures)")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint), checkpoint folder, "
                                                             "or Hugging Face model folder (config.json + safetensors)")
    p.add_argument("--hf", action="store_true", help="read the folder as a Hugging Face model (else detected)")
    p.add_argument("--data", metavar="CORPUS", help="text to measure on (default: the run's validation split; "
                                                     "the builtin corpus for a Hugging Face model)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: RUN/analysis)")
    p.add_argument("--batches", type=int, default=4, help="batches of held-out text (default 4; for a Hugging Face "
                   "model 4 × 8 windows of 256 tokens, 8,192 tokens; progress and the time left go to stderr)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, help="sequence length (default: the run's data.seq_len; 256 for a "
                                               "Hugging Face model)")
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("compare", help="token-level comparison of two models: Δ_sym by token difficulty")
    p.add_argument("checkpoint_a", metavar="CKPT_A", help="model A (Δ_sym > 0 where A is better)")
    p.add_argument("checkpoint_b", metavar="CKPT_B", help="model B (runs, checkpoints or Hugging Face folders)")
    p.add_argument("--hf", action="store_true", help="read both folders as Hugging Face models (else detected)")
    p.add_argument("--data", metavar="CORPUS", help="text to compare on, streamed (default: A's validation split; "
                                                     "the builtin corpus with a Hugging Face model)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: A's run folder, analysis/compare-B)")
    p.add_argument("--labels", metavar="A,B", help="names for the two models (default: their run folders)")
    p.add_argument("--max-tokens", type=_budget, metavar="N|all", help="stop after about N tokens (default "
                   "32,768: about a minute for two tiny models on 2 CPU cores; progress and the time left go to "
                   "stderr); all: the whole text")
    p.add_argument("--bins", type=int, default=10, help="difficulty quantile bins (default 10)")
    p.add_argument("--top-k", type=int, default=20, help="largest gaps to list each way (default 20)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, help="sequence length (default: the runs' data.seq_len)")
    p.add_argument("--tokenizer", metavar="PATH_OR_FOLDER", help=TOKENIZER_HELP)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("coordcheck", help="activation and update scales over γ in the first steps (fresh models)")
    _config_args(p)
    p.add_argument("--gammas", type=_floats, default=[0.5, 0.75, 1.0, 1.25], help="comma-separated γ values")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per γ (default 5)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default="runs/coordcheck", metavar="DIR",
                   help="output folder (default runs/coordcheck, beside the runs)")
    p.add_argument("--residual-flow", action="store_true",
                   help="also fit the residual-flow exponent over widths (the paper predicts 1 − γ)")
    p.add_argument("--widths", type=_ints, default=[64, 128, 256, 512], help="widths for --residual-flow")
    p.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="seeds for --residual-flow")
    p.set_defaults(func=cmd_coordcheck)

    p = sub.add_parser("report", help="one self-contained HTML report for run, sweep or recipe folders")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run, sweep or recipe folders; everything below them is "
                   "read")
    p.add_argument("--out", metavar="FILE.html", help="where to write it (default DIR/report.html; needed for "
                   "several folders)")
    p.add_argument("--include-unfinished", action="store_true", help="draw runs that have not finished in the "
                   "figures too (they are always listed, marked, in the runs table)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Process setup: PyTorch backs CPU tensors of >= 2 MB with transparent huge pages when this is set before
    # its first such allocation; a training step then takes far fewer page faults (the gain is measured in
    # benchmarks/README.md). THP_MEM_ALLOC_ENABLE=0 in the environment opts out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SmallinitError as e:
        one_line = str(e).replace("\r", "\\r").replace("\n", "\\n")  # a file name may hold a newline
        kind = "" if isinstance(e, Preempted) else "error: "  # a stop that was asked for is not an error
        sys.stderr.write(f"smallinit: {kind}{one_line}\n")  # one write: lines of several ranks do not interleave
        return e.exit_code
    except OSError as e:  # a read or write no library call turned into a SmallinitError (disk full, read-only)
        where = f" {e.filename}" if e.filename else ""
        sys.stderr.write(f"smallinit: error: cannot access{where} ({e.strerror or type(e).__name__}); "
                         "check free disk space, permissions and the path\n")
        return 2
    except (MemoryError, RuntimeError) as e:  # an allocation no estimate foresaw (CPU, GPU or numpy)
        if not isinstance(e, MemoryError) and not any(m in str(e) for m in _OUT_OF_MEMORY):
            raise
        sys.stderr.write(f"smallinit: error: out of memory ({_first_line(e)}); lower train.batch_size or "
                         "data.seq_len, raise train.grad_accum, set train.activation_checkpointing=true or choose a "
                         "smaller model\n")
        return 2
    except KeyboardInterrupt:
        print("smallinit: interrupted", file=sys.stderr)
        return 130


_OUT_OF_MEMORY = ("out of memory", "can't allocate memory")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


if __name__ == "__main__":
    sys.exit(main())
