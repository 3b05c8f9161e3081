"""Recipe loading and validation: every failure is a RecipeError naming the field."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolchain.errors import RecipeError
from toolchain.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "recipes" / "minilm-tweets.yaml"


def _base() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_every_shipped_recipe_and_profile_loads():
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        recipe = load_recipe(path)
        profiles = yaml.safe_load(path.read_text()).get("profiles", {})
        for name in profiles:
            assert load_recipe(path, profile=name).name == f"{recipe.name}-{name}"


def test_profile_deep_merges():
    quick = load_recipe(DEFAULT, profile="quick")
    full = load_recipe(DEFAULT)
    assert quick.finetune.steps < full.finetune.steps
    assert quick.finetune.lr == full.finetune.lr  # untouched keys survive the merge
    assert quick.artifacts() != full.artifacts()


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda d: d["pruning"].update(memebrs=3), r"unknown key 'pruning\.memebrs'.*Did you mean 'members'"),
        (lambda d: d["finetune"].update(steps="many"), r"field 'finetune\.steps'.*'many'"),
        (lambda d: d.pop("model"), r"missing required field 'model'"),
        (lambda d: d["pruning"].update(ratio=1.5), r"field 'pruning\.ratio'"),
        (lambda d: d["pruning"].update(members=0), r"field 'pruning\.members'.*greater than or equal to 1"),
        (lambda d: d["data"]["splits"].update(train=0), r"field 'data\.splits'.*split 'train' has size 0"),
        (lambda d: d["export"].update(batch={"min": 8, "opt": 1, "max": 4}), r"export\.batch.*min <= opt <= max"),
        (lambda d: d.update(shift={"severities": [0, 2]}), r"field 'shift\.severities'.*distinct values in 1\.\.5"),
        (lambda d: d.update(shift={"corruptions": ["fog"]}), r"field 'shift\.corruptions'.*unknown corruption"),
        (lambda d: d["data"].update(near_ood={"match": "(coachella", "rows": 10}),
         r"field 'data\.near_ood'.*not a regular expression"),
        (lambda d: d["data"].update(near_ood={"rows": 10}), r"field 'data\.near_ood'.*exactly one of classes"),
        (lambda d: d["data"].update(near_ood={"classes": ["a"], "match": "b"}),
         r"field 'data\.near_ood'.*exactly one of classes"),
    ],
)
def test_validation_errors_name_the_field(mutate, pattern):
    data = _base()
    mutate(data)
    with pytest.raises(RecipeError, match=pattern):
        parse_recipe(data, source="'x.yaml'")


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  source: [unclosed\ndata: {id: tweets}\n")
    with pytest.raises(RecipeError, match=r"not valid YAML at line \d+, column \d+"):
        load_recipe(bad)


def test_missing_file_and_unknown_profile(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "none.yaml")
    with pytest.raises(RecipeError, match="no profile 'fast'"):
        load_recipe(DEFAULT, profile="fast")


def test_budget_and_ratio_exclusive():
    data = _base()
    data["pruning"].update(budget=20)
    data["pruning"].pop("ratio")
    assert parse_recipe(data).pruning.keep_rule() == {"budget": 20}
    data["pruning"]["ratio"] = 0.3
    with pytest.raises(RecipeError, match="either ratio or budget"):
        parse_recipe(data)


def test_digest_changes_only_with_its_sections():
    a = parse_recipe(_base())
    data = _base()
    data["bench"]["rounds"] = 99
    b = parse_recipe(data)
    assert a.digest("model", "data") == b.digest("model", "data")
    assert a.digest("bench") != b.digest("bench")


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(allow_nan=True),
                  st.text(max_size=8), st.lists(st.integers(), max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(section=st.sampled_from(["model", "data", "finetune", "scoring", "pruning", "fusion", "export", "bench"]),
       key=st.text(min_size=1, max_size=12), value=_leaf, drop=st.booleans())
def test_fuzzed_recipes_load_or_raise_recipe_error(section, key, value, drop):
    data = _base()
    target = data[section]
    if drop and target:
        target.pop(sorted(target)[0])
    else:
        existing = sorted(target)
        # crc32, not hash(): str hashes change with PYTHONHASHSEED, and so would the examples
        target[existing[zlib.crc32(key.encode("utf-8", "surrogatepass")) % len(existing)]
               if key[0].isalpha() else key] = value
    try:
        parse_recipe(data)
    except RecipeError:
        pass


def test_compare_variants_merge_over_the_recipe():
    recipe = load_recipe(DEFAULT, profile="quick")  # the default run has none; its quick profile tests three
    by_name = {e.name: recipe.variant(e) for e in recipe.compare}
    taylor, circuit = by_name["taylor"], by_name["circuit"]
    assert taylor.scoring.criterion == "taylor" and taylor.scoring.alpha == recipe.scoring.alpha
    assert circuit.pruning.strategy == "circuit-samples" and circuit.pruning.ratio == recipe.pruning.ratio
    assert taylor.artifacts() == recipe.artifacts() / "variants" / "taylor"
    assert taylor.compare == []
    # same model, data and fine-tuning: a variant reuses the recipe's fine-tuned model
    assert taylor.digest("model", "data", "finetune") == recipe.digest("model", "data", "finetune")
    assert taylor.digest("scoring") != recipe.digest("scoring")


def test_compare_variant_with_a_budget_keeps_the_budget():
    data = _base()
    data["pruning"].pop("ratio")
    data["pruning"]["budget"] = 30
    data["compare"] = [{"name": "p", "pruning": {"strategy": "partition", "core": 2}}]
    recipe = parse_recipe(data)
    assert recipe.variant(recipe.compare[0]).pruning.keep_rule() == {"budget": 30}


@pytest.mark.parametrize(
    ("compare", "pattern"),
    [
        ([{"name": "x", "pruning": {"strategy": "bogus"}}], r"field 'compare\.0\.pruning\.strategy' \(variant 'x'\)"),
        ([{"name": "x", "pruning": {"strategy": "mixed-criteria", "criteria": ["his", "hies"]}}],
         r"compare\.0\.pruning.*one criterion per member"),
        ([{"name": "x", "pruning": {"criteria": ["his", "hies", "taylor"]}}],
         r"compare\.0\.pruning.*'criteria' is only used by strategy 'mixed-criteria'"),
        ([{"name": "x"}, {"name": "x"}], "variant names must be unique, repeated: x"),
        ([{"name": "x", "scoring": {"alpha": 2}}], r"compare\.0\.scoring\.alpha"),
        ([{"name": "x", "pruning": {"temperatur": 1}}], r"compare\.0\.pruning\.temperatur"),
        ([{"name": "bad/name"}], r"compare\.0\.name"),
    ],
)
def test_bad_compare_entries_name_the_field(compare, pattern):
    data = _base()
    data["compare"] = compare
    with pytest.raises(RecipeError, match=pattern):
        parse_recipe(data)


@pytest.mark.parametrize(
    ("pruning", "pattern"),
    [
        ({"strategy": "mixed-criteria", "criteria": ["his", "taylor"]}, r"members=3, got 2"),
        ({"strategy": "bootstrap", "criteria": ["his", "taylor", "hies"]}, "only used by strategy 'mixed-criteria'"),
        ({"strategy": "sampled", "temperature": -1}, r"pruning\.temperature"),
        ({"strategy": "partition", "core": -1}, r"pruning\.core"),
    ],
)
def test_member_strategy_fields_are_checked(pruning, pattern):
    data = _base()
    data["pruning"].update(pruning)
    with pytest.raises(RecipeError, match=pattern):
        parse_recipe(data)


def test_sampled_accepts_an_infinite_temperature():
    data = _base()
    data["pruning"].update(strategy="sampled", temperature=float("inf"))
    data["pruning"].pop("criteria", None)
    assert parse_recipe(data).pruning.temperature == float("inf")


def test_a_compare_entry_switching_strategy_drops_the_inherited_criteria():
    data = _base()
    data["pruning"].update(strategy="mixed-criteria", criteria=["his", "taylor", "hies"])
    data["compare"] = [{"name": "b", "pruning": {"strategy": "bootstrap"}},
                       {"name": "m", "pruning": {"criteria": ["taylor", "his", "hies"]}}]
    r = parse_recipe(data)
    assert r.variant(r.compare[0]).pruning.criteria is None
    assert r.variant(r.compare[1]).pruning.criteria == ["taylor", "his", "hies"]


def test_a_recipe_without_near_ood_keeps_its_cache_keys():
    """The near_ood field came later: a recipe without it hashes as it did before, one with it differently."""
    import hashlib
    import json

    data = _base()
    data["data"].pop("near_ood", None)
    recipe = parse_recipe(data)
    before = recipe.model_dump(mode="json")["data"]
    before.pop("near_ood")
    expected = hashlib.sha256(json.dumps({"data": before}, sort_keys=True).encode()).hexdigest()
    assert recipe.digest("data") == expected
    assert parse_recipe(_base()).digest("data") != expected  # the default recipe holds Coachella tweets out


def _keys(data: dict) -> dict[str, str]:
    from toolchain.pipeline import Context, stages

    return {name: Context(recipe=parse_recipe(data)).key(name) for name in stages()}


def _near_ood(rows: int | None = None, match: str = "(?i)coachella") -> dict:
    data = _base()
    data["data"]["near_ood"] = {"match": match, **({"rows": rows} if rows is not None else {})}
    return data


def test_near_ood_rows_key_only_the_stages_that_read_them():
    """data.near_ood.rows only selects which held-out rows evaluate scores: evaluate and report rerun, no other."""
    from toolchain.pipeline import stages

    default = _keys(_near_ood())
    assert len(default) == len(stages()) >= 13
    fewer = _keys(_near_ood(rows=32))
    assert {s for s in default if default[s] != fewer[s]} == {"evaluate", "report"}
    assert _keys(_near_ood(rows=48))["evaluate"] not in (default["evaluate"], fewer["evaluate"])
    # which rows leave the ID set is training data: every stage that reads data reruns
    other = _keys(_near_ood(match="(?i)festival"))
    assert {s for s in default if default[s] == other[s]} == set()


def test_near_ood_rows_at_the_default_keep_the_keys_from_before():
    """A recipe at the default rows (the default recipe's 500) hashes every section as before this split."""
    import hashlib
    import json

    recipe = parse_recipe(_near_ood(rows=500))
    dump = recipe.model_dump(mode="json")
    for section in ("data",):
        expected = hashlib.sha256(json.dumps({section: dump[section]}, sort_keys=True).encode()).hexdigest()
        assert recipe.digest(section) == expected
        assert recipe.digest(section, "data.near_ood.rows") == recipe.digest(section)
    assert parse_recipe(_near_ood(rows=32)).digest("data") == recipe.digest("data")
    assert parse_recipe(_near_ood(rows=32)).digest("data", "data.near_ood.rows") != recipe.digest("data")
    without = _base()
    without["data"].pop("near_ood", None)
    plain = parse_recipe(without)
    assert plain.digest("data", "data.near_ood.rows") == plain.digest("data")  # no near_ood: nothing added


def test_the_accuracy_levers_at_their_defaults_keep_the_keys_from_before():
    """The accuracy levers came later (issue 33): at their defaults (off) every key is as before, nothing reruns."""
    import hashlib
    import json

    data = _base()
    data["fusion"].pop("recovery_steps", None)  # the default recipe's own end-to-end recovery: this test wants off
    recipe = parse_recipe(data)
    dump = recipe.model_dump(mode="json")
    later = {"fusion": ("temperature", "recovery_steps"), "baselines": ("temperature",), "scoring": ("task_weight",)}
    for section, fields in later.items():
        before = {k: v for k, v in dump[section].items() if k not in fields}
        expected = hashlib.sha256(json.dumps({section: before}, sort_keys=True).encode()).hexdigest()
        assert recipe.digest(section) == expected, section
    assert recipe.digest("export", "baselines.temperature") == recipe.digest("export")


def test_temperature_scaling_keys_only_the_stages_that_fit_or_run_it():
    """Hydra's temperature: fuse and after; the baselines': the stages that run them (export and after, evaluate)."""
    default = _keys(_base())
    hydra = _base()
    hydra.setdefault("fusion", {})["temperature"] = True
    changed = {s for s, k in _keys(hydra).items() if k != default[s]}
    assert changed == {"fuse", "export", "build", "parity", "bench", "evaluate", "compare", "report"}
    hydra["fusion"] = {**_base()["fusion"], "recovery_steps": 10}  # fused recovery: same stages
    assert {s for s, k in _keys(hydra).items() if k != default[s]} == changed
    baselines = _base()
    baselines.setdefault("baselines", {})["temperature"] = True
    changed = {s for s, k in _keys(baselines).items() if k != default[s]}
    assert changed == {"export", "build", "parity", "bench", "evaluate", "report"}  # ensemble does not retrain


def test_task_weight_needs_the_circuit_search_with_the_ood_auroc_objective():
    data = _base()
    data["scoring"] = {"criterion": "hies", "task_weight": 0.5}
    with pytest.raises(RecipeError, match=r"task_weight.*criterion: circuit and objective: ood_auroc"):
        parse_recipe(data)
    data["scoring"] = {"criterion": "circuit", "objective": "ood_auroc", "task_weight": 0.5}
    recipe = parse_recipe(data)  # its compare variants with other criteria do not inherit the weight
    assert recipe.scoring.task_weight == 0.5
    assert {e.name: recipe.variant(e).scoring.task_weight for e in recipe.compare} == {
        e.name: (0.5 if recipe.variant(e).scoring.objective == "ood_auroc" else 0.0) for e in recipe.compare}
