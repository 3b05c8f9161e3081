"""Running one TensorRT execution context with torch buffers, data-dependent outputs included.

An output whose shape depends on the data (NonZero, NonMaxSuppression, ...) still has ``-1`` dims
after ``IExecutionContext.infer_shapes()``: its size is only known while the engine runs. Such an
output gets an ``IOutputAllocator`` (``context.set_output_allocator(name, allocator)``, as
TensorRT's ``dds_faster_rcnn`` sample does): TensorRT calls ``reallocate_output_async`` (or
``reallocate_output``, deprecated in 10.x) for the bytes it needs and ``notify_shape`` with the
final shape; the output is read from that buffer after the stream is synchronised. Every other
output gets a buffer sized from ``get_tensor_shape`` and ``set_tensor_address``.

Written against the TensorRT 10.x/11.x Python API; tested on CPU with a fake context that follows
the same protocol (tests/engines/test_trt_fake_runtime.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolchain.errors import EngineError


def make_output_allocator(trt: Any, device: Any) -> Any:
    """A ``trt.IOutputAllocator`` that keeps one growing torch byte buffer per output on ``device``."""
    import torch

    class TorchOutputAllocator(trt.IOutputAllocator):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffers: dict[str, torch.Tensor] = {}
            self.shapes: dict[str, tuple[int, ...]] = {}

        def _allocate(self, tensor_name: str, size: int) -> int:
            buf = self.buffers.get(tensor_name)
            if buf is None or buf.numel() < max(int(size), 1):
                # at least one byte: a zero-size output still needs a non-null address
                buf = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)
                self.buffers[tensor_name] = buf
            return int(buf.data_ptr())

        def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
            return self._allocate(tensor_name, size)

        def reallocate_output_async(self, tensor_name: str, memory: int, size: int, alignment: int,
                                    stream: int) -> int:
            return self._allocate(tensor_name, size)

        def notify_shape(self, tensor_name: str, shape: Sequence[int]) -> None:
            self.shapes[tensor_name] = tuple(int(d) for d in shape)

        def reset(self, names: Sequence[str]) -> None:
            """Forget the shapes of ``names`` before a run (buffers are kept and reused)."""
            for name in names:
                self.shapes.pop(name, None)

        def take(self, tensor_name: str, dtype: torch.dtype) -> torch.Tensor:
            """The output TensorRT wrote, as a tensor of its notified shape (a copy of the bytes)."""
            if tensor_name not in self.shapes:
                raise EngineError(f"TensorRT ran but never reported the shape of data-dependent output "
                                  f"'{tensor_name}' (IOutputAllocator.notify_shape was not called).")
            shape = self.shapes[tensor_name]
            count = 1
            for d in shape:
                count *= d
            if count == 0:
                return torch.empty(shape, dtype=dtype, device=device)
            nbytes = count * torch.empty((), dtype=dtype).element_size()
            buf = self.buffers.get(tensor_name)
            if buf is None or buf.numel() < nbytes:
                raise EngineError(f"TensorRT reported shape {list(shape)} for output '{tensor_name}' but allocated "
                                  f"{0 if buf is None else buf.numel()} bytes for it, fewer than {nbytes}.")
            return buf[:nbytes].clone().view(dtype).reshape(shape)

    return TorchOutputAllocator()


def run_context(ctx: Any, inputs: Mapping[str, Any], outputs: Sequence[str], dtype_of: Callable[[str], Any], *,
                allocator: Any, device: Any, stream_handle: int, synchronize: Callable[[], None],
                who: str) -> dict[str, Any]:
    """Bind ``inputs`` (torch tensors on ``device``), run ``ctx`` once, return the outputs (on ``device``).

    ``dtype_of(name)`` is the torch dtype of an output; ``allocator`` comes from
    :func:`make_output_allocator` and serves the data-dependent outputs; ``synchronize`` waits for
    the stream ``stream_handle``. ``who`` names the runner and engine in messages.
    """
    import torch

    for name, tensor in inputs.items():
        if not ctx.set_input_shape(name, tuple(tensor.shape)):
            raise EngineError(f"{who}: TensorRT rejected shape {list(tensor.shape)} for input '{name}' "
                              "(outside the engine's optimisation profile, or a static dim differs).")
        if not ctx.set_tensor_address(name, tensor.data_ptr()):
            raise EngineError(f"{who}: TensorRT rejected the buffer of input '{name}'.")
    unresolved = ctx.infer_shapes()
    if unresolved:
        raise EngineError(f"{who}: TensorRT could not infer shapes for {list(unresolved)}.")
    bound: dict[str, Any] = {}
    dynamic = []
    for name in outputs:
        shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
        if any(d < 0 for d in shape):  # data-dependent: sized by TensorRT while it runs
            dynamic.append(name)
            if not ctx.set_output_allocator(name, allocator):
                raise EngineError(f"{who}: TensorRT refused an output allocator for data-dependent output '{name}'.")
            continue
        out = torch.empty(shape, dtype=dtype_of(name), device=device)
        if not ctx.set_tensor_address(name, out.data_ptr()):
            raise EngineError(f"{who}: TensorRT rejected the buffer of output '{name}'.")
        bound[name] = out
    allocator.reset(dynamic)
    if not ctx.execute_async_v3(stream_handle):
        raise EngineError(f"{who}: execute_async_v3 failed; see the TensorRT log above.")
    synchronize()
    for name in dynamic:
        bound[name] = allocator.take(name, dtype_of(name))
    return {name: bound[name] for name in outputs}
