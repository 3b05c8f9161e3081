"""The fine-tuning loop: learns a separable task, reproducible, validates its arguments."""

from __future__ import annotations

import pytest
import torch

from toolchain.models.tiny import tiny_bert
from toolchain.pruning import finetune


def _task(n=48, seed=0):
    """Class 0 sentences use tokens 5..49, class 1 tokens 52..99: linearly separable bags of words."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    ids = torch.randint(5, 50, (n, 8), generator=g) + 47 * labels[:, None]
    ids[:, 0] = 2
    return ids, labels


def _batches_fn(ids, labels):
    def fn(batch_size, seed):
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
        for s in range(0, len(order), batch_size):
            i = order[s : s + batch_size]
            x = ids[i]
            batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "token_type_ids": torch.zeros_like(x)}
            yield batch, labels[i]

    return fn


def _fresh():
    tiny = tiny_bert(seed=0, num_labels=2)
    with torch.no_grad():
        tiny.model.classifier.weight.div_(300.0)  # undo the tiny model's saturated head
    for mod in tiny.model.modules():  # dropout on, so the run depends on the seeded torch RNG
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.1
    return tiny


def test_finetune_reduces_loss_and_is_reproducible():
    ids, labels = _task()
    runs = []
    for _ in range(2):
        tiny = _fresh()
        tiny.model.train()
        out = finetune(tiny.model, tiny.adapter, _batches_fn(ids, labels), steps=24, lr=5e-3, batch_size=16, seed=3,
                       progress=False)
        assert not tiny.model.training
        runs.append((tiny.model.state_dict(), out))
    (sd_a, out_a), (sd_b, out_b) = runs
    assert len(out_a["losses"]) == 24 and len(out_a["lrs"]) == 24
    first, last = sum(out_a["losses"][:5]) / 5, sum(out_a["losses"][-5:]) / 5
    assert last < 0.5 * first
    assert out_a["losses"] == out_b["losses"]
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    # warm-up then linear decay: the peak is reached after 10% of the steps
    assert max(out_a["lrs"]) == pytest.approx(5e-3, rel=0.35) and out_a["lrs"][-1] < out_a["lrs"][6]


def test_finetune_seed_changes_the_run():
    ids, labels = _task()
    a, b = _fresh(), _fresh()
    la = finetune(a.model, a.adapter, _batches_fn(ids, labels), steps=5, lr=1e-3, batch_size=16, seed=0,
                  progress=False)["losses"]
    lb = finetune(b.model, b.adapter, _batches_fn(ids, labels), steps=5, lr=1e-3, batch_size=16, seed=1,
                  progress=False)["losses"]
    assert la != lb


def test_finetune_leaves_the_global_rng_alone():
    ids, labels = _task(n=16)
    tiny = _fresh()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    finetune(tiny.model, tiny.adapter, _batches_fn(ids, labels), steps=2, lr=1e-3, batch_size=8, seed=0, progress=False)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"steps": 0}, "steps=0"), ({"lr": 0.0}, "lr=0.0"), ({"batch_size": 0}, "batch_size=0"),
     ({"warmup_ratio": 1.0}, "warmup_ratio=1.0"), ({"seed": -2}, "seed=-2"), ({"weight_decay": -1.0}, "weight_decay"),
     ({"distill": 1.5}, "distill=1.5"), ({"distill": 0.5}, "needs a teacher"),
     ({"distill": 0.5, "teacher": lambda b: b, "temperature": 0.0}, "temperature=0.0")],
)
def test_finetune_argument_errors(kwargs, match):
    ids, labels = _task(n=8)
    tiny = _fresh()
    args = {"steps": 1, "lr": 1e-3, "batch_size": 4, "seed": 0, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=match):
        finetune(tiny.model, tiny.adapter, _batches_fn(ids, labels), **args)


def test_finetune_rejects_empty_data():
    tiny = _fresh()
    with pytest.raises(ValueError, match="no batch"):
        finetune(tiny.model, tiny.adapter, lambda bs, seed: iter(()), steps=1, lr=1e-3, batch_size=4, seed=0,
                 progress=False)


def _kl_to(teacher, tiny, ids, t=2.0):
    """Mean KL(softmax(teacher / t) || softmax(student / t)) on the task's rows."""
    import torch.nn.functional as F

    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        p = F.log_softmax(teacher.adapter.logits(batch) / t, -1)
        q = F.log_softmax(tiny.adapter.logits(batch) / t, -1)
    return float(F.kl_div(q, p, log_target=True, reduction="batchmean"))


def test_distillation_pulls_the_student_towards_the_teacher_and_is_off_at_weight_0():
    ids, labels = _task()
    teacher = tiny_bert(seed=5, num_labels=2)  # another random model: its predictions ignore the labels
    teacher.model.eval()
    kw = {"steps": 24, "lr": 5e-3, "batch_size": 16, "seed": 3, "progress": False}
    plain, off, soft = _fresh(), _fresh(), _fresh()
    finetune(plain.model, plain.adapter, _batches_fn(ids, labels), **kw)
    finetune(off.model, off.adapter, _batches_fn(ids, labels), teacher=teacher.adapter.logits, distill=0.0, **kw)
    out = finetune(soft.model, soft.adapter, _batches_fn(ids, labels), teacher=teacher.adapter.logits, distill=1.0,
                   **kw)
    sd_plain, sd_off = plain.model.state_dict(), off.model.state_dict()
    assert all(torch.equal(sd_plain[k], sd_off[k]) for k in sd_plain)  # weight 0: exactly the labels-only run
    assert _kl_to(teacher, soft, ids) < 0.5 * _kl_to(teacher, plain, ids)
    assert out["losses"][-1] < out["losses"][0]


def test_distillation_loss_is_the_stated_mix():
    import torch.nn.functional as F

    from toolchain.pruning.finetune import _LossFn

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    got = _LossFn(lambda b: teacher, 0.3, 2.0)(student, labels, {})
    p_t, p_s = F.softmax(teacher / 2, -1), F.softmax(student / 2, -1)
    kl = (p_t * (p_t.log() - p_s.log())).sum(-1)
    expected = 0.7 * F.cross_entropy(student, labels, reduction="none") + 0.3 * 4.0 * kl
    assert torch.allclose(got, expected, atol=1e-6)
