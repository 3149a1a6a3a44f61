"""Element types: the names the API takes, their wire enums, numpy and torch dtypes.

numpy has no bfloat16: bf16 results are ``ml_dtypes.bfloat16`` arrays (install the ``ml-dtypes``
extra), or torch tensors with ``as_torch=True``, or their raw bits as ``np.uint16`` arrays with
``bf16_bits=True`` (no ml-dtypes needed for either). Without ml-dtypes a bf16 numpy result raises
ImportError naming the package and how to install it.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from ._proto import dequant_pb2 as pb

# Output dtypes of Dequantize: name -> (wire enum, element bytes).
OUTPUT_DTYPES: Dict[str, int] = {"fp16": pb.DTYPE_FP16, "bf16": pb.DTYPE_BF16, "fp32": pb.DTYPE_FP32}
_WIRE_TO_SAFETENSORS = {pb.DTYPE_FP16: "F16", pb.DTYPE_BF16: "BF16", pb.DTYPE_FP32: "F32"}

# safetensors dtype code -> numpy dtype name ("bfloat16" etc. come from ml_dtypes).
_SAFETENSORS_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64",
    "F16": "float16", "F32": "float32", "F64": "float64",
}
_SAFETENSORS_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_SAFETENSORS_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
}
FLOATING = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})


def output_dtype(name: str) -> int:
    """The wire enum of an output dtype name ("fp16", "bf16", "fp32"). Raises ValueError."""
    try:
        return OUTPUT_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(OUTPUT_DTYPES)}, not {name!r}") from None


def safetensors_code(wire_dtype: int) -> str:
    """The safetensors code ("F16", "BF16", "F32") of a Dequantize output dtype enum."""
    return _WIRE_TO_SAFETENSORS[wire_dtype]


def numpy_dtype(code: str) -> np.dtype:
    """The numpy dtype of a safetensors dtype code. BF16/F8 need ml_dtypes (ImportError with a
    hint otherwise); unknown codes raise ValueError."""
    if code in _SAFETENSORS_NUMPY:
        return np.dtype(_SAFETENSORS_NUMPY[code]).newbyteorder("<")
    if code in _SAFETENSORS_ML_DTYPES:
        try:
            import ml_dtypes  # pylint: disable=import-outside-toplevel
        except ImportError as e:
            raise ImportError(
                f"{code} numpy arrays need the ml-dtypes package (numpy has no "
                f"{_SAFETENSORS_ML_DTYPES[code]}): pip install ml-dtypes (or "
                "'dequantd[ml-dtypes]'); or pass as_torch=True"
                + (", or bf16_bits=True for the raw bits as uint16" if code == "BF16" else "")
            ) from e
        return np.dtype(getattr(ml_dtypes, _SAFETENSORS_ML_DTYPES[code]))
    raise ValueError(f"unknown safetensors dtype {code!r}")


def torch_dtype(code: str) -> Any:
    """The torch dtype of a safetensors dtype code (needs torch). Raises ValueError."""
    import torch  # pylint: disable=import-outside-toplevel

    name = _SAFETENSORS_TORCH.get(code)
    if name is None or not hasattr(torch, name):
        raise ValueError(f"safetensors dtype {code!r} has no torch dtype here")
    return getattr(torch, name)


def element_bytes(code: str) -> int:
    """Bytes per element of a safetensors dtype code."""
    sizes = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2,
             "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
    try:
        return sizes[code]
    except KeyError:
        raise ValueError(f"unknown safetensors dtype {code!r}") from None


def from_bytes(buffer: Any, code: str, shape: tuple, as_torch: bool,
               bf16_bits: bool = False) -> Any:
    """A numpy array (or torch tensor) of `shape` and dtype `code` over `buffer` (a writable
    bytearray/uint8 array of exactly the right size; not copied). `bf16_bits`: a BF16 numpy
    result as its raw bits, np.uint16 little-endian (no ml_dtypes needed)."""
    raw = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer
    if bf16_bits and code == "BF16" and not as_torch:
        return raw.view(np.dtype("<u2")).reshape(shape)
    if as_torch:
        import torch  # pylint: disable=import-outside-toplevel

        return torch.from_numpy(raw).view(torch_dtype(code)).reshape(shape)
    return raw.view(numpy_dtype(code)).reshape(shape)
