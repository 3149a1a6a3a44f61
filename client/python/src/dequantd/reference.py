"""A numpy reference of the AWQ GEMM dequantization dequantd serves (independent of the server).

    w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]

computed exactly in float32 ((q - z) is in [-15, 15], s is fp16 or bf16, so the product is exact)
and rounded once to the output dtype, round to nearest even (the definition in
kernels/awq_format.h). Nibble order: column 8c + i of a packed int32 word sits in bits
[4j, 4j + 4) with j = [0, 4, 1, 5, 2, 6, 3, 7][i] (AutoAWQ / vLLM "reverse AWQ order").
"""

from __future__ import annotations

import numpy as np

from . import dtypes

AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack(packed: np.ndarray) -> np.ndarray:
    """int32 (R, C) packed words -> uint8 (R, 8 C) nibbles in column order."""
    words = np.ascontiguousarray(packed).view(np.uint32)
    out = np.empty((words.shape[0], words.shape[1] * 8), dtype=np.uint8)
    for i, j in enumerate(AWQ_REVERSE_ORDER):
        out[:, i::8] = (words >> np.uint32(4 * j)) & np.uint32(0xF)
    return out


def pack(values: np.ndarray) -> np.ndarray:
    """uint8 (R, 8 C) values in [0, 15] -> int32 (R, C) packed words (inverse of unpack)."""
    v = np.asarray(values, dtype=np.uint32)
    words = np.zeros((v.shape[0], v.shape[1] // 8), dtype=np.uint32)
    for i, j in enumerate(AWQ_REVERSE_ORDER):
        words |= (v[:, i::8] & np.uint32(0xF)) << np.uint32(4 * j)
    return words.view(np.int32)


def dequantize(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray,
               dtype: str = "fp16") -> np.ndarray:
    """Dequantizes one AWQ GEMM layer in numpy.

    Args:
        qweight: int32 (K, N/8).
        qzeros: int32 (K/G, N/8).
        scales: float16 or ml_dtypes.bfloat16 (K/G, N); G = K / scales.shape[0] must divide K.
        dtype: "fp16", "bf16" (needs ml_dtypes) or "fp32".

    Returns:
        (K, N) array of the output dtype.

    Raises:
        ValueError: shapes that do not fit together, or an unknown dtype.
    """
    dtypes.output_dtype(dtype)
    k = qweight.shape[0]
    rows, n = scales.shape
    if rows == 0 or k % rows or qweight.shape[1] * 8 != n or qzeros.shape != (rows, n // 8):
        raise ValueError(f"shapes do not fit: qweight {qweight.shape}, qzeros {qzeros.shape}, "
                         f"scales {scales.shape}")
    g = k // rows
    q = unpack(qweight).astype(np.float32)
    z = np.repeat(unpack(qzeros).astype(np.float32), g, axis=0)
    s = np.repeat(np.asarray(scales).astype(np.float32), g, axis=0)
    w = (q - z) * s
    target = {"fp16": "F16", "bf16": "BF16", "fp32": "F32"}[dtype]
    return w.astype(dtypes.numpy_dtype(target))
