"""GFC layers: the conv and MatMul lowerings against each other and against dense references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolchain.hydra.gfc import (
    GroupedLinear,
    StreamLinear,
    block_diagonal,
    gfc_conv,
    gfc_matmul,
    grouped_linear,
    stream_linear,
)


def _reference(x, weight, bias):
    """Member by member with F.linear on the token-major view."""
    groups, _, in_f = weight.shape
    parts = []
    for m in range(groups):
        xm = x[:, m * in_f:(m + 1) * in_f].transpose(1, 2)  # [B, T, in]
        parts.append(F.linear(xm, weight[m], None if bias is None else bias[m]).transpose(1, 2))
    return torch.cat(parts, dim=1)


class TestGroupedLinearFunctions:
    @pytest.mark.parametrize(("groups", "in_f", "out_f", "bias"), [(1, 5, 3, True), (3, 4, 6, True), (4, 8, 2, False)])
    def test_lowerings_match_reference_and_each_other(self, groups, in_f, out_f, bias):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, groups * in_f, 7, generator=g)
        w = torch.randn(groups, out_f, in_f, generator=g)
        b = torch.randn(groups, out_f, generator=g) if bias else None
        ref = _reference(x, w, b)
        conv, mm = gfc_conv(x, w, b), gfc_matmul(x, w, b)
        assert conv.shape == (2, groups * out_f, 7)
        assert (conv - ref).abs().max() <= 1e-5
        assert (mm - ref).abs().max() <= 1e-5
        assert (conv - mm).abs().max() <= 1e-6

    def test_block_diagonal_dense_form(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(3, 2 * 4, 5, generator=g)
        w = torch.randn(2, 3, 4, generator=g)
        dense = block_diagonal(w)
        assert dense.shape == (6, 8)
        assert torch.equal(dense[:3, 4:], torch.zeros(3, 4))
        assert (torch.matmul(dense, x) - gfc_conv(x, w)).abs().max() <= 1e-5

    def test_hand_computed_values(self):
        x = torch.tensor([[[1.0], [2.0], [3.0], [4.0]]])  # B=1, M=2, in=2, T=1
        w = torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]]])  # member 0 sums, member 1: 2a - b
        b = torch.tensor([[0.5], [1.0]])
        expected = torch.tensor([[[3.5], [3.0]]])
        for lowering in ("conv", "matmul"):
            assert torch.equal(grouped_linear(x, w, b, lowering), expected)

    def test_unknown_lowering(self):
        with pytest.raises(ValueError, match="lowering"):
            grouped_linear(torch.zeros(1, 2, 1), torch.zeros(1, 2, 2), None, "einsum")


class TestStreamLinear:
    def test_matches_per_stream_linear(self):
        g = torch.Generator().manual_seed(2)
        x = torch.randn(2, 3 * 4, 5, generator=g)
        w, b = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
        ref = _reference(x, w.expand(3, 6, 4), b.expand(3, 6))
        conv = stream_linear(x, w, b, 3, "conv")
        mm = stream_linear(x, w, b, 3, "matmul")
        assert (conv - ref).abs().max() <= 1e-5
        assert (conv - mm).abs().max() <= 1e-6

    def test_module(self):
        mod = StreamLinear(3, 4, 6)
        assert mod.weight.shape == (6, 4) and mod.bias.shape == (6,)
        assert mod(torch.randn(2, 12, 5)).shape == (2, 18, 5)


class TestGroupedLinearModule:
    def test_shapes_and_lowering_switch(self):
        mod = GroupedLinear(3, 4, 6)
        assert mod.weight.shape == (3, 6, 4) and mod.bias.shape == (3, 6)
        torch.nn.init.normal_(mod.weight)
        torch.nn.init.normal_(mod.bias)
        x = torch.randn(2, 12, 5)
        conv = mod(x)
        mod.lowering = "matmul"
        # N(0, 1) weights give outputs up to ~10: float32 round-off of two summation orders is relative
        assert (mod(x) - conv).abs().max() <= 1e-6 * max(1.0, float(conv.abs().max()))
        assert "groups=3" in repr(mod)

    def test_no_bias(self):
        assert GroupedLinear(2, 3, 3, bias=False).bias is None

    @pytest.mark.parametrize(("kwargs", "field"), [
        ({"groups": 0, "in_features": 2, "out_features": 2}, "groups"),
        ({"groups": 2, "in_features": -1, "out_features": 2}, "in_features"),
        ({"groups": 2, "in_features": 2, "out_features": 2.0}, "out_features"),
    ])
    def test_validation_names_the_field(self, kwargs, field):
        with pytest.raises(ValueError, match=field):
            GroupedLinear(**kwargs)

    def test_validation_of_lowering(self):
        with pytest.raises(ValueError, match="'dense'"):
            GroupedLinear(2, 2, 2, lowering="dense")
