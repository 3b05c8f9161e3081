import numpy as np
import onnxruntime as ort
import pytest
from engine_models import feed

from toolchain.engines import make_runner
from toolchain.engines.onnxrt import OnnxrtRunner, SessionFromOnnx, build_session_options
from toolchain.errors import EngineError, GraphError, MissingDependencyError


class TestSessionOptions:
    def test_spinning_is_off_by_default(self):
        options = build_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"

    def test_arguments_reach_the_options(self, tmp_path):
        options = build_session_options(intra_op_threads=2, inter_op_threads=1, optimization_level="basic",
                                        allow_spinning=True, optimized_model_path=tmp_path / "opt" / "m.onnx")
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
        assert options.optimized_model_filepath == str(tmp_path / "opt" / "m.onnx")

    def test_bad_arguments(self):
        with pytest.raises(EngineError, match="optimization_level"):
            build_session_options(optimization_level="max")  # type: ignore[arg-type]
        with pytest.raises(EngineError, match="thread"):
            build_session_options(intra_op_threads=-1)


def test_optimised_graph_is_saved(tmp_path, scorer_onnx):
    target = tmp_path / "optimised.onnx"
    with OnnxrtRunner(scorer_onnx, optimized_model_path=target, optimization_level="extended") as runner:
        runner.infer(feed())
    assert target.is_file() and target.stat().st_size > 0


def test_lazy_loader_builds_on_call(scorer_onnx):
    loader = SessionFromOnnx(scorer_onnx, intra_op_threads=1)
    session = loader()
    assert [i.name for i in session.get_inputs()] == ["x", "mask"]


def test_output_names(scorer_onnx):
    with make_runner("onnxrt-cpu", path=scorer_onnx) as runner:
        assert runner.output_names() == ["scores", "probs"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="onnxruntime-gpu is installed")
def test_cuda_runner_without_onnxruntime_gpu(scorer_onnx):
    runner = make_runner("onnxrt-cuda", path=scorer_onnx)
    with pytest.raises(MissingDependencyError, match="onnxruntime-gpu") as info:
        runner.activate()
    assert info.value.exit_code == 3


class TestBadFiles:
    def test_missing_file(self, tmp_path):
        with pytest.raises(GraphError, match="not found"):
            OnnxrtRunner(tmp_path / "none.onnx").activate()

    def test_corrupted_file(self, tmp_path):
        bad = tmp_path / "bad.onnx"
        bad.write_bytes(np.random.default_rng(1).integers(0, 256, 2048, dtype=np.uint8).tobytes())
        with pytest.raises(GraphError, match=r"bad\.onnx"):
            OnnxrtRunner(bad).activate()
