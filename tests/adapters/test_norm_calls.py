"""Norms a forward calls rather than holds (nanochat / modded-nanogpt: ``F.rms_norm(x, (d,))`` with no weight and
no ε; a written-out x·rsqrt(mean(x²) + ε)), measured by the adapter found from the forward, the Monitor and
analyze against √(ms/(ms + ε)) computed here at the ε the call used, and their ε set (or refused) by
set_norm_eps_."""

from __future__ import annotations

import copy as copy_module
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from smallinit import Monitor, set_norm_eps_
from smallinit.analysis.measure import analyze_model
from smallinit.init.eps import NormEpsError
from smallinit.measures.activations import measure_activations
from support.nanochat_style import GPT, Config

FP32_EPS = torch.finfo(torch.float32).eps


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    model = GPT(Config(**kw))
    # the embedding's mean square right at ε (fp32's machine epsilon): the first norm keeps about 1/√2 of 1/σ
    nn.init.normal_(model.wte.weight, std=FP32_EPS**0.5)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _factor(h: torch.Tensor, eps: float) -> float:
    ms = h.double().pow(2).mean(-1)
    return torch.sqrt(ms / (ms + eps)).mean().item()


def _first_two(model: GPT, ids: torch.Tensor, eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs of the root's first norm (the embedding) and of layer 0's first (its normed output)."""
    e = model.wte(ids).detach()
    return e, F.rms_norm(e, (e.size(-1),), eps=eps)


def test_functional_norms_measured_at_the_eps_they_use():
    model, ids = _model(), _ids()
    acts = measure_activations(model, ids)
    e, h0 = _first_two(model, ids, None)
    sites = set(acts.norm_factor)
    # per layer: pre-attention, QK-norm, pre-MLP; the embedding's and the final norm at the root
    assert sites == {"<root>:rms_norm#0", "<root>:rms_norm#1"} | {
        f"h.{i}{s}" for i in (0, 1) for s in (":rms_norm#0", ".attn:rms_norm#0", ":rms_norm#1")
    }
    assert acts.norm_factor["<root>:rms_norm#0"] == pytest.approx(_factor(e, FP32_EPS), rel=1e-9)
    assert 0.6 < acts.norm_factor["<root>:rms_norm#0"] < 0.8  # saturating, as set up
    assert acts.norm_factor["h.0:rms_norm#0"] == pytest.approx(_factor(h0, FP32_EPS), rel=1e-9)
    assert any("rms_norm with no ε" in n and f"{FP32_EPS:.3g}" in n for n in acts.notes)
    assert not any(k.startswith("norm_factor") for k in acts.not_measured)


def test_monitor_and_analyze_measure_functional_norms(tmp_path):
    model, ids = _model(norm_eps=1e-5), _ids()
    with Monitor(model, every=1, batch=ids, out=tmp_path / "run") as monitor:
        record = monitor(0)
        e, _ = _first_two(model, monitor.tokens, 1e-5)  # the Monitor's held-out inputs
    assert record["norm_factor"]["<root>:rms_norm#0"] == pytest.approx(_factor(e, 1e-5), rel=1e-9)
    result = analyze_model(model, [(ids, ids)])
    e, _ = _first_two(model, ids, 1e-5)
    assert result.norm_factor["<root>:rms_norm#0"] == pytest.approx(_factor(e, 1e-5), rel=1e-9)
    assert not any("no ε" in n for n in result.notes)  # ε was passed


def test_set_norm_eps_sets_the_eps_of_norm_calls_while_that_model_runs():
    model, other, ids = _model(norm_eps=1e-5), _model(norm_eps=1e-5), _ids()
    e, _ = _first_two(model, ids, 1e-5)
    before = measure_activations(model, ids).norm_factor["<root>:rms_norm#0"]
    assert before == pytest.approx(_factor(e, 1e-5), rel=1e-9) and before < 0.2
    touched = set_norm_eps_(model, 1e-12)
    assert len(touched) == 8 and "h.1.attn:rms_norm#0" in touched
    after = measure_activations(model, ids).norm_factor["<root>:rms_norm#0"]
    assert after == pytest.approx(_factor(e, 1e-12), rel=1e-9) and after > 0.99
    # the model's output is the one F.rms_norm gives at the new ε
    reference = _model(norm_eps=1e-12)
    assert torch.equal(model(ids), reference(ids))
    # another model of the same class, and this one in another thread, are untouched by the first's hooks
    assert measure_activations(other, ids).norm_factor["<root>:rms_norm#0"] == pytest.approx(before)
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(y=model(ids)))
    thread.start()
    thread.join()
    assert torch.equal(seen["y"], reference(ids))
    # set again: replaced, not stacked; a failing forward leaves no mode behind
    set_norm_eps_(model, 1e-3)
    assert measure_activations(model, ids).norm_factor["<root>:rms_norm#0"] == pytest.approx(_factor(e, 1e-3))
    with pytest.raises(IndexError):
        model(torch.full((1, 4), 999))
    assert torch._C._len_torch_function_stack() == 0
    assert torch.equal(other(ids), _model(norm_eps=1e-5)(ids))


def test_written_out_norms_are_measured_and_their_eps_refused():
    model, ids = _model(norm="hand"), _ids()
    e = model.wte(ids).detach()
    acts = measure_activations(model, ids)
    assert acts.norm_factor["<root>:hand-written#0"] == pytest.approx(_factor(e, 1e-6), rel=1e-9)
    assert len(acts.norm_factor) == 8
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        NormEpsError, match=r"8 norms are written out.*<root>:hand-written#0 at nanochat_style"
    ):
        set_norm_eps_(model, 1e-12)
    assert measure_activations(model, ids).norm_factor == acts.norm_factor  # nothing was changed
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


class _DivSqrt(nn.Module):
    """Norms written as x / sqrt(mean(x²) + ε), as many hand-written LayerNorms are: the input centred as a
    temporary no name holds once its square is taken, ε a buffer (a one-element tensor)."""

    def __init__(self, d: int = 32, vocab: int = 64):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        nn.init.normal_(self.wte.weight, std=1e-3)  # mean square 1e-6, at ε: a factor of about 1/√2
        self.fc = nn.Linear(d, d, bias=False)
        self.register_buffer("eps", torch.tensor(1e-6))

    def _ln(self, x: torch.Tensor) -> torch.Tensor:
        var = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True)
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(var + self.eps)

    def _rms(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x * x).mean(-1, keepdim=True).add(1e-5).sqrt()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._rms(self.fc(self._ln(self.wte(ids)))) @ self.wte.weight.T  # tied logits


def test_norms_written_with_a_division_by_sqrt_are_found_measured_and_refused():
    """x / sqrt(…) is the same norm as x·rsqrt(…): found, measured against the factor computed here (the
    hand-written LayerNorm's on the centred input), and its ε refused in one line naming both sites; they had
    been missed, so the model read as having no norm at all."""
    model, ids = _DivSqrt(), _ids()
    e = model.wte(ids).detach().double()
    centred = e - e.mean(-1, keepdim=True)
    h = model.fc(model._ln(model.wte(ids))).detach()
    factors = measure_activations(model, ids).norm_factor
    assert factors.keys() == {"<root>:hand-written#0", "<root>:hand-written#1"}
    assert factors["<root>:hand-written#0"] == pytest.approx(_factor(centred, 1e-6), rel=1e-6)
    assert factors["<root>:hand-written#0"] < 0.8  # the batch sits at ε: a factor that is felt
    assert factors["<root>:hand-written#1"] == pytest.approx(_factor(h, 1e-5), rel=1e-9)
    with pytest.raises(
        NormEpsError, match=r"2 norms are written out.*hand-written#0 at .*hand-written#1 at "
    ):
        set_norm_eps_(model, 1e-12)


def test_set_norm_eps_finds_the_calls_of_the_forward_as_it_is_now():
    """Why set_norm_eps_ follows the forward on every call rather than caching a model's norm calls: which norms
    a forward calls can hang on Python state no cache key sees. The same modules and weights, with the config
    flag flipped to written-out norms after a first set_norm_eps_, must be refused, not told "done"."""
    model = _model(norm_eps=1e-5)
    assert len(set_norm_eps_(model, 1e-12)) == 8
    model.cfg.norm = "hand"  # no module, parameter or buffer changes
    with pytest.raises(NormEpsError, match="8 norms are written out"):
        set_norm_eps_(model, 1e-12)


def test_norm_layers_are_not_counted_again_as_calls():
    """nn.RMSNorm calls F.rms_norm inside its own forward: that call is the layer's, measured once."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.norm = nn.Embedding(64, 16), nn.RMSNorm(16, eps=1e-4)
            self.head = nn.Linear(16, 64)

        def forward(self, ids):
            return self.head(self.norm(self.emb(ids)))

    model, ids = Net(), _ids()
    acts = measure_activations(model, ids)
    assert set(acts.norm_factor) == {"norm"}
    assert acts.norm_factor["norm"] == pytest.approx(_factor(model.emb(ids).detach(), 1e-4), rel=1e-6)
    assert set_norm_eps_(model, 1e-12) == ["norm"] and model.norm.eps == 1e-12


def test_a_copy_keeps_the_set_eps_and_setting_it_again_replaces_it():
    model, ids = _model(norm_eps=1e-5), _ids()
    set_norm_eps_(model, 1e-12)
    e, _ = _first_two(model, ids, None)
    for copy in (copy_module.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert measure_activations(copy, ids).norm_factor["<root>:rms_norm#0"] == pytest.approx(
            _factor(e, 1e-12), rel=1e-9
        )
        set_norm_eps_(copy, 1e-3)
        assert len(copy._forward_pre_hooks) == 1 and len(copy._forward_hooks) == 1
        assert measure_activations(copy, ids).norm_factor["<root>:rms_norm#0"] == pytest.approx(
            _factor(e, 1e-3), rel=1e-9
        )
    # the original is untouched by its copies
    assert measure_activations(model, ids).norm_factor["<root>:rms_norm#0"] == pytest.approx(
        _factor(e, 1e-12)
    )


def test_norm_calls_are_found_on_meta():
    """A model built on meta (no values): the calls and their ε are still found, and written-out ones refused."""
    with torch.device("meta"):
        functional, written = GPT(Config(norm_eps=1e-5)), GPT(Config(norm="hand"))
    assert len(set_norm_eps_(functional, 1e-12)) == 8
    with pytest.raises(NormEpsError, match="8 norms are written out"):
        set_norm_eps_(written, 1e-12)
