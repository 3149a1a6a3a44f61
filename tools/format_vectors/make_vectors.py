#!/usr/bin/env python3
"""Makes the reference test vectors under tests/data/formats/ with each format's OWN code.

Every case is one small safetensors file, tests/data/formats/<format>/<case>.safetensors, holding
the packed tensors under the names a real checkpoint uses (model.layers.0.mlp.down_proj.qweight,
...) and the library's own dequantized result as expected.fp16 / expected.bf16 / expected.fp32,
plus <case>.config.json, the `quantization_config` a real checkpoint of that case carries. The
inputs are fresh random codes, zeros and scales (seeded, so a rerun gives the same bytes); every
packed tensor is made by the format's own packer where the library has one, and every expected
tensor by the library's own dequantizer. Nothing here re-implements a format except where a
section says "transcription" (FP8 block without CUDA), and the script cross-checks each library
path against a second library path where one exists. The layouts and the reference arithmetic are
written down in docs/formats/<format>.md; tests/python/test_format_vectors.py re-derives every
expected tensor from the packed ones in plain numpy and asserts bit equality.

References used (the versions these vectors were made with; pip installs, Python 3.11, CPU):
  torch 2.15.0 (PyPI), numpy 2.4.6, safetensors 0.8.0, ml-dtypes 0.6.0
  gptqmodel 7.7.0        GPTQ: PackableQuantLinear.pack_original / pack_block (packer),
                         utils/model.py convert_gptq_v2_to_v1_format_module (v1 zeros),
                         utils/model_dequant.py convert_gptq_file (the offline dequantizer: the
                         expected tensors) and TorchLinear.dequantize_weight (the in-memory one;
                         asserted equal to expected.fp16 except in the v1 zero-0 case, where
                         both are stored; docs/formats/gptq.md says why)
  compressed-tensors 0.20.0
                         PackedQuantizationCompressor.compress / .decompress (pack-quantized),
                         FloatQuantizationCompressor.compress / .decompress (float-quantized)
  compressed-tensors 0.18.0 (only for compressed_tensors_actorder: actorder "group",
                         weight_g_idx, was removed in 0.19)
  transformers 5.23.0    integrations/mxfp4.py convert_moe_packed_tensors (MXFP4, gpt-oss)
  DeepSeek-V3 inference/kernel.py weight_dequant (Triton, CUDA only; not a package). Without
                         --deepseek-kernel the FP8 block expected tensors come from a
                         transcription of its arithmetic (labelled below); with it (on a CUDA
                         machine) they come from the kernel itself and the transcription is
                         asserted equal. The committed FP8 block vectors were made here by the
                         transcription (CPU) and verified on an NVIDIA H200: the kernel body of
                         weight_dequant_kernel at deepseek-ai/DeepSeek-V3 commit
                         06231633430c449a1f6a8c0b5a1d6f99860b8eb2, run with torch 2.11.0+cu130 and
                         triton 3.6.0 on the same inputs (regenerated from the same seed; input
                         sha256 equal), gave sha256-identical fp16, bf16 and fp32 outputs for all
                         four cases.

Usage (from the repo root, in a venv with the packages above: python3 -m venv V &&
V/bin/pip install -r tools/format_vectors/requirements.txt; torch from PyPI brings its CUDA
libraries, about 5 GB, though this runs on the CPU):
  python tools/format_vectors/make_vectors.py [--out tests/data/formats] [--only gptq,mxfp4,...]
      [--deepseek-kernel PATH/TO/DeepSeek-V3/inference/kernel.py]
Formats for --only: gptq, compressed_tensors, fp8_block, mxfp4 (the default: these four), and
compressed_tensors_actorder, which needs compressed-tensors 0.18.x (0.19 removed actorder
"group"); the committed case was made with 0.18.0 unpacked from its wheel onto PYTHONPATH:
  pip download --no-deps compressed-tensors==0.18.0 && unzip -d ct018 compressed_tensors-0.18.0-*.whl
  PYTHONPATH=ct018 python tools/format_vectors/make_vectors.py --only compressed_tensors_actorder
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile

import numpy as np
import torch

PREFIX = "model.layers.0.mlp.down_proj"
EXPERTS = "model.layers.0.mlp.experts"
OUT_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def save_case(out_dir, fmt, case, tensors, config, notes):
    """Writes <out>/<fmt>/<case>.safetensors and <case>.config.json."""
    from safetensors.torch import save_file

    d = os.path.join(out_dir, fmt)
    os.makedirs(d, exist_ok=True)
    meta = {"case": case, "format": fmt, "made_by": "tools/format_vectors/make_vectors.py",
            "notes": notes}
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, case + ".safetensors"),
              metadata={"about": json.dumps(meta, sort_keys=True)})  # one key: stable header bytes
    with open(os.path.join(d, case + ".config.json"), "w") as f:
        json.dump({"quantization_config": config}, f, indent=2, sort_keys=True)
        f.write("\n")
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"  {fmt}/{case}: {len(tensors)} tensors, {size} bytes")


def rand_fp16_scales(rng, shape, neg_frac=0.1, lo=-4.0, hi=-1.5):
    """Realistic fp16 scales: |s| = 10^U(lo, hi), some negative, as fp32 holding fp16 values."""
    mag = 10.0 ** rng.uniform(lo, hi, size=shape)
    sign = np.where(rng.random(shape) < neg_frac, -1.0, 1.0)
    return torch.from_numpy((sign * mag).astype(np.float16).astype(np.float32))


# ------------------------------------------------------------------------------------------------
# GPTQ (gptqmodel 7.7.0)
# ------------------------------------------------------------------------------------------------
def gptq_cases(out_dir, rng):
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.config import QuantizeConfig
    from gptqmodel.utils.model import (convert_gptq_v1_to_v2_format_module,
                                       convert_gptq_v2_to_v1_format_module)
    from gptqmodel.utils.model_dequant import convert_gptq_file, unpack_cols, unpack_rows

    # name, bits, group, K, N, sym, desc_act, checkpoint_format, zero range, edge scales
    cases = [
        ("gptq_4bit_g128_sym_v1", 4, 128, 256, 64, True, False, "gptq", None, True),
        ("gptq_4bit_g128_sym_v2", 4, 128, 256, 64, True, False, "gptq_v2", None, False),
        ("gptq_4bit_g32_asym_v1", 4, 32, 128, 64, False, False, "gptq", (1, 15), False),
        ("gptq_4bit_g64_asym_v2", 4, 64, 128, 64, False, False, "gptq_v2", (0, 15), True),
        ("gptq_4bit_g32_asym_descact_v2", 4, 32, 128, 64, False, True, "gptq_v2", (0, 15), False),
        ("gptq_4bit_g32_sym_descact_v1", 4, 32, 128, 64, True, True, "gptq", None, False),
        ("gptq_8bit_g128_sym_v1", 8, 128, 256, 64, True, False, "gptq", None, True),
        ("gptq_8bit_g64_asym_v2", 8, 64, 128, 64, False, False, "gptq_v2", (0, 255), False),
        ("gptq_8bit_gm1_asym_v1", 8, -1, 128, 64, False, False, "gptq", (1, 255), False),
        ("gptq_2bit_g64_asym_v2", 2, 64, 128, 64, False, False, "gptq_v2", (0, 3), False),
        ("gptq_3bit_g32_asym_v1", 3, 32, 128, 64, False, False, "gptq", (1, 7), False),
        # v1 with true zero points of 0: GPTQModel's v2->v1 word subtraction borrows into the next
        # field; its two dequantizers then disagree (see docs/formats/gptq.md, "v1 and zero 0").
        ("gptq_4bit_g64_asym_v1_zero0", 4, 64, 128, 64, False, False, "gptq", (0, 15), False),
    ]
    for (name, bits, group, K, N, sym, desc_act, ckpt, zr, edge) in cases:
        G = K if group == -1 else group
        ngroups = K // G
        maxq = (1 << bits) - 1
        if desc_act:
            perm = torch.from_numpy(rng.permutation(K))
            g_idx = torch.empty(K, dtype=torch.int32)
            g_idx[perm] = (torch.arange(K) // G).to(torch.int32)
        else:
            g_idx = (torch.arange(K) // G).to(torch.int32)
        q = torch.from_numpy(rng.integers(0, maxq + 1, size=(N, K))).to(torch.int64)
        if sym:
            zeros = torch.full((N, ngroups), 1 << (bits - 1), dtype=torch.int64)
        else:
            zeros = torch.from_numpy(rng.integers(zr[0], zr[1] + 1, size=(N, ngroups)))
            if name.endswith("zero0"):
                zeros[::3, :] = 0  # many true zeros of 0
        scales = rand_fp16_scales(rng, (N, ngroups))  # [N, groups], fp16 values
        if edge:
            # fp16 edge cases: subnormal scales, and scales whose product overflows fp16 (inf).
            scales[0, :] = 2.0 ** -20
            scales[1, :] = -(2.0 ** -24) * 3
            scales[2, :] = 30000.0 if bits == 4 else 1000.0
            scales[3, :] = -65504.0 / (maxq - (1 << (bits - 1)) + 1)
        # Original weight W = (q - z) * s exactly (fp32), so the packer's round((W + z*s)/s) is q.
        gl = g_idx.long()
        W = ((q - zeros[:, gl]).to(torch.float32) * scales[:, gl])
        lin = torch.nn.Linear(K, N, bias=False)
        lin.weight.data = W
        kw = dict(bits=bits, group_size=group, sym=sym, desc_act=desc_act, in_features=K,
                  out_features=N, bias=False, pack_dtype=torch.int32)
        mod = TorchLinear(**kw)
        mod.pack_original(lin, scales.clone(), zeros.clone(), g_idx.clone())
        if bits in (2, 4, 8):  # the block packer must agree with the original one
            mod_b = TorchLinear(**kw)
            mod_b.pack_block(lin, scales.clone(), zeros.clone(), g_idx.clone())
            assert torch.equal(mod_b.qweight, mod.qweight) and torch.equal(mod_b.qzeros, mod.qzeros)
        assert torch.equal(unpack_rows(mod.qweight, bits), q.T.to(torch.int32)), name
        assert torch.equal(unpack_cols(mod.qzeros, bits)[:, :N], zeros.T.to(torch.int32)), name
        if ckpt == "gptq":  # what GPTQModel's pack_module does before saving format "gptq"
            convert_gptq_v2_to_v1_format_module(mod, QuantizeConfig(bits=bits))
        tensors = {f"{PREFIX}.qweight": mod.qweight.clone(), f"{PREFIX}.qzeros": mod.qzeros.clone(),
                   f"{PREFIX}.scales": mod.scales.clone(), f"{PREFIX}.g_idx": mod.g_idx.to(torch.int32)}
        if sym and bits == 4:
            want = 0x77777777 if ckpt == "gptq" else -0x77777778  # 0x88888888 as int32
            assert bool((mod.qzeros == want).all()), (name, hex(int(mod.qzeros[0, 0])))
        qcfg = QuantizeConfig(bits=bits, group_size=group, desc_act=desc_act, sym=sym, format=ckpt)
        # As config.json holds it (JSON round trip: the dict holds str-valued enums).
        config = json.loads(json.dumps({k: v for k, v in qcfg.to_dict().items() if k != "meta"}))

        # Offline dequantizer (the expected tensors): convert_gptq_file on a real safetensors file.
        with tempfile.TemporaryDirectory() as tmp:
            from safetensors.torch import save_file
            path = os.path.join(tmp, "model.safetensors")
            save_file({k: v.contiguous() for k, v in tensors.items()}, path)
            from pathlib import Path
            for tag, dt in OUT_DTYPES.items():
                res = convert_gptq_file(Path(path), dt, config, "cpu")
                tensors[f"expected.{tag}"] = res[f"{PREFIX}.weight"]
        # In-memory dequantizer: TorchLinear.dequantize_weight() after GPTQModel's load-time
        # v1->v2 conversion. Output (K, N) in the scales' dtype (fp16).
        mem = TorchLinear(**kw)
        for b in ("qweight", "qzeros", "scales", "g_idx"):
            setattr(mem, b, tensors[f"{PREFIX}.{b}"].clone())
        if ckpt == "gptq":
            convert_gptq_v1_to_v2_format_module(mem, bits=bits, pack_dtype=torch.int32)
        mem.eval()
        w_mem = mem.dequantize_weight().T.contiguous()
        notes = ("expected.*: gptqmodel.utils.model_dequant.convert_gptq_file, (N, K) = "
                 "(out_features, in_features), fp32 (q - z) * s then one cast.")
        if name.endswith("zero0"):
            assert not torch.equal(w_mem, tensors["expected.fp16"]), "expected the paths to differ"
            tensors["expected_torchlinear.fp16"] = w_mem
            notes += (" expected_torchlinear.fp16: TorchLinear.dequantize_weight().T after "
                      "convert_gptq_v1_to_v2_format_module (word-wise +0x11111111), which "
                      "differs here.")
        else:
            assert torch.equal(w_mem.view(torch.int16), tensors["expected.fp16"].view(torch.int16)), name
            notes += " TorchLinear.dequantize_weight().T equals expected.fp16 bit for bit."
        save_case(out_dir, "gptq", name, tensors, config, notes)


# ------------------------------------------------------------------------------------------------
# compressed-tensors 0.20.0
# ------------------------------------------------------------------------------------------------
def ct_cases(out_dir, rng):
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)

    # name, kind, bits, strategy, group, sym, scale dtype, N, K
    cases = [
        ("ct_int4_g32_sym_bf16", "int", 4, "group", 32, True, torch.bfloat16, 64, 128),
        ("ct_int4_g64_asym_bf16", "int", 4, "group", 64, False, torch.bfloat16, 64, 256),
        ("ct_int4_g128_sym_fp16", "int", 4, "group", 128, True, torch.float16, 64, 256),
        ("ct_int4_g32_asym_fp32", "int", 4, "group", 32, False, torch.float32, 40, 128),
        ("ct_int8_channel_sym_bf16", "int", 8, "channel", None, True, torch.bfloat16, 64, 128),
        ("ct_int8_channel_asym_bf16", "int", 8, "channel", None, False, torch.bfloat16, 64, 128),
        ("ct_fp8_tensor_fp32", "float", 8, "tensor", None, True, torch.float32, 64, 128),
        ("ct_fp8_channel_bf16", "float", 8, "channel", None, True, torch.bfloat16, 64, 128),
    ]
    for (name, kind, bits, strategy, group, sym, sdt, N, K) in cases:
        wargs = dict(num_bits=bits, type=kind, symmetric=sym, strategy=strategy)
        if group:
            wargs["group_size"] = group
        args = QuantizationArgs(**wargs)
        scheme = QuantizationScheme(targets=["Linear"], weights=args)
        fmt = "pack-quantized" if kind == "int" else "float-quantized"
        qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt,
                                quantization_status="compressed", ignore=["lm_head"])
        config = json.loads(json.dumps(qc.model_dump(), default=str))
        sshape = {"group": (N, K // (group or 1)), "channel": (N, 1), "tensor": (1,)}[strategy]
        if kind == "int":
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            q = torch.from_numpy(rng.integers(lo, hi + 1, size=(N, K))).to(torch.int64)
            s = rand_fp16_scales(rng, sshape, lo=-3.5, hi=-1.5).to(sdt)
            if sdt == torch.float32:  # fp32 scales: use full 24-bit mantissas
                s = (s.double() * (1 + torch.from_numpy(rng.random(sshape)) * 1e-3)).float()
            if sdt == torch.float16:
                s[0] = 2.0 ** -20  # fp16-subnormal scale
            reps = K // s.shape[1]
            s_full = s.to(torch.float32).repeat_interleave(reps, dim=1)
            sd = {"weight_scale": s.clone()}
            if sym:
                zp_full = torch.zeros(N, K, dtype=torch.int64)
            else:
                zp = torch.from_numpy(rng.integers(lo, hi + 1, size=s.shape)).to(torch.int8)
                sd["weight_zero_point"] = zp.clone()
                zp_full = zp.to(torch.int64).repeat_interleave(reps, dim=1)
            W = (q - zp_full).to(torch.float64) * s_full.to(torch.float64)
            sd["weight"] = W.to(torch.float32)
            if sdt != torch.float32:  # exact for fp16/bf16 scales; fp32 ones round W, not q
                assert torch.equal(sd["weight"].to(torch.float64), W)
            comp = PackedQuantizationCompressor.compress(sd, scheme)
            from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
            assert torch.equal(unpack_from_int32(comp["weight_packed"], bits, (N, K)).long(), q), name
            dec = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
        else:
            codes = rng.integers(0, 256, size=(N, K)).astype(np.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN
            codes[0, :8] = [0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE]  # +-0, subnormals, +-448
            f8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
            if strategy == "tensor":
                s = torch.tensor([2.5e-3 * (1 + rng.random())], dtype=torch.float32)
            else:
                s = rand_fp16_scales(rng, sshape, lo=-3.5, hi=-1.5).to(sdt)
            W = f8.to(torch.float64) * s.to(torch.float64).reshape(-1, 1)
            sd = {"weight": W.to(torch.float32), "weight_scale": s.clone()}
            comp = FloatQuantizationCompressor.compress(sd, scheme)
            assert torch.equal(comp["weight"].view(torch.uint8), f8.view(torch.uint8)), name
            dec = FloatQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
        assert dec.dtype == sdt, (name, dec.dtype)
        tensors = {f"{PREFIX}.{k}": v for k, v in comp.items()}
        for tag, dt in OUT_DTYPES.items():
            tensors[f"expected.{tag}"] = dec.to(dt)
        notes = ("expected.*: compressed_tensors "
                 f"{'PackedQuantizationCompressor' if kind == 'int' else 'FloatQuantizationCompressor'}"
                 f".decompress(...)['weight'] ({sdt}, the scale dtype: (q - zp) * s computed in the "
                 "scale dtype), then .to(<dtype>). (N, K) = (out_features, in_features).")
        save_case(out_dir, "compressed_tensors", name, tensors, config, notes)


def ct_actorder_cases(out_dir, rng):
    """actorder "group" (weight_g_idx): compressed-tensors 0.19+ rejects it, so this case needs an
    older release on PYTHONPATH (made with 0.18.0, the last one that accepts it)."""
    import compressed_tensors
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)

    ver = tuple(int(v) for v in compressed_tensors.__version__.split(".")[:2])
    assert ver < (0, 19), f"actorder group needs compressed-tensors < 0.19, got {ver}"
    print(f"  (compressed-tensors {compressed_tensors.__version__} for actorder group)")
    name, G, N, K, sdt = "ct_int4_g32_asym_actorder_bf16", 32, 64, 128, torch.bfloat16
    args = QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group",
                            group_size=G, actorder="group")
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                            quantization_status="compressed", ignore=["lm_head"])
    config = json.loads(json.dumps(qc.model_dump(), default=str))
    perm = torch.from_numpy(rng.permutation(K))
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[perm] = (torch.arange(K) // G).to(torch.int32)  # G columns per group, scattered
    q = torch.from_numpy(rng.integers(-8, 8, size=(N, K))).to(torch.int64)
    s = rand_fp16_scales(rng, (N, K // G), lo=-3.5, hi=-1.5).to(sdt)
    zp = torch.from_numpy(rng.integers(-8, 8, size=(N, K // G))).to(torch.int8)
    gl = g_idx.long()
    W = (q - zp.long()[:, gl]).to(torch.float64) * s.to(torch.float64)[:, gl]
    sd = {"weight": W.to(torch.float32), "weight_scale": s.clone(), "weight_zero_point": zp.clone(),
          "weight_g_idx": g_idx.clone()}
    assert torch.equal(sd["weight"].to(torch.float64), W)
    comp = PackedQuantizationCompressor.compress(sd, scheme)
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    assert torch.equal(unpack_from_int32(comp["weight_packed"], 4, (N, K)).long(), q)
    dec = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
    assert dec.dtype == sdt
    tensors = {f"{PREFIX}.{k}": v for k, v in comp.items()}
    for tag, dt in OUT_DTYPES.items():
        tensors[f"expected.{tag}"] = dec.to(dt)
    notes = (f"compressed-tensors {compressed_tensors.__version__} (actorder group was removed in "
             "0.19). expected.*: PackedQuantizationCompressor.decompress(...)['weight'] (bf16; "
             "columns argsorted by weight_g_idx, grouped by G, dequantized, unpermuted), then "
             ".to(<dtype>). (N, K).")
    save_case(out_dir, "compressed_tensors", name, tensors, config, notes)


# ------------------------------------------------------------------------------------------------
# FP8 block-scaled (DeepSeek-V3 style)
# ------------------------------------------------------------------------------------------------
def deepseek_weight_dequant_transcription(x, s, out_dtype, block_size=128):
    """Transcription (not the original) of deepseek-ai/DeepSeek-V3 inference/kernel.py
    weight_dequant_kernel at commit 06231633430c449a1f6a8c0b5a1d6f99860b8eb2:
        x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        s = tl.load(s_ptr + pid_m * n + pid_n)        # scale_inv in its stored dtype
        y = x * s                                       # fp32 (s promoted to fp32)
        tl.store(y_ptr + offs, y, mask=mask)            # cast to torch.get_default_dtype(), RNE
    One 128x128 tile per program; partial edge tiles masked."""
    M, N = x.shape
    se = s.to(torch.float32).repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)
    return (x.to(torch.float32) * se[:M, :N]).to(out_dtype)


def fp8_block_cases(out_dir, rng, kernel_path):
    weight_dequant = None
    if kernel_path:
        spec = importlib.util.spec_from_file_location("deepseek_kernel", kernel_path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        weight_dequant = mod.weight_dequant
        assert torch.cuda.is_available(), "--deepseek-kernel needs CUDA"
    # name, scale dtype, N (rows, out), K (cols, in)
    cases = [
        ("fp8_block_scalef32_136x144", torch.float32, 136, 144),
        ("fp8_block_scalebf16_136x144", torch.bfloat16, 136, 144),
        ("fp8_block_scalef16_136x144", torch.float16, 136, 144),
        ("fp8_block_ue8m0_144x128", torch.float32, 144, 128),
    ]
    for (name, sdt, N, K) in cases:
        codes = rng.integers(0, 256, size=(N, K)).astype(np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x7E  # E4M3FN NaN is 0x7F/0xFF: none here
        codes[0, :8] = [0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x7E, 0xFE]
        x = torch.from_numpy(codes).view(torch.float8_e4m3fn)
        gs = ((N + 127) // 128, (K + 127) // 128)
        if "ue8m0" in name:  # V3.1 scale_fmt ue8m0: powers of two stored as fp32
            s = torch.from_numpy(2.0 ** rng.integers(-14, -5, size=gs)).to(torch.float32)
        else:
            amax = rng.uniform(0.02, 2.0, size=gs)
            s = torch.from_numpy(amax / 448.0).to(torch.float32)  # full-mantissa fp32
            s[0, 1] = -s[0, 1]  # a negative scale
            if sdt == torch.float16:
                s[1, 0] = 3.0e-6  # fp16-subnormal scale_inv
            if sdt == torch.float32:
                s[1, 1] = 256.0  # 448 * 256 overflows fp16: inf in the fp16 output
            s = s.to(sdt)
        tensors = {f"{PREFIX}.weight": x, f"{PREFIX}.weight_scale_inv": s}
        for tag, dt in OUT_DTYPES.items():
            ref = deepseek_weight_dequant_transcription(x, s, dt)
            if weight_dequant is not None:
                prev = torch.get_default_dtype()
                torch.set_default_dtype(dt)
                try:
                    got = weight_dequant(x.cuda().contiguous(), s.cuda().contiguous()).cpu()
                finally:
                    torch.set_default_dtype(prev)
                assert got.dtype == dt
                bits = torch.int32 if dt == torch.float32 else torch.int16
                assert torch.equal(got.view(bits), ref.view(bits)), (name, tag)
                ref = got
            tensors[f"expected.{tag}"] = ref
        config = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                  "weight_block_size": [128, 128]}
        if "ue8m0" in name:
            config["scale_fmt"] = "ue8m0"
        src = ("DeepSeek-V3 inference/kernel.py weight_dequant (Triton, ran on CUDA)"
               if weight_dequant is not None else
               "transcription of DeepSeek-V3 weight_dequant (CPU)")
        notes = (f"expected.*: {src} with torch default dtype = <dtype>; fp32 product x * s, "
                 "then one cast. (N, K) = (out_features, in_features); scale_inv "
                 f"[{gs[0]}, {gs[1]}] {sdt}.")
        save_case(out_dir, "fp8_block", name, tensors, config, notes)


# ------------------------------------------------------------------------------------------------
# MXFP4 (gpt-oss, transformers 5.23.0)
# ------------------------------------------------------------------------------------------------
def mxfp4_cases(out_dir, rng):
    from transformers import Mxfp4Config
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    E, H, I = 2, 64, 32  # experts, hidden_size, intermediate_size
    cases = [("mxfp4_gptoss_e2", (110, 135)), ("mxfp4_edge_exponents_e2", None)]
    for name, srange in cases:
        tensors = {}
        for proj, rows, cols in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            blocks = torch.from_numpy(rng.integers(0, 256, size=(E, rows, cols // 32, 16)).astype(np.uint8))
            if srange:
                scales = rng.integers(srange[0], srange[1] + 1, size=(E, rows, cols // 32))
            else:
                # the whole E8M0 range but 0xFF (NaN in OCP MX; transformers gives inf/NaN)
                scales = rng.integers(0, 255, size=(E, rows, cols // 32))
                scales.flat[:6] = [0, 1, 127, 142, 143, 254]
            scales = torch.from_numpy(scales.astype(np.uint8))
            tensors[f"{EXPERTS}.{proj}_blocks"] = blocks
            tensors[f"{EXPERTS}.{proj}_scales"] = scales
            tensors[f"{EXPERTS}.{proj}_bias"] = torch.from_numpy(
                rng.standard_normal((E, rows)).astype(np.float32)).to(torch.bfloat16)
            for tag, dt in OUT_DTYPES.items():
                out = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dt)
                assert tuple(out.shape) == (E, cols, rows), out.shape
                tensors[f"expected.{proj}.{tag}"] = out
        cfg = Mxfp4Config(modules_to_not_convert=["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                  "model.embed_tokens", "lm_head"]).to_dict()
        cfg = json.loads(json.dumps(cfg, default=lambda v: getattr(v, "value", str(v))))
        notes = ("expected.<proj>.<dtype>: transformers.integrations.mxfp4.convert_moe_packed_tensors"
                 "(blocks, scales, dtype=<dtype>), shape [E, in, out] (transposed from the blocks' "
                 "[E, out, in]): gate_up_proj [E, hidden, 2*intermediate] (gate/up interleaved "
                 "along the last axis), down_proj [E, intermediate, hidden].")
        save_case(out_dir, "mxfp4", name, tensors, cfg, notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "formats"))
    ap.add_argument("--only", default="gptq,compressed_tensors,fp8_block,mxfp4")
    ap.add_argument("--deepseek-kernel", default=None,
                    help="path to DeepSeek-V3 inference/kernel.py (needs CUDA and triton)")
    a = ap.parse_args()
    torch.manual_seed(0)
    only = set(a.only.split(","))
    print(f"torch {torch.__version__}, numpy {np.__version__}")
    # One generator per format, so regenerating one format leaves the others' bytes unchanged.
    if "gptq" in only:
        gptq_cases(a.out, np.random.default_rng(21001))
    if "compressed_tensors" in only:
        ct_cases(a.out, np.random.default_rng(21002))
    if "compressed_tensors_actorder" in only:  # needs compressed-tensors < 0.19 (see above)
        ct_actorder_cases(a.out, np.random.default_rng(21005))
    if "fp8_block" in only:
        fp8_block_cases(a.out, np.random.default_rng(21003), a.deepseek_kernel)
    if "mxfp4" in only:
        mxfp4_cases(a.out, np.random.default_rng(21004))
    return 0


if __name__ == "__main__":
    sys.exit(main())
