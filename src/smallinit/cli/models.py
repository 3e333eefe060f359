"""Models in and out: ``tokenizer train``, ``export-hf``, ``generate``, ``init-hf`` and ``eval``
(lm-evaluation-harness)."""

from __future__ import annotations

import argparse
import sys

from smallinit.cli.args import (
    device_arg,
    model_sets,
    out_arg,
    out_file,
    positional_out,
    required_out,
    set_arg,
    string_list,
)
from smallinit.cli.base import Command
from smallinit.cli.deprecated import old, to_set
from smallinit.errors import ConfigError


def add_tokenizer_train(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", help="builtin corpus name, file, directory or glob")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=8192,
        help="vocabulary size to reach (default 8192); a corpus "
        "too small for it gives a smaller one, kept with a warning that names the size reached",
    )
    p.add_argument(
        "--text-field",
        default="text",
        help="the field holding the text in .jsonl / .parquet documents (default text)",
    )
    out_arg(
        p,
        "folder to write tokenizer.json into (required; use it as data.tokenizer=DIR/tokenizer.json)",
        required=True,
    )


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from smallinit.data import iter_documents, train_tokenizer

    out = out_file(args.out, "tokenizer.json", "tokenizer train")
    tok = train_tokenizer(iter_documents(args.corpus, text_field=args.text_field), args.vocab_size, out)
    print(f"wrote {out} (vocab {tok.vocab_size})")
    return 0


def add_export_hf(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    positional_out(p)


def cmd_export_hf(args: argparse.Namespace) -> int:
    from smallinit.export.hf import export_hf

    r = export_hf(args.checkpoint, required_out(args, "export-hf"))
    remote = " (load with trust_remote_code=True)" if r.remote_code else ""
    print(f"wrote {r.out_dir}: {r.architecture}{remote}, step {r.step}; {r.reason}")
    return 0


def add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    p.add_argument("--prompt", help="text to continue (default: stdin, as is; empty = a new document)")
    p.add_argument(
        "--max-new-tokens", type=int, default=100, help="at most this many new tokens (default 100)"
    )
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)"
    )
    p.add_argument("--top-k", type=int, help="sample only from the k most likely tokens (default: all)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="sample only from the most likely tokens holding this probability, in (0, 1] (default 1)",
    )
    # the sampling's seed: no config key holds it (train.seed seeds the weights and batches)
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    p.add_argument(
        "--no-prompt",
        action="store_true",
        help="print only the continuation (default: the prompt, then its continuation)",
    )
    device_arg(p)


def cmd_generate(args: argparse.Namespace) -> int:
    from smallinit.generate import Sampling, generate, load_pretrained

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed).validate()
    if args.prompt is None and sys.stdin.isatty():
        raise ConfigError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
    prompt = sys.stdin.read() if args.prompt is None else args.prompt
    model, tokenizer = load_pretrained(args.checkpoint, device=args.device)
    continuation = generate(model, tokenizer, prompt, args.max_new_tokens, sampling)
    print(continuation if args.no_prompt else prompt + continuation)
    return 0


INIT_HF_KEYS = {
    "model.gamma": (float, 1.0),
    "model.norm_eps": (float, 1e-12),
    "model.gate": (str, "none"),
    "model.init_scales": (string_list, []),
    "train.seed": (int, 0),
}


def add_init_hf(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", metavar="CONFIG_OR_DIR", help="a config.json or a folder holding one")
    positional_out(p)
    set_arg(
        p,
        "model.gamma=G: σ = d_in^(−γ) (default 1, the paper's choice); model.norm_eps=E: ε of every norm "
        "(default 1e-12); model.gate=elementwise|headwise|none: the attention output gate σ(X W_θ) on every "
        'softmax attention (default none); model.init_scales=["ROLE=RULE", ...]: per-role overrides of the γ '
        'rule, e.g. ["embedding=std:1", "output=zero"] (docs/muon-and-role-scales.md); train.seed=N: seed of '
        "the weights (default 0)",
    )
    p.add_argument(
        "--keep-norm-eps",
        action="store_true",
        help="keep the architecture's ε (for norms that hard-code it or configs that cannot save it)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH_OR_FOLDER",
        help="the tokenizer to save with the model: a folder "
        "saved by save_pretrained, a tokenizer.json, or 'default' / 'bytes' (default: the largest of "
        "smallinit's builtin 8,192- and 257-token ones that covers the vocabulary, else none, said)",
    )
    old(p, "--gamma", metavar="G", new="--set model.gamma={}", then=to_set("model.gamma"))
    old(p, "--norm-eps", metavar="E", new="--set model.norm_eps={}", then=to_set("model.norm_eps"))
    old(p, "--seed", metavar="N", new="--set train.seed={}", then=to_set("train.seed"))


def cmd_init_hf(args: argparse.Namespace) -> int:
    from smallinit.export.hf import init_hf

    out, sets = required_out(args, "init-hf"), model_sets(args, INIT_HF_KEYS)
    norm_eps = None if args.keep_norm_eps else sets["model.norm_eps"]
    print(
        init_hf(
            args.config,
            out,
            gamma=sets["model.gamma"],
            norm_eps=norm_eps,
            seed=sets["train.seed"],
            tokenizer=args.tokenizer,
            gate=sets["model.gate"],
            scales=sets["model.init_scales"] or None,
        )
    )
    return 0


def add_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="run folder (its newest checkpoint) or checkpoint folder"
    )
    p.add_argument(
        "--tasks", required=True, help="comma-separated lm-eval tasks, e.g. hellaswag,triviaqa,gsm8k"
    )
    p.add_argument("--limit", type=float, help="at most N examples per task (a fraction if < 1)")
    p.add_argument("--include-path", metavar="DIR", help="folder of extra task YAMLs (e.g. local tasks)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    # lm-eval's own knob, passed through: no smallinit config key holds it
    p.add_argument(
        "--batch-size", type=int, default=8, help="lm-eval's batch size: requests per forward (default 8)"
    )
    device_arg(p)
    p.add_argument("--log-samples", action="store_true", help="store every example's inputs and outputs too")


def cmd_eval(args: argparse.Namespace) -> int:
    from smallinit.export.lmeval import run_eval

    limit = None if args.limit is None else (int(args.limit) if args.limit.is_integer() else args.limit)
    r = run_eval(
        args.checkpoint,
        args.tasks.split(","),
        limit=limit,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        device=args.device,
        log_samples=args.log_samples,
    )
    print(r.table)
    print(f"results: {r.results_file}")
    return 0


COMMANDS = (
    Command(
        "tokenizer",
        "tokenizer tools",
        commands=(
            Command(
                "train",
                "train a byte-level BPE tokenizer on a corpus",
                add_tokenizer_train,
                cmd_tokenizer_train,
            ),
        ),
    ),
    Command(
        "export-hf",
        "write a Hugging Face transformers folder from a run or checkpoint",
        add_export_hf,
        cmd_export_hf,
    ),
    Command(
        "generate",
        "continue a prompt with a trained run or checkpoint (KV-cached decoding)",
        add_generate,
        cmd_generate,
    ),
    Command(
        "init-hf",
        "γ-init a Hugging Face architecture from its config.json and save it",
        add_init_hf,
        cmd_init_hf,
    ),
    Command(
        "eval",
        "lm-evaluation-harness on a run or checkpoint (needs the eval extra)",
        add_eval,
        cmd_eval,
    ),
)
