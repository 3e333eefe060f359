"""Per-role init scales: the γ rule overridden by role (embedding, head, output projections, hidden matrices),
each matrix drawn with the σ its row says, within sampling noise, on smallinit's model and on Hugging Face
architectures; the roles checked against names the architectures give their output projections."""

import math
import re
import subprocess
import sys

import pytest
import torch

from smallinit import Config, Transformer
from smallinit.config import ModelConfig
from smallinit.errors import ConfigError
from smallinit.init import gamma_init_, init_plan
from smallinit.init.scales import InitScaleError, RoleScale, parse_scales

NOISE = 6.0  # sampling-noise bound, in standard errors of a sample σ (σ/√(2n))
# the matrices each architecture's modeling source adds to the residual stream
OUTPUT = re.compile(r"\.(o_proj|down_proj|c_proj)(\.weight)?$")


def assert_drawn_as_the_table_says(model: torch.nn.Module, report) -> None:
    params = dict(model.named_parameters())
    for row in report.rows:
        p = params[row.name].detach().double()
        if row.rule == "zeros":
            assert torch.count_nonzero(p) == 0, row.name
        elif row.rule == "normal":
            n = p.numel()
            s = p.std().item()
            assert abs(s / row.std - 1) < NOISE / math.sqrt(2 * n), (row.name, s, row.std)


def expected_std(name: str, fan_in: int, gamma: float, layers: int, head: str = "lm_head.weight") -> float:
    """The σ the scales below ask for, from the names alone."""
    if "embed" in name:
        return 1.0
    if name == head:
        return fan_in**-0.5
    if OUTPUT.search(name):
        return fan_in**-gamma / math.sqrt(2 * layers)
    return fan_in**-gamma


SCALES = ["embedding=std:1", "output=depth", "head=gamma:0.5"]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_smallinit_model_draws_each_role_at_its_scale(moe):
    extra = {"moe": {"shared_expert": True}} if moe else {}
    cfg = ModelConfig.preset("cpu-1m", n_layers=3, tie_embeddings=False, init_scales=SCALES, **extra)
    model = Transformer(cfg, seed=1)
    report = model.init_report
    assert report.scales == SCALES and "per-role scales" in str(report)
    drawn = [r for r in report.rows if r.rule == "normal"]
    assert {r.role for r in drawn} == {"embedding", "head", "output", "hidden"}
    for r in drawn:
        assert r.role == "output" if OUTPUT.search(r.name) else r.role != "output", r.name
        assert r.std == pytest.approx(expected_std(r.name, r.fan_in, cfg.gamma, cfg.n_layers)), r.name
    assert_drawn_as_the_table_says(model, report)


def test_zero_output_projections_from_set_and_toml(tmp_path):
    cfg = Config.load(overrides=['model.init_scales=["output=zero"]', "model.n_layers=2"])
    (tmp_path / "run.toml").write_text(cfg.to_toml())
    assert Config.load(tmp_path / "run.toml").model.init_scales == ["output=zero"]
    model = Transformer(cfg.model)
    zeros = {r.name for r in model.init_report.rows if r.rule == "zeros"}
    assert zeros == {n for n, _ in model.named_parameters() if OUTPUT.search(n)} and len(zeros) == 4
    assert_drawn_as_the_table_says(model, model.init_report)


def test_no_scales_draws_what_it_drew_before():
    """Without scales the weights are those of the plain γ rule: one generator, the same σ, the same order."""
    cfg = ModelConfig.preset("cpu-1m", n_layers=2)
    a, b = Transformer(cfg, seed=3), Transformer(cfg, seed=3)
    gamma_init_(
        b,
        1.0,
        generator=torch.Generator().manual_seed(3),
        example_inputs=b.example_inputs(),
        scales=["hidden=gamma:1"],
    )
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3_moe"])
def test_hugging_face_architectures_draw_each_role_at_its_scale(arch):
    hf_tiny = pytest.importorskip("support.hf_tiny")
    model = hf_tiny.build(arch)
    text = model.config.get_text_config()
    tied = getattr(text, "tie_word_embeddings", False)
    scales = {"embedding": "std:1", "output": "depth"} | ({} if tied else {"head": "gamma:0.5"})
    report = gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0), scales=scales)
    layers = text.num_hidden_layers
    drawn = [r for r in report.rows if r.rule == "normal"]
    outputs = {r.name for r in drawn if r.role == "output"}
    assert outputs == {r.name for r in drawn if OUTPUT.search(r.name)} and len(outputs) == 2 * layers
    for r in drawn:
        if r.role == "embedding":
            assert r.std == 1.0, r.name
        elif r.role == "head":
            assert r.std == pytest.approx(r.fan_in**-0.5) and not tied
        elif r.role == "output":
            assert r.std == pytest.approx(r.fan_in**-1.0 / math.sqrt(2 * layers)), r.name
        else:
            assert r.role == "hidden" and r.std == pytest.approx(r.fan_in**-1.0), r.name
    assert_drawn_as_the_table_says(model, report)


def test_a_role_that_matches_nothing_is_refused_in_one_line():
    model = Transformer(ModelConfig.preset("cpu-1m", n_layers=1))  # tied: the head is the embedding
    with pytest.raises(InitScaleError, match=r"no parameter has role head \(the head is tied") as e:
        init_plan(model, 1.0, example_inputs=model.example_inputs(), scales=["head=zero"])
    assert "\n" not in str(e.value)
    with pytest.raises(
        InitScaleError, match="needs one forward"
    ):  # no inputs: output cannot be told from hidden
        init_plan(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), 1.0, scales=["output=zero"]
        )
    with pytest.raises(ConfigError, match="no parameter has role head"):
        Transformer(ModelConfig.preset("cpu-1m", n_layers=1, init_scales=["head=zero"]))


@pytest.mark.parametrize(
    "spec, match",
    [
        ("outpt=zero", "ROLE one of embedding, head, output, hidden"),
        ("output=half", "RULE must be one of std:X, gamma:X, zero, depth"),
        ("embedding=std:-1", "std must be a positive number"),
        ("output", "write ROLE=RULE"),
    ],
)
def test_a_bad_scale_is_one_line(spec, match):
    with pytest.raises(InitScaleError, match=match):
        RoleScale.parse(spec)


def test_scales_read_as_a_list_or_a_mapping_and_a_role_once():
    assert parse_scales({"output": "zero", "head": "gamma:0.5"}) == parse_scales(
        ["output=zero", "head=gamma:0.5"]
    )
    assert str(parse_scales(["embedding=std:1"])["embedding"]) == "embedding=std:1"
    with pytest.raises(InitScaleError, match="given twice"):
        parse_scales(["output=zero", "output=depth"])


def test_info_shows_the_table_and_refuses_a_role_that_matches_nothing():
    run = [sys.executable, "-m", "smallinit", "info", "--preset", "cpu-1m"]
    r = subprocess.run([*run, "--set", 'model.init_scales=["output=zero"]'], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "per-role scales output=zero" in r.stdout
    assert re.search(r"blocks\.\*\.attn\.o_proj\.weight +6 \(64, 64\) +output +zeros", r.stdout)
    r = subprocess.run([*run, "--set", 'model.init_scales=["head=zero"]'], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no parameter has role head" in r.stderr
    assert r.stdout == ""  # refused before the parameter counts, not after them


@pytest.mark.parametrize("shared", [False, True], ids=["experts", "shared-expert"])
def test_info_on_an_moe_config_traces_the_writers_on_the_meta_device(shared):
    """`smallinit info` builds the model on the meta device: the MoE forward runs there too (no autocast region on
    a device without autocast, the experts' grouped matmul on shapes alone), so its table of roles and σ is the
    one gamma_init_ draws the real model by, the experts' down_proj an output projection."""
    import dataclasses

    scales = ["embedding=std:1", "output=depth"]
    cfg = ModelConfig.preset("cpu-moe-1m")
    cfg = dataclasses.replace(cfg, n_layers=2, moe=dataclasses.replace(cfg.moe, shared_expert=shared))
    with torch.device("meta"):
        meta = Transformer(cfg, init=False)
    plan = init_plan(meta, 1.0, example_inputs=meta.example_inputs(), scales=scales)
    real = Transformer(cfg, seed=0)
    drawn = gamma_init_(real, 1.0, example_inputs=real.example_inputs(), scales=scales)
    assert [(r.name, r.role, r.rule, r.std) for r in plan.rows] == [
        (r.name, r.role, r.rule, r.std) for r in drawn.rows
    ]
    roles = {r.name: r.role for r in plan.rows}
    assert roles["blocks.0.mlp.down_proj"] == "output" and roles["blocks.0.mlp.up_proj"] == "hidden"
    if shared:
        assert roles["blocks.1.mlp.shared_expert.down_proj.weight"] == "output"
