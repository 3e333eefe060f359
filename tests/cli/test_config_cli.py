"""Configs resolve and validate; the CLI turns every user error into one line and exit code 2."""

import json
import re
import subprocess
import sys

import pytest

from smallinit import Config, ModelConfig, MoEConfig, TrainConfig, Transformer
from smallinit.cli import main
from smallinit.errors import ConfigError


def test_resolution_order(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[model]\npreset = "cpu-5m"\ngamma = 0.5\n[train]\nsteps = 7\nlr = 1e-3\n')
    cfg = Config.load(f, overrides=["train.lr=2e-3", "model.gate=headwise", "model.norm_eps=1e-5"])
    assert cfg.model.d_model == ModelConfig.preset("cpu-5m").d_model
    assert (cfg.model.gamma, cfg.train.steps, cfg.train.lr) == (0.5, 7, 2e-3)
    assert (cfg.model.gate, cfg.model.norm_eps) == ("headwise", 1e-5)
    assert Config.load(f, preset="cpu-20m").model.d_model == 384
    assert Config.from_dict(json.loads(cfg.to_json())) == cfg
    assert (
        Config().model.norm_eps == 1e-12
        and Config().model.gate == "elementwise"
        and Config().model.gamma == 1.0
    )


@pytest.mark.parametrize(
    "override,match",
    [
        ("model.gamma=0", "gamma"),
        ("model.gamma=-1", "gamma"),
        ("model.norm_eps=0", "norm_eps"),
        ("model.n_heads=5", "divide"),
        ("model.n_kv_heads=3", "divide"),
        ("model.gate=sideways", "gate"),
        ("model.preset=huge", "unknown preset"),
        ("train.steps=0", "steps"),
        ("train.lr=abc", "a number"),
        ("train.schedule=linear", "schedule"),
        ("train.precision=fp16", "fp16"),
        ("model.colour=1", "unknown config key"),
        ("train.grad_accum=3", "divide"),
        ("data.seq_len=100000", "max_seq_len"),
        ("nonsense", "form"),
        ("train.steps=1.5", "an integer"),
        ("model.moe.top_k=9", "top_k"),
    ],
)
def test_bad_values(override, match):
    extra = ["model.moe.num_experts=4"] if override.startswith("model.moe") else []
    with pytest.raises(ConfigError, match=match):
        Config.load(overrides=[*extra, override])


@pytest.mark.parametrize(
    "override,built,message",
    [
        (
            "train.schedule=linear",
            lambda: TrainConfig(schedule="linear"),
            'train.schedule must be one of "cosine", "wsd", "constant", got "linear"',
        ),
        (
            "train.precision=fp16",
            lambda: TrainConfig(precision="fp16"),
            "train.precision=fp16 is refused: ε = 1e-12",
        ),
        (
            "model.gate=sideways",
            lambda: ModelConfig(gate="sideways"),
            'model.gate must be one of "none", "headwise", "elementwise", got "sideways"',
        ),
        (
            "model.moe.score=relu",
            lambda: ModelConfig(moe=MoEConfig(score="relu")),
            'model.moe.score must be one of "softmax", "sigmoid", got "relu"',
        ),
    ],
)
def test_choices_are_refused_from_files_and_from_code_alike(override, built, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config.load(overrides=[override])
    with pytest.raises(ConfigError, match=re.escape(message)):
        built().validate()


def test_values_are_spelled_as_they_are_written():
    """A wrong value is shown as TOML spells it (true, not True) beside the choices, spelled the same way."""
    with pytest.raises(
        ConfigError, match=re.escape('model.gate must be one of "none", "headwise", "elementwise", got true')
    ):
        Config.load(overrides=["model.gate=true"])
    with pytest.raises(ConfigError, match=re.escape("config key model.gamma must be a number, got true")):
        Config.load(overrides=["model.gamma=true"])
    with pytest.raises(ConfigError, match=re.escape('config key train.steps must be an integer, got "ten"')):
        Config.load(overrides=["train.steps=ten"])


@pytest.mark.parametrize(
    "argv,expect",
    [
        (
            ["--set", "train.stepz=3"],
            "unknown config key train.stepz (did you mean train.steps?); known keys: ",
        ),
        (["--set", "trian.steps=3"], "unknown config key trian (did you mean train?)"),
        (["--set", "model.gate=headwse"], 'got "headwse" (did you mean headwise?)'),
        (["--preset", "cpu-1n"], "unknown preset 'cpu-1n' (did you mean cpu-1m?); choose one of"),
    ],
)
def test_a_misspelling_gets_a_did_you_mean(argv, expect, capsys):
    assert main(["config", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expect in err, err


def test_set_with_a_space_says_key_equals_value(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--set", "train.steps", "10"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert (
        "'train.steps' is not KEY=VALUE" in err
        and "--set train.steps=VALUE" in err
        and "unrecognized" not in err
    )


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(bad)
    bad.write_text("model = 3\n")
    with pytest.raises(ConfigError, match="table"):
        Config.load(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--set", "model.gamma=-2"],
        ["train", "--preset", "nope"],
        ["train", "--config", "/nonexistent.toml"],
        ["train", "--set", "data.corpus=/nonexistent/corpus.txt", "--set", "data.tokenizer=bytes"],
        ["info", "--set", "model.gate=x"],
        ["tokenizer", "train", "/nonexistent/dir", "--out", "x"],
    ],
)
def test_cli_errors_are_one_line_exit_2(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smallinit: error:") and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_info_summarises_the_init_table_and_layers_lists_it(capsys):
    assert main(["info", "--preset", "1.5b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 25 and "--layers lists each" in lines[1]
    q = next(line for line in lines if line.startswith("blocks.*.attn.q_proj.weight"))
    assert q.split()[1] == "24" and q.split()[-1] == f"{2048**-1.0:.4g}"  # one row for the 24 layers' q_proj
    assert main(["info", "--preset", "1.5b", "--layers"]) == 0
    full = capsys.readouterr().out
    assert "blocks.23.attn.q_proj.weight" in full and len(full.splitlines()) > 240


def test_cli_info_and_module_entry(capsys):
    assert main(["info", "--preset", "cpu-5m"]) == 0
    out = capsys.readouterr().out
    model = Transformer(ModelConfig.preset("cpu-5m"))  # counted here from the built model's tensors
    total = sum(p.numel() for p in model.parameters())  # a dense model: every parameter is active
    non_embedding = total - model.embed.weight.numel()
    assert (
        out.splitlines()[0]
        == f"parameters: {total:,} total, {total:,} active, {non_embedding:,} without embeddings"
    )
    assert "blocks.*.mlp.down_proj.weight" in out
    r = subprocess.run(
        [sys.executable, "-m", "smallinit", "info", "--set", "model.n_heads=3"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, "-m", "smallinit", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "train" in r.stdout


def test_cli_train_and_resume_refusal(tmp_path, capsys):
    run = tmp_path / "run"
    sets = [
        "--set",
        "data.tokenizer=bytes",
        "--set",
        "data.corpus=shakespeare",
        "--set",
        "train.steps=3",
        "--set",
        "train.eval_every=0",
        "--set",
        "model.d_model=32",
        "--set",
        "model.n_heads=2",
        "--set",
        "model.n_kv_heads=2",
    ]
    assert main(["train", "--out", str(run), *sets]) == 0
    assert main(["train", "--out", str(run), *sets]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "other"), "--resume"]) == 2
