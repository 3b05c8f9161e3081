"""Circuit search: batched vs looped, the greedy algorithm, objectives, scores as a plan."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolchain.pruning import keep_mask
from toolchain.scoring import OOD_LABEL, circuit_scores, evaluate_masks, objective_value
from toolchain.scoring.calibration import as_calibration


def _reference_circuit(adapter, calib, n_heads, fork=0):
    """The layer-conditioned greedy search written out with one gated forward per mask (loss objective).

    Layers before ``fork`` (a Hydra model's shared trunk) are never masked and not searched.
    """
    hpl = adapter.heads_per_layer()
    chosen = []

    def loss(masked):
        gates = torch.ones(len(hpl), max(hpl))
        for l, h in masked:
            gates[l, h] = 0.0
        with torch.no_grad():
            logits = torch.cat([adapter.gated_logits(b, gates) for b, _ in calib]).double()
        return float(F.cross_entropy(logits, torch.cat([y for _, y in calib])))

    for l, n in enumerate(hpl):
        if l < fork:
            continue
        damage = {h: loss([*chosen, (l, h)]) for h in range(n)}
        best = sorted(damage, key=lambda h: (-damage[h], h))[:n_heads]
        chosen.extend((l, h) for h in sorted(best))
    return chosen


def test_circuit_follows_the_greedy_algorithm(bert, make_calib):
    calib = make_calib(bert, sizes=(5, 3))
    got = circuit_scores(bert.adapter, calib, n_heads=2)
    assert [tuple(x) for x in got.extras["circuit"]] == _reference_circuit(bert.adapter, calib, 2)


@pytest.mark.parametrize("objective", ["loss", "nll"])
def test_batched_and_looped_select_the_same_heads(tiny, make_calib, objective):
    calib = make_calib(tiny, sizes=(4, 3))
    looped = circuit_scores(tiny.adapter, calib, n_heads=2, objective=objective, mode="looped")
    for max_bs in (256, 5, 2):  # several masks per forward; masks chunked; rows split
        batched = circuit_scores(tiny.adapter, calib, n_heads=2, objective=objective, max_batch_size=max_bs)
        assert batched.extras["circuit"] == looped.extras["circuit"]
        assert batched.params["mode_used"] == "batched"
        torch.testing.assert_close(batched.scores, looped.scores, rtol=1e-4, atol=1e-6)


def test_batched_and_looped_select_the_same_heads_ood_auroc(bert):
    with torch.no_grad():
        bert.model.classifier.weight.div_(300.0)  # undo the tiny model's saturation: distinct max-probs
    batch = bert.make_batch(8, 3)
    labels = torch.tensor([0, 1, 2, OOD_LABEL, 0, OOD_LABEL, OOD_LABEL, 1])
    calib = [(batch, labels)]
    looped = circuit_scores(bert.adapter, calib, n_heads=1, objective="ood_auroc", mode="looped")
    batched = circuit_scores(bert.adapter, calib, n_heads=1, objective="ood_auroc", max_batch_size=12)
    assert batched.extras["circuit"] == looped.extras["circuit"]
    assert 0.0 <= looped.extras["unmasked_objective"] <= 1.0


def test_evaluate_masks_batched_equals_looped(tiny, make_calib):
    data = as_calibration(make_calib(tiny, sizes=(3, 2)))
    masks = (torch.rand(5, tiny.adapter.num_layers, tiny.adapter.max_heads) > 0.4).float()
    a = evaluate_masks(tiny.adapter, data, masks, mode="batched", max_batch_size=7)
    b = evaluate_masks(tiny.adapter, data, masks, mode="looped")
    assert a.shape == (5, 5, b.shape[-1]) and a.dtype == torch.float64
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_objectives_on_hand_made_logits():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0], [0.0, 3.0]])
    labels = torch.tensor([0, 1, OOD_LABEL, OOD_LABEL])
    expected = float(F.cross_entropy(logits[:2].double(), labels[:2]))
    assert objective_value("loss", logits, labels) == pytest.approx(expected)
    assert objective_value("nll", logits, labels) == pytest.approx(expected)
    # OOD rows: max-prob 0.5 and 0.95; ID rows 0.88 and 0.73 -> OOD row 2 ranks above both ID, row 3 below both
    assert objective_value("ood_auroc", logits, labels) == pytest.approx(0.5)


def test_with_a_fork_the_trunk_is_never_masked_and_scores_above_every_head(bert, make_calib):
    calib = make_calib(bert, sizes=(5, 3))
    got = circuit_scores(bert.adapter, calib, n_heads=2, fork=1)
    circuit = [tuple(x) for x in got.extras["circuit"]]
    assert circuit == _reference_circuit(bert.adapter, calib, 2, fork=1) and all(l >= 1 for l, _ in circuit)
    hpl = bert.adapter.heads_per_layer()
    trunk = got.scores[0, : hpl[0]]
    assert bool(torch.isnan(torch.tensor(got.extras["damage"][0][: hpl[0]])).all())
    assert float(trunk.min()) > float(got.scores[1:][torch.isfinite(got.scores[1:])].max())
    keep = keep_mask(got, budget=2 * (len(hpl) - 1), fork=1)  # the plan of the searched layers keeps the circuit
    assert bool(keep[0, : hpl[0]].all()) and {tuple(x) for x in torch.nonzero(keep).tolist() if x[0] >= 1} == set(
        circuit)
    assert got.params["fork"] == 1 and got.extras["mask_evaluations"] == sum(n + 1 for n in hpl[1:])
    with pytest.raises(ValueError, match="fork"):
        circuit_scores(bert.adapter, calib, n_heads=2, fork=len(hpl))


def test_circuit_scores_make_plans_keep_exactly_the_circuit(bert, make_calib):
    got = circuit_scores(bert.adapter, make_calib(bert), n_heads=3)
    circuit = {tuple(x) for x in got.extras["circuit"]}
    assert len(circuit) == 3 * bert.adapter.num_layers
    for scope in ("global", "layer"):
        keep = keep_mask(got, budget=len(circuit), scope=scope)
        assert {tuple(x) for x in torch.nonzero(keep).tolist()} == circuit


def test_circuit_argument_errors(bert, make_calib):
    calib = make_calib(bert)
    with pytest.raises(ValueError, match="n_heads"):
        circuit_scores(bert.adapter, calib, n_heads=0)
    with pytest.raises(ValueError, match="objective"):
        circuit_scores(bert.adapter, calib, n_heads=1, objective="accuracy")
    with pytest.raises(ValueError, match="ood_auroc"):
        circuit_scores(bert.adapter, calib, n_heads=1, objective="ood_auroc")
    with pytest.raises(ValueError, match="max_batch_size"):
        circuit_scores(bert.adapter, calib, n_heads=1, max_batch_size=0)


def test_the_task_weight_subtracts_the_id_nll_from_the_auroc():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [5.0, 5.0], [0.0, 3.0]])
    labels = torch.tensor([0, 1, OOD_LABEL, OOD_LABEL])
    nll = float(F.cross_entropy(logits[:2].double(), labels[:2]))
    assert objective_value("ood_auroc", logits, labels, 0.7) == pytest.approx(0.5 - 0.7 * nll)
    with pytest.raises(ValueError, match="task_weight"):
        objective_value("loss", logits, labels, 0.7)


def test_a_heavy_task_weight_makes_the_search_that_of_the_nll(bert):
    """AUROC moves by at most 1 between masks; at a weight of 1e6 the NLL decides every step, as the nll search."""
    calib = bert.labelled_batches(sizes=(6, 6), ood_every=3)
    heavy = circuit_scores(bert.adapter, calib, n_heads=1, objective="ood_auroc", task_weight=1e6)
    nll = circuit_scores(bert.adapter, [(b, y) for b, y in calib], n_heads=1, objective="nll")
    assert heavy.extras["circuit"] == nll.extras["circuit"]
    assert heavy.params["task_weight"] == 1e6 and "task_weight" not in nll.params
    with pytest.raises(ValueError, match="task_weight"):
        circuit_scores(bert.adapter, calib, n_heads=1, objective="loss", task_weight=0.5)
    with pytest.raises(ValueError, match="task_weight"):
        circuit_scores(bert.adapter, calib, n_heads=1, objective="ood_auroc", task_weight=-1.0)


def _circuit_step_masks(adapter, layer, seed=0):
    """A circuit step's masks: random gates below ``layer`` shared by all, then one head of ``layer`` masked each."""
    g = torch.Generator().manual_seed(seed)
    base = torch.ones(adapter.num_layers, adapter.max_heads)
    base[:layer] = (torch.rand(layer, adapter.max_heads, generator=g) > 0.4).float()
    masks = [base.clone()]
    for h in range(adapter.heads_per_layer()[layer]):
        m = base.clone()
        m[layer, h] = 0.0
        masks.append(m)
    return torch.stack(masks)


@pytest.mark.parametrize("mode", ["batched", "looped"])
def test_a_circuit_step_runs_its_shared_layers_once_per_batch(tiny, make_calib, mode):
    """Masks that agree on the first layers: those run once per batch; the logits are those of full runs."""
    adapter = tiny.adapter
    modules = adapter.layer_modules()
    assert modules is not None and len(modules) == adapter.num_layers  # every family's stack is found
    layer = adapter.num_layers - 1
    masks = _circuit_step_masks(adapter, layer)
    data = as_calibration(make_calib(tiny, sizes=(3, 2)))
    calls = [0] * len(modules)  # forwards that compute each layer (its query projection runs)
    hooks = [lv.q.register_forward_pre_hook(lambda *_a, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, lv in enumerate(adapter.layers())]
    try:
        shared = evaluate_masks(adapter, data, masks, mode=mode, max_batch_size=7)
        once = list(calls)
        full = evaluate_masks(adapter, data, masks, mode=mode, max_batch_size=7, share_prefix=False)
    finally:
        for h in hooks:
            h.remove()
    forwards = [c_full - c for c, c_full in zip(once, calls, strict=True)]  # forwards of the unshared run
    assert once[0] == len(data) and forwards[0] > len(data)  # shared: one run of layer 0 per batch
    assert once[layer] == forwards[layer]  # the differing layer runs once per forward either way
    torch.testing.assert_close(shared, full, rtol=1e-5, atol=1e-6)
    assert all("forward" not in vars(m) for m in modules)  # the layers are restored


def test_masks_that_differ_in_the_first_layer_share_nothing(bert, make_calib):
    masks = _circuit_step_masks(bert.adapter, 0)
    data = as_calibration(make_calib(bert, sizes=(3,)))
    torch.testing.assert_close(evaluate_masks(bert.adapter, data, masks),
                               evaluate_masks(bert.adapter, data, masks, share_prefix=False), rtol=0, atol=0)


def test_circuit_scores_are_the_same_with_and_without_the_shared_prefix(tiny, make_calib):
    calib = make_calib(tiny, sizes=(4, 3))
    on = circuit_scores(tiny.adapter, calib, n_heads=2)
    off = circuit_scores(tiny.adapter, calib, n_heads=2, share_prefix=False)
    assert on.extras["circuit"] == off.extras["circuit"] and on.params == off.params
    torch.testing.assert_close(on.scores, off.scores, rtol=1e-5, atol=1e-6)
