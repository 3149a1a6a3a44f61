#!/usr/bin/env bash
# The H200 check of issue 9 (run on the device machine from the repository root, after
# `. $BUNDLE/env.sh`): makes a two-layer model (numpy), starts the bundled dequantd with the CUDA
# backend and --shared-memory=all, runs tests/gpu/torch_ipc_demo.py against it, and the C++
# dequantd_ipc_smoke when bundled. PYTHONPATH must hold the generated dequant_pb2*.py.
# Logs under $OUT. Exit status: non-zero when a check failed.
set -uo pipefail
OUT=${OUT:-$PWD/out}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
# Stubs: generated here by grpc_tools when the machine has it (matching its protobuf), else the
# carried ones made by Debian's protoc (PYTHONPATH).
if python3 -c "import grpc_tools" 2>/dev/null && [ -f "$HERE/dequant.proto" ]; then
  stubs=$(mktemp -d)
  python3 -m grpc_tools.protoc -I"$HERE" --python_out="$stubs" --grpc_python_out="$stubs" \
    "$HERE/dequant.proto" && export PYTHONPATH="$stubs${PYTHONPATH:+:$PYTHONPATH}"
fi
model=$(mktemp -d)/model
python3 "$HERE/torch_ipc_demo.py" make-model "$model" || exit 1
port=50551
dequantd --backend=cuda --model="$model" --listen=127.0.0.1:$port --metrics-listen=127.0.0.1:9555 \
  --shared-memory=all >"$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 1 120); do
  grep -q "listening on" "$OUT/server.log" 2>/dev/null && break
  sleep 0.5
done
rc=0
python3 "$HERE/torch_ipc_demo.py" run --server 127.0.0.1:$port --model "$model" --reps "${REPS:-5}" \
  2>&1 | tee "$OUT/demo.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
if command -v dequantd_ipc_smoke >/dev/null 2>&1; then
  dequantd_ipc_smoke 127.0.0.1:$port 2>&1 | tee "$OUT/smoke.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9555/metrics").read().decode())' \
  | grep -E "^dequantd_(delivered|shared_memory)" | tee "$OUT/metrics.txt"
kill -TERM $server
wait $server
tail -5 "$OUT/server.log"
exit $rc
