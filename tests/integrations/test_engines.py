"""The pretraining engines for real (marker ``engines``; .ci/run installs their extras): torchtitan, OLMo-core
and litgpt, each training its own model with the Monitor and no adapter written here.

* docs/integrations.md's example of each engine runs as written (torchtitan and OLMo-core under torchrun,
  2 gloo ranks, FSDP2), trains 20 steps, and ``smallinit report`` draws the folder it wrote;
* γ-init inside each engine (torchtitan's init_states, OLMo-core's Callback, litgpt's reset_parameters
  hook) gives every parameter, gathered from its shards, the value one process draws on the unsharded model;
* the Monitor's measurements on each engine's model equal references computed here by hand from the
  engine's own modules: the sink from probabilities softmax(q·kᵀ·scale) over the causal mask, with q and k
  as the engine's attention kernel receives them; the residual flow from the embedding's output and the
  final norm's input; each norm's factor by its own formula √(mean(x²) / (mean(x²) + ε)); the stable rank
  ‖W‖_F² / σ_max² of every matrix, and of each part (q, k, v) of a fused projection, split as the engine's
  forward splits it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from smallinit import Monitor, gamma_init_, set_norm_eps_
from smallinit.cli import main
from smallinit.monitor.records import AnalysisRecord, parse_record

pytestmark = pytest.mark.engines

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
WORKER = Path(__file__).parents[1] / "_engines_worker.py"
# what the report draws from a monitor's records: each measurement's section
SECTIONS = ("RMSNorm factor", "Attention sink per layer", "Residual flow", "Condensation: stable rank")


def doc_block(section: str) -> str:
    body = re.split(r"^## ", DOC.read_text(encoding="utf-8"), flags=re.M)
    (text,) = [b for b in body if b.startswith(section + "\n")]
    (code,) = re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)
    return code


def run(args: list[str], cwd: Path) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # the workers beside the smallinit this test imports (a checkout on PYTHONPATH, not the installed one)
        "PYTHONPATH": os.pathsep.join([str(WORKER.parent), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", *args]


def analysis(folder: Path) -> list[AnalysisRecord]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(parse_record, map(json.loads, lines)) if isinstance(r, AnalysisRecord)]


def check_trained_and_reported(folder: Path, world_size: int) -> None:
    recs = analysis(folder)
    assert [r.step for r in recs] == [0, 10, 20]
    for r in recs:  # every measurement taken, on the engine's model as it is
        assert r.sink and r.residual_flow > 0 and r.norm_factor and r.matrices and r.max_attention_logit, r
    assert recs[-1].loss != recs[0].loss  # the steps moved the weights the monitor measures
    assert json.loads((folder / "monitor.json").read_text())["world_size"] == world_size
    assert main(["report", str(folder), "--out", str(folder / "report")]) == 0
    page = (folder / "report" / "report.html").read_text(encoding="utf-8")
    for title in SECTIONS:
        assert title in page, title


# -- each engine's example of docs/integrations.md, as written ---------------------------------------------


@pytest.mark.parametrize(
    ("section", "module", "folder", "world"),
    [
        ("torchtitan", "torchtitan", "runs/titan", 2),
        ("OLMo-core", "olmo_core", "runs/olmo/smallinit", 2),
        ("litgpt", "litgpt", "runs/litgpt", 1),
    ],
)
def test_the_doc_example_trains_with_the_monitor_and_is_reported(tmp_path, section, module, folder, world):
    pytest.importorskip(module)
    script = tmp_path / "example.py"
    script.write_text(doc_block(section), encoding="utf-8")
    run(torchrun(str(script)) if world == 2 else [sys.executable, str(script)], cwd=tmp_path)
    check_trained_and_reported(tmp_path / folder, world)
    if section == "torchtitan":  # its fused wqkv, sharded: watched whole and per part, never silently missed
        ranks = analysis(tmp_path / folder)[-1].by_matrix("stable_rank")
        for i in (0, 1):
            name = f"layers.{i}.attention.qkv_linear.wqkv.weight"
            assert {f"{name}[{part}]" for part in "qkv"} | {name} <= set(ranks), sorted(ranks)


# -- γ-init inside the engines: the sharded draw is the unsharded one ----------------------------------------


def test_torchtitan_init_states_draws_the_gamma_rule_and_shards_get_the_unsharded_draw(tmp_path):
    pytest.importorskip("torchtitan")
    run(torchrun(str(WORKER), "titan", str(tmp_path)), cwd=tmp_path)
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["sharded"] and ok["differ"] == []
    for name, W in torch.load(tmp_path / "titan.pt").items():  # torchtitan's init_states drew N(0, d_in^-2)
        if W.dim() == 2:
            assert W.std().item() == pytest.approx(W.shape[-1] ** -1.0, rel=0.05), name
        else:
            assert torch.equal(W, torch.ones_like(W)), name  # its norms: 1, as the γ rule sets them


def test_olmo_callback_gamma_initialises_the_sharded_model_as_one_process(tmp_path):
    pytest.importorskip("olmo_core")
    run(torchrun(str(WORKER), "olmo", str(tmp_path)), cwd=tmp_path)
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["sharded"] and ok["differ"] == []


def test_litgpt_initialize_weights_hook_draws_what_gamma_init_draws():
    pytest.importorskip("litgpt")
    import lightning as L
    from litgpt import GPT

    from smallinit.integrations.litgpt import initialize_weights

    model = GPT(litgpt_config())
    report = initialize_weights(L.Fabric(accelerator="cpu", devices=1), model, gamma=1.0, seed=3)
    reference = GPT(litgpt_config())
    gamma_init_(reference, 1.0, generator=torch.Generator().manual_seed(3))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert report.by_name()["transformer.h.0.mlp.proj.weight"].fan_in == 64  # d_in of the down projection


# -- the measurements against references computed from each engine's own modules ---------------------------


# -- the paper's gate on the engines' models -------------------------------------------------------------


def titan_mla_model():
    """torchtitan's DeepSeek-V3 debug model, 2 layers, its attention with a low-rank query (q_lora_rank > 0, as
    its 236B and 671B flavors: wq_a → q_norm → wq_b, no wq), through SDPA, drawn by its own init_weights."""
    pytest.importorskip("torchtitan")
    from torchtitan.models import deepseek_v3
    from torchtitan.models.common.attention import ScaledDotProductAttention

    config = deepseek_v3.model_registry("debugmodel").model
    config.layers = config.layers[:2]
    for i, layer in enumerate(config.layers):
        a = layer.attention
        layer.attention = deepseek_v3.make_mla_attention_config(
            layer_id=i, dim=config.dim, n_heads=a.n_heads, q_lora_rank=64, kv_lora_rank=a.kv_lora_rank,
            qk_nope_head_dim=a.qk_nope_head_dim, qk_rope_head_dim=a.qk_rope_head_dim, v_head_dim=a.v_head_dim,
            mscale=a.mscale, attn_backend="flex", linear_init=a.wkv_a.param_init, norm_init=a.kv_norm.param_init,
            depth_init=lambda _i, init=a.wo.param_init: init, rope=a.rope,
        )  # fmt: skip
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    return model


def gate_model(engine: str):
    """(model γ-initialised, its first attention block, the block's query and output projection, tokens)."""
    if engine == "torchtitan":
        pytest.importorskip("torchtitan")
        from _engines_worker import titan_model

        model, first, projections, vocab = (
            titan_model(shard=False),
            "layers.0.attention",
            ("qkv_linear", "wo"),
            2048,
        )
    elif engine == "torchtitan-mla":
        model, first, projections, vocab = titan_mla_model(), "layers.0.attention", ("wq_a", "wo"), 2048
    elif engine == "litgpt":
        pytest.importorskip("litgpt")
        from litgpt import GPT

        model = GPT(litgpt_config())
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        first, projections, vocab = "transformer.h.0.attn", ("qkv", "proj"), 256
    else:
        pytest.importorskip("olmo_core")
        from olmo_core.nn.transformer import TransformerConfig

        model = TransformerConfig.olmo2_1M(vocab_size=256).build(init_device="cpu")
        model.init_weights(device=torch.device("cpu"))
        gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
        first, projections, vocab = "blocks.0.attention", ("w_q", "w_out"), 256
    return (
        model,
        first,
        projections,
        torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(1)),
    )


@pytest.mark.parametrize("engine", ["torchtitan", "torchtitan-mla", "OLMo-core", "litgpt"])
def test_the_gate_on_an_engines_model_is_the_papers_and_trains(engine):
    """add_attention_gate_ on the engine's own model: the output projection of the first block reads
    Y ⊙ σ(X W_θ), Y and X taken from the ungated model (its query projection's input, its output projection's
    input); W_θ has σ = d_model^(−1); 20 AdamW steps lower the loss and move W_θ."""
    import copy

    from smallinit import add_attention_gate_

    model, first, (q, o), tokens = gate_model(engine)
    ungated = copy.deepcopy(model)
    report = add_attention_gate_(model, "elementwise", 1.0, generator=torch.Generator().manual_seed(2))
    kind = first.rsplit(".", 1)[1]  # what the engine calls its attention blocks
    blocks = [n for n, m in model.named_modules() if n.endswith(kind) and hasattr(m, o)]
    assert report.blocks == blocks and len(blocks) >= 2 and not report.ungated and not report.kept
    seen = {}

    def keep(key):  # the first call's input; the hook returns None, so it changes nothing
        def hook(module, args, *output):
            seen.setdefault(key, args[0])

        return hook

    getattr(ungated.get_submodule(first), q).register_forward_pre_hook(keep("X"))
    getattr(ungated.get_submodule(first), o).register_forward_pre_hook(keep("Y"))
    gated = model.get_submodule(first)
    handle = getattr(gated, o).register_forward_hook(keep("gated"))  # its input after the gate's pre-hook
    x = tokens[:, :-1]
    with torch.no_grad():
        ungated(x), model(x)
    handle.remove()
    W = gated.g_proj.weight.detach().clone()
    assert W.shape == (getattr(gated, o).in_features, seen["X"].shape[-1])
    assert W.std().item() == pytest.approx(1 / W.shape[1], rel=0.1)
    torch.testing.assert_close(
        seen["gated"], seen["Y"] * torch.sigmoid(seen["X"] @ W.T), rtol=1e-5, atol=1e-6
    )

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5 and not torch.equal(gated.g_proj.weight, W)


def test_a_gated_torchtitan_model_trains_under_fully_shard_as_in_one_process(tmp_path):
    pytest.importorskip("torchtitan")
    run(torchrun(str(WORKER), "titan_gate", str(tmp_path)), cwd=tmp_path)
    got = torch.load(tmp_path / "titan_gate.pt")
    sharded, one = got["losses"][True], got["losses"][False]
    assert sharded == pytest.approx(one, rel=1e-4) and one[-1] < one[0] - 0.5
    assert sorted(got["gates"][True]) == [f"layers.{i}.attention.g_proj.weight" for i in (0, 1)]
    for name, W in got["gates"][False].items():
        torch.testing.assert_close(got["gates"][True][name], W, rtol=1e-4, atol=1e-6)
    # the documented path (gamma_param_init, build on meta, add the gate, init_weights()) drew W_θ itself:
    # σ = d_model^(−1), the same numbers sharded and whole, never the memory to_empty left
    for name, W in got["documented"][False].items():
        assert W.std().item() == pytest.approx(1 / W.shape[1], rel=0.05), name
        assert torch.equal(got["documented"][True][name], W), name


def test_a_litgpt_model_gated_on_meta_is_drawn_by_fsdps_materialisation_and_trains(tmp_path):
    """litgpt's pretraining on meta under FSDP: the γ hooks and the gate's own reset draw every matrix as FSDP
    materialises it (torch's FSDP1 on 2 ranks, calling reset_parameters as Fabric's FSDP does); each matrix has
    σ = d_in^(−γ), W_θ included, and it trains. The gate drawn by the hook was left flagged undrawn and its
    forward refused."""
    pytest.importorskip("litgpt")
    run(torchrun(str(WORKER), "litgpt_meta_fsdp", str(tmp_path)), cwd=tmp_path)
    got = torch.load(tmp_path / "litgpt_meta_fsdp.pt")
    matrices = {n: W for n, W in got["weights"].items() if W.ndim == 2}
    assert {n for n in matrices if "g_proj" in n} == {f"transformer.h.{i}.attn.g_proj.weight" for i in (0, 1)}
    for name, W in matrices.items():  # d_in is each matrix's row length, the embedding's d_model included
        assert W.std().item() == pytest.approx(W.shape[1] ** -1.0, rel=0.1), name
    losses = got["losses"]
    assert losses[-1] < losses[0] - 0.3


def test_a_monitor_built_before_the_optimizer_leaves_fsdp2_training_bit_identical(tmp_path):
    """FSDP2 reshards after the backward: the Monitor's forward (it has none) must not leave the root's
    unsharded parameters registered for an optimizer built next to update as copies."""
    pytest.importorskip("torchtitan")
    run(torchrun(str(WORKER), "titan_monitor_order", str(tmp_path)), cwd=tmp_path)
    runs = torch.load(tmp_path / "titan_monitor_order.pt")
    plain = runs["none"]
    assert plain["losses"][-1] < plain["losses"][0]
    for order in ("monitor-first", "optimizer-first"):
        assert runs[order]["losses"] == plain["losses"], order
        for name, W in plain["weights"].items():
            assert torch.equal(runs[order]["weights"][name], W), (order, name)


def litgpt_config():
    from litgpt import Config

    return Config(
        block_size=64,
        vocab_size=256,
        padded_vocab_size=256,
        n_layer=2,
        n_head=4,
        n_query_groups=2,
        n_embd=32,
        intermediate_size=64,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        parallel_residual=False,
    )


class Taps:
    """What the engine's modules receive and return in one forward, read with hooks on them."""

    def __init__(self):
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.qk: list[tuple[torch.Tensor, torch.Tensor, float | None]] = []  # (B, H, T, hd) each
        self.handles = []

    def input_of(self, name: str, module: torch.nn.Module) -> None:
        self.handles.append(
            module.register_forward_pre_hook(lambda m, args: self.inputs.__setitem__(name, args[0].detach()))
        )

    def output_of(self, name: str, module: torch.nn.Module) -> None:
        self.handles.append(
            module.register_forward_hook(lambda m, args, out: self.outputs.__setitem__(name, out.detach()))
        )

    def clear(self) -> None:
        self.inputs.clear()
        self.outputs.clear()
        self.qk.clear()


def sink_by_hand(q: torch.Tensor, k: torch.Tensor, scale: float | None) -> float:
    """Mean over heads, sequences and queries i ≥ 2 of the weight on key 1, from softmax(q·kᵀ·scale)
    over the causal mask (grouped keys repeated over their query heads)."""
    q, k = q.double(), k.double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    T = s.shape[-1]
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1)[:, :, 1:, 0].mean(dim=(0, 2)).mean().item()


def rms_factor(x: torch.Tensor, eps: float) -> float:
    ms = x.double().pow(2).mean(-1)
    return (ms / (ms + eps)).sqrt().mean().item()


def stable_rank_by_hand(W: torch.Tensor) -> float:
    s = torch.linalg.svdvals(W.double())
    return (s.pow(2).sum() / s[0] ** 2).item()


def check_against_references(
    model, taps: Taps, tokens, *, embedding, final_norm, norms, fused, tmp_path, monitored=None
):
    """The Monitor's record at step 0 (of ``monitored``, the model where not given) against the references read
    by ``taps`` in the same forward."""
    with Monitor(monitored or model, every=1, batch=tokens, out=tmp_path / "mon") as monitor:
        taps.clear()  # what building the monitor ran is not the measured forward
        rec = parse_record(monitor(0))
    e, h_L = taps.outputs[embedding].double(), taps.inputs[final_norm].double()
    flow = ((h_L - e).norm(dim=-1) / e.norm(dim=-1)).mean().item()
    assert rec.residual_flow == pytest.approx(flow, rel=1e-6)
    sinks = [sink_by_hand(q, k, scale) for q, k, scale in taps.qk]
    assert len(taps.qk) == len(rec.sink.per_layer) > 0
    assert list(rec.sink.per_layer) == pytest.approx(sinks, rel=1e-5)
    factors = {name: rms_factor(taps.inputs[name], eps) for name, eps in norms.items()}
    assert set(rec.norm_factor) == set(factors)
    assert rec.norm_factor == pytest.approx(factors, rel=1e-6)
    ranks = rec.by_matrix("stable_rank")
    params = dict(model.named_parameters())
    matrices = {f"{n}.weight": m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, W in matrices.items():  # every projection, fused or not, under its own name
        assert ranks[name] == pytest.approx(stable_rank_by_hand(W.detach()), rel=1e-4), name
    for name, parts in fused.items():  # and each part of a fused one, as the forward splits it
        got = sorted(v for k, v in ranks.items() if k != name and k.startswith(name))
        want = sorted(stable_rank_by_hand(p) for p in parts(params[name].detach()))
        assert got == pytest.approx(want, rel=1e-4), name
    return rec, {"flow": flow, "sink": sinks, "norm_factor": factors}


@pytest.mark.parametrize("inner", ["sdpa", "flex", "flex-call"])
def test_torchtitan_measurements_equal_their_references(tmp_path, inner):
    """SDPA, and torchtitan's default: flex attention, compiled, with its block mask from
    get_attention_masks (built by the adapter as torchtitan's trainer builds it, or passed by call=), measured
    on the CPU through smallinit's math path of it, said."""
    pytest.importorskip("torchtitan")
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    from smallinit.adapters import TracedAdapter

    config = model_registry("debugmodel").model
    config.layers = config.layers[:2]
    if inner == "sdpa":
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = config.build()
    with torch.no_grad():
        model.init_weights()
    gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    set_norm_eps_(model, 1e-3)  # factors well below 1, so each norm's formula is tested where it bites
    taps = Taps()
    taps.output_of("tok_embeddings", model.tok_embeddings)
    norms = {n: m.eps for n, m in model.named_modules() if isinstance(m, torch.nn.RMSNorm)}
    for name in norms:
        taps.input_of(name, model.get_submodule(name))
    for block in model.layers.values():  # q, k as the kernel receives them: (B, T, H, hd), after RoPE
        block.attention.inner_attention.register_forward_pre_hook(
            lambda m, args, kwargs: taps.qk.append(
                (args[0].transpose(1, 2), args[1].transpose(1, 2), kwargs.get("scale"))
            ),
            with_kwargs=True,
        )
    attention = model.layers["0"].attention.qkv_linear
    hpk, hd = attention.heads_per_kv, attention.head_dim

    def qkv_parts(W):  # rows are (kv group, [its query heads, its key, its value], head dim)
        W = W.view(-1, hpk + 2, hd, W.shape[-1])
        return [W[:, part].reshape(-1, W.shape[-1]) for part in (slice(0, hpk), hpk, hpk + 1)]

    fused = {f"layers.{i}.attention.qkv_linear.wqkv.weight": qkv_parts for i in model.layers}
    tokens = torch.randint(0, 2048, (2, 16), generator=torch.Generator().manual_seed(1))

    def with_masks(m, t):  # torchtitan's training loop passes flex attention its block mask so
        return m(t, attention_masks=m.get_attention_masks(torch.arange(t.shape[1]).expand(t.shape[0], -1)))

    rec, ref = check_against_references(
        model,
        taps,
        tokens,
        embedding="tok_embeddings",
        final_norm="norm",
        norms=norms,
        fused=fused,
        tmp_path=tmp_path,
        monitored=TracedAdapter(model, call=with_masks) if inner == "flex-call" else None,
    )
    assert not rec.not_measured
    if inner != "sdpa":  # and says how
        with torch.no_grad():
            adapter = TracedAdapter(model, call=with_masks if inner == "flex-call" else None)
            notes = adapter.observe(tokens, kinds=("attention",)).notes
        assert "math path" in notes["attention"], notes


def test_olmo_measurements_equal_their_references(tmp_path):
    pytest.importorskip("olmo_core")
    from olmo_core.nn.transformer import TransformerConfig

    model = TransformerConfig.olmo2_1M(vocab_size=256).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    set_norm_eps_(model, 1e-3)  # factors well below 1, so each norm's formula is tested where it bites
    taps = Taps()
    taps.output_of("embeddings", model.embeddings)
    norms = {n: m.eps for n, m in model.named_modules() if type(m).__name__ == "RMSNorm"}
    for name in norms:
        taps.input_of(name, model.get_submodule(name))
    for block in model.blocks.values():  # the backend receives (q, k, v) as (B, T, H, hd), after RoPE
        block.attention.backend.register_forward_pre_hook(
            lambda m, args: taps.qk.append(
                (args[0][0].transpose(1, 2), args[0][1].transpose(1, 2), getattr(m, "scale", None))
            )
        )
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    rec, ref = check_against_references(
        model,
        taps,
        tokens,
        embedding="embeddings",
        final_norm="lm_head.norm",
        norms=norms,
        fused={},
        tmp_path=tmp_path,
    )
    assert not rec.not_measured


def test_litgpt_measurements_equal_their_references(tmp_path):
    pytest.importorskip("litgpt")
    from litgpt import GPT

    config = litgpt_config()
    model = GPT(config)
    gamma_init_(model, 1.0, generator=torch.Generator().manual_seed(0))
    set_norm_eps_(model, 1e-3)  # factors well below 1, so each norm's formula is tested where it bites
    taps = Taps()
    taps.output_of("transformer.wte", model.transformer.wte)
    norms = {n: m.eps for n, m in model.named_modules() if type(m).__name__ == "RMSNorm"}
    for name in norms:
        taps.input_of(name, model.get_submodule(name))
    for block in model.transformer.h:  # litgpt's attention kernel is a method: q, k read as it gets them
        attn = block.attn
        kernel = attn.scaled_dot_product_attention

        def tapped(q, k, v, mask=None, kernel=kernel, attn=attn):
            taps.qk.append((q, k, attn.mscale**2 / config.head_size**0.5))
            return kernel(q, k, v, mask)

        attn.scaled_dot_product_attention = tapped
    q_rows, kv_rows = config.n_head * config.head_size, config.n_query_groups * config.head_size

    def qkv_parts(W):  # litgpt splits its qkv output into (q, k, v) blocks of rows
        return list(W.split([q_rows, kv_rows, kv_rows]))

    fused = {f"transformer.h.{i}.attn.qkv.weight": qkv_parts for i in range(config.n_layer)}
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    rec, ref = check_against_references(
        model,
        taps,
        tokens,
        embedding="transformer.wte",
        final_norm="transformer.ln_f",
        norms=norms,
        fused=fused,
        tmp_path=tmp_path,
    )
    assert not rec.not_measured


def test_a_monitor_of_the_fabric_wrapped_model_measures_the_model_itself(tmp_path):
    """Monitor(fabric.setup(model)) reads the model inside Fabric's wrapper: the same record as Monitor(model)."""
    pytest.importorskip("litgpt")
    import lightning as L
    from litgpt import GPT

    torch.manual_seed(0)
    model = GPT(litgpt_config())
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    with Monitor(model, every=1, batch=tokens, out=tmp_path / "plain") as monitor:
        want = monitor(0)
    wrapped = L.Fabric(accelerator="cpu", devices=1).setup(model)
    with Monitor(wrapped, every=1, batch=tokens, out=tmp_path / "fabric") as monitor:
        got = monitor(0)
    assert got == want and got["sink"] and got["residual_flow"] > 0
