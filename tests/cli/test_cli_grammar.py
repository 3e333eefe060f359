"""The CLI has one grammar (issue 33): every flag has help and no measured time, --out is a folder and never
positional, configuration goes only through --config/--preset/--set, one `plan` verb takes recipes and sweep
files, and each old spelling still works for one release with exactly one deprecation line on stderr."""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

import pytest

from smallinit.cli import build_parser, main, study
from smallinit.cli.deprecated import Old
from smallinit.config import config_keys

SWEEP = (
    '[base]\n"model.preset" = "cpu-1m"\n"data.tokenizer" = "bytes"\n"train.steps" = 5\n'
    '[grid]\n"model.gamma" = [0.5, 1.0]\n'
)
TINY = [
    "model.d_model=16",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.n_kv_heads=2",
    "model.d_ff=32",
    "model.vocab_size=257",
    "data.seq_len=8",
]


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command that runs something, by its full name ("tokenizer train"), walking the argparse tree."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, p in action.choices.items():
                subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
                found.update(_commands(p, f"{prefix}{name} ") if subs else {f"{prefix}{name}": p})
    return found


COMMANDS = _commands(build_parser())
# sweep and recipe: the flags their old --plan takes (its notice names `plan`)
HIDDEN_ON_PURPOSE = {
    ("recipe", "--seed-sd"),
    ("recipe", "--json"),
    ("recipe", "--untimed"),
    *(
        ("sweep", flag)
        for flag in (
            "--num-devices",
            "--accelerator",
            "--mfu",
            "--tokens-per-s",
            "--seed-sd",
            "--json",
            "--untimed",
        )
    ),
}


def _visible(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in p._actions if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)
    ]


def test_the_walk_sees_every_command():  # the tests below would pass on a walk that found nothing
    assert {"train", "plan", "recipes", "status", "tokenizer train", "report"} <= set(COMMANDS)
    assert len(COMMANDS) >= 18


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_has_help_and_every_hidden_one_is_an_old_spelling(name):
    p = COMMANDS[name]
    assert not [a.dest for a in _visible(p) if not (a.help or "").strip()]
    hidden = [a for a in p._actions if a.help is argparse.SUPPRESS]
    assert all(isinstance(a, Old) or (name, a.option_strings[0]) in HIDDEN_ON_PURPOSE for a in hidden)


def _helps() -> list[str]:
    top = build_parser()
    texts = [top.description or ""]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            texts += [c.help or "" for c in action._choices_actions]
    for p in COMMANDS.values():
        texts += [a.help for a in _visible(p)]
    return texts


def test_no_help_quotes_a_measured_time_or_this_machine():
    """Times drift with the code and the machine; they live in README.md and benchmarks/README.md."""
    timing = re.compile(
        r"\b\d[\d,.]*\s*(min|s|ms|h|sec|seconds?|minutes?|hours?|cores?)\b|\bminute|CPU-seconds"
    )
    assert not [t for t in _helps() if timing.search(t)]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_out_is_a_folder_and_never_positional(name):
    p = COMMANDS[name]
    assert not [a for a in _visible(p) if not a.option_strings and "out" in (a.dest + str(a.metavar)).lower()]
    outs = [a for a in p._actions if "--out" in a.option_strings]
    assert all(a.metavar == "DIR" for a in outs)


# What the remaining flags that share a config key's name mean instead (each names another quantity).
NOT_CONFIG = {
    "--device": "where this command runs, not where a training runs",
    "--seed": "generate: the sampling's seed",
    "--batch-size": "eval: lm-eval's batch size",
    "--tokenizer": "the tokenizer of a Hugging Face folder",
    "--steps": "coordcheck: steps per γ",
    "--vocab-size": "tokenizer train: the size to reach",
    "--text-field": "tokenizer train: the corpus's field",
    "--top-k": "generate: sampling; compare: gaps listed (not model.moe.top_k)",
    "--preset": "the grammar's own: --config/--preset/--set",
    "--init-from": "train: also takes that run's config, more than train.init_from",
}


def test_no_flag_duplicates_a_config_key():
    leaves = {k.key.rsplit(".", 1)[-1] for k in config_keys()}
    shared = {
        (name, flag)
        for name, p in COMMANDS.items()
        for a in _visible(p)
        for flag in a.option_strings
        if flag.startswith("--") and flag[2:].replace("-", "_") in leaves
    }
    assert {flag for _, flag in shared} <= set(NOT_CONFIG), shared
    assert {name for name, flag in shared if flag in ("--seed", "--batch-size")} == {"generate", "eval"}
    with_config = {
        name for name, p in COMMANDS.items() if any("--set" in a.option_strings for a in p._actions)
    }
    assert {
        "train",
        "config",
        "info",
        "plan",
        "recipe",
        "coordcheck",
        "analyze",
        "compare",
        "init-hf",
    } <= with_config


def test_each_commands_flags_are_declared_beside_it():
    """add_<command> right above cmd_<command> in its family's module, and build_parser only puts them together."""
    for name, p in COMMANDS.items():
        stem = name.replace(" ", "_").replace("-", "_")
        run = p.get_default("func")
        module = sys.modules[run.__module__]
        assert run.__name__ == f"cmd_{stem}", name
        add = getattr(module, f"add_{stem}", None)
        if add is None:  # a command without flags (recipes)
            assert not [a for a in p._actions if not isinstance(a, argparse._HelpAction)], name
            continue
        source, first = inspect.getsourcelines(add)
        after = inspect.getsource(module).splitlines()[first - 1 + len(source) :]
        following = next(line for line in after if line.startswith("def "))
        assert following.startswith(f"def {run.__name__}("), (name, following)
    assert len(inspect.getsourcelines(build_parser)[0]) <= 10


def test_demo_picks_its_scale_with_scale_as_recipe_and_plan_do():
    for name in ("demo", "recipe", "plan"):
        (scale,) = [a for a in COMMANDS[name]._actions if "--scale" in a.option_strings]
        assert scale.help is not argparse.SUPPRESS, name
    assert "--scale {full,quick}" in COMMANDS["demo"].format_usage()
    assert "--quick" not in COMMANDS["demo"].format_help()
    assert _parse(["demo"])["scale"] == "full"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_usage_shows_no_needed_input_as_optional(name):
    """recipe RECIPE and sweep SWEEP.toml need their input (only an old spelling leaves it out), so no usage shows a
    positional in brackets as if it could be left out."""
    usage = COMMANDS[name].format_usage()
    assert not re.findall(r"\[[A-Z][A-Za-z_.]*\]", usage), usage


def test_the_gpu_kinds_are_typed_once_in_the_planner_and_listed_in_help(monkeypatch):
    from smallinit.study.planning.cost import GPUS

    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: no kind cut at its hyphen
    assert f"the devices' kind: {', '.join(GPUS)}, or cpu" in COMMANDS["plan"].format_help()
    cli = Path(inspect.getfile(build_parser)).parent
    assert not [(f.name, k) for f in cli.glob("*.py") for k in GPUS if k != "h100" and k in f.read_text()]


# Old spelling → the new one: both parse to the same arguments (so they do the same), and the old one says so.
SAME = [
    (["recipe", "--list"], ["recipes"]),
    (["recipe", "demo", "--scale", "quick", "--plan"], ["plan", "demo", "--scale", "quick"]),
    (["sweep", "s.toml", "--plan"], ["plan", "s.toml"]),
    (["sweep", "--status", "runs/s"], ["status", "runs/s"]),
    (["plan", "demo", "--gpus", "4"], ["plan", "demo", "--num-devices", "4"]),
    (["plan", "demo", "--gpu", "h200"], ["plan", "demo", "--accelerator", "h200"]),
    (["info", "--memory", "--gpus", "8"], ["info", "--memory", "--num-devices", "8"]),
    (["train", "--wandb"], ["train", "--set", "train.wandb=true"]),
    (["coordcheck", "--batch-size", "2"], ["coordcheck", "--set", "train.batch_size=2"]),
    (["analyze", "RUN", "--batches", "1"], ["analyze", "RUN", "--set", "train.eval_batches=1"]),
    (["analyze", "RUN", "--batch-size", "2"], ["analyze", "RUN", "--set", "train.batch_size=2"]),
    (["compare", "A", "B", "--seq-len", "32"], ["compare", "A", "B", "--set", "data.seq_len=32"]),
    (
        ["init-hf", "c.json", "--out", "o", "--gamma", "0.5"],
        ["init-hf", "c.json", "--out", "o", "--set", "model.gamma=0.5"],
    ),
    (
        ["init-hf", "c.json", "--out", "o", "--norm-eps", "1e-6"],
        ["init-hf", "c.json", "--out", "o", "--set", "model.norm_eps=1e-6"],
    ),
    (
        ["init-hf", "c.json", "--out", "o", "--seed", "3"],
        ["init-hf", "c.json", "--out", "o", "--set", "train.seed=3"],
    ),
    (["init-hf", "c.json", "o"], ["init-hf", "c.json", "--out", "o"]),
    (["export-hf", "RUN", "hf"], ["export-hf", "RUN", "--out", "hf"]),
    (["demo", "--quick"], ["demo", "--scale", "quick"]),
]


def _parse(argv: list[str]) -> dict:
    return vars(build_parser().parse_args(argv))


@pytest.mark.parametrize("old,new", SAME, ids=[" ".join(o) for o, _ in SAME])
def test_an_old_spelling_parses_as_its_new_one_and_says_so_once(old, new, capsys):
    now = _parse(new)
    assert capsys.readouterr().err == ""
    then = _parse(old)
    assert then["func"] is now["func"]
    assert {k: then[k] for k in now if k in then and k != "command"} == {
        k: now[k] for k in then if k in now and k != "command"
    }
    assert not [
        k for k in now if k not in then and now[k]
    ]  # what the old command lacks is left at its default
    lines = capsys.readouterr().err.splitlines()
    spelled = [t for t in new if t not in old][-1]
    assert len(lines) == 1 and lines[0].startswith("smallinit: deprecated: ") and spelled in lines[0], lines


def test_plan_takes_a_recipe_and_a_sweep_file(tmp_path, capsys):
    sweep = tmp_path / "grid.toml"
    sweep.write_text(SWEEP)
    assert main(["plan", str(sweep), "--accelerator", "cpu", "--num-devices", "2", "--untimed"]) == 0
    out = capsys.readouterr().out
    assert "total: 2 runs" in out and "2 CPU cores" in out
    assert main(["plan", "reasoning", "--scale", "cpu", "--untimed"]) == 0
    assert capsys.readouterr().out.startswith("plan: recipe reasoning --scale cpu")
    assert (
        main(["plan", str(sweep), "--scale", "cpu"]) == 2
    )  # a sweep file has no scales: one line, not ignored
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--scale is for recipes" in err


def test_the_old_plan_spellings_still_plan(tmp_path, capsys):
    sweep = tmp_path / "grid.toml"
    sweep.write_text(SWEEP)
    assert main(["sweep", str(sweep), "--plan", "--gpu", "cpu", "--untimed"]) == 0
    captured = capsys.readouterr()
    assert "total: 2 runs" in captured.out and captured.err.count("deprecated") == 2  # --plan and --gpu
    assert "'smallinit plan SWEEP.toml'" in captured.err and not (tmp_path / "runs").exists()
    assert main(["recipe", "reasoning", "--plan", "--untimed"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("plan: recipe reasoning --scale cpu") and captured.err.count("\n") == 1


@pytest.mark.parametrize(
    "command", [["plan", "reasoning"], ["train"], ["recipe", "reasoning"], ["analyze", "RUN"]]
)
def test_set_without_a_value_is_one_line_and_exit_2(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command, "--set", "badvalue"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'badvalue' is not KEY=VALUE" in err


def test_a_set_a_model_reading_command_does_not_read_is_refused(tmp_path, capsys):
    assert (
        main(["init-hf", str(tmp_path / "c.json"), "--out", str(tmp_path / "o"), "--set", "train.steps=3"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "reads only model.gamma, model.norm_eps, model.gate, model.init_scales, train.seed" in err
    )
    assert (
        main(["init-hf", str(tmp_path / "c.json"), "--out", str(tmp_path / "o"), "--set", "train.seed=x"])
        == 2
    )
    assert "train.seed takes a whole number" in capsys.readouterr().err


def test_a_command_that_writes_a_folder_needs_out(tmp_path, capsys):
    assert main(["export-hf", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "smallinit: error: export-hf needs --out DIR, the new folder to write\n"


def test_one_file_commands_write_into_the_out_folder_and_the_old_file_spelling_works(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question\n" * 50)
    assert (
        main(["tokenizer", "train", str(corpus), "--vocab-size", "270", "--out", str(tmp_path / "tok")]) == 0
    )
    assert (tmp_path / "tok" / "tokenizer.json").is_file() and capsys.readouterr().err == ""
    assert (
        main(["tokenizer", "train", str(corpus), "--vocab-size", "270", "--out", str(tmp_path / "t.json")])
        == 0
    )
    assert (tmp_path / "t.json").is_file()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("smallinit: deprecated: 'smallinit tokenizer train --out FILE.json'")

    cc = tmp_path / "cc"
    assert (
        main(
            [
                "coordcheck",
                "--gammas",
                "1",
                "--steps",
                "1",
                "--out",
                str(cc),
                *sum((["--set", s] for s in TINY), []),
            ]
        )
        == 0
    )
    assert main(["report", str(cc), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").is_file() and capsys.readouterr().err == ""
    assert main(["report", str(cc), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").is_file()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("smallinit: deprecated: 'smallinit report --out FILE.html'")


def test_recipe_without_a_name_lists_like_recipes(capsys, monkeypatch):
    # listing plans every scale: slow, and tested elsewhere
    monkeypatch.setattr(study, "cmd_recipes", lambda args: 0)
    assert main(["recipe"]) == 0
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("smallinit: deprecated: 'smallinit recipe' is now 'smallinit recipes'")
