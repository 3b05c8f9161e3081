"""The pipeline: stages in order, their cache keys, skip-if-unchanged, and the Python API.

Each stage is a function ``build(ctx, work_dir) -> info`` plus the recipe sections and upstream
stages its output depends on. Its cache key hashes those sections and the upstream keys, so
changing a recipe field reruns exactly the stages downstream of it. A stage whose published
folder has a manifest with the same key and intact files is skipped; ``force`` reruns it and every
stage downstream of it (:func:`force_reasons`: a forced stage rebuilds under the same key, so the
keys alone would leave the stages that read its outputs "up to date"). Each manifest also records a
digest of its upstream stages' published files: a stage whose upstream outputs changed since it was
built (an upstream forced by an earlier run that stopped before it, or by ``bench --force bench``
before ``run``) reruns too.

Under ``torchrun`` / ``accelerate launch`` (see :mod:`toolchain.distributed`) every rank runs
:func:`run_pipeline`, and only rank 0 writes artifacts: it alone takes the lock, decides which
stages are up to date and publishes. The stages in :data:`DISTRIBUTED_STAGES` run on every rank
(they split their work over the ranks: scoring batches, circuit masks, member trainings); a
non-main rank builds into a private temporary folder that is discarded. The other stages run on
rank 0 alone while the other ranks wait, and later stages read rank 0's published outputs from
the shared artifacts folder. A failure on any rank aborts the stage on every rank (rank 0 drops
its work folder: nothing partial is published) and ends the job on every rank with that rank's
message and a nonzero exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape

from toolchain import distributed as dist
from toolchain import interrupts
from toolchain.artifacts import (
    StageDir,
    folder_digest,
    locked,
    read_digest_cache,
    read_manifest,
    remove_stale_temporaries,
    scratch_folder,
    write_digest_cache,
)
from toolchain.errors import ArtifactError, RecipeError, ToolchainError, environment_error
from toolchain.recipe import Recipe


@dataclass(frozen=True)
class Stage:
    """One pipeline stage."""

    name: str
    sections: tuple[str, ...]
    upstream: tuple[str, ...]
    build: Callable[[Context, Path], dict[str, Any]]
    #: the line printed when the stage runs; a function of the context where it depends on the recipe
    summary: str | Callable[[Context], str]
    #: bumped when the stage's code changes what it writes: a new version is a new cache key
    version: int = 1
    #: every rank runs it under torch.distributed (it splits its work over the ranks); the other
    #: stages run on rank 0 only while the other ranks wait
    distributed: bool = False
    #: checks run once the stage's output is there, whether it ran or was up to date
    after: Callable[[Context], None] | None = None


#: the registry, filled by the stage modules (:data:`STAGE_PACKAGE`) as they are imported
STAGES: dict[str, Stage] = {}

#: where the stages live; imported on first use (plugin discovery: this module imports no stage)
STAGE_PACKAGE = "toolchain.stages"

def stage(name: str, sections: tuple[str, ...], upstream: tuple[str, ...], summary: str | Callable[[Context], str],
          version: int = 1, distributed: bool = False, after: Callable[[Context], None] | None = None):
    """Register a stage function under ``name`` (see :class:`Stage` for the fields)."""

    def wrap(fn: Callable[[Context, Path], dict[str, Any]]) -> Callable[[Context, Path], dict[str, Any]]:
        STAGES[name] = Stage(name, sections, upstream, fn, summary, version, distributed, after)
        return fn

    return wrap


def stages() -> dict[str, Stage]:
    """Every registered stage, in run order (importing :data:`STAGE_PACKAGE` on first use)."""
    if not STAGES:
        import importlib

        importlib.import_module(STAGE_PACKAGE)
    return {name: STAGES[name] for name in run_order(STAGES)}


def run_order(registry: dict[str, Stage]) -> list[str]:
    """A topological order of ``registry`` by ``upstream`` (ties: registration order); a cycle is an error."""
    done: list[str] = []
    left = list(registry)
    while left:
        ready = next((n for n in left if all(u in done for u in registry[n].upstream if u in registry)), None)
        if ready is None:
            raise ToolchainError(f"the stages {', '.join(left)} depend on each other in a cycle.")
        done.append(ready)
        left.remove(ready)
    return done


def force_reasons(force: Collection[str], registry: dict[str, Stage]) -> dict[str, str]:
    """Why each stage must rerun because of ``--force``: the forced stages and, transitively, all downstream of them.

    ``{stage: "forced"}`` for a forced stage, ``{stage: "downstream of forced a, b"}`` for a stage
    that reads (through ``upstream``, transitively) the outputs of forced stages ``a`` and ``b``;
    the other stages are absent. A forced stage rebuilds under the same cache key, and keys chain
    on upstream keys, not outputs: without this its downstream stages would count as up to date.
    """
    order = run_order(registry)
    origins: dict[str, set[str]] = {}
    for name in order:
        origins[name] = set().union(*(({u} if u in force else set()) | origins[u]
                                      for u in registry[name].upstream if u in origins))
    reasons: dict[str, str] = {}
    for name in order:
        if name in force:
            reasons[name] = "forced"
        elif origins[name]:
            reasons[name] = "downstream of forced " + ", ".join(n for n in order if n in origins[name])
    return reasons


@dataclass
class Context:
    """What every stage sees: the recipe, the artifacts root, the console, the forced stages."""

    recipe: Recipe
    console: Console = field(default_factory=lambda: Console(stderr=True))
    force: frozenset[str] = frozenset()
    progress: bool = True
    #: filled by :func:`run_pipeline`: the up-to-date stages that ran all the same -> why (``forced``, ``downstream
    #: of forced bench``, ``upstream bench rebuilt since``; see :func:`force_reasons`)
    forced_reruns: dict[str, str] = field(default_factory=dict, repr=False)

    def publishes(self, name: str) -> bool:
        """Whether this context runs and publishes stage ``name`` (a compare variant runs only some)."""
        return True

    @property
    def root(self) -> Path:
        """``artifacts/<recipe name>``."""
        return self.recipe.artifacts()

    def stage_dir(self, name: str) -> Path:
        """Published folder of stage ``name``."""
        return self.root / name

    def key(self, name: str) -> str:
        """Cache key of stage ``name`` (recipe sections + seed + data and model content + upstream keys)."""
        st = stages()[name]
        h = hashlib.sha256()
        h.update(name.encode())
        if st.version > 1:  # version 1 keeps the keys of artifacts written before versions existed
            h.update(f"version {st.version}".encode())
        h.update(self.recipe.digest(*st.sections, "seed").encode())
        if "data" in st.sections and any(self._data_sources):  # a local csv: data set: its content too
            h.update(repr(self._data_sources).encode())
        if "model" in st.sections and self._model_source is not None:  # the checkpoint folder's content
            h.update(f"model {self._model_source}".encode())
        for up in st.upstream:
            h.update(self.key(up).encode())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ data
    @cached_property
    def data(self) -> dict[str, Any]:
        """The recipe's splits, loaded once (:func:`toolchain.data.batching.recipe_splits`)."""
        from toolchain.data.batching import recipe_splits

        return recipe_splits(self.recipe.data, self.recipe.seed, warn=lambda m: self.console.print(
            f"warning: {m}", highlight=False, markup=False))

    @cached_property
    def _model_source(self) -> str | None:
        """Content hash of the ``model.source`` folder (weights, config, tokenizer files); None without one."""
        from toolchain.models import resolve_source

        if self.recipe.model.source is None:
            return None
        folder = resolve_source(self.recipe.model.source)
        return folder_digest(folder, self.digest_cache)

    @cached_property
    def digest_cache(self) -> dict[str, Any]:
        """File digests of model folders (see :func:`toolchain.artifacts.folder_digest`); saved with each stage."""
        return read_digest_cache(self.root)

    @cached_property
    def _data_sources(self) -> tuple[str | None, ...]:
        from toolchain.data import source_digest

        return tuple(source_digest(n) if n else None for n in (self.recipe.data.id, self.recipe.data.ood))

    @property
    def class_names(self) -> list[str]:
        """In-distribution class names (:func:`toolchain.data.batching.class_names`)."""
        from toolchain.data.batching import class_names

        return class_names(self.data)


def run_pipeline(ctx: Context, until: str | None = None, only: list[str] | None = None) -> dict[str, str]:
    """Run the stages in order (up to ``until``, or just ``only``); returns stage -> status.

    ``ctx.force`` is expanded here, once, to the forced stages and everything downstream of them
    (:func:`force_reasons`); the same on every rank, and rank 0's decision is broadcast anyway.
    """
    registry = stages()
    names = list(registry)
    if until is not None:
        if until not in names:
            raise ToolchainError(f"unknown stage '{until}' (stages: {', '.join(names)}).")
        names = names[: names.index(until) + 1]
    if only is not None:
        names = [n for n in names if n in only]
    reasons = force_reasons(ctx.force, registry)
    dist.init_from_env()
    status: dict[str, str] = {}
    with dist.guard("the pipeline"), _quiet_unless_main(ctx), contextlib.ExitStack() as stack:
        if dist.is_main():  # rank 0 alone holds the lock (and writes)
            stack.enter_context(locked(ctx.root))
            _remove_leftovers(ctx)
        dist.barrier(what="taking the artifacts lock")
        reruns: dict[str, str] = {}
        for name in names:
            status[name], why = _run_stage(ctx, name, reasons.get(name))
            if why is not None:
                reruns[name] = why
            if STAGES[name].after is not None:  # e.g. checks that need the model, also when cached
                STAGES[name].after(ctx)
        line = forced_summary(reruns)  # this run's; ctx.forced_reruns was filled as each stage began
        if line:  # rank 0 reports (the other ranks' console is quiet here)
            ctx.console.print(line, highlight=False, markup=False)
    return status


def forced_summary(reruns: dict[str, str]) -> str:
    """One line naming the stages that reran while up to date: ``forced: bench; rerun: report (downstream of ...)``."""
    forced = [n for n, why in reruns.items() if why == "forced"]
    downstream = [f"{n} ({why})" for n, why in reruns.items() if why != "forced"]
    parts = ([f"forced: {', '.join(forced)}"] if forced else []) + \
        ([f"rerun: {', '.join(downstream)}"] if downstream else [])
    return "; ".join(parts)


def _remove_leftovers(ctx: Context) -> None:
    """Delete what a killed run left in the artifacts folder (we hold the lock: no live run owns it)."""
    names, freed = remove_stale_temporaries(ctx.root)
    if names:
        ctx.console.print(f"removed {len(names)} temporary folder(s) left by an interrupted run "
                          f"({freed / 1e6:.1f} MB): {', '.join(names)}", highlight=False)


@contextlib.contextmanager
def _quiet_unless_main(ctx: Context):
    """Silence the console and progress bars of the non-main ranks (rank 0 reports)."""
    if dist.is_main():
        yield
        return
    quiet, progress = ctx.console.quiet, ctx.progress
    ctx.console.quiet, ctx.progress = True, False
    try:
        yield
    finally:
        ctx.console.quiet, ctx.progress = quiet, progress


def _run_stage(ctx: Context, name: str, forced: str | None = None) -> tuple[str, str | None]:
    """Run stage ``name`` unless it is up to date; returns ``(status, why it ran while up to date)``.

    ``forced``: why ``--force`` reruns it (:func:`force_reasons`).
    """
    interrupts.check()
    st = STAGES[name]
    sd = StageDir(ctx.root, name, ctx.key(name))
    main = dist.is_main()
    # rank 0 decides (it alone reads the published folders) and every rank follows its decision
    complete, why = dist.broadcast_object(_decide(ctx, st, sd, forced) if main else None)
    if complete:
        ctx.console.print(f"[dim]- {name}: up to date, skipped[/dim]")
        return "skipped", None
    if why is not None:  # known while the stage runs (a cache of its own may need to know why it reruns)
        ctx.forced_reruns[name] = why
    summary = st.summary(ctx) if callable(st.summary) else st.summary
    said = "" if why is None else ("forced: " if why == "forced" else f"rerun ({escape(why)}): ")
    ctx.console.print(f"[bold]> {name}[/bold]: {said}{escape(summary)}")
    extra = {} if why is None else {"rerun_reason": why}  # recorded in the stage's manifest
    if dist.enabled() and not st.distributed:
        if main:
            with dist.local_only():
                _build_and_publish(ctx, st, sd, sd.begin(), extra=extra)
        dist.barrier(what=f"waiting for rank 0's stage '{name}'")
        return "ran", why
    with contextlib.ExitStack() as stack:
        work = sd.begin() if main else stack.enter_context(scratch_folder(name, dist.rank()))
        _build_and_publish(ctx, st, sd, work, publish=main, extra=extra)
    dist.barrier(what=f"publishing stage '{name}'")  # the others may read the published folder now
    return "ran", why


def _decide(ctx: Context, st: Stage, sd: StageDir, forced: str | None) -> tuple[bool, str | None]:
    """``(up to date, why it reruns all the same)``: forced, or an upstream's files changed since it was built."""
    if forced is not None:
        return False, forced
    if not sd.is_complete():
        return False, None
    recorded = (read_manifest(sd.final) or {}).get("upstream_outputs")
    if not isinstance(recorded, dict):  # published before upstream outputs were recorded: the keys decide
        return True, None
    # an ancestor this context does not publish (a compare variant's score stage: prune scores itself) was not
    # rebuilt: a variant that reuses the recipe's own prune / fuse / evaluate folders keeps them
    changed = [u for u in _ancestors(st)
               if u in recorded and ctx.publishes(u) and recorded[u] != _outputs_digest(ctx, u)]
    if changed:
        return False, f"upstream {', '.join(changed)} rebuilt since"
    return True, None


def _ancestors(st: Stage) -> list[str]:
    """Every stage ``st`` depends on, transitively, in run order.

    A stage may read an ancestor's files directly (``parity`` reads ``export``'s graphs through
    ``build``, whose own files need not change when the graphs do).
    """
    registry = stages()
    seen: set[str] = set()
    todo = [u for u in st.upstream if u in registry]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [u for u in registry[name].upstream if u in registry]
    return [n for n in run_order(registry) if n in seen]


def _outputs_digest(ctx: Context, name: str) -> str | None:
    """Digest of stage ``name``'s published files (its manifest's sha256 of each); ``None`` when unpublished."""
    manifest = read_manifest(ctx.stage_dir(name))
    if manifest is None:
        return None
    return hashlib.sha256(json.dumps(manifest.get("files", {}), sort_keys=True).encode()).hexdigest()[:16]


def _build_and_publish(ctx: Context, st: Stage, sd: StageDir, work: Path, *, publish: bool = True,
                       extra: dict[str, Any] | None = None) -> None:
    """Build into ``work``; when every rank succeeded, publish (rank 0), ``extra`` in the manifest; else drop it."""
    t0 = time.perf_counter()
    try:
        info = st.build(ctx, work) or {}
        dist.barrier(what=f"stage '{st.name}'")  # every rank finished: a failure on any rank raises here
        info = {"seconds": round(time.perf_counter() - t0, 3), "seed": ctx.recipe.seed,
                "upstream": {u: ctx.key(u) for u in st.upstream}, **(extra or {}), **info}
        if publish:
            info["upstream_outputs"] = {u: _outputs_digest(ctx, u) for u in _ancestors(st)}  # see _decide
            sd.publish(info)
            if "digest_cache" in ctx.__dict__:
                write_digest_cache(ctx.root, ctx.digest_cache)
    except BaseException as exc:
        if publish:
            sd.abort()
        env = environment_error(exc, where=str(work)) if isinstance(exc, Exception) else None
        if env is not None and not isinstance(exc, ToolchainError):
            raise ArtifactError(f"stage '{st.name}' could not write its outputs in {env}. Nothing was published: "
                                "completed stages are kept and the next run resumes.") from exc
        raise
    ctx.console.print(f"  {st.name}: done in {info['seconds']:.1f} s")


def stage_manifest(ctx: Context, name: str) -> dict[str, Any]:
    """The published manifest of an upstream stage (a clear error when it is missing)."""
    manifest = read_manifest(ctx.stage_dir(name))
    if manifest is None:
        raise ToolchainError(f"stage '{name}' has no output in '{ctx.stage_dir(name)}'; run it first.")
    return manifest


def same_stage_files(ctx: Context, a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two stage folders hold the same files (by the stages' manifests' sha256): ``(stage, folder)``."""
    def files(stage_name: str, folder: str) -> dict[str, str]:
        listed = stage_manifest(ctx, stage_name).get("files", {})
        return {k.removeprefix(folder + "/"): v for k, v in listed.items() if k.startswith(folder + "/")}

    fa = files(*a)
    return bool(fa) and fa == files(*b)


def set_seed(seed: int) -> None:
    """Seed torch, numpy and Python's hash-independent RNGs."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


def check_recipe_against_model(recipe: Recipe, heads_per_layer: list[int]) -> None:
    """Checks that need the model: a head budget larger than the model, a floor too high."""
    total = sum(heads_per_layer)
    budget = recipe.pruning.budget
    if budget is not None and budget > total:
        raise RecipeError(
            f"field 'pruning.budget': {budget} heads requested but the model has {total} "
            f"({len(heads_per_layer)} layers x {max(heads_per_layer)} heads). Lower the budget."
        )
    floor = recipe.pruning.min_heads_per_layer
    if floor > min(heads_per_layer):
        raise RecipeError(
            f"field 'pruning.min_heads_per_layer': {floor} is more than the {min(heads_per_layer)} heads a layer has."
        )
    if budget is not None and budget < floor * len(heads_per_layer):
        raise RecipeError(
            f"field 'pruning.budget': {budget} is below the floor of {floor} head(s) x {len(heads_per_layer)} layers."
        )

