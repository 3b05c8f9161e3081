"""Every criterion on every family; registry; HeadScores I/O; L2, random, hashing; pruned models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from toolchain.scoring import CRITERIA, HeadScores, criterion_params, data_hash, l2_scores, score_heads

PARAMS = {"random": {"seed": 3}, "circuit": {"n_heads": 2}}


@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_every_criterion_on_every_family(tiny, calib, criterion):
    s = score_heads(tiny.adapter, calib, criterion, **PARAMS.get(criterion, {}))
    assert isinstance(s, HeadScores) and s.criterion == criterion
    assert s.scores.dtype == torch.float64
    assert s.scores.shape == (tiny.adapter.num_layers, tiny.adapter.max_heads)
    assert bool(torch.isfinite(s.scores).all())
    assert s.heads_per_layer == tiny.adapter.heads_per_layer()
    assert s.data_hash == data_hash(calib)
    json.dumps(s.to_dict(), allow_nan=False)
    assert not tiny.model.training


def _pruned(tiny):
    keep = torch.ones(tiny.adapter.num_layers, tiny.adapter.max_heads, dtype=torch.bool)
    keep[0, 1:] = False  # layer 0 keeps one head
    keep[1, 3] = False
    model = tiny.adapter.prune(keep)
    return type(tiny.adapter)(model, **tiny.adapter.clone_kwargs())


@pytest.mark.parametrize("criterion", sorted(CRITERIA))
def test_pruned_model_scores_are_nan_past_each_layer(tiny, calib, criterion):
    adapter = _pruned(tiny)
    s = score_heads(adapter, calib, criterion, **PARAMS.get(criterion, {}))
    assert s.heads_per_layer == [1, 3]
    assert s.scores.shape == (2, 3)
    assert bool(torch.isnan(s.scores[0, 1:]).all()) and bool(torch.isfinite(s.scores[0, :1]).all())
    assert bool(torch.isfinite(s.scores[1]).all())


def test_l2_matches_manual_slices(bert):
    sd = bert.model.state_dict()
    d = 8  # hidden 32 / 4 heads
    got = l2_scores(bert.adapter)
    for l in range(2):
        pre = f"bert.encoder.layer.{l}.attention"
        for h in range(4):
            rows = slice(h * d, (h + 1) * d)
            sq = sum(sd[f"{pre}.self.{n}.weight"][rows].double().pow(2).sum() for n in ("query", "key", "value"))
            sq += sd[f"{pre}.output.dense.weight"][:, rows].double().pow(2).sum()
            assert float(got.scores[l, h]) == pytest.approx(math.sqrt(float(sq)), rel=1e-12)
    assert got.data_hash == ""


def test_random_is_seeded(bert):
    a = score_heads(bert.adapter, None, "random", seed=5)
    b = score_heads(bert.adapter, None, "random", seed=5)
    c = score_heads(bert.adapter, None, "random", seed=6)
    assert torch.equal(a.scores, b.scores) and not torch.equal(a.scores, c.scores)


def test_registry_errors(bert, make_calib):
    calib = make_calib(bert)
    with pytest.raises(ValueError, match="known criteria: his, taylor"):
        score_heads(bert.adapter, calib, "magnitude")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['beta'\]"):
        score_heads(bert.adapter, calib, "hies", beta=1.0)
    with pytest.raises(ValueError, match="n_heads"):
        score_heads(bert.adapter, calib, "circuit")
    with pytest.raises(ValueError, match="mode"):
        score_heads(bert.adapter, calib, "his", mode="fast")
    with pytest.raises(ValueError, match="calib"):
        score_heads(bert.adapter, [], "his")
    assert criterion_params("hies")["alpha"] == 0.5


def test_data_hash_is_stable_and_content_sensitive(bert, make_calib):
    a, b = make_calib(bert), make_calib(bert)
    assert data_hash(a) == data_hash(b) and len(data_hash(a)) == 64
    b[0][1][0] = (b[0][1][0] + 1) % 3
    assert data_hash(a) != data_hash(b)
    c = make_calib(bert)
    c[1][0]["input_ids"][0, 1] += 1
    assert data_hash(a) != data_hash(c)


def test_head_scores_json_round_trip_with_nan(tmp_path):
    s = HeadScores(torch.tensor([[0.5, float("nan")], [1.0, -2.0]]), "his", {"alpha": (1, 2)}, "abc", [1, 2],
                   {"note": float("inf")})
    path = s.to_json(tmp_path / "sub" / "scores.json")
    back = HeadScores.from_json(path)
    assert back.heads_per_layer == [1, 2] and back.params == {"alpha": [1, 2]} and back.extras == {"note": None}
    assert math.isnan(back.scores[0, 1]) and back.scores[1].tolist() == [1.0, -2.0]
    assert back.criterion == "his" and back.data_hash == "abc"
    assert [p.name for p in path.parent.iterdir()] == ["scores.json"]  # no temporary file left
    with pytest.raises(ValueError, match="format"):
        (tmp_path / "bad.json").write_text('{"format": "other"}')
        HeadScores.from_json(tmp_path / "bad.json")


def test_head_scores_validates_shape():
    with pytest.raises(ValueError, match="heads_per_layer"):
        HeadScores(torch.zeros(2, 3), "his", {}, "", [3, 2, 1])


def test_plot_heatmap_writes_png(tmp_path):
    s = HeadScores(torch.tensor([[0.5, float("nan")], [1.0, -2.0]]), "his", {}, "", [1, 2])
    path = s.plot_heatmap(tmp_path / "heat.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heat.png"]


def test_ranking_breaks_ties_by_index():
    s = HeadScores(torch.tensor([[1.0, 2.0], [2.0, 1.0]]), "x", {}, "", [2, 2])
    assert s.ranking() == [(0, 1), (1, 0), (0, 0), (1, 1)]


def test_subset_keeps_rows_in_their_batches(bert, make_calib):
    from toolchain.scoring import subset

    calib = make_calib(bert, sizes=(4, 3))
    part = subset(calib, [0, 0, 2, 5])
    assert len(part) == 2
    (b0, y0), (b1, y1) = part
    assert torch.equal(b0["input_ids"], calib[0][0]["input_ids"][[0, 0, 2]])
    assert y0.tolist() == calib[0][1][[0, 0, 2]].tolist()
    assert torch.equal(b1["attention_mask"], calib[1][0]["attention_mask"][[1]]) and y1.shape == (1,)
    with pytest.raises(ValueError, match="indices"):
        subset(calib, [7])
    with pytest.raises(ValueError, match="indices"):
        subset(calib, [])


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"input_ids": torch.zeros(2, 3)}, "single dict"),
        ([torch.zeros(2)], r"calib\[0\] must be a"),
        ([({"x": torch.zeros(2, 3)}, torch.tensor([0.5, 1.0]))], "integer"),
        ([({"x": torch.zeros(2, 3)}, torch.tensor([0, 1, 2]))], "no batch tensor has 3 rows"),
        ([({}, torch.tensor([0]))], "dict of tensors"),
    ],
)
def test_as_calibration_errors(bad, match):
    from toolchain.scoring import as_calibration

    with pytest.raises(ValueError, match=match):
        as_calibration(bad)
