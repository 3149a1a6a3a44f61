"""Checks the written format specs (docs/formats/*.md) against each format's own library.

tests/data/formats/<format>/<case>.safetensors hold packed tensors and the dense result that the
format's own dequantizer produced (tools/format_vectors/make_vectors.py: gptqmodel,
compressed-tensors, transformers, DeepSeek-V3's weight_dequant). Each test here re-derives every
expected tensor from the packed tensors with a plain numpy transcription of the spec, written to
be obviously right rather than fast (bits unpacked as a little-endian bit stream, one formula per
format, fp32 arithmetic with the rounding the reference does), and asserts bit equality.
Needs numpy and ml-dtypes only (no torch, no server); the safetensors files are read by the small
reader below.
"""

import glob
import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "formats")
PREFIX = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts"
F32 = np.float32
OUT = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}
ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I32": np.int32,
             "I64": np.int64, "I8": np.int8, "U8": np.uint8, "I16": np.int16,
             "F8_E4M3": ml_dtypes.float8_e4m3fn}


def read_safetensors(path):
    """{name: ndarray} from a safetensors file: u64 header length, JSON header, raw LE data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = np.dtype(ST_DTYPES[info["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=dt).reshape(info["shape"])
    return out


def cases(fmt):
    paths = sorted(glob.glob(os.path.join(DATA, fmt, "*.safetensors")))
    assert paths, f"no vectors under {DATA}/{fmt}"
    return [pytest.param(p, id=os.path.basename(p)[:-len(".safetensors")]) for p in paths]


def config_of(path):
    with open(path[:-len(".safetensors")] + ".config.json") as f:
        return json.load(f)["quantization_config"]


def assert_bits_equal(got, want, what):
    """Bit equality (so -0 vs +0 and inf count), with the first differences in the message."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype,
                                                                  got.shape, want.shape)
    u = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    g, w = got.view(u), want.view(u)
    bad = np.argwhere(g != w)
    assert bad.size == 0, (f"{what}: {len(bad)} of {g.size} differ; first at {bad[:3].tolist()}: "
                           f"got {got[tuple(bad[0])]} want {want[tuple(bad[0])]}")


def unpack_bits(words, bits, axis, count):
    """Values of `bits` bits packed densely into int32 words along `axis`: the words along that
    axis, each taken little-endian (bit 0 first), form one bit stream; value i is the unsigned
    integer at stream bits [i*bits, (i+1)*bits), low bit first. Returns `count` values per line."""
    w = np.ascontiguousarray(np.moveaxis(words.astype("<u4"), axis, -1))
    stream = np.unpackbits(w.view(np.uint8), axis=-1, bitorder="little")  # [..., 32 * words]
    nvals = stream.shape[-1] // bits
    fields = stream[..., :nvals * bits].reshape(*stream.shape[:-1], nvals, bits).astype(np.int64)
    vals = (fields << np.arange(bits)).sum(axis=-1)[..., :count]
    return np.moveaxis(vals, -1, axis)


def to_out(x_f32, tag):
    """One round-to-nearest-even cast from fp32 (numpy and ml-dtypes both round to nearest even;
    overflow gives inf)."""
    with np.errstate(over="ignore"):
        return x_f32.astype(OUT[tag])


# ---- GPTQ (docs/formats/gptq.md) ---------------------------------------------------------------
V1_WORD_ADD = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}


@pytest.mark.parametrize("path", cases("gptq"))
def test_gptq(path):
    t = read_safetensors(path)
    cfg = config_of(path)
    bits = cfg["bits"]
    qweight, qzeros = t[f"{PREFIX}.qweight"], t[f"{PREFIX}.qzeros"]
    scales, g_idx = t[f"{PREFIX}.scales"], t[f"{PREFIX}.g_idx"].astype(np.int64)
    K, N = g_idx.shape[0], scales.shape[1]
    assert qweight.dtype == np.int32 and qweight.shape == (K * bits // 32, N)
    assert qzeros.dtype == np.int32 and qzeros.shape == (scales.shape[0], N * bits // 32)
    assert scales.dtype == np.float16
    group = cfg["group_size"] if cfg["group_size"] != -1 else K
    assert scales.shape[0] == K // group and g_idx.min() >= 0 and g_idx.max() < K // group
    if not cfg["desc_act"]:
        assert np.array_equal(g_idx, np.arange(K) // group)
    v1 = cfg["checkpoint_format"] == "gptq"
    mask = (1 << bits) - 1

    q = unpack_bits(qweight, bits, axis=0, count=K)            # [K, N], row k = input feature k
    z = unpack_bits(qzeros, bits, axis=1, count=N)             # [K/G, N]
    if v1:
        z = (z + 1) & mask                                     # stored = z - 1, per field
    if cfg["sym"]:
        assert (z == 1 << (bits - 1)).all()
    d = (q - z[g_idx]).astype(F32) * scales[g_idx].astype(F32)  # exact in fp32
    for tag in OUT:
        assert_bits_equal(to_out(d, tag).T, t[f"expected.{tag}"], f"expected.{tag}")  # (N, K)

    if "expected_torchlinear.fp16" in t:
        # GPTQModel's in-memory path converts v1 to v2 by adding a constant to the whole word,
        # so a stored field of 0xF (true zero 0) carries into the next field.
        words = (qzeros.astype(np.int64) + V1_WORD_ADD[bits]) & 0xFFFFFFFF
        zw = unpack_bits(words.astype(np.uint32).view(np.int32), bits, axis=1, count=N)
        assert not np.array_equal(zw, z)
        dw = (q - zw[g_idx]).astype(F32) * scales[g_idx].astype(F32)
        assert_bits_equal(to_out(dw, "fp16").T, t["expected_torchlinear.fp16"],
                          "expected_torchlinear.fp16")


# ---- compressed-tensors (docs/formats/compressed_tensors.md) ------------------------------------
@pytest.mark.parametrize("path", cases("compressed_tensors"))
def test_compressed_tensors(path):
    t = read_safetensors(path)
    cfg = config_of(path)
    w = cfg["config_groups"]["group_0"]["weights"]
    bits, strategy, sym = w["num_bits"], w["strategy"], w["symmetric"]
    scale = t[f"{PREFIX}.weight_scale"]
    sdt = scale.dtype
    if cfg["format"] == "pack-quantized":
        assert w["type"] == "int"
        N, K = (int(v) for v in t[f"{PREFIX}.weight_shape"])
        packed = t[f"{PREFIX}.weight_packed"]
        assert packed.dtype == np.int32 and packed.shape == (N, -(-K * bits // 32))
        off = 1 << (bits - 1)
        q = unpack_bits(packed, bits, axis=1, count=K) - off    # signed, stored + 2^(b-1)
        if strategy == "group":
            G = w["group_size"]
            assert scale.shape == (N, K // G)
        else:
            assert strategy == "channel" and scale.shape == (N, 1)
            G = K
        if sym:
            assert f"{PREFIX}.weight_zero_point" not in t
            zp = np.zeros(scale.shape, np.int64)
        else:
            zpp = t[f"{PREFIX}.weight_zero_point"]
            assert zpp.dtype == np.int32 and zpp.shape == (-(-N * bits // 32), scale.shape[1])
            zp = unpack_bits(zpp, bits, axis=0, count=N) - off  # packed along N (dim 0)
        cols = np.arange(K) // G
        if w.get("actorder") == "group":
            # weight_g_idx (compressed-tensors <= 0.18): the library sorts the columns by g_idx,
            # cuts the sorted order into groups of G and un-sorts, so column k's group is its rank
            # in that order // G; with exactly G columns per group that is g_idx[k].
            g_idx = t[f"{PREFIX}.weight_g_idx"].astype(np.int64)
            assert g_idx.shape == (K,) and (np.bincount(g_idx) == G).all()
            cols = np.empty(K, np.int64)
            cols[np.argsort(g_idx, kind="stable")] = np.arange(K) // G
            assert np.array_equal(cols, g_idx) and not np.array_equal(g_idx, np.arange(K) // G)
        else:
            assert f"{PREFIX}.weight_g_idx" not in t
        # (q - zp) * s in the scale dtype: the fp32 product of exact operands, rounded once to it
        d = (q - zp[:, cols]).astype(F32) * scale[:, cols].astype(F32)
    else:
        assert cfg["format"] == "float-quantized" and w["type"] == "float" and bits == 8
        x = t[f"{PREFIX}.weight"]
        assert x.dtype == ml_dtypes.float8_e4m3fn
        N, K = x.shape
        assert scale.shape == {"tensor": (1,), "channel": (N, 1)}[strategy]
        d = x.astype(F32) * scale.reshape(-1, 1).astype(F32)
    native = d.astype(sdt)   # the library's result, in the scale dtype
    for tag in OUT:
        want = t[f"expected.{tag}"]
        assert want.shape == (N, K)
        assert_bits_equal(native.astype(F32).astype(OUT[tag]) if OUT[tag] != sdt else native,
                          want, f"expected.{tag}")


# ---- FP8 block-scaled (docs/formats/fp8_block.md) ----------------------------------------------
@pytest.mark.parametrize("path", cases("fp8_block"))
def test_fp8_block(path):
    t = read_safetensors(path)
    cfg = config_of(path)
    assert cfg["quant_method"] == "fp8" and cfg["fmt"] == "e4m3"
    bm, bk = cfg["weight_block_size"]
    x, s = t[f"{PREFIX}.weight"], t[f"{PREFIX}.weight_scale_inv"]
    assert x.dtype == ml_dtypes.float8_e4m3fn
    N, K = x.shape
    assert s.shape == (-(-N // bm), -(-K // bk))
    if cfg.get("scale_fmt") == "ue8m0":
        m, e = np.frexp(s.astype(np.float64))
        assert (np.abs(m) == 0.5).all()  # powers of two
    rows, cols = np.arange(N) // bm, np.arange(K) // bk
    with np.errstate(over="ignore"):
        d = x.astype(F32) * s[rows][:, cols].astype(F32)   # fp32 product, rounded in fp32
    for tag in OUT:
        assert_bits_equal(to_out(d, tag), t[f"expected.{tag}"], f"expected.{tag}")


# ---- MXFP4 (docs/formats/mxfp4.md) ------------------------------------------------------------
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=F32)


@pytest.mark.parametrize("path", cases("mxfp4"))
def test_mxfp4(path):
    t = read_safetensors(path)
    assert config_of(path)["quant_method"] == "mxfp4"
    for proj in ("gate_up_proj", "down_proj"):
        blocks, scales = t[f"{EXPERTS}.{proj}_blocks"], t[f"{EXPERTS}.{proj}_scales"]
        assert blocks.dtype == np.uint8 and scales.dtype == np.uint8
        E, rows, nblk, B = blocks.shape
        assert B == 16 and scales.shape == (E, rows, nblk)
        vals = np.empty((E, rows, nblk, 32), F32)
        vals[..., 0::2] = E2M1[blocks & 0xF]     # low nibble: even element
        vals[..., 1::2] = E2M1[blocks >> 4]      # high nibble: odd element
        with np.errstate(over="ignore"):
            pow2 = np.ldexp(F32(1), scales.astype(np.int32) - 127).astype(F32)  # 2^(s-127), fp32
            d = (vals * pow2[..., None]).reshape(E, rows, nblk * 32)             # [E, out, in]
        for tag in OUT:
            assert_bits_equal(to_out(d, tag).transpose(0, 2, 1), t[f"expected.{proj}.{tag}"],
                              f"expected.{proj}.{tag}")                          # [E, in, out]
