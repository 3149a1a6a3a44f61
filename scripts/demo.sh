#!/usr/bin/env bash
# The main job, end to end on a fresh machine: install dependencies, build, make the bundled
# SmolLM2-135M AWQ checkpoint, start dequantd on it, dequantize a real layer with dequantctl,
# report shape, time and the error against the original weights, then stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
layer=${DEQUANTD_DEMO_LAYER:-model.layers.0.self_attn.q_proj}
model=models/smollm2-135m-awq
ref=models/smollm2-135m-awq-reference/original.safetensors

scripts/install-deps.sh
scripts/build.sh dequantd dequantctl
scripts/make-model.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port); mport=$(free_port)
# The server log and the dequantized layer live in $work, removed on exit; a failed demo keeps
# the log there and says so.
work=$(mktemp -d -t dequantd-demo.XXXXXX)
log=$work/dequantd.log
out=$work/$layer.npy
server=
cleanup() {
  local status=$?
  if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  if [[ $status -eq 0 ]]; then
    rm -rf "$work"
  else
    rm -f "$out"
    echo "demo: FAILED (exit $status); the server log is kept in $log" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
build/server/dequantd --model "$model" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" >"$log" 2>&1 &
server=$!
ctl() { build/client/dequantctl --server "127.0.0.1:$port" "$@"; }
for _ in $(seq 100); do ctl info >/dev/null 2>&1 && break; sleep 0.1; done
echo "== server log"; cat "$log"
echo "== dequantctl info"; ctl info
layers=$(ctl list)  # captured: piping into head would end dequantctl with SIGPIPE under pipefail
echo "== dequantctl list: $(tail -n 1 <<<"$layers"); the first 4 layers:"
sed -n '1,5p' <<<"$layers"
echo "== dequantctl dequantize --tensor $layer"
ctl dequantize --tensor "$layer" --dtype fp16 --out "$out" \
  --compare "$ref:$layer.weight" --compare-layout kn  # the reference is (K, N): docs/model.md
echo "(error: the served AWQ 4-bit weights against the original fp32 weights of that layer;"
echo " about 10% relative RMS is what 4-bit min-max quantization gives, see docs/model.md)"
echo "== metrics (requests)"
python3 - "$mport" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print("\n".join(l for l in text.splitlines() if l.startswith("dequantd_rpc_requests_total")))
PY
echo "demo: OK"
