#!/usr/bin/env bash
# Several GPUs in one dequantd (issue 14), on 1 or 2 GPUs. Run on the device machine from the
# repository root (dequantd on PATH, python3 with numpy, grpcio, safetensors, torch):
#   tests/gpu/multi_gpu_check.sh            (OUT=dir for logs, CLIENTS=8, REPS=12)
# With two GPUs the workers are cuda:0 and cuda:1 (--devices 0,1). With one GPU the same checks
# run on two workers of GPU 0 (--devices 0,0: cuda:0 and cuda:0.1), which exercises routing,
# spreading, split placement and taking a worker out of rotation for real, but not two chips.
# Prints a table of checks (and the aggregate kernel-side rate, one GPU vs all) and exits 1 when
# a check failed. Every dequantd it starts is stopped.
set -uo pipefail
OUT=${OUT:-$PWD/out}
HERE=$(cd "$(dirname "$0")" && pwd)
CLIENTS=${CLIENTS:-8}
REPS=${REPS:-12}
mkdir -p "$OUT"
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null ||
  nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 2 ]; then
  devices=0,1; first=cuda:0; second=cuda:1; last=1
else
  devices=0,0; first=cuda:0; second=cuda:0.1; last=0
fi
echo "GPUs visible: $ngpu; workers --devices $devices ($first, $second)"
model=$OUT/model
[ -f "$model/config.json" ] || python3 "$HERE/multi_gpu_check.py" make-model "$model" || exit 1

port=50661
mport=9661
server=
rows=$OUT/rows.txt
: >"$rows"
stop() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  server=
}
trap stop EXIT
# start NAME [ENV=VALUE] -- ARGS...: starts dequantd, waits for "listening on".
start() {
  local name=$1; shift
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  stop
  env "${env[@]}" dequantd --backend=cuda --model="$model" --listen=127.0.0.1:$port \
    --metrics-listen=127.0.0.1:$mport --shared-memory=cuda "$@" >"$OUT/$name.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    grep -q "listening on" "$OUT/$name.log" 2>/dev/null && return 0
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
  done
  echo "ROW [$name] dequantd started | FAIL | $(tail -3 "$OUT/$name.log" | tr '\n' ' ')" >>"$rows"
  return 1
}
check() {  # check PHASE TAG [options]: runs a phase, appends its rows
  local phase=$1 tag=$2; shift 2
  python3 "$HERE/multi_gpu_check.py" "$phase" --server 127.0.0.1:$port --metrics 127.0.0.1:$mport \
    --model "$model" --tag "$tag" "$@" 2>&1 | tee -a "$OUT/checks.log" | grep -E "^(ROW|RATE)" >>"$rows"
}

# 1. Each GPU alone: bit-exact, and the one-GPU rate under load.
for d in $(echo "$devices" | tr ',' '\n' | sort -u); do
  if start "gpu$d" -- --devices="$d"; then
    check exact "cuda:$d alone"
    check load "cuda:$d alone" --clients "$CLIENTS" --reps "$REPS"
  fi
done
# 2. Both workers, replicated: exact, DequantizeLayers spread, both busy, device region.
if start both -- --devices="$devices"; then
  check info both --expect-serving "$first,$second"
  check exact both --expect-spread
  check load both --clients "$CLIENTS" --reps "$REPS"
  check region both --region-device "$last"
fi
# 3. Split placement: each worker holds part of the model; still bit-exact.
if start split -- --devices="$devices" --placement=split; then
  check info split --expect-serving "$first,$second" --expect-split
  check exact split
fi
# 4. The second worker fails its 3rd launch: taken out of rotation, calls go on on the first.
if start launch-failure DEQUANTD_INJECT_DEVICE_FAILURE="$second=launch@2" -- --devices="$devices"; then
  check load launch-failure --clients 4 --reps 6
  check info launch-failure --expect-serving "$first" --expect-failed "$second"
  check exact launch-failure
  logged=FAIL
  grep -q "device $second taken out of rotation" "$OUT/launch-failure.log" && logged=ok
  echo "ROW [launch-failure] log line \"device $second taken out of rotation\" | $logged | $(grep -m1 'taken out' "$OUT/launch-failure.log" | cut -c1-160)" >>"$rows"
fi
# 5. The second worker is unavailable at start: the server starts and serves on the first.
if start start-failure DEQUANTD_INJECT_DEVICE_FAILURE="$second=start" -- --devices="$devices"; then
  check info start-failure --expect-serving "$first" --expect-failed "$second"
  check exact start-failure
fi
stop

echo
printf '%-78s | %-4s | %s\n' check result detail
printf '%.0s-' $(seq 1 120); echo
grep '^ROW' "$rows" | sed 's/^ROW //' | awk -F' \\| ' '{printf "%-78s | %-4s | %s\n", $1, $2, $3}'
one=$(grep "^RATE \[cuda:0 alone\]" "$rows" | awk '{print $4}')
all=$(grep "^RATE \[both\]" "$rows" | awk '{print $3}')
if [ -n "$one" ] && [ -n "$all" ]; then
  python3 -c "o, a = $one, $all; print(f'aggregate kernel-side rate under $CLIENTS clients: one GPU {o/1e9:.1f} GB/s, both workers {a/1e9:.1f} GB/s, ratio {a/o:.2f}')"
fi
grep -q '| FAIL |' "$rows" && exit 1
exit 0
