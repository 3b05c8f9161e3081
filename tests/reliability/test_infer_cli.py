"""``hydra-toolchain infer``: bad inputs, broken graphs and foreign engines, through the public CLI.

Every failure is one ``error:`` paragraph naming the tensor (or file), what was expected and what
was given, with the documented exit code (2 bad input, 3 TensorRT missing) and no traceback; an
existing ``--out`` file is never touched by a failed run. Real ONNX graphs, real ONNX Runtime.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from reliability_cli import check_error, cli
from torch import nn

from toolchain.engines import make_runner
from toolchain.engines.tensorrt import EngineSidecar, RuntimeIdentity, feed_specs, sidecar_path
from toolchain.errors import EngineError, FeedError, MissingDependencyError
from toolchain.export.onnx_export import export_onnx

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


class Scorer(nn.Module):
    """x float32 [B, 6], mask int64 [B, 6] -> scores [B, 4], probs [B, 4]; ``root`` = sqrt(x[:, :4]) (NaN if x < 0)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.proj(x * mask.to(x.dtype))
        return {"scores": scores, "probs": torch.softmax(scores, -1), "root": torch.sqrt(x[:, :4])}


def feed(batch: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": np.abs(rng.standard_normal((batch, 6))).astype(np.float32), "mask": np.ones((batch, 6), np.int64)}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("infer")
    example = {k: torch.from_numpy(v) for k, v in feed(2).items()}
    outs = ["scores", "probs", "root"]
    axes = {n: {0: "batch"} for n in ["x", "mask", *outs]}
    dynamic = export_onnx(Scorer().eval(), example, outs, tmp / "scorer.onnx", dynamic_axes=axes).path
    static = export_onnx(Scorer().eval(), example, outs, tmp / "static" / "scorer.onnx", dynamic_axes={}).path
    np.savez(tmp / "good.npz", **feed(3))
    return {"dynamic": dynamic, "static": static, "good": tmp / "good.npz", "tmp": tmp}


def _bad_feed_case(graphs, tmp_path, arrays: dict[str, np.ndarray], graph: str = "dynamic"):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    out = tmp_path / "out.npz"
    out.write_bytes(b"previous outputs")
    result = cli("infer", str(graphs[graph]), "--inputs", str(inputs), "--out", str(out))
    assert out.read_bytes() == b"previous outputs", "a failed run must not touch --out"
    return result


def test_good_inputs_write_the_outputs(graphs, tmp_path):
    out = tmp_path / "deeper" / "out.npz"
    result = cli("infer", str(graphs["dynamic"]), "--inputs", str(graphs["good"]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "3 output(s)" in result.stderr and "scores: float32 [3, 4]" in result.stderr
    with np.load(out) as got:
        assert sorted(got.files) == ["probs", "root", "scores"]
        with torch.no_grad():
            ref = Scorer()(**{k: torch.from_numpy(v) for k, v in feed(3).items()})
        np.testing.assert_allclose(got["scores"], ref["scores"].numpy(), atol=1e-5)
    assert not [p for p in out.parent.iterdir() if p.name != "out.npz"], "no temporary file may stay behind"


def test_nan_in_an_output_is_pointed_at(graphs, tmp_path):
    arrays = feed(2)
    arrays["x"][1, 2] = -1.0
    np.savez(tmp_path / "in.npz", **arrays)
    result = cli("infer", str(graphs["dynamic"]), "--inputs", str(tmp_path / "in.npz"), "--out",
                 str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    assert "root: float32 [2, 4]  warning: nan at index (1, 2) (first NaN/Inf)" in result.stderr


@pytest.mark.parametrize(("case", "needles"), [
    ("wrong-name", ["unknown input(s) ['X']", "missing input(s) ['x']"]),
    ("wrong-dtype", ["input 'x' has dtype float64, expected float32"]),
    ("wrong-rank", ["input 'mask' has shape (6,) (rank 1), expected rank 2"]),
    ("wrong-dim", ["input 'x' axis 1 is 5, expected 6"]),
    ("batch-mismatch", ["dim 'batch' is"]),
    ("not-numeric", ["input 'x' has dtype <U1, expected float32"]),
])
def test_bad_feeds_name_the_tensor_expected_and_given(graphs, tmp_path, case, needles):
    arrays = feed(3)
    if case == "wrong-name":
        arrays["X"] = arrays.pop("x")
    elif case == "wrong-dtype":
        arrays["x"] = arrays["x"].astype(np.float64)
    elif case == "wrong-rank":
        arrays["mask"] = arrays["mask"][0]
    elif case == "wrong-dim":
        arrays["x"] = arrays["x"][:, :5]
    elif case == "batch-mismatch":
        arrays["mask"] = arrays["mask"][:2]
    else:
        arrays["x"] = np.array([["a"] * 6] * 3)
    result = _bad_feed_case(graphs, tmp_path, arrays)
    last = check_error(result, 2, "scorer.onnx", "bad feed", *needles, "in.npz")
    assert "scorer.onnx expects 'x' float32 [batch, 6], 'mask' int64 [batch, 6]" in last


def test_batch_larger_than_a_static_graph(graphs, tmp_path):
    result = _bad_feed_case(graphs, tmp_path, feed(4), graph="static")
    check_error(result, 2, "input 'x' axis 0 is 4, expected 2", "batch size is fixed", "split the input",
                "expects 'x' float32 [2, 6]")


def test_bad_inputs_files(graphs, tmp_path):
    graph = str(graphs["dynamic"])
    check_error(cli("infer", graph, "--inputs", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "o.npz")), 2,
                "nope.npz", "does not exist", "numpy.savez")
    (tmp_path / "junk.npz").write_bytes(b"\x00\xff" + os.urandom(256))
    last = check_error(cli("infer", graph, "--inputs", str(tmp_path / "junk.npz"), "--out", str(tmp_path / "o.npz")),
                       2, "inputs file", "junk.npz", "is not a NumPy .npz archive", "numpy.savez")
    assert "pickled" not in last
    (tmp_path / "text.npz").write_text("input_ids,attention_mask\n1,1\n")  # a text file renamed
    last = check_error(cli("infer", graph, "--inputs", str(tmp_path / "text.npz"), "--out", str(tmp_path / "o.npz")),
                       2, "text.npz", "is not a NumPy .npz archive (it looks like a text file)", "numpy.savez")
    assert "pickled" not in last
    np.save(tmp_path / "one.npy", feed()["x"])
    check_error(cli("infer", graph, "--inputs", str(tmp_path / "one.npy"), "--out", str(tmp_path / "o.npz")), 2,
                "one.npy", "single unnamed array", "numpy.savez")
    check_error(cli("infer", graph, "--inputs", str(graphs["good"]), "--out", str(graphs["good"])), 2,
                "would overwrite an input")
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("damage", ["missing", "truncated", "external-missing"])
def test_broken_onnx_files(graphs, tmp_path, damage):
    class Big(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"y": self.lin(x)}

    path = tmp_path / "m.onnx"
    export_onnx(Big().eval(), {"x": torch.randn(2, 64)}, ["y"], path, dynamic_axes={"x": {0: "b"}},
                external_data=damage == "external-missing")
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 64), np.float32))
    needles = {"missing": ["m.onnx", "does not exist"], "truncated": ["m.onnx", "truncated"],
               "external-missing": ["m.onnx.data", "missing", "copy it next to the .onnx file"]}[damage]
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        (tmp_path / "m.onnx.data").unlink()
    check_error(cli("infer", str(path), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz")), 2,
                *needles)
    assert not (tmp_path / "o.npz").exists()


def test_empty_inputs_are_refused_before_onnx_runtime(graphs, tmp_path):
    result = _bad_feed_case(graphs, tmp_path, feed(0))
    check_error(result, 2, "scorer.onnx (onnxrt-cpu): bad feed", "input 'x' is empty (shape (0, 6): batch 0)",
                "input 'mask' is empty", "pass at least one row", "in.npz")
    assert "ONNXRuntimeError" not in result.stderr


@pytest.mark.parametrize("where", ["parent-is-a-file", "folder", "read-only-filesystem"])
def test_an_unwritable_out_is_refused_before_inference(graphs, tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    out = {"parent-is-a-file": tmp_path / "a-file" / "out.npz", "folder": tmp_path,
           "read-only-filesystem": Path("/proc/hydra-infer-out.npz")}[where]
    if where == "read-only-filesystem" and not Path("/proc/self").exists():
        pytest.skip("no /proc on this system")
    needle = {"parent-is-a-file": "is a file, not a folder", "folder": "is a folder",
              "read-only-filesystem": "no file can be created in '/proc'"}[where]
    result = cli("infer", str(graphs["dynamic"]), "--inputs", str(graphs["good"]), "--out", str(out))
    check_error(result, 2, f"--out '{out}'", needle)
    assert "output(s)" not in result.stderr


class TinyBert(nn.Module):
    """A 1-layer BERT classifier: 100-token vocabulary, 40 positions, 2 token types."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        torch.manual_seed(0)
        config = transformers.BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=40, num_labels=3)
        self.bert = transformers.BertForSequenceClassification(config).eval()

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> dict[str, torch.Tensor]:
        return {"logits": self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                    token_type_ids=token_type_ids).logits}


def text_feed(batch: int = 2, seq: int = 8, types: bool = False) -> dict[str, np.ndarray]:
    ids = (np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) * 7) % 100
    out = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    return out | ({"token_type_ids": np.zeros_like(ids)} if types else {})


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("bert")
    paths = {}
    for key, types in (("bert", False), ("bert-types", True)):
        example = {k: torch.from_numpy(v) for k, v in text_feed(types=types).items()}
        axes = {n: {0: "batch", 1: "sequence"} for n in example} | {"logits": {0: "batch"}}
        paths[key] = export_onnx(TinyBert().eval(), example, ["logits"], tmp / key / "bert.onnx",
                                 dynamic_axes=axes).path
    return paths


def test_text_graph_limits_come_from_the_embedding_tables(bert):
    from toolchain.engines.inputs import onnx_value_limits

    limits = onnx_value_limits(bert["bert"])
    assert sorted(limits) == ["input_ids"]
    ids = limits["input_ids"]
    assert (ids.vocab, ids.max_length) == (100, 40) and ids.table.endswith("word_embeddings.weight")
    assert ids.length_table.endswith("position_embeddings.weight")
    typed = onnx_value_limits(bert["bert-types"])
    assert typed["token_type_ids"].vocab == 2 and typed["input_ids"].vocab == 100


@pytest.mark.parametrize(("case", "needles"), [
    ("id-too-large", ["input 'input_ids' holds token id 150 at index (1, 3), outside the vocabulary 0..99",
                      "word_embeddings.weight' has 100 rows", "tokenize with this model's own tokenizer"]),
    ("negative-id", ["input 'input_ids' holds a negative token id -3 at index (0, 5); ids must lie in 0..99"]),
    ("too-long", ["input 'input_ids' has a sequence of 50 tokens, over the maximum 40",
                  "position_embeddings.weight' has 40 rows", "truncate the inputs to 40 tokens"]),
    ("empty-sequence", ["input 'input_ids' is empty (shape (2, 0): axis 1 0)"]),
    ("empty-batch", ["input 'input_ids' is empty (shape (0, 8): batch 0)"]),
    ("token-type", ["input 'token_type_ids' holds token id 2 at index (0, 0), outside the vocabulary 0..1",
                    "token_type_embeddings.weight' has 2 rows"]),
])
def test_token_ids_and_lengths_are_checked_against_the_graph(bert, tmp_path, case, needles):
    arrays = text_feed(seq=50 if case == "too-long" else 0 if case == "empty-sequence" else 8,
                       batch=0 if case == "empty-batch" else 2, types=case == "token-type")
    if case == "id-too-large":
        arrays["input_ids"][1, 3] = 150
    elif case == "negative-id":
        arrays["input_ids"][0, 5] = -3
    elif case == "token-type":
        arrays["token_type_ids"][0, 0] = 2
    result = _bad_feed_case({"g": bert["bert-types" if case == "token-type" else "bert"]}, tmp_path, arrays, "g")
    check_error(result, 2, "bert.onnx (onnxrt-cpu): bad feed", *needles, "in.npz")
    assert "ONNXRuntimeError" not in result.stderr


def test_good_text_feed_runs(bert, tmp_path):
    np.savez(tmp_path / "in.npz", **text_feed(seq=40))
    result = cli("infer", str(bert["bert"]), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "o.npz"))
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "o.npz") as got:
        assert got["logits"].shape == (2, 3)


# ------------------------------------------------------------------------------------ TensorRT engines

FOREIGN = dict(tensorrt_version="9.9.9", gpu_name="NVIDIA Imaginary 9000", compute_capability="12.7")


def fake_engine(folder: Path, *, with_inputs: bool = True, **changes) -> Path:
    """An engine file (opaque bytes) with a sidecar as build_engine writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    engine = folder / "scorer.engine"
    engine.write_bytes(b"not really a serialized engine")
    profile = {"x": [[1, 6], [4, 6], [8, 6]], "mask": [[1, 6], [4, 6], [8, 6]]}
    inputs = {"x": {"dtype": "float32", "shape": ["batch", 6]}, "mask": {"dtype": "int64", "shape": ["batch", 6]}}
    sidecar = EngineSidecar(**{**FOREIGN, "precision": "fp16", "strongly_typed": True, "profile": profile,
                               "onnx_file": "scorer.onnx", "onnx_sha256": "0" * 64, "workspace_gb": 1.0,
                               "built_at": "2026-01-01T00:00:00+00:00", "inputs": inputs if with_inputs else {},
                               **changes})
    sidecar_path(engine).write_text(json.dumps(sidecar.to_json()))
    return engine


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is installed: the missing-TensorRT message cannot be shown")
def test_engine_without_tensorrt_says_what_it_needs(graphs, tmp_path):
    engine = fake_engine(tmp_path / "e")
    result = cli("infer", str(engine), "--inputs", str(graphs["good"]), "--out", str(tmp_path / "o.npz"))
    check_error(result, 3, "TensorRT is not installed", "pip install",
                "scorer.engine needs TensorRT 9.9.9 on a 'NVIDIA Imaginary 9000' GPU (compute capability 12.7)",
                "scorer.engine.json")
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("with_inputs", [True, False], ids=["sidecar-inputs", "profile-only"])
def test_engine_feed_is_checked_against_the_sidecar_before_tensorrt(graphs, tmp_path, with_inputs):
    engine = fake_engine(tmp_path / "e", with_inputs=with_inputs)
    result = _bad_feed_case({"engine": engine}, tmp_path, feed(9), graph="engine")
    check_error(result, 2, "scorer.engine: bad feed", "input 'x' batch 9 is outside the profile range 1..8",
                "rebuild the engine with a wider profile or split the input", "in.npz")
    if with_inputs:  # the recorded inputs also catch names and dtypes
        bad = {"X": feed(2)["x"], "mask": feed(2)["mask"].astype(np.int32)}
        last = check_error(_bad_feed_case({"engine": engine}, tmp_path, bad, graph="engine"), 2,
                           "unknown input(s) ['X']", "missing input(s) ['x']",
                           "input 'mask' has dtype int32, expected int64")
        assert "expects 'x' float32 [batch, 6]" in last


def test_engine_token_ids_are_checked_against_the_graph_it_was_built_from(bert, tmp_path):
    from toolchain.artifacts import sha256_file

    folder = tmp_path / "e"
    folder.mkdir()
    onnx_copy = folder / "bert.onnx"
    onnx_copy.write_bytes(bert["bert"].read_bytes())
    profile = {n: [[1, 1], [4, 16], [8, 64]] for n in ("input_ids", "attention_mask")}
    inputs = {n: {"dtype": "int64", "shape": ["batch", "sequence"]} for n in ("input_ids", "attention_mask")}
    engine = fake_engine(folder, profile=profile, inputs=inputs, onnx_file="bert.onnx",
                         onnx_sha256=sha256_file(onnx_copy))
    arrays = text_feed()
    arrays["input_ids"][0, 1] = 100
    result = _bad_feed_case({"engine": engine}, tmp_path, arrays, graph="engine")
    check_error(result, 2, "scorer.engine: bad feed", "token id 100 at index (0, 1), outside the vocabulary 0..99")
    onnx_copy.write_bytes(b"another graph")  # not the graph the engine was built from: its limits are not used
    result = _bad_feed_case({"engine": engine}, tmp_path, arrays, graph="engine")
    assert "token id" not in result.stderr


def test_engine_sidecar_missing_or_corrupt(graphs, tmp_path):
    engine = fake_engine(tmp_path / "e")
    args = ["--inputs", str(graphs["good"]), "--out", str(tmp_path / "o.npz")]
    sidecar_path(engine).write_text('{"tensorrt_version": 10')
    check_error(cli("infer", str(engine), *args), 2, "scorer.engine.json", "malformed", "rebuild the engine")
    sidecar_path(engine).write_text(json.dumps({**json.loads(json.dumps(FOREIGN)), "profile": "x"}))
    check_error(cli("infer", str(engine), *args), 2, "scorer.engine.json", "malformed")
    sidecar_path(engine).unlink()
    check_error(cli("infer", str(engine), *args), 2, "scorer.engine.json is missing", "rebuild the engine")
    check_error(cli("infer", str(tmp_path / "none.engine"), *args), 2, "none.engine", "does not exist")
    check_error(cli("infer", str(graphs["dynamic"]), "--engine", "tensorrt", *args), 2,
                "is an ONNX file", "--engine onnxrt-cpu")
    check_error(cli("infer", str(engine), "--engine", "onnxrt-cpu", *args), 2, "is a TensorRT engine")
    check_error(cli("infer", str(engine), "--engine", "trt", *args), 2, "--engine 'trt'", "onnxrt-cpu, onnxrt-cuda")
    assert not (tmp_path / "o.npz").exists()


# ------------------------------------------------------------ function level: an "installed" TensorRT


class _FakeTrt:
    __version__ = "10.15.1"


@pytest.fixture()
def installed(monkeypatch):
    """Pretend TensorRT 10.15.1 and an H200 are present; anything past the identity check would fail loudly."""
    from toolchain.engines.tensorrt import runner as trt_runner

    monkeypatch.setattr(trt_runner, "import_tensorrt", lambda: _FakeTrt)
    monkeypatch.setattr(trt_runner, "require_cuda", lambda device=0: device)
    monkeypatch.setattr(trt_runner, "current_identity",
                        lambda trt, device=0: RuntimeIdentity(trt.__version__, "NVIDIA H200", "9.0"))


def test_activation_refuses_another_tensorrt_or_gpu_before_deserialising(installed, tmp_path):
    engine = fake_engine(tmp_path / "e")
    with pytest.raises(EngineError) as info:
        make_runner("tensorrt", engine_path=engine).activate()
    message = info.value.message
    assert "TensorRT 9.9.9 built it, this machine has 10.15.1" in message
    assert "built for compute capability 12.7, this GPU is 9.0" in message and "NVIDIA Imaginary 9000" in message
    assert "Rebuild it here" in message and info.value.exit_code == 2


def test_activation_same_identity_reaches_deserialisation(installed, tmp_path):
    engine = fake_engine(tmp_path / "e", tensorrt_version="10.15.1", gpu_name="NVIDIA H200", compute_capability="9.0")
    with pytest.raises(AttributeError, match="Logger"):  # past every check: the fake module has no TensorRT API
        make_runner("tensorrt", engine_path=engine).activate()


@pytest.mark.skipif(HAVE_TRT, reason="tensorrt is installed")
def test_missing_tensorrt_error_names_the_engine_needs(tmp_path):
    engine = fake_engine(tmp_path / "e")
    with pytest.raises(MissingDependencyError) as info:
        make_runner("tensorrt", engine_path=engine).activate()
    assert info.value.exit_code == 3 and "needs TensorRT 9.9.9" in info.value.message


def test_feed_specs_from_sidecar(tmp_path):
    from toolchain.engines.tensorrt import read_sidecar

    specs, limits, complete = feed_specs(read_sidecar(fake_engine(tmp_path / "a")))
    assert complete and specs["x"].dtype == np.float32 and specs["mask"].shape == ("batch", 6)
    assert limits["x"].max_shape == (8, 6)
    specs, _limits, complete = feed_specs(read_sidecar(fake_engine(tmp_path / "b", with_inputs=False)))
    assert not complete and specs["x"].dtype is None and specs["x"].shape == (None, 6)
    runner = make_runner("tensorrt", engine_path=tmp_path / "b" / "scorer.engine")
    assert runner.precheck(feed(8)) is True
    with pytest.raises(FeedError, match=r"batch 9 is outside the profile range 1\.\.8"):
        runner.precheck(feed(9))


def test_build_engine_records_the_graph_inputs_for_the_sidecar(graphs):
    from toolchain.engines.tensorrt.builder import graph_inputs
    from toolchain.export.graph import load_checked

    assert graph_inputs(load_checked(graphs["dynamic"], load_weights=False)) == {
        "x": {"dtype": "float32", "shape": ["batch", 6]}, "mask": {"dtype": "int64", "shape": ["batch", 6]}}
    assert graph_inputs(load_checked(graphs["static"], load_weights=False))["x"]["shape"] == [2, 6]
