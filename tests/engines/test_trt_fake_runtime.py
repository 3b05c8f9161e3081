"""TensorRT runtime/builder logic on CPU, against fakes that follow TensorRT's Python API protocol.

The fake execution context computes Relu and NonZero from the bytes at the addresses it was given
and, for the data-dependent NonZero output, asks the output allocator for memory
(``reallocate_output_async``) and reports the shape (``notify_shape``), as TensorRT does.
"""

import ctypes
import logging
import types

import numpy as np
import pytest
import torch

from toolchain.engines.tensorrt.builder import _add_profile, _load_timing_cache
from toolchain.engines.tensorrt.outputs import make_output_allocator, run_context
from toolchain.errors import EngineError


class _IOutputAllocator:  # stands in for tensorrt.IOutputAllocator (a pybind11 base class)
    def __init__(self):
        pass


FAKE_TRT = types.SimpleNamespace(IOutputAllocator=_IOutputAllocator)
CPU = torch.device("cpu")


class FakeContext:
    """Engine with input x (float32, batch <= 8) -> y = relu(x) (static shape) and idx = NonZero(x) (DDS)."""

    def __init__(self, notify=True, accept_shapes=True):
        self.addresses, self.allocators, self.shapes = {}, {}, {}
        self.notify, self.accept_shapes = notify, accept_shapes

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return self.accept_shapes and shape[0] <= 8

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr
        return True

    def infer_shapes(self):
        return []

    def get_tensor_shape(self, name):
        return {"y": self.shapes["x"], "idx": (len(self.shapes["x"]), -1)}[name]

    def set_output_allocator(self, name, allocator):
        self.allocators[name] = allocator
        return True

    def execute_async_v3(self, stream):
        shape = self.shapes["x"]
        x = np.frombuffer(ctypes.string_at(self.addresses["x"], 4 * int(np.prod(shape))), np.float32).reshape(shape)
        y = np.maximum(x, 0).astype(np.float32)
        ctypes.memmove(self.addresses["y"], y.tobytes(), y.nbytes)
        idx = np.stack(np.nonzero(x)).astype(np.int64)
        allocator = self.allocators["idx"]
        ptr = allocator.reallocate_output_async("idx", 0, idx.nbytes, 256, stream)
        assert ptr != 0
        ctypes.memmove(ptr, idx.tobytes(), idx.nbytes)
        if self.notify:
            allocator.notify_shape("idx", idx.shape)
        return True


def _run(ctx, x, allocator=None):
    dtypes = {"y": torch.float32, "idx": torch.int64}
    allocator = allocator or make_output_allocator(FAKE_TRT, CPU)
    return run_context(ctx, {"x": torch.from_numpy(x)}, ["y", "idx"], dtypes.__getitem__, allocator=allocator,
                       device=CPU, stream_handle=0, synchronize=lambda: None, who="trt (m.engine)")


class TestDataDependentOutputs:
    def test_nonzero_output_comes_from_the_output_allocator(self):
        x = np.array([[0.0, 1.5, -2.0], [3.0, 0.0, 0.0]], np.float32)
        ctx = FakeContext()
        out = _run(ctx, x)
        np.testing.assert_array_equal(out["idx"].numpy(), np.stack(np.nonzero(x)))
        np.testing.assert_array_equal(out["y"].numpy(), np.maximum(x, 0))
        assert "idx" in ctx.allocators and "idx" not in ctx.addresses  # DDS output is not pre-sized

    def test_buffers_are_reused_and_results_do_not_alias_them(self):
        allocator = make_output_allocator(FAKE_TRT, CPU)
        ctx = FakeContext()
        big = _run(ctx, np.ones((4, 3), np.float32), allocator)["idx"]
        small = _run(ctx, np.array([[0.0, 2.0, 0.0]], np.float32), allocator)["idx"]
        assert tuple(big.shape) == (2, 12) and tuple(small.shape) == (2, 1)
        np.testing.assert_array_equal(small.numpy(), [[0], [1]])
        np.testing.assert_array_equal(big.numpy()[1], np.tile(np.arange(3), 4))  # not overwritten by run 2

    def test_empty_nonzero_result(self):
        out = _run(FakeContext(), np.zeros((2, 3), np.float32))
        assert tuple(out["idx"].shape) == (2, 0) and out["idx"].dtype == torch.int64

    def test_missing_notify_shape_is_an_engine_error(self):
        with pytest.raises(EngineError, match=r"never reported the shape of data-dependent output 'idx'"):
            _run(FakeContext(notify=False), np.ones((1, 3), np.float32))

    def test_rejected_input_shape_names_the_input(self):
        with pytest.raises(EngineError, match=r"trt \(m\.engine\): TensorRT rejected shape \[9, 3\] for input 'x'"):
            _run(FakeContext(), np.ones((9, 3), np.float32))

    def test_deprecated_reallocate_output_is_served_too(self):
        allocator = make_output_allocator(FAKE_TRT, CPU)
        ptr = allocator.reallocate_output("idx", 0, 64, 256)
        assert ptr == allocator.buffers["idx"].data_ptr() and allocator.buffers["idx"].numel() == 64


# ------------------------------------------------------------------------------ builder: timing cache


class FakeCache:
    def __init__(self, data: bytes):
        self.data, self.device = data, "other" if data.startswith(b"OTHERGPU") else "this"


class FakeConfig:
    """create_timing_cache: None for a blob it cannot read; set_timing_cache: TypeError on None, False on
    a cache from another device (the only False case NvInfer.h documents)."""

    def __init__(self, fresh_ok=True, raise_on_foreign=False):
        self.attached, self.fresh_ok, self.raise_on_foreign = None, fresh_ok, raise_on_foreign
        self.profiles = []

    def create_timing_cache(self, data):
        data = bytes(data)
        if data == b"":
            return FakeCache(b"") if self.fresh_ok else None
        if data.startswith((b"OURS", b"OTHERGPU")):
            return FakeCache(data)
        if self.raise_on_foreign:
            raise RuntimeError("Timing cache deserialization failed")
        return None

    def set_timing_cache(self, cache, ignore_mismatch):
        if not isinstance(cache, FakeCache):
            raise TypeError("set_timing_cache(): incompatible function arguments")
        if cache.device != "this" and not ignore_mismatch:
            return False
        self.attached = cache
        return True

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)
        return -1 if profile.invalid else len(self.profiles) - 1


class TestTimingCache:
    def test_usable_cache_is_attached(self, tmp_path):
        (tmp_path / "t.cache").write_bytes(b"OURS timings")
        config = FakeConfig()
        _load_timing_cache(config, tmp_path / "t.cache")
        assert config.attached.data == b"OURS timings"

    def test_no_cache_file_attaches_a_fresh_cache(self, tmp_path):
        config = FakeConfig()
        _load_timing_cache(config, tmp_path / "missing.cache")
        assert config.attached.data == b""

    @pytest.mark.parametrize("raises", [False, True])
    def test_foreign_or_corrupt_cache_falls_back_to_a_fresh_one(self, tmp_path, caplog, raises):
        (tmp_path / "t.cache").write_bytes(b"\x00\x01 TensorRT 9 cache blob")
        config = FakeConfig(raise_on_foreign=raises)
        with caplog.at_level(logging.WARNING, logger="toolchain.engines.tensorrt.builder"):
            _load_timing_cache(config, tmp_path / "t.cache")
        assert config.attached.data == b""
        assert "cannot be read by this TensorRT" in caplog.text and "t.cache" in caplog.text

    def test_cache_from_another_device_falls_back_to_a_fresh_one(self, tmp_path, caplog):
        (tmp_path / "t.cache").write_bytes(b"OTHERGPU timings")
        config = FakeConfig()
        with caplog.at_level(logging.WARNING, logger="toolchain.engines.tensorrt.builder"):
            _load_timing_cache(config, tmp_path / "t.cache")
        assert config.attached.data == b"" and "another device" in caplog.text

    def test_no_fresh_cache_is_an_engine_error(self, tmp_path):
        with pytest.raises(EngineError, match="could not create or attach an empty timing cache"):
            _load_timing_cache(FakeConfig(fresh_ok=False), None)


# ------------------------------------------------------------------------------ builder: profile


class FakeProfile:
    def __init__(self):
        self.shapes, self.invalid = {}, False

    def set_shape(self, name, lo, opt, hi):
        self.shapes[name] = (lo, opt, hi)
        self.invalid = self.invalid or lo[0] == 3  # stands in for whatever TensorRT finds invalid


class FakeBuilder:
    def create_optimization_profile(self):
        return FakeProfile()


class FakeNetwork:
    num_inputs = 1

    def get_input(self, i):
        return types.SimpleNamespace(name="x", shape=(-1, 6))


class TestProfile:
    def test_valid_profile_is_added(self):
        config = FakeConfig()
        _add_profile(FakeBuilder(), config, FakeNetwork(), {"x": [[1, 6], [4, 6], [8, 6]]})
        assert config.profiles[0].shapes["x"] == ([1, 6], [4, 6], [8, 6])

    def test_profile_rejected_by_tensorrt_is_an_engine_error(self):
        with pytest.raises(EngineError, match=r"TensorRT rejected the optimisation profile .*'x'"):
            _add_profile(FakeBuilder(), FakeConfig(), FakeNetwork(), {"x": [[3, 6], [4, 6], [8, 6]]})
