"""The ONNX-TensorRT parser's operator support and its version-gated rules, as data.

Operator rows come from ``docs/operators.md`` of github.com/onnx/onnx-tensorrt, the TensorRT 10.15 GA
version ("TensorRT 10.15 supports operators in the inclusive range of opset 9 to opset 24"), one line
per operator: ``Op: supported types | restriction``. Operators its table marks ``N`` are in
:data:`UNSUPPORTED`. TensorRT 11.x: NVIDIA's *ONNX Opset Guide* points to the same operators.md.

What changed between releases is in three tables, each row naming its source: :data:`OP_SINCE`
(an operator the parser imports from a release on), :data:`FEATURE_SINCE` (a form of a supported
operator, e.g. Squeeze without ``axes``) and :data:`OPSET_MAX` (the newest opset per release).
:mod:`toolchain.export.lint` gates every rule by the target TensorRT version. Update this file when a
TensorRT release is adopted, and raise :data:`NEWEST` with it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

_F = "FP32, FP16, BF16"
_FI = "FP32, FP16, BF16, INT32, INT64"
_ALL = "FP32, FP16, BF16, INT32, INT64, BOOL"
_AXES = "`axes` must be an initializer"

_TABLE = f"""
Abs: {_FI}
Acos: {_F}
Acosh: {_F}
Add: {_FI}
And: BOOL
ArgMax: {_FI}
ArgMin: {_FI}
Asin: {_F}
Asinh: {_F}
Atan: {_F}
Atanh: {_F}
Attention: FP32, FP16, BF16, INT8, FP8 | Q, K, V and attn_mask must be 4D; no past_key/past_value or extra outputs
AveragePool: {_F} | 2D or 3D pooling only; dilations must be empty or all ones
BatchNormalization: {_F}
BlackmanWindow: FP32, FP16
Cast: FP32, FP16, BF16, INT32, INT64, UINT8, BOOL
CastLike: FP32, FP16, BF16, INT32, INT64, UINT8, BOOL
Ceil: {_F}
Celu: {_F}
Clip: {_F}
Concat: {_ALL}
Constant: FP32, FP16, BF16, FP8, FP4, INT4, INT32, INT64, BOOL | sparse_value and value_string(s) unsupported
ConstantOfShape: FP32, FP16, BF16, FP8, FP4, INT4, INT32, INT64, BOOL
Conv: {_F}
ConvTranspose: {_F}
Cos: {_F}
Cosh: {_F}
CumSum: {_F} | `axis` must be a build-time constant
DeformConv: FP32, FP16 | 1D or 2D spatial input; symmetric pads
DFT: {_F} | (type column not in operators.md 10.15; taken as the float types)
DepthToSpace: {_FI}
DequantizeLinear: INT8, FP8, FP4, INT4 | `x_zero_point` must be zero
Div: {_FI}
Dropout: {_F} | `is_training` must be an initializer and False
Einsum: {_F}
Elu: {_F}
Equal: {_FI}
Erf: {_F}
Exp: {_F}
Expand: {_ALL}
EyeLike: {_ALL} | input must have static dimensions
Flatten: {_ALL}
Floor: {_F}
Gather: {_ALL}
GatherElements: {_ALL}
GatherND: {_ALL}
Gelu: FP32, FP16, BF16, INT8, INT32, INT64
Gemm: {_F}
GlobalAveragePool: {_F}
GlobalLpPool: {_F}
GlobalMaxPool: {_F}
Greater: {_FI}
GreaterOrEqual: {_FI}
GridSample: FP32, FP16 | input must be 4D
GroupNormalization: {_F}
GRU: {_F} | bidirectional GRUs need the same activations both ways
HammingWindow: FP32, FP16
HannWindow: FP32, FP16
HardSigmoid: {_F}
HardSwish: {_F}
Hardmax: {_F} | `axis` dimension must be a build-time constant
Identity: {_ALL}
If: {_ALL} | branch outputs must have the same rank and different names
ImageScaler: {_F}
InstanceNormalization: {_F}
IsInf: {_F}
IsNaN: {_FI}
LayerNormalization: {_F} | only the first output Y is supported
LeakyRelu: {_F}
Less: {_FI}
LessOrEqual: {_FI}
Log: {_F}
LogSoftmax: {_F}
Loop: {_ALL} | scan output length cannot be dynamic
LRN: {_F}
LSTM: {_F} | input_forget and layout must be 0
LpNormalization: {_F}
LpPool: {_F} | dilations must be empty or all ones
MatMul: {_F}
Max: {_FI}
MaxPool: {_F} | 2D or 3D pooling only; Indices output unsupported
Mean: FP32, FP16, BF16, FP8, INT32, INT64
MeanVarianceNormalization: {_F}
Min: {_FI}
Mish: FP32, FP16
Mod: {_FI}
Mul: {_FI}
Neg: {_FI}
NonMaxSuppression: FP32, FP16
NonZero: FP32, FP16
Not: BOOL
OneHot: {_ALL} | `depth` must be a build-time constant
Or: BOOL
Pad: {_FI}
ParametricSoftplus: {_F}
Pow: {_FI}
PRelu: {_F}
QuantizeLinear: {_F} | `y_zero_point` must be 0
RandomNormal: {_F}
RandomNormalLike: {_F}
RandomUniform: {_F}
RandomUniformLike: {_F}
Range: {_FI}
Reciprocal: {_F}
ReduceL1: {_FI} | {_AXES}
ReduceL2: {_FI} | {_AXES}
ReduceLogSum: {_FI} | {_AXES}
ReduceLogSumExp: {_FI} | {_AXES}
ReduceMax: {_FI} | {_AXES}
ReduceMean: {_FI} | {_AXES}
ReduceMin: {_FI} | {_AXES}
ReduceProd: {_FI} | {_AXES}
ReduceSum: {_FI} | {_AXES}
ReduceSumSquare: {_FI} | {_AXES}
Relu: {_FI}
Reshape: {_ALL}
Resize: {_F} | limited coordinate-transformation and interpolation modes; no antialiasing
ReverseSequence: {_ALL}
RMSNormalization: {_F}
RNN: {_F} | bidirectional RNNs need the same activations both ways
RoiAlign: FP32, FP16
RotaryEmbedding: {_F} | `position_ids` must be INT64
Round: {_F}
STFT: FP32 | `frame_step` and `window` must be initializers; real input
ScaledTanh: {_F}
Scan: {_F}
Scatter: {_FI}
ScatterElements: {_FI}
ScatterND: {_FI} | `reduction` must be none
Selu: {_F}
Shape: {_ALL}
Shrink: {_FI}
Sigmoid: {_F}
Sign: {_FI}
Sin: {_F}
Sinh: {_F}
Size: {_ALL}
Slice: {_ALL}
Softmax: {_F}
Softplus: {_F}
Softsign: {_F}
SpaceToDepth: {_FI}
Split: {_ALL}
Sqrt: {_F}
Squeeze: {_ALL} | `axes` must be resolvable to a constant
Sub: {_FI}
Sum: {_FI}
Swish: {_F}
Tan: {_F}
Tanh: {_F}
TensorScatter: FP32, FP16, BF16, INT32 | `past_cache` and `update` must be 4D; `axis` must be -2
ThresholdedRelu: {_F}
Tile: {_ALL}
TopK: {_FI} | K must be below 3840
Transpose: {_ALL}
Trilu: {_ALL}
Unsqueeze: {_ALL} | `axes` must be resolvable to a constant
Upsample: {_F}
Where: {_ALL}
Xor: BOOL
"""


class OpSupport(NamedTuple):
    """One operator row: the data types the parser supports and its restriction text ('' if none)."""

    types: frozenset[str]
    restriction: str


def _parse(table: str) -> dict[str, OpSupport]:
    rows: dict[str, OpSupport] = {}
    for line in table.strip().splitlines():
        op, rest = line.split(":", 1)
        types, _, restriction = rest.partition("|")
        rows[op.strip()] = OpSupport(frozenset(t.strip() for t in types.split(",")), restriction.strip())
    return rows


#: Supported operators (TensorRT 10.15 / 11.x operators.md), op type -> types and restriction.
SUPPORTED: MappingProxyType[str, OpSupport] = MappingProxyType(_parse(_TABLE))

#: Operators operators.md lists as not supported (``N``).
UNSUPPORTED: frozenset[str] = frozenset(
    """AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor CenterCropPad Col2Im Compress
    ConcatFromSequence ConvInteger Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool MaxUnpool
    MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement
    QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty SequenceErase
    SequenceInsert SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence StringConcat
    StringNormalizer StringSplit TfIdfVectorizer Unique""".split()
)

Version = tuple[int, int]

#: The newest TensorRT (major, minor) whose rules this table holds: the lint's default target.
NEWEST: Version = (11, 5)


class Rule(NamedTuple):
    """Something the parser accepts from TensorRT ``since`` on, and where that fact comes from."""

    since: Version
    what: str
    source: str


_CL = "onnx-tensorrt docs/Changelog.md"
_ISSUE = "issue #22 (TensorRT release notes; not confirmed against the text here)"

#: Operators the parser imports only from a TensorRT (major, minor) on.
OP_SINCE: MappingProxyType[str, Rule] = MappingProxyType({
    "DeformConv": Rule((10, 1), "DeformConv", f"{_CL}, TensorRT 10.1 GA; TensorRT OSS v10.1.0 release"),
    "BlackmanWindow": Rule((10, 4), "BlackmanWindow", f"{_CL}, TensorRT 10.4 GA"),
    "HammingWindow": Rule((10, 4), "HammingWindow", f"{_CL}, TensorRT 10.4 GA"),
    "HannWindow": Rule((10, 4), "HannWindow", f"{_CL}, TensorRT 10.4 GA"),
    "STFT": Rule((10, 5), "real-valued STFT", f"{_CL}, TensorRT 10.5 GA; TensorRT OSS v10.5.0 release"),
    "Attention": Rule((10, 14), "Attention", "onnx-tensorrt release 10.14 GA parser update"),
    "RotaryEmbedding": Rule((10, 15), "RotaryEmbedding", f"{_CL}, TensorRT 10.15 GA"),
    "RMSNormalization": Rule((10, 15), "RMSNormalization", f"{_CL}, TensorRT 10.15 GA"),
    "TensorScatter": Rule((10, 15), "TensorScatter", f"{_CL}, TensorRT 10.15 GA"),
    "Swish": Rule((11, 0), "Swish", "TensorRT 11.0 release notes"),
    "DFT": Rule((11, 2), "DFT", "TensorRT 11.2 release (NVIDIA/TensorRT v11.2: parser adds DFT via FFTPlugin)"),
})

#: Forms of supported operators (or of the graph) the parser accepts only from a release on.
FEATURE_SINCE: MappingProxyType[str, Rule] = MappingProxyType({
    "local-function": Rule((9, 0), "nodes backed by ONNX local functions (model.functions)",
                           f"{_CL}, TensorRT 9.0 EA/GA (local functions imported)"),
    "topk-runtime-k": Rule((8, 6), "TopK with a K computed at run time", f"{_CL}, TensorRT 8.6 EA (dynamic K)"),
    "float64": Rule((8, 0), "float64 tensors, cast down to float32 with clamping to +-FLT_MAX",
                    f"{_CL}, 21.05 (DOUBLE downcast); operators.md 10.x data-type note"),
    "einsum-ellipsis": Rule((10, 12), "Einsum with an ellipsis ('...') in its equation", _ISSUE),
    "pow-integer-base": Rule((10, 12), "Pow with an integer (INT32/INT64) base", _ISSUE),
    "squeeze-no-axes": Rule((11, 5), "Squeeze without axes (squeeze every size-1 dim)",
                            "TensorRT 11.5 release; onnx-tensorrt release 11.5-GA parser update"),
})

#: Newest default-domain opset per release: ``(since, max opset, exact, source)``. ``exact`` is
#: False when the step happened somewhere after the previous row, in a release not pinned down here
#: (an opset in that gap is a warning, not an error, for the releases in between).
OPSET_MAX: tuple[tuple[Version, int, bool, str], ...] = (
    ((10, 0), 20, True, "operators.md for TensorRT 10.0 ('opset 9 to opset 20')"),
    ((10, 15), 24, False, "operators.md for TensorRT 10.15 ('opset 9 to opset 24')"),
    ((11, 0), 24, True, _ISSUE + ": 11.x before 11.5 parses up to opset 24"),
    ((11, 5), 25, True, "TensorRT 11.5 release; onnx-tensorrt release 11.5-GA ('Added support for ONNX opset 25')"),
)
#: Oldest opset the parser imports (every operators.md of 10.x/11.x: "opset 9 to ...").
OPSET_MIN = 9

#: TensorRT majors this lint knows.
MAJORS: frozenset[int] = frozenset(v[0] for v, *_ in OPSET_MAX)

#: TopK's K must be below this (operators.md TopK row).
TOPK_MAX_K = 3840

#: ONNX element type name (``TensorProto.DataType.Name``) -> operators.md type column.
TYPE_COLUMN: MappingProxyType[str, str] = MappingProxyType(
    {"FLOAT": "FP32", "FLOAT16": "FP16", "BFLOAT16": "BF16", "INT32": "INT32", "INT64": "INT64",
     "BOOL": "BOOL", "UINT8": "UINT8", "INT8": "INT8", "FLOAT8E4M3FN": "FP8", "INT4": "INT4",
     "FLOAT4E2M1": "FP4"}
)
