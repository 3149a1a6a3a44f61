#!/usr/bin/env bash
# Time to a ready model on the H200 host (issue 23 part 4), one call, from the repository root
# after `. BUNDLE/env.sh` (dequantd on PATH): writes the Llama-3-8B-shaped synthetic AWQ
# checkpoint (bench/awq_model.py, ~5.6 GB) under $WORK, starts dequantd on it (CUDA backend,
# --shared-memory=cuda), runs bench/time_to_model.py (loader, from_pretrained warm and cold,
# safetensors load_file, ceilings) and stops the server. Logs and time_to_model.json under $OUT.
#
#   bench/time_to_model.sh [PRESET] [BLOCKS]     (default llama-8b, the preset's 32 blocks)
#
# DEQUANTD_FLAGS: more dequantd flags, e.g. DEQUANTD_FLAGS=--read-staging-bytes=0 for ReadTensor's
# one-thread path (issue 23), to compare with the default staged one.
set -uo pipefail
OUT=${OUT:-$PWD/out}
WORK=${WORK:-$(mktemp -d /tmp/time-to-model.XXXXXX)}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PRESET=${1:-llama-8b}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$ROOT/client/python/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 "$HERE/awq_model.py" "$WORK/awq" --preset "$PRESET" ${2:+--blocks "$2"} || exit 1
echo "checkpoint written in $(( $(date +%s) - t0 )) s: $(du -sh "$WORK/awq" | cut -f1)"
port=50661
metrics=50662
dequantd --backend=cuda --model="$WORK/awq" --listen=127.0.0.1:$port \
  --metrics-listen=127.0.0.1:$metrics \
  --shared-memory=cuda ${DEQUANTD_FLAGS:-} >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  grep -q "listening on" "$OUT/server.log" 2>/dev/null && break
  kill -0 $server 2>/dev/null || { tail -20 "$OUT/server.log"; exit 1; }
  sleep 0.2
done
python3 "$HERE/time_to_model.py" --server 127.0.0.1:$port --model "$WORK/awq" --work "$WORK" \
  --device cuda:0 --metrics "http://127.0.0.1:$metrics/metrics" --json "$OUT/time_to_model.json" \
  2>&1 | grep -v "Loading weights" | tee "$OUT/time_to_model.log"
rc=${PIPESTATUS[0]}
kill -TERM $server; wait $server
rm -rf "$WORK"
exit $rc
