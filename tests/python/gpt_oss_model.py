"""A gpt-oss-shaped (MXFP4) checkpoint small enough for a test: the MoE experts of
tests/data/formats/mxfp4/mxfp4_gptoss_e2 (hidden 64, the experts' intermediate 32, 2 experts;
blocks, scales and biases as gpt-oss ships them, with transformers' own dequantization of them
as the case's expected tensors) inside a one-layer GptOssForCausalLM whose other parameters
(attention with its sinks, router, norms, embeddings, an untied lm_head) are random bf16.
Used by tests/python/test_torch.py (CPU) and tests/gpu/torch_loader_check.py (CUDA)."""

import json
import os

import safetensors
import safetensors.torch
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASE = os.path.join(ROOT, "tests", "data", "formats", "mxfp4", "mxfp4_gptoss_e2")
EXPERTS = "model.layers.0.mlp.experts."
# The experts' parameters: transformers' GptOssExperts, [E, K, N].
PROJECTIONS = (("gate_up_proj", (2, 64, 64)), ("down_proj", (2, 32, 64)))


def config():
    """The transformers GptOssConfig of the model."""
    import transformers

    return transformers.GptOssConfig(
        vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=2,
        num_experts_per_tok=1, layer_types=["full_attention"], sliding_window=16,
        max_position_embeddings=64, tie_word_embeddings=False)


def make(model_dir, seed=23):
    """Writes the checkpoint (config.json with the case's quantization_config,
    model.safetensors) into `model_dir` (created). Returns {projection: the bytes of
    transformers' own bf16 dequantization of its blocks}."""
    import transformers

    cfg = config()
    torch.manual_seed(seed)
    dense = transformers.GptOssForCausalLM(cfg).to(torch.bfloat16)
    with open(CASE + ".safetensors", "rb") as f:
        case = dict(safetensors.deserialize(f.read()))
    tensors = {n: p.detach().contiguous() for n, p in dense.state_dict().items()
               if not n.startswith(EXPERTS) and "rotary_emb" not in n}
    for name, t in case.items():
        if name.startswith(EXPERTS):  # the blocks, scales and biases of both projections
            dtype = {"U8": torch.uint8, "BF16": torch.bfloat16}[t["dtype"]]
            tensors[name] = torch.frombuffer(bytearray(t["data"]), dtype=dtype).view(t["shape"])
    os.makedirs(model_dir)
    safetensors.torch.save_file(tensors, os.path.join(model_dir, "model.safetensors"))
    with open(CASE + ".config.json") as f:
        quantization = json.load(f)["quantization_config"]
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(dict(cfg.to_dict(), quantization_config=quantization), f)
    return {proj: bytes(case[f"expected.{proj}.bf16"]["data"]) for proj, _ in PROJECTIONS}
