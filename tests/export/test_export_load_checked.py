import numpy as np
import onnx
import pytest
from export_models import copy_model

from toolchain.errors import GraphError
from toolchain.export.graph import load_checked
from toolchain.export.onnx_export import export_onnx


@pytest.fixture(scope="module")
def external_model(tmp_path_factory, conv_module):
    from export_models import CONV_AXES, CONV_EXPORT_SHAPE, conv_inputs

    path = tmp_path_factory.mktemp("ext") / "conv.onnx"
    export_onnx(conv_module, conv_inputs(CONV_EXPORT_SHAPE), ["logits", "probs"], path, dynamic_axes=CONV_AXES,
                external_data=True)
    return path


class TestLoadChecked:
    def test_good_file_loads_with_weights(self, bert_onnx, external_model):
        assert len(load_checked(bert_onnx.path).graph.node) > 100
        model = load_checked(external_model)
        assert all(i.data_location == onnx.TensorProto.DEFAULT for i in model.graph.initializer)

    def test_missing_file(self, tmp_path):
        with pytest.raises(GraphError, match=r"not found: .*absent\.onnx; export"):
            load_checked(tmp_path / "absent.onnx")

    def test_empty_file(self, tmp_path):
        (tmp_path / "empty.onnx").write_bytes(b"")
        with pytest.raises(GraphError, match="empty"):
            load_checked(tmp_path / "empty.onnx")

    def test_truncated_file(self, tmp_path, bert_onnx):
        data = bert_onnx.path.read_bytes()
        cut = tmp_path / "cut.onnx"
        cut.write_bytes(data[: len(data) // 2])
        with pytest.raises(GraphError, match=r"cut\.onnx.*(truncated|corrupted)") as info:
            load_checked(cut)
        assert "\n" not in info.value.message

    def test_corrupted_bytes(self, tmp_path):
        bad = tmp_path / "noise.onnx"
        bad.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
        with pytest.raises(GraphError, match=r"noise\.onnx.*(truncated|corrupted)"):
            load_checked(bad)

    def test_missing_external_weights_file_is_named(self, tmp_path, external_model):
        moved = copy_model(external_model, tmp_path / "copy")
        (moved.parent / "conv.onnx.data").unlink()
        with pytest.raises(GraphError, match=r"external weights file 'conv\.onnx\.data'.*missing"):
            load_checked(moved)

    def test_truncated_external_weights_file(self, tmp_path, external_model):
        moved = copy_model(external_model, tmp_path / "copy")
        data = moved.parent / "conv.onnx.data"
        data.write_bytes(data.read_bytes()[:100])
        with pytest.raises(GraphError, match="truncated"):
            load_checked(moved)

    def test_graph_only_load_skips_weights(self, external_model):
        model = load_checked(external_model, load_weights=False)
        assert any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
