"""The pipeline's stages, one module each; importing this package registers them.

Run order comes from each stage's ``upstream`` (:func:`toolchain.pipeline.run_order`); the
import order below (kept out of isort's hands) only breaks ties between stages that are ready
at the same time, e.g. ``ensemble`` before ``score`` after ``finetune``. Each stage writes only
into its work folder; the pipeline publishes it with a manifest.
"""

# isort: off
from toolchain.stages import load  # noqa: F401  (imported to register the stages)
from toolchain.stages import training  # noqa: F401
from toolchain.stages import scoring  # noqa: F401
from toolchain.stages import fuse  # noqa: F401
from toolchain.stages import export  # noqa: F401
from toolchain.stages import evaluate  # noqa: F401
from toolchain.stages import compare  # noqa: F401
from toolchain.stages import build  # noqa: F401
from toolchain.stages import parity  # noqa: F401
from toolchain.stages import bench  # noqa: F401
from toolchain.stages import report  # noqa: F401
# isort: on
from toolchain.stages.common import VARIANT_STAGES, VariantContext, load_stage_model
from toolchain.stages.parity import parity_outcome, rescue_failing_graphs

__all__ = ["VARIANT_STAGES", "VariantContext", "load_stage_model", "parity_outcome", "rescue_failing_graphs"]
