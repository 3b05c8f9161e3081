"""Fixtures for the Hydra tests: one tiny model per registered family, keep masks."""

import math

import pytest
import torch

from toolchain.models.tiny import TINY_MODELS

FAMILIES = sorted(TINY_MODELS)


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request):
    """Tiny tensors gain nothing from a second intra-op thread, and on a busy 2-core machine
    OpenMP barriers stall (measured: the fuse tests took 64 s with 2 threads, 8 s with 1).
    Tests marked ``slow`` (the real model) keep the session's thread count."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(params=FAMILIES)
def tiny(request):
    """A fresh tiny model (float32) whose probabilities are far from uniform.

    tiny.py scales the BERT and ViT classifiers; CLIP's zero-shot head has no classifier to
    scale and its initial temperature (logit_scale = log(1/0.07), x14.3) leaves some batches
    with every probability below 0.5, so the temperature is raised to x40 (logits stay below
    ~16, so float32 rounding stays a few ulps under the 1e-5 tolerance).
    """
    tiny = TINY_MODELS[request.param]()
    scale = getattr(tiny.model, "logit_scale", None)
    if isinstance(scale, torch.nn.Parameter):
        with torch.no_grad():
            scale.fill_(math.log(40.0))
    return tiny


def make_equal_masks(layers: int = 2, heads: int = 4, members: int = 3, seed: int = 0) -> torch.Tensor:
    """Every member keeps ``heads // 2`` heads per layer; the sets differ between members."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(members, layers, heads, dtype=torch.bool)
    for m in range(members):
        for layer in range(layers):
            masks[m, layer, torch.randperm(heads, generator=g)[: heads // 2]] = True
    return masks


def make_unequal_masks() -> torch.Tensor:
    """3 members x 2 layers x 4 heads, unequal counts, one-head and all-head layers."""
    masks = torch.zeros(3, 2, 4, dtype=torch.bool)
    masks[0, 0, 2] = True  # member 0, layer 0: one head
    masks[1, 0, :] = True  # member 1, layer 0: every head
    masks[2, 0, [0, 3]] = True
    masks[0, 1, [0, 1, 3]] = True
    masks[1, 1, 1] = True  # member 1, layer 1: one head
    masks[2, 1, :] = True  # member 2, layer 1: every head
    return masks


@pytest.fixture
def equal_masks():
    return make_equal_masks()


@pytest.fixture
def unequal_masks():
    return make_unequal_masks()
