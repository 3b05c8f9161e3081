"""The runner contract every backend implements (after Polygraphy's ``BaseRunner``).

A backend subclasses :class:`Runner` and implements four small hooks:
``_activate_impl`` (load the model/session/engine), ``_deactivate_impl`` (free it),
``_input_specs_impl`` (name -> :class:`TensorSpec`) and ``_infer_impl`` (run one feed). The base
class owns the public :meth:`Runner.activate` / :meth:`Runner.deactivate` / :meth:`Runner.infer`,
the context manager and every input check, so all backends reject bad feeds with the same
:class:`~toolchain.errors.EngineError` messages:

* unknown or missing input names;
* an input that is not a numpy array, or has the wrong dtype;
* the wrong rank, or a static dim that differs;
* one named dynamic dim (``"batch"``) given different sizes in different inputs;
* a dim outside the runner's limits (``max_batch``, or a TensorRT profile's min/max).

Every problem in a feed is collected and reported in one message.

A text feed shorter than an engine profile's minimum sequence (a 7-token batch against a profile
of 8..128) is padded up to it before the checks (:func:`pad_to_profile`): with token id 0 and
``attention_mask`` 0, which leaves every real position's result as it was for an encoder (the
added keys are masked), and the outputs' padded sequence axes are cut back. A feed without an
``attention_mask`` is not padded, and the message says why.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple, Self

import numpy as np

from toolchain.errors import EngineError, FeedError

log = logging.getLogger(__name__)

Dim = int | str | None


class TensorSpec(NamedTuple):
    """dtype and shape of one input; a dim is an ``int`` (static), a name or None (dynamic).

    ``dtype`` None means unknown (not checked): an engine checked from its sidecar profile only.
    """

    dtype: np.dtype | None
    shape: tuple[Dim, ...]


class ShapeLimits(NamedTuple):
    """Per-axis bounds an input must respect (a TensorRT optimisation profile's min and max)."""

    min_shape: tuple[int, ...]
    max_shape: tuple[int, ...]


def check_feed(
    feed: Mapping[str, object],
    specs: Mapping[str, TensorSpec],
    *,
    limits: Mapping[str, ShapeLimits] | None = None,
    max_batch: int | None = None,
    runner: str = "runner",
    complete: bool = True,
) -> None:
    """Validate one feed against the input specs; raise one :class:`FeedError` listing every problem.

    Args:
        feed: input name -> numpy array.
        specs: input name -> :class:`TensorSpec`.
        limits: input name -> per-axis (min, max) bounds (TensorRT profile).
        max_batch: the largest allowed size of axis 0 of every input.
        runner: name used in the message.
        complete: ``specs`` lists every input (False: names outside it are not reported as unknown).
    """
    problems: list[str] = []
    unknown = sorted(set(feed) - set(specs)) if complete else []
    missing = sorted(set(specs) - set(feed))
    if unknown:
        problems.append(f"unknown input(s) {unknown} (expected {sorted(specs)})")
    if missing:
        problems.append(f"missing input(s) {missing}")
    named: dict[str, tuple[str, int]] = {}
    advice: set[str] = set()
    for name in sorted(set(feed) & set(specs)):
        value, spec = feed[name], specs[name]
        if not isinstance(value, np.ndarray):
            problems.append(f"input '{name}' is a {type(value).__name__}; pass a numpy array")
            continue
        if spec.dtype is not None and value.dtype != spec.dtype:
            problems.append(
                f"input '{name}' has dtype {value.dtype}, expected {spec.dtype} (use .astype(np.{spec.dtype}))"
            )
        if value.ndim != len(spec.shape):
            problems.append(f"input '{name}' has shape {tuple(value.shape)} (rank {value.ndim}), expected rank "
                            f"{len(spec.shape)} {tuple(spec.shape)}")
            continue
        for axis, (size, dim) in enumerate(zip(value.shape, spec.shape)):
            if isinstance(dim, int) and dim >= 0 and size != dim:
                problems.append(f"input '{name}' axis {axis} is {size}, expected {dim}")
                if axis == 0:
                    advice.add("the batch size is fixed in this graph: split the input or re-export with a dynamic "
                               "batch")
            elif isinstance(dim, str):
                first = named.setdefault(dim, (name, size))
                if first[1] != size:
                    problems.append(f"dim '{dim}' is {first[1]} in '{first[0]}' but {size} in '{name}'")
        if max_batch is not None and value.ndim and value.shape[0] > max_batch:
            problems.append(f"input '{name}' batch {value.shape[0]} is over the maximum {max_batch}; split the batch")
        bounds = (limits or {}).get(name)
        if bounds is not None and len(bounds.min_shape) == value.ndim == len(bounds.max_shape):
            for axis, size in enumerate(value.shape):
                lo, hi = bounds.min_shape[axis], bounds.max_shape[axis]
                if not lo <= size <= hi:
                    what = "batch" if axis == 0 else f"axis {axis}"
                    problems.append(f"input '{name}' {what} {size} is outside the profile range {lo}..{hi}")
                    advice.add("rebuild the engine with a wider profile or split the input")
    if problems:
        raise FeedError(f"{runner}: bad feed: " + "; ".join(problems) + "".join(f" ({a})" for a in sorted(advice))
                        + ".")


#: the input that marks padding (Hugging Face's name): a feed is padded up to a profile's minimum only when it has one
MASK_INPUT = "attention_mask"

#: axis -> (size given, size padded to)
Padding = dict[int, tuple[int, int]]


def pad_to_profile(feed: Mapping[str, object], limits: Mapping[str, ShapeLimits], *,
                   outputs_known: bool = True, neutral: bool = True) -> tuple[dict[str, object], Padding, str | None]:
    """Pad sequences shorter than the profile's minimum: ``(feed, padding, why not)``.

    Axes after the batch whose size is under ``limits``' minimum are padded at the end with 0
    (token id 0, ``attention_mask`` 0), when the feed has an ``attention_mask`` input padded on the
    same axes, every padded input holds integers, and the inputs agree on the axis's size. Otherwise
    the feed is returned as given with the reason (``check_feed`` then reports the short axis).

    Args:
        feed: input name -> array.
        limits: input name -> :class:`ShapeLimits` (an engine's profile).
        outputs_known: the runner can tell its outputs' dynamic axes (to cut the padding back).
        neutral: padding at the end (mask 0) leaves the graph's result unchanged: a graph exported by
            this toolchain, whose families pool by the mask, the first token or the EOT token's argmax
            (its engines' sidecars say so, :func:`toolchain.engines.source.pads_neutral`). A graph from
            elsewhere may pool at the last non-pad token id (Hugging Face decoder classifiers), and is
            not padded.
    """
    short: dict[str, dict[int, int]] = {}
    for name, value in feed.items():
        bounds = limits.get(name)
        if bounds is None or not isinstance(value, np.ndarray) or len(bounds.min_shape) != value.ndim:
            continue
        for axis in range(1, value.ndim):
            if value.shape[axis] < bounds.min_shape[axis]:
                short.setdefault(name, {})[axis] = int(bounds.min_shape[axis])
    if not short:
        return dict(feed), {}, None
    if not neutral:
        return dict(feed), {}, ("the engine's source graph was not exported by hydra-toolchain, so padding may change "
                                "its result (a classifier that pools at the last non-pad token); rebuild it with a "
                                "smaller sequence minimum (--seq MIN:OPT:MAX) or feed longer rows")
    padding: Padding = {}
    problems = []
    for name, axes in sorted(short.items()):
        value = feed[name]
        assert isinstance(value, np.ndarray)
        if value.dtype.kind not in "iub":
            problems.append(f"input '{name}' holds {value.dtype}, not token ids or a mask")
        for axis, low in axes.items():
            size, padded = padding.get(axis, (value.shape[axis], low))
            if size != value.shape[axis]:
                problems.append(f"the inputs differ in length on axis {axis}")
            padding[axis] = (size, max(padded, low))
    if MASK_INPUT not in feed:
        problems.append(f"the feed has no '{MASK_INPUT}' input to mark added positions as padding, so padding would "
                        "change the result")
    elif set(short.get(MASK_INPUT, {})) != set(padding):
        problems.append(f"'{MASK_INPUT}' is not short on the same axes as the other inputs")
    if not outputs_known:
        problems.append("this runner cannot tell which output axes to cut the padding back from")
    if problems:
        return dict(feed), {}, "; ".join(dict.fromkeys(problems))
    out = dict(feed)
    for name, axes in short.items():
        value = feed[name]
        assert isinstance(value, np.ndarray)
        widths = [(0, padding[a][1] - value.shape[a]) if a in axes else (0, 0) for a in range(value.ndim)]
        out[name] = np.pad(value, widths, constant_values=0)
    return out, padding, None


def unpad_outputs(outputs: Mapping[str, np.ndarray], padding: Padding,
                  output_dims: Mapping[str, Sequence[int | None]]) -> dict[str, np.ndarray]:
    """Cut :func:`pad_to_profile`'s padding back from the outputs.

    An output axis after the first that is dynamic (None in ``output_dims``) and has a padded
    axis's padded size is cut back to that axis's given size; static axes (class counts) are kept.
    """
    back = {padded: size for size, padded in padding.values()}
    out = {}
    for name, value in outputs.items():
        dims = list(output_dims.get(name) or [])
        index = tuple(slice(0, back[n]) if 0 < a < len(dims) and dims[a] is None and n in back else slice(None)
                      for a, n in enumerate(value.shape))
        out[name] = value[index]
    return out


def check_feed_why(feed: Mapping[str, object], specs: Mapping[str, TensorSpec], why: str | None,
                   **kw: Any) -> None:
    """:func:`check_feed`, its message saying why a short feed was not padded (``why`` from :func:`pad_to_profile`)."""
    try:
        check_feed(feed, specs, **kw)
    except FeedError as exc:
        if why is None:
            raise
        raise FeedError(exc.message.rstrip(".") + f" (not padded up to the profile minimum: {why}).") from None


def recorded_specs(
    profile: Mapping[str, Sequence[Sequence[int]]], inputs: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, TensorSpec], dict[str, ShapeLimits], bool]:
    """Input specs and limits an engine file's sidecar records: ``(specs, limits, complete)`` for :func:`check_feed`.

    Args:
        profile: input name -> ``[min, opt, max]`` shapes (TensorRT's optimisation profile, the
            bounds an OpenVINO model was compiled for).
        inputs: input name -> ``{"dtype": numpy name, "shape": dims}`` (empty in old sidecars).

    With ``inputs`` the specs are complete (names, dtypes, ranks, static dims); otherwise they come
    from the profile alone (names in the profile, ranks; dtypes unknown). ``limits`` are the
    profile's min/max shapes.
    """
    limits = {name: ShapeLimits(tuple(lo), tuple(hi)) for name, (lo, _opt, hi) in profile.items()}
    if inputs:
        specs = {}
        for name, spec in inputs.items():
            try:
                dtype = np.dtype(spec["dtype"]) if spec.get("dtype") else None
            except TypeError:
                dtype = None
            specs[name] = TensorSpec(dtype, tuple(spec["shape"]))
        return specs, limits, True
    specs = {name: TensorSpec(None, tuple(lo if lo == hi else None for lo, hi in zip(lim.min_shape, lim.max_shape)))
             for name, lim in limits.items()}
    return specs, limits, False


class Runner(abc.ABC):
    """One inference backend behind a common interface; use as a context manager.

    Example::

        with make_runner("onnxrt-cpu", path=onnx_path) as runner:
            outputs = runner.infer({"input_ids": ids, "attention_mask": mask})  # name -> np.ndarray
    """

    kind: str = "runner"

    def __init__(self, *, name: str | None = None, max_batch: int | None = None) -> None:
        if max_batch is not None and max_batch < 1:
            raise EngineError(f"{self.kind}: max_batch must be >= 1, got {max_batch}.")
        self.name = name or self.kind
        self.max_batch = max_batch
        self._active = False
        self._specs: dict[str, TensorSpec] | None = None

    # ------------------------------------------------------------------ hooks for the backends
    @abc.abstractmethod
    def _activate_impl(self) -> None:
        """Load whatever inference needs (model, session, engine and context)."""

    @abc.abstractmethod
    def _deactivate_impl(self) -> None:
        """Release what ``_activate_impl`` loaded."""

    @abc.abstractmethod
    def _input_specs_impl(self) -> dict[str, TensorSpec]:
        """Input name -> :class:`TensorSpec` (called once per activation)."""

    @abc.abstractmethod
    def _infer_impl(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one checked feed; return output name -> numpy array (host memory)."""

    def _shape_limits(self) -> dict[str, ShapeLimits]:
        """Per-input axis bounds (TensorRT profiles); none by default."""
        return {}

    def _output_dims(self) -> dict[str, tuple[int | None, ...]] | None:
        """Output name -> dims (None where dynamic), to cut a padded feed's outputs back; None: not known.

        Kinds with a profile minimum (OpenVINO, TensorRT) say it, so short text feeds are padded
        (:func:`pad_to_profile`); the default (None) never pads.
        """
        return None

    def _pads_neutral(self) -> bool:
        """Padding a short feed leaves the result unchanged (:func:`pad_to_profile`); unknown: no."""
        return False

    def engine_info(self) -> dict[str, Any]:
        """What the engine really is, read back from it once active: ``{}`` when the kind has nothing to add.

        A kind that compiles a graph at a precision (OpenVINO) reports ``precision`` (asked for),
        ``ran_precision`` (what its layers really ran in), its runtime version and device; the
        parity gate judges the engine at ``ran_precision`` and reports a mismatch.
        """
        return {}

    def precheck(self, feed: Mapping[str, object]) -> bool:
        """Check ``feed`` before activation, from what is known without loading (False: nothing known).

        Backends whose activation is expensive or needs hardware (TensorRT reads its sidecar) override
        this so that a bad feed is reported before anything is loaded; it raises the same
        :class:`EngineError` as :meth:`infer`.
        """
        return False

    # ------------------------------------------------------------------------------ public API
    @property
    def is_active(self) -> bool:
        """True between :meth:`activate` and :meth:`deactivate`."""
        return self._active

    def activate(self) -> None:
        """Load the backend; a second call while active does nothing."""
        if self._active:
            log.debug("%s is already active", self.name)
            return
        self._activate_impl()
        self._active = True
        self._specs = None

    def deactivate(self) -> None:
        """Release the backend; a call while inactive does nothing."""
        if not self._active:
            return
        try:
            self._deactivate_impl()
        finally:
            self._active = False
            self._specs = None

    def __enter__(self) -> Self:
        self.activate()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.deactivate()

    def _require_active(self, what: str) -> None:
        if not self._active:
            raise EngineError(f"{self.name}: call activate() (or use 'with') before {what}.")

    def input_specs(self) -> dict[str, TensorSpec]:
        """Input name -> ``(dtype, shape)``; dynamic dims are a name or None.

        Example: ``{"input_ids": (int64, ("batch", "seq"))}``.
        """
        self._require_active("input_specs()")
        if self._specs is None:
            self._specs = self._input_specs_impl()
        return dict(self._specs)

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Check ``feed`` against :meth:`input_specs` and run it.

        Args:
            feed: input name -> numpy array, e.g. ``input_ids`` int64 ``[B, S]``.

        Returns:
            Output name -> numpy array, e.g. ``logits`` float32 ``[B, K]``.
        """
        self._require_active("infer()")
        limits = self._shape_limits()
        dims = self._output_dims() if limits else None
        padded, padding, why = pad_to_profile(feed, limits, outputs_known=dims is not None,
                                              neutral=bool(limits) and self._pads_neutral())
        check_feed_why(padded, self.input_specs(), why, limits=limits, max_batch=self.max_batch, runner=self.name)
        if padding:
            log.debug("%s: padded %s up to the profile minimum", self.name, padding)
        outputs = self._infer_impl(dict(padded))  # type: ignore[arg-type]  # checked: numpy arrays
        return unpad_outputs(outputs, padding, dims or {}) if padding else outputs

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return f"<{type(self).__name__} {self.name!r} ({state})>"
