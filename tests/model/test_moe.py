"""MoE against independent computations: a per-token reference, the dense SwiGLU, the Switch loss formula,
parameter counts from the shapes, γ-init statistics per expert, and a short training run."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from smallinit import Config, ModelConfig, MoEConfig, Transformer, gamma_init_, load_model
from smallinit.cli import main
from smallinit.errors import ConfigError
from smallinit.model import MoE, SwiGLU
from smallinit.model.moe import load_balancing_loss, router_z_loss
from smallinit.train import Callback, Trainer
from support.runs import final_tensors

DISPATCH = ["grouped", "loop"]


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def moe_layer(d=16, d_ff=24, seed=0, gamma=0.5, dispatch="auto", **kw) -> MoE:
    layer = MoE(d, d_ff, MoEConfig(**kw), dispatch=dispatch)
    gamma_init_(layer, gamma, generator=torch.Generator().manual_seed(seed))
    return layer


def reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: scores, top-k by sorting, weights, and each chosen expert as a plain SwiGLU."""
    out = []
    for t in x.reshape(-1, x.shape[-1]):
        logits = layer.router.weight @ t
        s = logits.softmax(-1) if layer.score == "softmax" else logits.sigmoid()
        chosen = sorted(range(layer.num_experts), key=lambda e: -s[e].item())[: layer.top_k]
        total = sum(s[e] for e in chosen) if layer.top_k > 1 else 1.0
        y = torch.zeros_like(t)
        for e in chosen:
            h = F.silu(layer.gate_proj[e] @ t) * (layer.up_proj[e] @ t)
            y = y + s[e] / total * (layer.down_proj[e] @ h)
        if layer.shared_expert is not None:
            y = y + layer.shared_expert(t)
        out.append(y)
    return torch.stack(out).view(x.shape)


@pytest.mark.parametrize("dispatch", DISPATCH)
def test_one_expert_top1_equals_dense_swiglu(dispatch):
    d, d_ff = 32, 48
    dense = SwiGLU(d, d_ff)
    gamma_init_(dense, 0.5, generator=torch.Generator().manual_seed(1))
    x = randn(3, 7, d)
    for score in ("softmax", "sigmoid"):
        layer = moe_layer(d, d_ff, num_experts=1, top_k=1, score=score, dispatch=dispatch)
        with torch.no_grad():
            layer.gate_proj[0] = dense.gate_proj.weight
            layer.up_proj[0] = dense.up_proj.weight
            layer.down_proj[0] = dense.down_proj.weight
        y, _ = layer(x)
        # softmax over one expert is 1; a sigmoid score is kept as the top-1 weight (Switch style)
        scale = 1.0 if score == "softmax" else torch.sigmoid(x @ layer.router.weight.T)
        torch.testing.assert_close(y, scale * dense(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dispatch", DISPATCH)
@pytest.mark.parametrize(
    "score,top_k,shared", [("softmax", 1, False), ("softmax", 2, True), ("sigmoid", 3, False)]
)
def test_matches_per_token_reference(dispatch, score, top_k, shared):
    layer = moe_layer(num_experts=6, top_k=top_k, score=score, shared_expert=shared, dispatch=dispatch)
    x = randn(2, 9, 16)
    y, _ = layer(x)
    torch.testing.assert_close(y, reference(layer, x), atol=1e-6, rtol=1e-5)


def test_dropless_output_does_not_depend_on_the_batch():
    layer = moe_layer(d=32, num_experts=8, top_k=2)
    x = randn(64, 32)
    y_all, _ = layer(x)
    # alone, in a permuted batch, and behind 500 tokens that all crowd the same experts as token 0
    crowd = x[:1].repeat(500, 1) + 1e-3 * randn(500, 32, seed=1)
    for i in (0, 5, 63):
        torch.testing.assert_close(layer(x[i : i + 1])[0][0], y_all[i], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            layer(torch.cat([crowd, x[i : i + 1]]))[0][-1], y_all[i], atol=1e-6, rtol=1e-5
        )
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x[perm])[0], y_all[perm], atol=1e-6, rtol=1e-5)
    # in the model: a sequence's logits do not depend on the other sequences of the batch
    m = Transformer(ModelConfig.preset("cpu-moe-1m", vocab_size=97, max_seq_len=32))
    tokens = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m(tokens[2:3]).logits[0], m(tokens).logits[2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2])
def test_gradients_reach_selected_experts_and_router(top_k):
    layer = moe_layer(num_experts=8, top_k=top_k, aux_loss_weight=0.0, z_loss_weight=0.0)
    x = randn(3, 16)  # few tokens, so some experts stay unselected
    selected = set(layer.route(x)[3].flatten().tolist())
    assert len(selected) < 8
    g_out = randn(3, 16, seed=1)
    (layer(x)[0] * g_out).sum().backward()  # the language-model path only: the aux weights are 0
    for name in ("gate_proj", "up_proj", "down_proj"):
        g = getattr(layer, name).grad
        for e in range(8):
            assert (g[e].abs().sum() > 0) == (e in selected), (name, e)
    assert layer.router.weight.grad.abs().sum() > 0
    # the gradients agree with autograd through the per-token reference (same seed, same weights)
    ref_layer = moe_layer(num_experts=8, top_k=top_k)
    (reference(ref_layer, x) * g_out).sum().backward()
    for p, q in zip(layer.parameters(), ref_layer.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-4)
    # the router losses alone also train the router
    layer.zero_grad()
    layer.aux_loss_weight, layer.z_loss_weight = 0.01, 1e-3
    layer(x)[1].backward()
    assert layer.router.weight.grad.abs().sum() > 0 and layer.gate_proj.grad is None


def test_load_balancing_loss_formula_and_minimum():
    E, N = 8, 4096
    gen = torch.Generator().manual_seed(0)
    # uniform routing: balanced assignments and uniform probabilities give exactly 1
    balanced = torch.full((E,), N // E)
    assert load_balancing_loss(torch.full((N, E), 1 / E), balanced).item() == pytest.approx(1.0, abs=1e-6)
    # against the formula written out
    probs = torch.randn(N, E, generator=gen).mul(3).softmax(-1)
    counts = torch.bincount(probs.argmax(-1), minlength=E)
    expect = E * sum(counts[e].item() / N * probs[:, e].mean().item() for e in range(E))
    assert load_balancing_loss(probs, counts).item() == pytest.approx(expect, rel=1e-5)
    # sharp top-1 routing (f = P): E·Σ f² ≥ 1, reached when balanced; it grows as tokens pile onto expert 0
    # and reaches E when all of them do
    noise, losses = 50 * torch.randn(N, E, generator=gen), []
    for bias in (0.0, 25.0, 50.0, 100.0, 1000.0):
        p = (noise + bias * F.one_hot(torch.tensor(0), E)).softmax(-1)
        losses.append(load_balancing_loss(p, torch.bincount(p.argmax(-1), minlength=E)).item())
    assert 1 - 1e-3 <= losses[0] < 1.02 and losses == sorted(losses) and losses[-1] == pytest.approx(E)
    # the layer reports the same loss for its own routing; zero router weights route uniformly
    layer = moe_layer(num_experts=E, top_k=2)
    x = torch.randn(256, 16, generator=gen)
    layer(x)
    logits, p, _, experts = layer.route(x)
    stats = layer.pop_stats()
    counts = torch.bincount(experts.flatten(), minlength=E)
    assert stats.balance_loss == pytest.approx(load_balancing_loss(p, counts).item(), rel=1e-5)
    z = torch.stack([torch.log(torch.exp(r.double()).sum()) ** 2 for r in logits]).mean().item()
    assert stats.z_loss == pytest.approx(z, rel=1e-5)
    assert stats.load == pytest.approx((counts / counts.sum()).tolist())
    torch.nn.init.zeros_(layer.router.weight)
    _, p, _, experts = layer.route(x)
    assert load_balancing_loss(p, torch.bincount(experts.flatten(), minlength=E)).item() == pytest.approx(1.0)
    assert router_z_loss(torch.zeros(5, E)).item() == pytest.approx(math.log(E) ** 2)


def test_router_losses_in_the_model_output_and_stats():
    cfg = ModelConfig.preset("cpu-moe-1m", vocab_size=97, max_seq_len=32, n_layers=4)
    cfg.moe.every_n_layers = 2
    m = Transformer(cfg)
    assert [type(b.mlp).__name__ for b in m.blocks] == ["SwiGLU", "MoE", "SwiGLU", "MoE"]
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    out = m(x, x)
    stats = [b.mlp.pop_stats() for b in m.blocks if isinstance(b.mlp, MoE)]
    expect = (
        sum(cfg.moe.aux_loss_weight * s.balance_loss + cfg.moe.z_loss_weight * s.z_loss for s in stats) / 2
    )
    assert out.aux_loss.item() == pytest.approx(expect, rel=1e-5)
    assert all(s.forwards == 1 and sum(s.load) == pytest.approx(1.0) for s in stats)
    assert m.blocks[1].mlp.pop_stats() is None  # popped
    m.eval()
    m(x)
    assert m.blocks[1].mlp.pop_stats() is None  # evaluation does not count
    # the capture API works on MoE models and does not change the result
    plain = m(x)
    cap = m(x, capture=("hidden", "attn", "qk", "norms"))
    torch.testing.assert_close(cap.logits, plain.logits, atol=1e-5, rtol=1e-5)
    assert len(cap.hidden_states) == 5 and len(cap.attentions) == 4
    assert Transformer(ModelConfig.preset("cpu-1m", vocab_size=97))(x).aux_loss is None


def expected_counts(cfg: ModelConfig) -> tuple[int, int]:
    """Total and active parameters from the shapes (every layer MoE, untied or tied head)."""
    d, m = cfg.d_model, cfg.moe
    hd = d // cfg.n_heads
    attn = 2 * d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd
    attn += {"none": 0, "headwise": d * cfg.n_heads, "elementwise": d * cfg.n_heads * hd}[cfg.gate]
    expert = 3 * d * (m.d_expert or cfg.d_ff)
    shared = expert if m.shared_expert else 0
    common = (
        cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
        + d
        + cfg.n_layers * (attn + 2 * d + d * m.num_experts + shared)
    )
    return common + cfg.n_layers * m.num_experts * expert, common + cfg.n_layers * m.top_k * expert


@pytest.mark.parametrize(
    "name,total,active",
    [
        ("moe-1.5b-a0.25b", 1.5e9, 0.25e9),
        ("moe-3b-a0.5b", 3e9, 0.5e9),
        ("cpu-moe-1m", 1e6, None),
        ("cpu-moe-5m", 5e6, None),
    ],
)
def test_preset_parameter_counts(name, total, active):
    cfg = ModelConfig.preset(name)
    with torch.device("meta"):
        m = Transformer(cfg, init=False)
    assert (m.num_params(), m.num_params(active=True)) == expected_counts(cfg)
    assert m.num_params() == pytest.approx(total, rel=0.05)
    if active:
        assert m.num_params(active=True) == pytest.approx(active, rel=0.05)
    cfg.moe.shared_expert = True
    with torch.device("meta"):
        m = Transformer(cfg, init=False)
    assert (m.num_params(), m.num_params(active=True)) == expected_counts(cfg)


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_gamma_init_std_per_expert(gamma):
    cfg = ModelConfig.preset("cpu-moe-5m", n_layers=2, gamma=gamma)
    m = Transformer(cfg, seed=3)
    rows = m.init_report.by_name()
    moe = m.blocks[0].mlp
    for name, fan in [("gate_proj", 128), ("up_proj", 128), ("down_proj", 192)]:
        w = getattr(moe, name)
        assert rows[f"blocks.0.mlp.{name}"].fan_in == fan
        for e in range(moe.num_experts):
            assert w[e].std().item() == pytest.approx(fan**-gamma, rel=0.03)
            assert w[e].mean().abs().item() < 0.05 * fan**-gamma
        assert not torch.allclose(w[0], w[1])
    assert moe.router.weight.std().item() == pytest.approx(128**-gamma, rel=0.05)


def test_config_checks_and_cli_info(capsys):
    with pytest.raises(ConfigError, match="capacity_factor"):
        Config.load(preset="cpu-moe-1m", overrides=["model.moe.capacity_factor=1.25"])
    with pytest.raises(ConfigError, match="every_n_layers"):
        Config.load(preset="cpu-moe-1m", overrides=["model.moe.every_n_layers=9"])
    # a nested override changes one key and keeps the preset's others
    moe = Config.load(preset="cpu-moe-5m", overrides=["model.moe.top_k=1"]).model.moe
    assert (moe.top_k, moe.num_experts, moe.d_expert) == (1, 8, 192)
    assert Config.load(preset="cpu-moe-5m", overrides=["model.moe=none"]).model.moe is None
    assert main(["info", "--preset", "moe-1.5b-a0.25b"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    total, active = expected_counts(ModelConfig.preset("moe-1.5b-a0.25b"))
    assert f"{total:,} total, {active:,} active" in first


def test_tiny_moe_trains_and_logs_expert_load(tmp_path):
    run = tmp_path / "run"
    cfg = Config.load(
        preset="cpu-moe-1m",
        overrides=[
            "model.n_layers=2",
            "data.tokenizer=bytes",
            "data.seq_len=32",
            "train.batch_size=8",
            "train.steps=40",
            "train.warmup_steps=5",
            "train.eval_every=20",
            "train.eval_batches=2",
            "train.log_every=10",
            "train.lr=1e-2",
        ],
    )
    trainer = Trainer(cfg, run, callbacks=[])
    summary = trainer.fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert vals[-1] < vals[0] - 1.0
    moe = [r for r in records if r.get("event") == "moe"]
    assert [r["step"] for r in moe] == [10, 20, 30, 40]
    for r in moe:
        assert set(r["load"]) == {"blocks.0.mlp", "blocks.1.mlp"}
        assert all(len(v) == 8 and sum(v) == pytest.approx(1.0, abs=1e-3) for v in r["load"].values())
        assert r["balance_loss"] >= 0.9 and r["z_loss"] > 0 and r["max_load_ratio"] >= 1.0
    assert summary["params_active"] < summary["params"]
    loaded = load_model(run)  # the checkpoint round-trips; the routing counters are not part of it
    assert isinstance(loaded.blocks[0].mlp, MoE)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


class StopAt(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, record):
        if trainer.step == self.step:
            raise KeyboardInterrupt


@pytest.mark.parametrize("compile", ["false", pytest.param("true", marks=pytest.mark.slow)])
def test_top6_training_is_bit_reproducible_with_two_threads(tmp_path, compile):
    """top_k 6 (what every GPU MoE preset uses) on 2 threads: two identical runs, and a run cut between its
    checkpoints and resumed, end with the same model and optimizer tensors bit for bit. With k >= 3 a token's
    k gradients summed in the order threads happen to run would differ in the last bits."""
    sets = [
        "model.n_layers=2",
        "model.moe.top_k=6",
        "data.tokenizer=bytes",
        "data.seq_len=32",
        "train.batch_size=8",  # 256 tokens × 6 slots × d 64: large enough for PyTorch to use both threads
        "train.steps=6",
        "train.warmup_steps=2",
        "train.checkpoint_every=3",
        "train.eval_every=0",
        "train.threads=2",
        f"train.compile={compile}",
    ]
    threads = torch.get_num_threads()
    try:
        for run in ("a", "b"):
            Trainer(Config.load(preset="cpu-moe-1m", overrides=sets), tmp_path / run, callbacks=[]).fit()
        cut = tmp_path / "cut"
        # stopped at step 4: step 4 is lost and redone from step 3's checkpoint
        with pytest.raises(KeyboardInterrupt):
            Trainer(Config.load(preset="cpu-moe-1m", overrides=sets), cut, callbacks=[StopAt(4)]).fit()
        Trainer(Config.load(preset="cpu-moe-1m", overrides=sets), cut, resume=True, callbacks=[]).fit()
    finally:
        torch.set_num_threads(threads)
    a, b, resumed = (final_tensors(tmp_path / run) for run in ("a", "b", "cut"))
    assert len(a) > 20 and a.keys() == b.keys() == resumed.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert [k for k in a if not torch.equal(a[k], resumed[k])] == []


def test_dispatches_agree_under_bf16_autocast():
    layer = moe_layer(d=32, d_ff=48, num_experts=4, top_k=2, dispatch="loop")
    x = randn(40, 32)
    outs = {}
    for dispatch in DISPATCH:
        layer.dispatch = dispatch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[dispatch] = layer(x)[0]
    assert outs["grouped"].dtype == outs["loop"].dtype == torch.bfloat16
    torch.testing.assert_close(outs["grouped"], outs["loop"])
    torch.testing.assert_close(outs["loop"].float(), layer(x)[0], atol=0.05, rtol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("widths", [(32, 48), (20, 12)], ids=["grouped-inside", "loop-inside"])
def test_compile_operator_equals_the_eager_dispatch(dtype, widths):
    """expert_mm (what torch.compile runs) against the loop, forward and both gradients, empty groups included."""
    from smallinit.model.moe import expert_matmul

    d_in, d_out = widths
    counts = torch.tensor([5, 0, 9, 2])
    x, w, dy = randn(16, d_in, seed=1), randn(4, d_out, d_in, seed=2), randn(16, d_out, seed=3)
    grads = {}
    for how in ("loop", "op"):
        xi, wi = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
        y = expert_matmul(xi, wi, counts, how=how)
        y.backward(dy.to(dtype))
        grads[how] = (y, xi.grad, wi.grad)
    for got, want in zip(grads["op"], grads["loop"]):
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want)
    assert not grads["op"][2][1].any()  # the expert that received no row gets no gradient


def test_compiled_moe_is_one_graph_without_breaks_or_recompiles():
    """cpu-moe-1m's blocks compiled as the trainer compiles them: several training steps, the routing changing
    between them, trace one graph (no break, no recompile), and give the eager model's loss and gradients."""
    from torch._dynamo.utils import counters

    cfg = ModelConfig.preset("cpu-moe-1m")
    eager, compiled = Transformer(cfg, seed=0), Transformer(cfg, seed=0)
    for block in compiled.blocks:  # aot_eager: Dynamo and AOTAutograd as under Inductor, without its codegen
        block.forward = torch.compile(block.forward, backend="aot_eager")
    torch._dynamo.reset()
    counters.clear()
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in (eager, compiled)]
    routings = []
    for step in range(3):
        tokens = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(step))
        losses = []
        for model, opt in zip((eager, compiled), opts):
            out = model(tokens, tokens)
            (out.loss + out.aux_loss).backward()
            opt.step()
            opt.zero_grad()
            losses.append(out.loss)
        routings.append(compiled.blocks[0].mlp.pop_stats().load)
        torch.testing.assert_close(losses[1], losses[0])
        eager.blocks[0].mlp.pop_stats()
    assert len({tuple(r) for r in routings}) == len(routings)  # the routing did change between steps
    assert counters["stats"]["unique_graphs"] == 1  # a recompile or a break would trace a second graph
    assert sum(counters["graph_break"].values()) == 0
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b)
