"""train.compile: the "auto" rule, the choice a run records and keeps, the sweep's shared cache, and the
compiled step against eager (numerics within the tolerance of test_distributed, resume bit for bit)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from smallinit import Config, ModelConfig, Transformer
from smallinit.errors import ConfigError
from smallinit.study.running import Sweep, SweepRunner, compile_cache_env
from smallinit.train import Trainer, compiling
from smallinit.train import checkpoint as ckpt
from smallinit.train.distributed import compile_for_training
from support.runs import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "data.corpus=shakespeare",
    "train.batch_size=8",
    "train.warmup_steps=1",
    "train.eval_batches=2",
    "train.device=cpu",
]


def cfg(*sets: str) -> Config:
    return Config.load(overrides=[*TINY, *sets])


def test_compile_key_takes_true_false_and_auto_only():
    assert Config().train.compile == "auto"
    assert cfg("train.compile=true").train.compile is True
    assert cfg("train.compile=false").train.compile is False
    assert cfg('train.compile="auto"').train.compile == "auto"
    with pytest.raises(ConfigError, match='train.compile must be true, false or "auto"'):
        cfg("train.compile=yes")
    with pytest.raises(ConfigError, match="train.compile must be bool or str"):
        cfg("train.compile=1")


def test_auto_compiles_where_the_saved_time_pays_for_the_compile():
    per_step = compiling.saved_s(cfg("train.steps=1"))
    cold_steps, warm_steps = compiling.COLD_S / per_step, compiling.WARM_S / per_step
    short_steps = int(1.5 * warm_steps) + 1  # pays for a warm compile with room to spare, not for a cold one
    short, long = cfg(f"train.steps={short_steps}"), cfg(f"train.steps={int(cold_steps) + 1}")
    assert not compiling.compile_pays([short], warm=False)
    assert compiling.compile_pays([short], warm=True)  # a warm cache makes a shorter run worth it
    assert compiling.compile_pays([long], warm=False)
    # cells of one graph share the cold compile: enough of them pay for it where one does not
    n = int(compiling.COLD_S / (per_step * short_steps - compiling.WARM_S)) + 2
    assert compiling.compile_pays([short] * n, warm=False)
    assert not compiling.compile_pays([short] * n, warm=False, jobs=n)  # ...unless all compile cold at once
    for other in ("model.d_model=256", "train.device=cuda"):  # not measured to pay: eager
        assert not compiling.compile_pays([cfg(f"train.steps={10**7}", other)], warm=True)
    assert not compiling.compile_pays(
        [Config.load(preset="cpu-moe-1m", overrides=["train.steps=10000000"])], warm=True
    )


def test_explicit_choices_and_a_resumed_runs_record_win_over_the_rule():
    long = f"train.steps={10**7}"
    assert compiling.resolve(cfg(long), 1, None) is True
    assert compiling.resolve(cfg(long, "train.compile=false"), 1, None) is False
    assert compiling.resolve(cfg("train.steps=2", "train.compile=true"), 1, None) is True
    assert compiling.resolve(cfg(long), 1, recorded=False) is False  # resume keeps the mode it started in
    assert compiling.resolve(cfg(long), 2, None) is False  # torchrun: not measured, eager


def test_runs_share_a_graph_across_gamma_and_seed_but_not_across_shapes_or_eps():
    key = compiling.graph_key(cfg())
    assert compiling.graph_key(cfg("model.gamma=0.5", "train.seed=3", "train.steps=7")) == key
    for other in ("model.d_model=64", "model.norm_eps=1e-5", "model.gate=none", "data.seq_len=16"):
        assert compiling.graph_key(cfg(other)) != key, other


def test_cache_marker(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    c = cfg()
    assert not compiling.is_warm(c)
    compiling.mark_warm(c)
    assert compiling.is_warm(c) and compiling.is_warm(cfg("model.gamma=0.5"))
    assert not compiling.is_warm(c, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "other")})


def test_sweep_cells_share_one_cache_and_one_choice_per_graph(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("SMALLINIT_CACHE", str(tmp_path / "cache"))
    assert compile_cache_env() == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "compile")}
    assert compile_cache_env({"TORCHINDUCTOR_CACHE_DIR": "/x"}) == {"TORCHINDUCTOR_CACHE_DIR": "/x"}
    base = dict(c.split("=", 1) for c in TINY)
    base = {k: v if not v.isdigit() else int(v) for k, v in base.items()}
    steps = int(compiling.COLD_S / compiling.saved_s(cfg("train.steps=1"))) + 1
    sweep = Sweep.from_dict(
        {
            "base": {**base, "train.steps": steps},
            "grid": {"model.gamma": [0.5, 1.0]},
            "arms": {"auto": {}, "off": {"train.compile": False}},
        }
    )
    runner = SweepRunner(sweep, tmp_path / "sweep", jobs=1)
    assert runner.compile == {
        "auto_gamma-0.5": True,
        "auto_gamma-1.0": True,
    }  # the explicit arm is left alone
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    compiling.mark_warm(cfg(f"train.steps={steps}"))
    short = Sweep.from_dict({"base": {**base, "train.steps": 1}, "grid": {"model.gamma": [0.5, 1.0]}})
    assert SweepRunner(short, tmp_path / "s2", jobs=1).compile == {"gamma-0.5": False, "gamma-1.0": False}


def test_compiled_blocks_share_one_graph_match_eager_and_leave_no_grad_calls_eager():
    """The one compile in the fast suite (~20 s): a 2-layer d = 16 model, forward and backward."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    mc = ModelConfig.preset("cpu-1m", d_model=16, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=32, vocab_size=64)
    eager, compiled = Transformer(mc, seed=0), Transformer(mc, seed=0)
    for block in compiled.blocks:
        compile_for_training(block)
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        compiled(x, y)
    assert counters["stats"]["unique_graphs"] == 0  # evaluation and analysis do not compile
    losses = []
    for model in (eager, compiled):
        loss = model(x, y).loss
        loss.backward()
        losses.append(loss.item())
    assert counters["stats"]["unique_graphs"] == 1  # one graph for both layers
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-3, atol=1e-7), name


def _final_weights(run):
    return load_file(ckpt.newest_checkpoint(run).path / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["true", "false"])
def test_resume_is_bit_exact_within_one_mode(tmp_path, mode):
    sets = ["train.steps=4", "train.checkpoint_every=2", "train.eval_every=2", f"train.compile={mode}"]
    Trainer(cfg(*sets), tmp_path / "full", callbacks=[]).fit()
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    shutil.rmtree(ckpt.checkpoint_dir(tmp_path / "cut", 4))  # as if killed between the checkpoints
    (tmp_path / "cut" / "summary.json").unlink()
    resumed = Trainer(cfg(*sets[:-1]), tmp_path / "cut", resume=True, callbacks=[])  # compile left at "auto"
    assert resumed.cfg.train.compile is (mode == "true") and resumed.step == 2
    resumed.fit()
    a, b = _final_weights(tmp_path / "full"), _final_weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
