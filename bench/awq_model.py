#!/usr/bin/env python3
"""Writes a synthetic Llama-shaped AWQ GEMM checkpoint that transformers can build: config.json
(llama, with quantization_config) and model.safetensors holding every projection's qweight /
qzeros / scales (random, seeded; the blocks share one block's packed data, as
bench/e2e/synthetic_model.h does, so that writing 8B takes seconds) and the F16 embeddings, norms
and, when untied, lm_head. For the loader's GPU check (tests/gpu/torch_loader_check.py) and the
time-to-model benchmark (bench/time_to_model.py).

  awq_model.py DIR --preset smollm2-135m|llama-8b [--blocks B] [--seed S]

Presets: smollm2-135m = the bundled model's shapes (hidden 576, 30 blocks, 9 heads / 3 KV heads,
intermediate 1536, vocab 49152, tied embeddings; K = 576 layers use G = 64 as there);
llama-8b = Llama-3-8B's (hidden 4096, 32 blocks, 32 / 8 heads, intermediate 14336, vocab 128256,
untied lm_head): 224 layers, 13.96 GB of bf16 weights in the linears, 16.06 GB in all.

Values: packed nibbles uniform in 0..15, scales uniform in [0.001, 0.003] (fp16), so that
w = (q - z) * s stays within +-0.045 like a trained 8B's; embeddings N(0, 0.02), norms
uniform in [0.9, 1.1]: a forward pass stays finite in bf16.
"""

import argparse
import json
import os

import numpy as np

PRESETS = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                     max_position_embeddings=8192, rms_norm_eps=1e-5),
}
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble j of a word holds column 8c + ORDER[j] (AutoAWQ)


def projections(cfg):
    """(name within a block, K, N) of the seven linears."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    return [("self_attn.q_proj", h, q), ("self_attn.k_proj", h, kv), ("self_attn.v_proj", h, kv),
            ("self_attn.o_proj", q, h), ("mlp.gate_proj", h, i), ("mlp.up_proj", h, i),
            ("mlp.down_proj", i, h)]


def group_size(k):
    return 128 if k % 128 == 0 else 64


def packed_layer(rng, k, n):
    g = group_size(k)
    qweight = rng.integers(0, 2**32, size=(k, n // 8), dtype=np.uint32).view(np.int32)
    qzeros = rng.integers(0, 2**32, size=(k // g, n // 8), dtype=np.uint32).view(np.int32)
    scales = rng.uniform(0.001, 0.003, size=(k // g, n)).astype(np.float16)
    return qweight, qzeros, scales


def make(directory, preset, blocks=None, seed=0):
    """Writes the checkpoint; returns the config dict."""
    from safetensors.numpy import save_file

    cfg = dict(PRESETS[preset])
    if blocks is not None:
        cfg["num_hidden_layers"] = blocks
    rng = np.random.default_rng(seed)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    shared = {name: packed_layer(rng, k, n) for name, k, n in projections(cfg)}
    tensors = {}
    for b in range(cfg["num_hidden_layers"]):
        for name, _, _ in projections(cfg):
            qweight, qzeros, scales = shared[name]
            prefix = f"model.layers.{b}.{name}"
            tensors[f"{prefix}.qweight"] = qweight
            tensors[f"{prefix}.qzeros"] = qzeros
            tensors[f"{prefix}.scales"] = scales
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{b}.{norm}.weight"] = rng.uniform(0.9, 1.1, h).astype(np.float16)
    tensors["model.norm.weight"] = rng.uniform(0.9, 1.1, h).astype(np.float16)
    tensors["model.embed_tokens.weight"] = (rng.standard_normal((v, h), dtype=np.float32)
                                            * 0.02).astype(np.float16)
    if not cfg["tie_word_embeddings"]:
        tensors["lm_head.weight"] = (rng.standard_normal((v, h), dtype=np.float32)
                                     * 0.02).astype(np.float16)
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16", **cfg,
              "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                      "zero_point": True, "version": "gemm"}}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--blocks", type=int, default=None, help="decoder blocks (default: the "
                        "preset's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make(args.dir, args.preset, args.blocks, args.seed)


if __name__ == "__main__":
    main()
