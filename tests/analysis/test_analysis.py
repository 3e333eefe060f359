"""The measurements against independent computations (brute force, SVD, the paper's numbers)."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import torch

from smallinit import ModelConfig, Transformer
from smallinit.analysis import (
    Sink,
    check_norm_saturation,
    coord_check,
    load_snapshots,
    matrix_stats,
    measured_norm_factors,
    relative_factor,
    residual_flow_ratio,
    residual_flow_sweep,
    rmsnorm_factor,
    row_cosine,
    saturation_gamma,
    sink_scores,
    spectral_norm,
    stable_rank,
    token_gap,
    token_gap_batch,
)
from smallinit.analysis.tokens import FINE_EDGES, text_batches
from smallinit.cli import main
from smallinit.config import TrainConfig
from smallinit.data import load_tokenizer
from smallinit.measures.norm_factor import init_variance
from smallinit.measures.sink import sink_shares
from smallinit.monitor.records import parse_record
from smallinit.train import load_model
from support.runs import TINY_MODEL

TINY = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=97, max_seq_len=64)


def tiny(seed: int = 0, **kw) -> Transformer:
    return Transformer(ModelConfig(**{**TINY, **kw}), seed=seed).eval()


def tokens(b: int, t: int, vocab: int = 97, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


# -- sink -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(gate="none"), dict(gate="headwise", qk_norm=True), dict(n_kv_heads=4)])
def test_sink_scores_match_brute_force_attention(kw):
    model = tiny(gamma=0.5, **kw)
    with torch.no_grad():  # sharper attention than at init, so the test sees more than uniform weights
        for b in model.blocks:
            b.attn.q_proj.weight.mul_(6.0)
            b.attn.k_proj.weight.mul_(6.0)
    x = tokens(3, 37)
    got = sink_scores(model, x, chunk=8)  # chunks that do not divide T
    probs = model(x, capture=("attn",)).attentions  # (B, H, T, T) per layer, a full softmax of q kᵀ
    for layer, p in enumerate(probs):
        heads = p[:, :, 1:, 0].double().mean(dim=(0, 2)).numpy()  # queries 2..T (1-based), key 1
        np.testing.assert_allclose(got.per_head[layer], heads, rtol=1e-5, atol=1e-7)
        assert got.per_layer[layer] == pytest.approx(heads.mean(), rel=1e-5)
    assert np.std(got.per_head) > 1e-3  # the weights differ between heads: the comparison is not trivial


def test_sink_share_counts_heads_above_each_threshold():
    per_head = np.array([[0.9, 0.31, 0.3, 0.0], [0.05, 0.81, 0.5, 0.29]])  # planted (layer, head) means
    shares = sink_shares(per_head)
    assert shares[0.3] == 4 / 8  # 0.9, 0.31, 0.81, 0.5; exactly 0.3 does not exceed it
    assert shares[0.8] == 2 / 8
    s = Sink(per_layer=tuple(per_head.mean(axis=1)), per_head=tuple(map(tuple, per_head)), share_above=shares)
    assert s.to_dict()["share_above"] == {"0.3": 0.5, "0.8": 0.25}


# -- condensation ----------------------------------------------------------------------------------------------


def test_stable_rank_matches_svdvals():
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(96, 200, generator=g),  # random: nearly degenerate top singular values
        torch.randn(300, 64, generator=g),
        torch.randn(80, 3, generator=g) @ torch.randn(3, 120, generator=g)
        + 0.05 * torch.randn(80, 120, generator=g),
        torch.randn(5, 7, generator=g),
    ]
    for W in cases:
        s = torch.linalg.svdvals(W.double())
        assert spectral_norm(W) == pytest.approx(s[0].item(), rel=1e-4)
        assert stable_rank(W) == pytest.approx((s**2).sum().item() / s[0].item() ** 2, rel=2e-4)
    assert stable_rank(torch.zeros(40, 40)) == 0.0


def test_matrix_stats_cover_every_matrix_once():
    model = tiny()  # tied embeddings: the LM head is the embedding and is counted once
    stats = {s.name: s for s in matrix_stats(model)}
    expected = {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert set(stats) == expected and "lm_head.weight" not in stats
    W = model.blocks[1].mlp.up_proj.weight
    s = stats["blocks.1.mlp.up_proj.weight"]
    sv = torch.linalg.svdvals(W.double())
    assert s.stable_rank == pytest.approx(((sv**2).sum() / sv[0] ** 2).item(), rel=2e-4)
    assert set(s.name for s in matrix_stats(model, "*q_proj*")) == {
        f"blocks.{i}.attn.q_proj.weight" for i in range(2)
    }


def test_matrix_stats_split_moe_experts():
    from smallinit.config import MoEConfig

    model = tiny(moe=MoEConfig(num_experts=3, top_k=2))
    stats = {s.name: s for s in matrix_stats(model, "blocks.1.mlp.*", cosine=False)}
    assert {f"blocks.1.mlp.up_proj.{e}" for e in range(3)} <= set(stats)
    W = model.blocks[1].mlp.up_proj[2]  # expert 2: its own (out × in) matrix
    sv = torch.linalg.svdvals(W.double())
    assert stats["blocks.1.mlp.up_proj.2"].stable_rank == pytest.approx(
        ((sv**2).sum() / sv[0] ** 2).item(), rel=2e-4
    )
    assert stats["blocks.1.mlp.up_proj.2"].shape == tuple(W.shape)


def test_row_cosine_mean_and_clusters():
    g = torch.Generator().manual_seed(1)
    dirs = torch.randn(2, 30, generator=g)
    labels = torch.tensor([0, 1] * 10)
    signs = torch.where(torch.arange(20) % 4 < 2, 1.0, -1.0)[:, None]  # a row and its negation align
    W = signs * dirs[labels] + 0.05 * torch.randn(20, 30, generator=g)
    rc = row_cosine(W)
    X = W.double().numpy()
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    C = np.abs(X @ X.T)
    assert rc.mean_abs == pytest.approx(C[~np.eye(20, dtype=bool)].mean(), rel=1e-9)
    assert sorted(rc.order) == list(range(20))
    assert np.allclose(rc.matrix, C[np.ix_(rc.order, rc.order)], atol=1e-6)
    ordered = labels[torch.as_tensor(rc.order)].tolist()
    assert ordered[:10] == [ordered[0]] * 10 and ordered[10:] == [ordered[10]] * 10  # two blocks


# -- norm factor -------------------------------------------------------------------------------------------------


def test_analytic_norm_factor_matches_the_paper():
    d = 2048
    assert init_variance(0.5, d) == pytest.approx(4.8e-4, rel=0.02)  # the paper's 4.8e-4
    assert init_variance(1.0, d) == pytest.approx(2.4e-7, rel=0.01)  # the paper's 2.4e-7
    # Saturation for ε = 1e-5: it sets in (σ² < 10ε) near γ ≈ 0.6 and is complete (σ² < ε) by γ ≈ 0.75.
    assert 0.58 < saturation_gamma(1e-5, d, 10) < 0.62
    assert 0.73 < saturation_gamma(1e-5, d) < 0.77
    assert rmsnorm_factor(1.0, 1e-5, d) == pytest.approx(1 / math.sqrt(2.4e-7 + 1e-5), rel=0.01)
    assert rmsnorm_factor(1.0, 1e-5, d) == pytest.approx(1e-5**-0.5, rel=0.03)  # pinned at ε^(−1/2)
    assert relative_factor(1.0, 1e-12, d) > 0.999 and relative_factor(0.5, 1e-5, d) > 0.98
    assert relative_factor(1.0, 1e-5, d) < 0.16


def test_measured_norm_factor_at_init_matches_analytic():
    d = 64
    eps = d**-2.0  # σ² = d^(−2γ) = ε at γ = 1: the analytic relative factor is 1/√2
    model = tiny(d_model=d, n_heads=4, n_kv_heads=4, gamma=1.0, norm_eps=eps)
    measured = measured_norm_factors(model, tokens(4, 32))
    assert set(measured) == {f"blocks.{i}.{n}" for i in range(2) for n in ("attn_norm", "mlp_norm")} | {
        "norm"
    }
    # the first norm sees the embedding, whose per-token variance scatters around d^(−2γ)
    assert measured["blocks.0.attn_norm"] == pytest.approx(relative_factor(1.0, eps, d), abs=0.03)
    assert 0.6 < relative_factor(1.0, eps, d) < 0.8


def test_saturation_warning_once(caplog):
    with caplog.at_level(logging.WARNING, logger="smallinit"):
        assert check_norm_saturation(ModelConfig(**{**TINY, "norm_eps": 1e-5, "gamma": 1.5}))
        assert not check_norm_saturation(ModelConfig(**{**TINY, "norm_eps": 1e-12, "gamma": 1.5}))
    assert len(caplog.records) == 1 and "norm_eps=1e-12" in caplog.records[0].getMessage()


# -- residual flow ------------------------------------------------------------------------------------------------


def test_residual_flow_is_zero_without_residual_branches():
    model = tiny()
    x = tokens(2, 16)
    assert residual_flow_ratio(model, x) > 0.01
    with torch.no_grad():
        for b in model.blocks:
            b.attn.o_proj.weight.zero_()
            b.mlp.down_proj.weight.zero_()
    assert residual_flow_ratio(model, x) == 0.0


def test_residual_flow_exponent_is_one_minus_gamma():
    gammas = [0.5, 0.75, 1.0, 1.25]
    sweep = residual_flow_sweep(
        gammas,
        [32, 64, 128, 256],
        base_config=ModelConfig.preset("cpu-1m", vocab_size=512),
        seeds=(0, 1),
        seq_len=16,
    )
    print("residual-flow exponents:", dict(zip(gammas, np.round(sweep.slopes, 3))))
    for g, s in zip(gammas, sweep.slopes):
        assert abs(s - (1 - g)) <= 0.15, (g, s)


# -- token level ----------------------------------------------------------------------------------------------------


def _xy(b: int, t: int, seed: int = 0):
    w = tokens(b, t + 1, seed=seed)
    return w[:, :-1], w[:, 1:]


def test_token_gap_per_token_definition():
    a, b = tiny(seed=0), tiny(seed=1)
    x, y = _xy(2, 20)
    gap = token_gap_batch(a, b, x, y)
    pa = a(x).logits.double().softmax(-1).gather(-1, y[..., None])[..., 0]
    pb = b(x).logits.double().softmax(-1).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(gap.delta_sym, (pa - pb) / (pa + pb), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gap.difficulty, -(pa.log() + pb.log()) / 2, rtol=1e-5, atol=1e-5)


def test_token_gap_self_is_zero_and_swap_flips_sign():
    a, b = tiny(seed=0), tiny(seed=1)
    batches = [_xy(4, 24, seed=s) for s in range(3)]
    same = token_gap(a, a, batches, top_k=5)
    assert same.mean_delta_sym == 0.0 and same.top_a == [] and same.top_b == []
    assert all(bn.mean_delta_sym == 0.0 and bn.mean_loss_diff == 0.0 for bn in same.bins)
    for x, y in batches:
        assert torch.equal(token_gap_batch(a, a, x, y).delta_sym, torch.zeros_like(y, dtype=torch.float64))
        assert torch.equal(token_gap_batch(a, b, x, y).delta_sym, -token_gap_batch(b, a, x, y).delta_sym)
    ab, ba = token_gap(a, b, batches, top_k=5), token_gap(b, a, batches, top_k=5)
    assert ab.mean_delta_sym == pytest.approx(-ba.mean_delta_sym, abs=1e-12) and ab.mean_delta_sym != 0
    for u, v in zip(ab.bins, ba.bins):
        assert u.count == v.count and u.mean_delta_sym == pytest.approx(-v.mean_delta_sym, abs=1e-12)
    assert [t.delta_sym for t in ab.top_a] == pytest.approx([-t.delta_sym for t in ba.top_b])


def test_token_gap_streaming_state_matches_brute_force():
    a, b = tiny(seed=0), tiny(seed=1)
    batches = [_xy(4, 32, seed=s) for s in range(6)]
    res = token_gap(a, b, batches, bins=5, top_k=7)
    per = [token_gap_batch(a, b, x, y) for x, y in batches]
    delta = torch.cat([g.delta_sym.ravel() for g in per]).numpy()
    diff = torch.cat([g.loss_diff.ravel() for g in per]).numpy()
    dif = torch.cat([g.difficulty.ravel() for g in per]).numpy()
    assert res.tokens == delta.size and sum(bn.count for bn in res.bins) == delta.size
    assert res.mean_delta_sym == pytest.approx(delta.mean(), rel=1e-9)
    for bn in res.bins:  # each bin's mean is the mean over exactly the tokens inside its edges
        inside = (dif >= bn.lo) & (dif < bn.hi)
        assert inside.sum() == bn.count
        assert bn.mean_delta_sym == pytest.approx(delta[inside].mean(), rel=1e-9, abs=1e-12)
        # quantile bins: equal counts up to the tokens of one fine histogram bin at each edge
        assert abs(bn.count - delta.size / 5) <= 2 * np.histogram(dif, FINE_EDGES)[0].max()
    assert [t.loss_diff for t in res.top_a] == pytest.approx(sorted(diff, reverse=True)[:7])
    assert [t.loss_diff for t in res.top_b] == pytest.approx(sorted(diff)[:7])


def test_text_batches_stream_documents_with_eos(tmp_path):
    tok = load_tokenizer("bytes")
    corpus = tmp_path / "c.jsonl"
    docs = ["hello world " * 30, "zweites Dokument " * 20]
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    stream = [tok.encode(docs[0]) + [tok.eos_id] + tok.encode(docs[1]) + [tok.eos_id]]
    got = list(text_batches(corpus, tok, seq_len=16, batch_size=3))
    flat = stream[0]
    k = 0
    for x, y in got:
        for row_x, row_y in zip(x.tolist(), y.tolist()):
            assert row_x == flat[k * 16 : k * 16 + 16] and row_y == flat[k * 16 + 1 : k * 16 + 17]
            k += 1
    assert k == (len(flat) - 1) // 16


# -- coordinate check --------------------------------------------------------------------------------------------------


def test_coord_check_scales():
    cfg = ModelConfig(**{**TINY, "n_kv_heads": 4})
    cc = coord_check(cfg, [0.5, 1.0], steps=2, batch_size=2, seq_len=16)
    for g, rms in zip(cc.gammas, cc.series("activation", "embed", 0)):
        assert rms == pytest.approx(32**-g, rel=0.05)  # embeddings start at d^(−γ)
    up = cc.series("update", "blocks.0.mlp.up_proj.weight", 1)
    assert all(u > 0 for u in up)
    assert {r["step"] for r in cc.rows if r["kind"] == "update"} == {1, 2}
    names = cc.names("activation")
    assert names == ["embed", "blocks.0", "blocks.1", "logits"]


def test_coord_check_takes_the_optimizer():
    """Muon's first update has RMS ≈ 0.2·lr whatever the matrix (match_rms_adamw: 0.2·√max(A, B) times an
    orthogonalised update of RMS 1/√max(A, B)); AdamW's first update is lr·sign(g), RMS = lr."""
    cfg, lr = ModelConfig(**{**TINY, "n_kv_heads": 4}), 1e-3
    for optimizer, low, high in (("adamw", 0.99, 1.01), ("muon", 0.1, 0.3)):
        train = TrainConfig(optimizer=optimizer, lr=lr, weight_decay=0.0, grad_clip=0.0)
        cc = coord_check(cfg, [0.5, 1.0], steps=1, batch_size=2, seq_len=16, train=train)
        for name in ("blocks.0.attn.q_proj.weight", "blocks.1.mlp.down_proj.weight"):
            assert all(low * lr < u < high * lr for u in cc.series("update", name, 1)), (optimizer, name)
    assert cc.config["train"]["optimizer"] == "muon" and cc.optimizer == "Muon + AdamW"


# -- training-time callback --------------------------------------------------------------------------------------------


def test_callback_writes_records_and_snapshots(tmp_path):
    run = tmp_path / "run"
    corpus = tmp_path / "c.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    overrides = [
        *TINY_MODEL,
        f"data.corpus={json.dumps(str(corpus))}",
        "train.batch_size=4",
        "train.steps=6",
        "train.eval_every=0",
        "train.log_every=3",
        "train.warmup_steps=1",
        "analysis.every=2",
        "analysis.snapshots=2",
        "analysis.heatmap_rows=16",
    ]
    assert main(["train", "--out", str(run), *sum((["--set", o] for o in overrides), [])]) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    analysis = [r for r in recs if r.get("event") == "analysis"]
    assert [r["step"] for r in analysis] == [0, 2, 4, 6]
    last = parse_record(analysis[-1])
    ranks = last.by_matrix("stable_rank")
    assert set(ranks) == {
        "blocks.0.attn.q_proj.weight",
        "blocks.1.attn.q_proj.weight",
        "blocks.0.mlp.up_proj.weight",
        "blocks.1.mlp.up_proj.weight",
    }
    # the record is what the library measures on the final model and the first validation windows
    from smallinit.data import iter_eval_batches, load_token_data

    model = load_model(run)
    data = load_token_data(str(corpus), load_tokenizer("bytes"), val_fraction=0.05)
    x, _ = next(iter_eval_batches(data.val, 4, 32, 1))
    sinks = sink_scores(model, x)
    assert last.sink.per_layer == pytest.approx(sinks.per_layer, rel=1e-5)
    assert last.sink.share_above == sinks.share_above
    assert last.residual_flow == pytest.approx(residual_flow_ratio(model, x), rel=1e-5)
    W = model.blocks[1].attn.q_proj.weight
    assert ranks["blocks.1.attn.q_proj.weight"] == pytest.approx(stable_rank(W, exact=True), rel=1e-4)
    snaps = load_snapshots(run)
    assert [s["step"] for s in snaps] == [0, 6]
    m = snaps[-1]["matrices"]["blocks.0.mlp.up_proj.weight"]
    assert m.shape == (16, 16) and np.allclose(np.diag(m), 1.0, atol=1e-3)


def test_norm_factors_alone_between_the_full_measurements(tmp_path):
    run = tmp_path / "run"
    corpus = tmp_path / "c.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
    overrides = [
        *TINY_MODEL,
        f"data.corpus={json.dumps(str(corpus))}",
        "train.batch_size=4",
        "train.steps=6",
        "train.eval_every=0",
        "train.log_every=3",
        "train.warmup_steps=1",
        "analysis.every=3",
        "analysis.norm_every=2",
        "analysis.snapshots=0",
    ]
    assert main(["train", "--out", str(run), *sum((["--set", o] for o in overrides), [])]) == 0
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    full = {r["step"]: r["norm_factor"] for r in recs if r.get("event") == "analysis"}
    norms = {r["step"]: r["norm_factor"] for r in recs if r.get("event") == "norm_factor"}
    assert sorted(full) == [0, 3, 6] and sorted(norms) == [0, 2, 4, 6]
    assert norms[0] == full[0] and norms[6] == full[6]  # where both are due, one forward serves both
    # the final model on the same held-out batch gives the logged factors
    from smallinit.data import iter_eval_batches, load_token_data

    data = load_token_data(str(corpus), load_tokenizer("bytes"), val_fraction=0.05)
    x, _ = next(iter_eval_batches(data.val, 4, 32, 1))
    assert measured_norm_factors(load_model(run), x) == pytest.approx(norms[6], rel=1e-5)


def test_the_library_section_of_analysis_md_imports_what_it_lists():
    """docs/analysis.md, "Library": its import block names functions that exist (it had named a removed one)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "analysis.md").read_text(encoding="utf-8")
    section = text[text.index("## Library") : text.index("## Choices")]
    (code,) = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    exec(compile(code, "docs/analysis.md", "exec"), {})
