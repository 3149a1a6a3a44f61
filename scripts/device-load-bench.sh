#!/usr/bin/env bash
# Issue 22's load rows, run on the GPU machine from the repository root after `. .bundle/env.sh`
# (a bundle holding dequantd and dequantd_load_bench, made on the build machine with
#   /work/shared/tools/device-bundle .bundle build/server/dequantd build/bench/e2e/dequantd_load_bench
# and carried with the call; docs/performance.md "Models of any size"): writes a
# Llama-3-70B-shaped checkpoint (35.6 GB, 8 shards) to LOAD_DIR unless it is there, then times
# dequantd's start to serving beside the file read with the same threads, warm and dropped from
# the page cache. Environment: LOAD_DIR (default /tmp/dequantd-l70b; must be on a disk for the
# dropped rows), LOAD_MODEL (llama-70b | llama-8b), LOAD_THREADS (16, the server's default; several, e.g. "8 16", run
# the rows once per count, each against the read with that many threads), LOAD_EXTRA (dequantd
# flags, comma-separated). Logs under $OUT (default ./out): load.txt (the table, and under each row the
# server's "loaded" line with the upload's per-thread profile and its "startup phases" line;
# last, the check of one layer per model block bit-exact against the CPU reference),
# load_server.log (the last start's whole log), load_host.txt.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
dir=${LOAD_DIR:-/tmp/dequantd-l70b}
{ date -u; nvidia-smi -L; df -h "$(dirname "$dir")" /dev/shm; free -g; nproc; } 2>&1 | tee "$OUT/load_host.txt"
: >"$OUT/load.txt"
rc=0
for threads in ${LOAD_THREADS:-16}; do
  dequantd_load_bench --dir "$dir" --model "${LOAD_MODEL:-llama-70b}" --threads "$threads" \
    --cold --dequantd "$(command -v dequantd)" --extra "${LOAD_EXTRA:-}" 2>&1 | tee -a "$OUT/load.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
cp "$dir.dequantd.log" "$OUT/load_server.log" 2>/dev/null
exit "$rc"
