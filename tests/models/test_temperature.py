"""Post-hoc temperature scaling: the fit recovers a known temperature, and folding divides every family's logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolchain.models.temperature import T_BOUNDS, fit_temperature, fold_temperature, scaled_nll
from toolchain.models.tiny import TINY_MODELS
from toolchain.models.wrappers import SingleModel


def _sampled(t_true: float, n: int = 20000, members: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits and labels drawn from softmax(logits / t_true) (an ensemble: the mean of the members' softmax)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 3.0, size=(n, members, 4))
    p = np.exp(z / t_true - (z / t_true).max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).mean(1)
    labels = np.array([rng.choice(4, p=row) for row in p])
    return (z[:, 0] if members == 1 else z), labels


@pytest.mark.parametrize(("t_true", "members"), [(0.5, 1), (2.0, 1), (1.5, 3)])
def test_the_fit_recovers_the_temperature_the_labels_were_drawn_at(t_true, members):
    z, y = _sampled(t_true, members=members)
    t = fit_temperature(z, y)
    assert t == pytest.approx(t_true, rel=0.06)
    assert scaled_nll(z, y, t) <= min(scaled_nll(z, y, 1.0), scaled_nll(z, y, t * 1.2), scaled_nll(z, y, t / 1.2))


def test_the_ensemble_nll_is_that_of_the_mean_of_the_members_softmax():
    z, y = _sampled(1.0, n=50, members=3, seed=1)
    p = np.exp(z / 2.0) / np.exp(z / 2.0).sum(-1, keepdims=True)
    want = -np.log(p.mean(1)[np.arange(50), y]).mean()
    assert scaled_nll(z, y, 2.0) == pytest.approx(want, rel=1e-12)
    assert T_BOUNDS[0] < fit_temperature(z, y) < T_BOUNDS[1]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same non-zero length"):
        fit_temperature(np.zeros((3, 2)), np.zeros(2, dtype=int))
    with pytest.raises(ValueError, match="positive and finite"):
        fold_temperature(torch.nn.Linear(2, 3), 0.0, 3)
    with pytest.raises(ValueError, match="no output layer with 5 outputs"):
        fold_temperature(torch.nn.Linear(2, 3), 2.0, 5)


def test_a_head_whose_logits_are_not_linear_in_its_last_layer_is_refused_and_left_as_it_was():
    head = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())  # tanh after the 3-wide layer
    x = torch.randn(5, 4)
    before = head(x).detach().clone()
    with pytest.raises(ValueError, match="cannot take a folded temperature"):
        fold_temperature(head, 2.0, 3, probe=lambda: head(x))
    assert torch.equal(head(x), before)


@pytest.mark.parametrize("family", sorted(TINY_MODELS))
def test_folding_divides_the_logits_of_every_family_single_and_fused(family):
    """The single model (Hugging Face module) and the fused Hydra's heads: logits / T, so graphs need no extra op."""
    from toolchain.hydra.fuse import fuse

    tiny = TINY_MODELS[family]()
    batch = tiny.make_batch(3, 0)
    single = SingleModel(tiny.adapter).eval()
    with torch.no_grad():
        before = single(**batch)["logits"].clone()
        masks = torch.ones(2, tiny.adapter.num_layers, tiny.adapter.max_heads, dtype=torch.bool)
        masks[0, :, 0] = False  # two members that differ
        hydra = fuse(tiny.adapter, masks).eval()
        hyd_before = hydra(**batch)["member_logits"].clone()
    classes = before.shape[-1]
    fold_temperature(tiny.adapter.model, 2.5, classes, probe=lambda: single(**batch)["logits"])
    with torch.no_grad():
        assert torch.allclose(single(**batch)["logits"], before / 2.5, rtol=1e-4, atol=1e-6)
        for head in {id(h): h for h in hydra.heads}.values():
            fold_temperature(head, 2.5, classes)
        after = hydra(**batch)
    assert torch.allclose(after["member_logits"], hyd_before / 2.5, rtol=1e-4, atol=1e-6)
    assert torch.allclose(after["probs"], torch.softmax(hyd_before / 2.5, -1).mean(1), atol=1e-6)
