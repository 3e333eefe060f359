"""train.optimizer = "muon": torch.optim.Muon on the hidden matrices beside AdamW, its split, its checkpoints
(kill -9 and resume bit-exact, sharded under FSDP2) and its distributed runs (2 gloo ranks against one process).

torch's Muon orthogonalises in bf16, so the last-bit differences of a 2-rank gradient reduction change a few
bf16 roundings: losses agree as AdamW's do (1e-5 relative, measured ~1e-6), gradient norms to 1e-4 (measured
2.9e-5 at step 6 under FSDP2), weights to 1e-3 (measured 3.7e-4 after 6 steps of d = 32), where AdamW's
agree to 1e-5.
"""

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from smallinit import Config, Transformer
from smallinit.config import ModelConfig, TrainConfig
from smallinit.train import Trainer
from smallinit.train import checkpoint as ckpt
from smallinit.train.optim import (
    MUON,
    OPTIMIZER_FILE,
    MuonAdamW,
    build_optimizer,
    optimizer_split,
    set_lr,
)
from support.distributed import cut_at, records, same, torchrun
from support.runs import TINY_MODEL, final_tensors
from support.training import resume, train_cmd, wait_for_step

WORKER = str(Path(__file__).parents[1] / "_dist_worker.py")
TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=2",
    "train.eval_batches=2",
    "train.log_every=1",
    "train.optimizer=muon",
]
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.d_expert=32"]
DIST = [*TINY, "train.grad_accum=2", "train.steps=6", "train.eval_every=3", "train.checkpoint_every=3"]
DIST += ["train.keep_checkpoints=10"]
RTOL = 1e-5  # losses, relative
ATOL = 1e-3  # weights, absolute: bf16 Newton–Schulz (module docstring)


def held(opt: MuonAdamW) -> tuple[set[int], set[int]]:
    return (
        {id(p) for g in opt.muon.param_groups for p in g["params"]},
        {id(p) for g in opt.adamw.param_groups for p in g["params"]},
    )


@pytest.mark.parametrize("moe", [False, True])
def test_the_split_is_what_each_optimizer_holds(moe):
    cfg = ModelConfig.preset("cpu-1m", n_layers=2, tie_embeddings=False, **({"moe": {}} if moe else {}))
    model = Transformer(cfg)
    tc = TrainConfig(optimizer="muon")
    split, opt = optimizer_split(model, tc), build_optimizer(model, tc)
    muon, adamw = held(opt)
    params = dict(model.named_parameters())
    assert split.keys() == params.keys() and not muon & adamw
    assert {n for n in split if split[n] == MUON} == {n for n, p in params.items() if id(p) in muon}
    assert {n for n in split if split[n] != MUON} == {n for n, p in params.items() if id(p) in adamw}
    why = {n: split[n].removeprefix("adamw: ") for n in split if split[n] != MUON}
    assert why["embed.weight"] == "embedding" and why["lm_head.weight"] == "output head"
    assert why["norm.weight"] == "norm" and why["blocks.0.attn.g_proj.weight"] == "attention gate"
    hidden = "blocks.1.mlp.router.weight" if moe else "blocks.1.mlp.up_proj.weight"
    assert split["blocks.0.attn.o_proj.weight"] == split[hidden] == MUON
    if moe:  # fused experts are 3-d: torch's Muon refuses them, AdamW holds them
        assert why["blocks.0.mlp.up_proj"].startswith("3-d")
    assert all(params[n].dim() == 2 for n in split if split[n] == MUON)
    # the schedule sets both; muon_lr scales Muon's through it
    tc = TrainConfig(optimizer="muon", lr=1e-3, muon_lr=2e-2, warmup_steps=0)
    opt = build_optimizer(model, tc)
    set_lr(opt, 0, tc)
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(2e-2)
    assert [g["lr"] for g in opt.adamw.param_groups] == pytest.approx([1e-3, 1e-3])


def test_adamw_holds_everything_by_default():
    model = Transformer(ModelConfig.preset("cpu-1m", n_layers=1))
    opt = build_optimizer(model, TrainConfig())
    assert isinstance(opt, torch.optim.AdamW)
    assert set(optimizer_split(model, TrainConfig()).values()) == {"adamw"}


@pytest.mark.parametrize("extra", [[], MOE], ids=["dense", "moe"])
def test_muon_trains_and_writes_its_split(tmp_path, extra):
    run = tmp_path / "run"
    cfg = Config.load(overrides=[*TINY, *extra, "train.steps=30", "train.eval_every=30", "train.lr=1e-2"])
    Trainer(cfg, run, callbacks=[]).fit()
    vals = [r["val_loss"] for r in records(run) if "val_loss" in r]
    assert vals[-1] < vals[0] - 0.5  # from ≈ ln(257) = 5.55
    split = json.loads((run / OPTIMIZER_FILE).read_text())
    state = final_tensors(run)
    for name, how in split.items():  # each optimizer's own state, for the parameters it holds
        keys = ckpt.MUON_STATE if how == MUON else ckpt.ADAM_STATE
        assert all(f"{name}.{k}" in state for k in keys), name


@pytest.mark.parametrize(
    "preset", ["cpu-1m", "cpu-5m", pytest.param("cpu-20m", marks=pytest.mark.slow), "cpu-moe-1m"]
)
def test_the_cpu_presets_and_an_moe_preset_train_with_muon(tmp_path, preset):
    sets = ["data.tokenizer=bytes", "data.seq_len=16", "train.batch_size=2", "train.steps=2"]
    cfg = Config.load(preset=preset, overrides=[*sets, "train.eval_every=0", "train.optimizer=muon"])
    trainer = Trainer(cfg, tmp_path / "run", callbacks=[])
    summary = trainer.fit()
    assert (
        math.isfinite(summary["val_loss"]) and trainer.optimizer.muon.state and trainer.optimizer.adamw.state
    )


def test_muon_resumes_bit_exact_after_kill_9(tmp_path):
    args = ("train.steps=30", "train.checkpoint_every=4", "train.eval_every=10", "train.log_every=1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(train_cmd(tmp_path / "full", *TINY, *args), check=True, env=env, capture_output=True)
    run = tmp_path / "killed"
    proc = subprocess.Popen(train_cmd(run, *TINY, *args), env=env, stdout=subprocess.DEVNULL)
    wait_for_step(run, 10)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert 8 <= ckpt.latest_checkpoint(run).step < 30
    resume(run, env)
    full, res = final_tensors(tmp_path / "full"), final_tensors(run)
    assert any(k.endswith(".momentum_buffer") for k in full)
    assert same(full, res)


def test_a_bad_optimizer_name_is_one_line_with_the_choices(tmp_path):
    r = subprocess.run(
        [*train_cmd(tmp_path / "run", "train.optimizer=sgd")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "adamw" in r.stderr and "muon" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path):
    run = tmp_path / "run"
    Trainer(Config.load(overrides=[*TINY, "train.steps=2", "train.eval_every=0"]), run, callbacks=[]).fit()
    _, optim = ckpt.read_tensors(ckpt.latest_checkpoint(run))
    adamw = Trainer(
        Config.load(overrides=[*TINY, "train.steps=2", "train.optimizer=adamw"]), tmp_path / "b", callbacks=[]
    )
    with pytest.raises(ckpt.CheckpointError, match="another train.optimizer"):
        ckpt.load_optimizer_tensors(adamw.optimizer, optim, adamw.names)
    adamw.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """single (this process); one 2-rank job writing ddp and fsdp; a second resuming both cut at step 3."""
    root = tmp_path_factory.mktemp("muon-dist")
    Trainer(Config.load(overrides=DIST), root / "single", callbacks=[]).fit()
    r = torchrun(WORKER, "init@ddp", root / "ddp", "init@fsdp", root / "fsdp", "--", *DIST)
    assert r.returncode == 0, r.stderr[-3000:]
    for layout in ("ddp", "fsdp"):
        cut_at(root / layout, root / f"{layout}-resumed", 3)
    r = torchrun(
        WORKER, "resume@ddp", root / "ddp-resumed", "resume@fsdp", root / "fsdp-resumed", "--", *DIST
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_muon_on_two_ranks_matches_one_process(runs, layout):
    single, multi = records(runs / "single"), records(runs / layout)
    assert [r["step"] for r in multi] == [r["step"] for r in single]
    for key, rel in (("loss", RTOL), ("val_loss", RTOL), ("grad_norm", 10 * RTOL)):
        a, b = [r[key] for r in single if key in r], [r[key] for r in multi if key in r]
        assert len(a) == len(b) > 0 and b == pytest.approx(a, rel=rel), key
    a, b = final_tensors(runs / "single"), final_tensors(runs / layout)
    assert a.keys() == b.keys() and any(k.endswith(".momentum_buffer") for k in b)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < ATOL


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_muon_resume_on_two_ranks_is_exact(runs, layout):
    """Both optimizers' states come back from the (sharded) checkpoint of step 3: the run ends bit-identical."""
    resumed = runs / f"{layout}-resumed"
    assert ckpt.newest_checkpoint(resumed).sharded
    assert same(final_tensors(resumed), final_tensors(runs / layout))
    assert [r["loss"] for r in records(resumed) if "loss" in r] == [
        r["loss"] for r in records(runs / layout) if "loss" in r
    ]
