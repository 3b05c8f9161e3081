"""Hydra Ensembles: M head-pruned members of one transformer fused into one graph.

Public API: :func:`fuse` (one model + keep masks), :func:`fuse_members` (M member models),
:func:`save_hydra` / :func:`load_hydra`, :func:`summary` / :func:`format_summary`, the
:class:`HydraModel` itself, the GFC building blocks (:mod:`toolchain.hydra.gfc`) and the
analytic cost model (:mod:`toolchain.hydra.cost`).
"""

from toolchain.hydra.config import HydraConfig, LayerSpec
from toolchain.hydra.fuse import format_summary, fuse, fuse_members, load_hydra, save_hydra, summary
from toolchain.hydra.gfc import GroupedLinear, StreamLinear, gfc_conv, gfc_matmul, grouped_linear
from toolchain.hydra.model import HydraModel

__all__ = [
    "GroupedLinear",
    "HydraConfig",
    "HydraModel",
    "LayerSpec",
    "StreamLinear",
    "format_summary",
    "fuse",
    "fuse_members",
    "gfc_conv",
    "gfc_matmul",
    "grouped_linear",
    "load_hydra",
    "save_hydra",
    "summary",
]
