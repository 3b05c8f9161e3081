"""The recipe: one YAML file that drives every stage, validated with pydantic.

Errors are :class:`~toolchain.errors.RecipeError` with the file, the dotted field path, what was received and
what to do (a did-you-mean for unknown keys, line and column for YAML syntax errors). A recipe may define
``profiles`` (e.g. ``quick``): partial recipes deep-merged over the base when selected with ``--profile NAME``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolchain.errors import RecipeError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Strict):
    """Which checkpoint to start from."""

    source: str | None = Field(
        None, description="local Hugging Face folder, or 'packaged:all-MiniLM-L6-v2' (CLIP: the prompt tokenizer)"
    )
    family: str = Field("auto", description="'auto' (from the checkpoint's config.json) or a registered model "
                        "family (toolchain.models.registry); required with from_config")
    #: build the model from this Hugging Face config dict instead of a checkpoint (ViT, tiny CLIP)
    from_config: dict[str, Any] | None = None
    max_length: int = Field(64, ge=4, le=4096, description="text: tokens per sample")
    image_size: int | None = Field(None, ge=4, description="images: side length fed to the model")
    num_channels: int = Field(1, ge=1, le=4, description="images: channels fed to the model")
    prompt_template: str = Field("a photo of a {}", description="CLIP: the class prompt ({} is the class name)")

    @field_validator("family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        allowed = ("auto", *_family_names())
        if value not in allowed:
            raise ValueError(f"Input should be {_one_of([repr(n) for n in allowed])}")
        return value

    @model_validator(mode="after")
    def _source_or_config(self) -> ModelSection:
        if self.source is None and self.from_config is None:
            raise ValueError("give model.source (a checkpoint) or model.from_config (a Hugging Face config dict)")
        if self.from_config is not None and self.family == "auto":
            raise ValueError(f"set model.family ({_one_of(_family_names())}) when the model is built from_config")
        return self


def _one_of(names: list[str] | tuple[str, ...]) -> str:  # "a, b or c"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _family_names() -> tuple[str, ...]:
    """The registered model families (:func:`toolchain.models.registry.family_names`), read when validating."""
    from toolchain.models.registry import family_names
    return tuple(family_names())


def _engine_kinds() -> list[str]:
    """The engine kinds a recipe may name (:func:`toolchain.engines.registry.selectable_kinds`)."""
    from toolchain.engines.registry import selectable_kinds
    return selectable_kinds()


def _default_engines() -> list[str]:
    from toolchain.engines.registry import default_engines
    return default_engines()


class NearOodSection(_Strict):
    """Near-OOD rows held out of the ID data set before it is split (toolchain/data/near_ood.py); evaluate only."""

    classes: list[str] | None = Field(None, description="held-out class names: their rows leave the ID set and "
                                      "its label space (a semantic shift, e.g. two Fashion-MNIST garments)")
    match: str | None = Field(None, description="text: a regular expression (re.search); matching rows leave the "
                              "ID set (a topic shift, e.g. '(?i)coachella' on the tweets)")
    rows: int = Field(500, ge=8, description="held-out rows scored as near_ood_test (a seeded sample)")

    @model_validator(mode="after")
    def _one_rule(self) -> NearOodSection:
        if (self.classes is None) == (self.match is None):
            raise ValueError("give exactly one of classes (held-out class names) or match (a text pattern)")
        if self.match is not None:
            import re

            try:
                re.compile(self.match)
            except re.error as exc:
                raise ValueError(f"match {self.match!r} is not a regular expression ({exc})") from None
        return self


class DataSection(_Strict):
    """In-distribution and OOD data sets and their split sizes (counts, or fractions)."""

    id: str = Field(description="tweets | bbc | fashion-mnist | digits | csv:PATH (text,label; relative to the recipe)")
    ood: str | None = Field(None, description="far-OOD data set, same forms as id (labels unused); null: none")
    splits: dict[str, float] = Field(default_factory=lambda: {"train": 4000, "val": 500, "calib": 128, "test": 1000},
                                     description="ID split sizes: counts, or fractions below 1; disjoint, seeded")
    ood_splits: dict[str, float] = Field(default_factory=lambda: {"ood_val": 200, "ood_test": 500},
                                         description="OOD split sizes (ood_val for selection, ood_test for evaluate)")
    near_ood: NearOodSection | None = Field(
        None, description="near-OOD rows held out of the ID data before splitting; no training, scoring or "
        "selection sees them (evaluate's ood.json)")

    @field_validator("splits", "ood_splits")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for name, size in value.items():
            if size <= 0:
                raise ValueError(f"split '{name}' has size {size}; sizes must be > 0 (a count or a fraction)")
        return value


class FinetuneSection(_Strict):
    """Fine-tuning of the base classifier on the in-distribution training split."""

    steps: int = Field(300, ge=0, description="optimiser steps (0: no fine-tuning)")
    lr: float = Field(5e-5, gt=0, lt=1, description="AdamW learning rate (linear decay)")
    batch_size: int = Field(32, ge=1, description="rows per step")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    group_by_length: bool = Field(True, description="text: batches of similar token length (shuffled groups), far "
                                  "less padding; also used by recovery fine-tuning")


class BaselinesSection(_Strict):
    """What Hydra is compared against beside the single model."""

    deep_ensemble: bool = Field(True, description="train the equal-budget deep ensemble (M - 1 more full fine-tunes) "
                                "and evaluate, export and bench it; false: the single model is the only baseline")
    temperature: bool = Field(False, description="post-hoc temperature scaling of the single model and of the deep "
                              "ensemble: one T each, fitted on the validation NLL, folded into their weights")


class ShiftSection(_Strict):
    """Covariate shift: the ID test split under seeded corruptions (toolchain/data/shift.py), scored by evaluate."""

    corruptions: list[str] | None = Field(None, description="corruption kinds (text: typos, word_dropout, word_swap, "
                                          "case_punct; images: gaussian_noise, blur, contrast, pixelate, rotate); "
                                          "null: every kind of the data's modality; []: off")
    severities: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5], description="severities, 1-5")
    rows: int | None = Field(300, ge=8, description="test rows corrupted (a seeded sample); null: the whole split")

    @field_validator("severities")
    @classmethod
    def _severities(cls, value: list[int]) -> list[int]:
        bad = [v for v in value if v not in (1, 2, 3, 4, 5)]
        if bad or len(set(value)) != len(value):
            raise ValueError(f"severities must be distinct values in 1..5; got {value}")
        return sorted(value)

    @field_validator("corruptions")
    @classmethod
    def _kinds(cls, value: list[str] | None) -> list[str] | None:
        from toolchain.data.shift import IMAGE_CORRUPTIONS, TEXT_CORRUPTIONS
        known = [*TEXT_CORRUPTIONS, *IMAGE_CORRUPTIONS]
        bad = [v for v in value or [] if v not in known]
        if bad:
            raise ValueError(f"unknown corruption(s) {bad}; known: {', '.join(known)}")
        return value


CRITERION = Literal["his", "taylor", "entropy", "hies", "l2", "random", "circuit"]


class ScoringSection(_Strict):
    """Head-importance criterion and its parameters."""

    criterion: CRITERION = Field("hies", description="head-importance criterion (circuit: a masked search)")
    alpha: float = Field(0.5, ge=0, le=1, description="HIES weight of gradient importance")
    normalize: Literal["global", "layer"] = Field("global", description="min-max over all heads or per layer")
    calib_samples: int = Field(128, ge=1, description="calibration rows the scores are computed on")
    batch_size: int = Field(16, ge=1, description="rows per scoring batch")
    objective: Literal["loss", "nll", "ood_auroc"] = Field("loss", description="circuit: what the search keeps")
    task_weight: float = Field(0.0, ge=0, description="circuit ood_auroc: keep AUROC - task_weight x ID NLL")

    @model_validator(mode="after")
    def _task_weight_needs_ood_auroc(self) -> ScoringSection:
        if self.task_weight and (self.criterion, self.objective) != ("circuit", "ood_auroc"):
            raise ValueError("task_weight weighs the task loss into the circuit search's ood_auroc objective: set "
                             f"criterion: circuit and objective: ood_auroc (got {self.criterion}, {self.objective})")
        return self


class RecoverySection(_Strict):
    """Optional recovery fine-tuning of each pruned member."""

    steps: int = Field(0, ge=0, description="fine-tuning steps per pruned member (0: no recovery)")
    lr: float = Field(5e-5, gt=0, lt=1, description="learning rate of the recovery fine-tune")
    batch_size: int = Field(32, ge=1, description="rows per recovery step")
    #: train each member on its own bootstrap resample of the training split (seeded per member)
    bootstrap: bool = False
    distill: float = Field(0.0, ge=0, le=1, description="weight of a teacher term: KL to the fine-tuned (unpruned) "
                           "model's softened predictions beside the labels' cross-entropy (0: labels only)")
    temperature: float = Field(2.0, gt=0, description="softening temperature of the teacher term")


class PruningSection(_Strict):
    """How many members, how each is made, and how many heads each keeps."""

    members: int = Field(3, ge=1, le=16, description="M")
    strategy: Literal["bootstrap", "seeds", "ratios", "circuit-samples", "partition", "sampled", "mixed-criteria"] = (
        Field("bootstrap", description="how the M members differ (docs/recipes.md, member strategies)"))
    #: partition: heads per layer every member shares (its best ``core``); the rest are dealt out disjointly
    core: int = Field(0, ge=0)
    #: sampled: Gumbel-top-k temperature (0 = deterministic top-k, .inf = uniform random)
    temperature: float = Field(1.0, ge=0)
    #: mixed-criteria: one criterion per member (length M)
    criteria: list[CRITERION] | None = None
    ratio: float | None = Field(0.5, ge=0, lt=1, description="fraction of heads pruned")
    budget: int | None = Field(None, ge=1, description="heads kept per member (instead of ratio)")
    scope: Literal["global", "layer"] = Field("global", description="rank heads over the model or within each layer")
    min_heads_per_layer: int = Field(1, ge=1, description="heads every layer keeps at least")
    fork: int = Field(0, ge=0, description="layers run once, the fine-tuned model's own, before the members split")
    mlp_share: float | None = Field(None, gt=0, le=1, description="fraction of the MLP neurons each member keeps "
                                    "(Taylor importance; needs fusion.mlp: grouped; null: all)")
    mlp_core: float = Field(0.0, ge=0, le=1, description="fraction of the MLP neurons every member keeps (the best)")
    recovery: RecoverySection = RecoverySection()

    @model_validator(mode="after")
    def _ratio_or_budget(self) -> PruningSection:
        if self.budget is not None and self.ratio is not None and "ratio" in self.model_fields_set:
            raise ValueError("give either ratio or budget, not both")
        if self.strategy == "mixed-criteria":
            if self.criteria is None or len(self.criteria) != self.members:
                got = "none" if self.criteria is None else f"{len(self.criteria)}"
                raise ValueError(f"strategy 'mixed-criteria' needs 'criteria' with one criterion per member "
                                 f"(members={self.members}, got {got})")
        elif self.criteria is not None:
            raise ValueError(f"'criteria' is only used by strategy 'mixed-criteria' (strategy is '{self.strategy}')")
        if self.mlp_core and (self.mlp_share is None or self.mlp_core > self.mlp_share):
            raise ValueError(f"mlp_core ({self.mlp_core}) is in every member's share: it needs an mlp_share >= it")
        return self

    def keep_rule(self) -> dict[str, float | int]:
        """``{"budget": n}`` when a budget is set, else ``{"ratio": r}``."""
        return {"budget": self.budget} if self.budget is not None else {"ratio": float(self.ratio or 0.0)}


class FusionSection(_Strict):
    """How members become one Hydra model."""

    mlp: Literal["average", "grouped"] = Field("average", description="one MLP on every stream, or one per member")
    layernorm: Literal["grouped", "average"] = Field("grouped", description="per-member affine or averaged")
    lowering: Literal["conv", "matmul"] = Field("conv", description="grouped FC as grouped Conv or batched MatMul")
    temperature: bool = Field(False, description="post-hoc temperature scaling of the fused Hydra: one T, fitted on "
                              "the validation NLL, folded into the heads")
    recovery_steps: int = Field(0, ge=0, description="end-to-end recovery of the fused Hydra: steps on the training "
                                "split with the NLL of its own prediction, input stage frozen; lr, batch size and "
                                "distillation from pruning.recovery (0: none)")


class Range(_Strict):
    """A dynamic dimension's min / opt / max (the TensorRT optimisation profile too)."""

    min: int = Field(1, ge=1, description="smallest size")
    opt: int = Field(8, ge=1, description="size the engine is tuned for")
    max: int = Field(32, ge=1, description="largest size")

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"need min <= opt <= max, got {self.min}, {self.opt}, {self.max}")
        return self


class ExportSection(_Strict):
    """ONNX export settings."""

    opset: int = Field(17, ge=13, le=23, description="ONNX opset")
    lowerings: list[Literal["conv", "matmul"]] = Field(["conv", "matmul"], description="Hydra graphs exported")
    precisions: list[Literal["fp32", "fp16", "bf16"]] = Field(["fp32", "fp16", "bf16"], description="graph precisions")
    batch: Range = Field(Range(min=1, opt=8, max=32), description="batch sizes: dynamic axis, checks, engine profile")
    sequence: Range = Field(Range(min=8, opt=64, max=128), description="sequence lengths (text), as batch")


class BenchSection(_Strict):
    """Latency measurement settings."""

    batch_sizes: list[int] = Field([1, 8], description="batch sizes of the generated feeds")
    #: tokens per generated text sample; None: the recipe's model.max_length (the length users run)
    sequence_length: int | None = Field(None, ge=1)
    threads: int = Field(2, ge=1, description="intra-op threads per session")
    warmup: int = Field(3, ge=0, description="untimed passes per case")
    rounds: int = Field(15, ge=1, description="timed interleaved rounds per case")
    #: precisions timed: each engine kind runs those it runs for real (ONNX Runtime CPU: fp32, fp16; OpenVINO: the
    #: engines it built, bf16/fp16 where the CPU has them); an emulator stands in for parity only, never here
    precisions: list[Literal["fp32", "fp16", "bf16"]] = ["fp32"]
    #: rows per batch of the real-row pass (the test split in token-length batches: rows per second); 0: none
    rows_batch: int = Field(32, ge=0)
    #: interleaved passes over the test split
    rows_rounds: int = Field(3, ge=1)
    #: test-split rows per pass, evenly spaced over the split (rows/s is a rate: a few hundred rows measure it;
    #: every variant, deep ensemble included, runs warm-up + rows_rounds passes); 0: the whole split
    rows: int = Field(256, ge=0)


class ParitySection(_Strict):
    """Parity gate overrides (defaults are measured per precision; see toolchain/parity/tolerances.py)."""

    #: per-metric absolute tolerance on the UQ-metric delta, e.g. {auroc_msp: 0.01}; "" sets every metric
    uq_tolerances: dict[str, float] = Field(default_factory=dict)
    #: per-engine or per-output numeric tolerances, e.g. {probs: {atol: 1e-3, rtol: 1e-2, stat: max}}
    tolerances: dict[str, dict[str, Any]] = Field(default_factory=dict)
    deep_ensemble: bool = Field(True, description="also gate each deep-ensemble member's engines against its "
                                "PyTorch model; false: Hydra and the single model only (members still benched)")


class CompareEntry(_Strict):
    """One more Hydra variant, built and evaluated beside the recipe's own (same model, data, fine-tuning).

    ``scoring``, ``pruning`` and ``fusion`` are partial sections merged over the recipe's, e.g.
    ``{name: taylor, scoring: {criterion: taylor}}``. Variants are evaluated in PyTorch only (not
    exported); their stages are cached under ``artifacts/<name>/variants/<variant>/``.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the report row hydra-<name>")
    scoring: dict[str, Any] = Field(default_factory=dict, description="partial scoring section over the recipe's")
    pruning: dict[str, Any] = Field(default_factory=dict, description="partial pruning section over the recipe's")
    fusion: dict[str, Any] = Field(default_factory=dict, description="partial fusion section over the recipe's")


class Recipe(_Strict):
    """A whole recipe. ``name`` names the artifacts folder ``artifacts/<name>/``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="names the folder artifacts/<name>/")
    seed: int = Field(0, description="seed of splits, training, scoring and sampling")
    model: ModelSection
    data: DataSection
    finetune: FinetuneSection = FinetuneSection()
    baselines: BaselinesSection = BaselinesSection()
    scoring: ScoringSection = ScoringSection()
    pruning: PruningSection = PruningSection()
    fusion: FusionSection = FusionSection()
    export: ExportSection = ExportSection()
    engines: list[str] = Field(default_factory=_default_engines,
                               description="engine kinds (toolchain.engines.registry), e.g. torch, onnxrt-cpu")
    bench: BenchSection = BenchSection()
    parity: ParitySection = ParitySection()
    shift: ShiftSection = ShiftSection()
    artifacts_dir: str = Field("artifacts", description="where artifacts/<name>/ goes (relative: to the recipe)")
    #: more Hydra variants to evaluate side by side in the report (e.g. other criteria or strategies)
    compare: list[CompareEntry] = Field(default_factory=list)

    @field_validator("engines")
    @classmethod
    def _known_engines(cls, value: list[str]) -> list[str]:
        allowed = _engine_kinds()
        for name in value:
            if name not in allowed:
                raise ValueError(f"{name!r}: input should be {_one_of([repr(n) for n in allowed])}")
        return value

    @model_validator(mode="after")
    def _check_compare(self) -> Recipe:
        names = [e.name for e in self.compare]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"compare: variant names must be unique, repeated: {', '.join(dup)}")
        for i, entry in enumerate(self.compare):
            for section in ("scoring", "pruning", "fusion"):
                over = getattr(entry, section)
                if not over:
                    continue
                cls = type(getattr(self, section))
                try:
                    cls.model_validate(_merged_section(getattr(self, section), over))
                except ValidationError as exc:
                    why = "; ".join(
                        f"field 'compare.{i}.{section}{''.join('.' + str(p) for p in e['loc'])}' "
                        f"(variant '{entry.name}'): {e['msg'].removeprefix('Value error, ')}"
                        for e in exc.errors()
                    )
                    raise ValueError(why) from None
        for at, r in [("", self)] + [(f"compare.{i}.", self.variant(e)) for i, e in enumerate(self.compare)]:
            if r.pruning.mlp_share is not None and r.fusion.mlp != "grouped":
                raise ValueError(f"field '{at}fusion.mlp': pruning.mlp_share gives each member its own MLP neurons, "
                                 f"which only mlp: grouped keeps (got '{r.fusion.mlp}')")
        return self

    def variant(self, entry: CompareEntry) -> Recipe:
        """The recipe of a compare variant: sections merged, artifacts under ``<this>/variants/``."""
        update: dict[str, Any] = {"name": entry.name, "compare": [],
                                  "artifacts_dir": str(self.artifacts() / "variants")}
        for section in ("scoring", "pruning", "fusion"):
            over = getattr(entry, section)
            if over:
                cls = type(getattr(self, section))
                update[section] = cls.model_validate(_merged_section(getattr(self, section), over))
        return self.model_copy(update=update)

    def digest(self, *sections: str) -> str:
        """Stable hash of the named sections or dotted fields (all when none): stage cache keys.

        A field of :data:`_EVALUATION_FIELDS` counts only where it is named as a dotted field (the
        stages that read it list it in ``sections``): inside its section it hashes at its default,
        and the dotted field adds its value only when that differs from the default (so a recipe at
        the default keeps its keys) and its parent exists (``data.near_ood.rows`` needs ``data.near_ood``).
        """
        full = self.model_dump(mode="json")
        named: dict[str, Any] = {}
        for name in sections:  # the dotted fields' real values, before the section is normalised
            value: Any = full
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            named[name] = value
        for path, default in _EVALUATION_FIELDS.items():  # read by a few stages only: not part of the section
            holder = _holder(full, path)
            if holder is not None and path[-1] in holder:
                holder[path[-1]] = default
        for path, default in _LATER_FIELDS.items():  # at their defaults: the keys from before the fields existed
            holder = _holder(full, path)
            if holder is not None and path[-1] in holder and holder[path[-1]] == default:
                del holder[path[-1]]
        data = full
        if sections:  # "section" or a dotted path such as "pruning.members"
            data = {}
            for name in sections:
                path = tuple(name.split("."))
                if path in _EVALUATION_FIELDS:  # at its default it is in the section's hash already
                    if named[name] is not None and named[name] != _EVALUATION_FIELDS[path]:
                        data[name] = named[name]
                    continue
                value = full
                for part in path:
                    value = value[part]
                data[name] = value
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def artifacts(self) -> Path:
        """``<artifacts_dir>/<name>``."""
        return Path(self.artifacts_dir) / self.name


#: fields added after artifacts were cached, with their defaults: a recipe that leaves one at its default
#: hashes as before the field existed, so its cached stages stay valid (``Recipe.digest``)
_LATER_FIELDS: dict[tuple[str, ...], Any] = {
    ("data", "near_ood"): None, ("pruning", "recovery", "distill"): 0.0, ("pruning", "recovery", "temperature"): 2.0,
    ("bench", "precisions"): ["fp32"], ("bench", "rows_batch"): 32, ("bench", "rows_rounds"): 3,
    ("fusion", "temperature"): False, ("fusion", "recovery_steps"): 0,
    ("baselines", "temperature"): False,  # also an evaluation field: hashed at its default in its section
    ("scoring", "task_weight"): 0.0, ("parity", "deep_ensemble"): True,
    ("pruning", "fork"): 0, ("pruning", "mlp_share"): None, ("pruning", "mlp_core"): 0.0,
}


#: fields only a few later stages read, with their defaults: in a section's digest they hash at the default (so
#: changing one reruns no stage that does not read it, and a recipe at the default keeps its keys from before);
#: the stages that read them name them in ``sections`` (evaluate, report; export for the temperature)
_EVALUATION_FIELDS: dict[tuple[str, ...], Any] = {
    ("data", "near_ood", "rows"): NearOodSection.model_fields["rows"].default,
    ("baselines", "temperature"): False,  # fitted where the baselines run (export, evaluate), not where they train
}
#: the dotted names of :data:`_EVALUATION_FIELDS`, for the stages' ``sections``
EVALUATION_FIELDS: tuple[str, ...] = tuple(".".join(path) for path in _EVALUATION_FIELDS)


def _holder(data: dict, path: tuple[str, ...]) -> dict | None:
    """The dict that holds ``path``'s last part in ``data`` (None when a parent is absent or null)."""
    holder: Any = data
    for part in path[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    return holder if isinstance(holder, dict) else None


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _merged_section(section: BaseModel, over: dict) -> dict:
    """A compare entry's partial section over the recipe's (only the recipe's explicitly set fields).

    Inherited ``criteria`` (of ``mixed-criteria``) and ``task_weight`` (of the circuit ``ood_auroc`` search)
    are dropped where the entry's strategy or search is another and it does not set them itself.
    """
    base = section.model_dump(exclude_unset=True)
    if "strategy" in over and over["strategy"] != "mixed-criteria" and "criteria" not in over:
        base.pop("criteria", None)
    merged = _deep_merge(base, over)
    if "task_weight" not in over and (merged.get("criterion"), merged.get("objective")) != ("circuit", "ood_auroc"):
        merged.pop("task_weight", None)  # the recipe's circuit-search weight: not for a variant with another search
    return merged


def _fields_of(model: type[BaseModel], path: tuple) -> list[str]:
    """Field names valid at ``path`` (for did-you-mean)."""
    cls: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(part) if hasattr(cls, "model_fields") else None
        if field is None:
            return []
        cls = field.annotation
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            return []
    return list(cls.model_fields)


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            known = _fields_of(Recipe, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            tip = f" Did you mean '{close[0]}'?" if close else f" Known keys here: {', '.join(known)}."
            lines.append(f"unknown key '{field}'.{tip}")
        elif err["type"] == "missing":
            lines.append(f"missing required field '{field}'.")
        else:
            got = err.get("input")
            shown = repr(got) if not isinstance(got, dict) else "{...}"
            msg = err["msg"].removeprefix("Value error, ")
            if not loc:  # a whole-recipe check: its message names the fields
                lines.append(f"{msg}.")
                continue
            lines.append(f"field '{field}': {msg} (got {shown}).")
    return f"recipe {source}: " + " ".join(lines) + " Fix the recipe and run again."


def parse_recipe(data: Any, source: str = "<dict>", profile: str | None = None) -> Recipe:
    """Validate a recipe given as a dict; apply ``profiles[profile]`` first when named."""
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {source}: the top level must be a mapping of sections, got {type(data).__name__}.")
    profiles = data.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise RecipeError(f"recipe {source}: 'profiles' must map profile names to partial recipes.")
    if profile is not None:
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none defined"
            raise RecipeError(f"recipe {source}: no profile '{profile}' (profiles: {known}).")
        data = _deep_merge(data, profiles[profile])
        data["name"] = f"{data.get('name', 'recipe')}-{profile}"
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_format_errors(exc, source)) from None


def load_recipe(path: str | Path, profile: str | None = None) -> Recipe:
    """Read and validate a YAML recipe file; every failure is a :class:`RecipeError`."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(
            f"recipe file '{path}' does not exist.", hint="Pass a YAML file, e.g. recipes/minilm-tweets.yaml."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read recipe '{path}': {exc}.") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError(f"recipe '{path}' is not valid YAML{where}: {problem}.") from None
    return resolve_paths(parse_recipe(data, source=f"'{path}'", profile=profile), path.resolve().parent)


def _against(base: Path, value: str) -> str:
    """``value`` as a path: ``~`` expanded, relative ones joined to ``base``."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def resolve_paths(recipe: Recipe, base: Path) -> Recipe:
    """Every relative path of a recipe resolved against ``base`` (the recipe file's folder).

    ``model.source`` (unless a ``packaged:`` alias), ``data.id`` / ``data.ood`` of the form
    ``csv:PATH`` and ``artifacts_dir``: so a recipe means the same files from any working directory.
    """
    from toolchain.data.csv_sets import resolve_csv_id

    model, data = recipe.model, recipe.data
    updates: dict[str, Any] = {"artifacts_dir": _against(base, recipe.artifacts_dir)}
    if model.source is not None and ":" not in model.source.split("/")[0]:
        updates["model"] = model.model_copy(update={"source": _against(base, model.source)})
    csv = {k: resolve_csv_id(v, base) for k in ("id", "ood") if (v := getattr(data, k))}
    csv = {k: v for k, v in csv.items() if v != getattr(data, k)}
    if csv:
        updates["data"] = data.model_copy(update=csv)
    return recipe.model_copy(update=updates)
