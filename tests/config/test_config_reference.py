"""The config reference: docs/config.md matches the dataclasses, `smallinit config` prints a config that
reads back, the examples load, and a run's own config.json reproduces the run."""

import json
import re
from pathlib import Path

import pytest
import tomllib
import torch

from smallinit import Config
from smallinit.cli import main
from smallinit.config import config_keys
from support.runs import TINY_MODEL, final_tensors

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(?P<key>[a-z0-9_.]+)` \| (?P<type>[^|]+) \| `(?P<default>.*)` \| (?P<doc>.+) \|$")
TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=2",
    "train.eval_batches=2",
    "train.log_every=2",
    "train.steps=4",
    "train.eval_every=2",
]


def documented() -> dict[str, tuple[str, object]]:
    rows = {}
    for line in (ROOT / "docs" / "config.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            assert m["key"] not in rows, f"{m['key']} is documented twice"
            rows[m["key"]] = (m["type"].strip(), tomllib.loads(f"v = {m['default']}")["v"])
    return rows


def test_docs_list_every_key_with_its_type_and_default():
    rows = documented()
    keys = {k.key: k for k in config_keys()}
    assert sorted(set(keys) - set(rows)) == [], "keys missing from docs/config.md"
    assert sorted(set(rows) - set(keys)) == [], "docs/config.md lists keys the config does not have"
    for name, k in keys.items():
        assert rows[name] == (k.type, k.default), name
        assert k.doc, f"{name} has no meaning in config/schema.py"


def test_config_command_prints_commented_toml_that_reads_back(tmp_path, capsys):
    args = [
        "--preset",
        "cpu-moe-1m",
        "--set",
        "train.steps=7",
        "--set",
        'data.corpus="a b.txt"',
        "--set",
        'analysis.heatmaps=["x"]',
    ]
    assert main(["config", *args]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\w+ = ", line):
            assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 4, f"no comment above {line!r}"
    f = tmp_path / "resolved.toml"
    f.write_text(text)
    want = Config.load(
        preset="cpu-moe-1m", overrides=["train.steps=7", 'data.corpus="a b.txt"', 'analysis.heatmaps=["x"]']
    )
    assert Config.load(f) == want and want.model.moe is not None
    assert main(["config", "--config", str(f), "--set", "model.gamma=0.5"]) == 0
    assert Config.load(f, overrides=["model.gamma=0.5"]).model.gamma == 0.5
    assert "gamma = 0.5" in capsys.readouterr().out


def test_preset_overrides_the_shape_a_file_sets(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(Config.load(overrides=["model.gamma=0.5"]).to_json())
    cfg = Config.load(f, preset="cpu-5m")
    assert (cfg.model.d_model, cfg.model.gamma) == (192, 0.5)


@pytest.mark.parametrize("name", ["cpu-run.toml", "paper-0.1b.toml"])
def test_examples_load(name):
    cfg = Config.load(ROOT / "examples" / name)
    assert cfg.train.schedule == "wsd" and cfg.model.gamma == 1.0 and cfg.model.norm_eps == 1e-12
    assert main(["info", "--config", str(ROOT / "examples" / name)]) == 0


def test_a_run_is_reproduced_from_its_folder(tmp_path, capsys):
    sets = [a for s in TINY for a in ("--set", s)]
    assert main(["train", "--out", str(tmp_path / "a"), *sets]) == 0
    assert main(["train", "--out", str(tmp_path / "b"), "--config", str(tmp_path / "a" / "config.json")]) == 0
    assert main(["train", "--out", str(tmp_path / "c"), "--config", str(tmp_path / "a")]) == 0
    capsys.readouterr()
    tensors = {}
    for run in "abc":
        tensors[run] = final_tensors(tmp_path / run)
        assert json.loads((tmp_path / run / "config.json").read_text()) == json.loads(
            (tmp_path / "a" / "config.json").read_text()
        )
    for run in "bc":
        assert all(torch.equal(tensors["a"][k], tensors[run][k]) for k in tensors["a"])


def test_bad_config_json_is_one_line(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text("{not json")
    assert main(["config", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and err.count("\n") == 1
    assert main(["config", "--config", str(tmp_path / "missing")]) == 2
    assert "run folder" in capsys.readouterr().err
