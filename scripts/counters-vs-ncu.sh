#!/usr/bin/env bash
# In-process hardware counters (dequantd_bench --hardware-counters, CUPTI Range Profiler) against
# Nsight Compute for the same kernel and launch config (issue 4, part 2). Runs on the GPU machine
# with dequantd_bench and ncu on PATH (after `. .bundle/env.sh`; see scripts/device-check.sh).
# Both runs share one tune cache, so the autotuner's first run picks the config and the others
# reuse it (Nsight Compute profiles the first v4_vec16 launch, never a tuning candidate).
# Usage: scripts/counters-vs-ncu.sh [SHAPES]   SHAPES: KxN,... (default 4096x14336,8192x28672)
# Writes $OUT/counters_*.log and $OUT/ncu_*.csv (default ./out); prints a markdown table with the
# difference in points (percentages) or percent (bytes). Exit status: non-zero when a run failed.
set -euo pipefail
shapes=${1:-4096x14336,8192x28672}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
tune_cache=$(mktemp -d)/tune.cache
metrics=dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct
metrics+=,l1tex__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum
bench_args=(--variants v4_vec16 --dtypes fp16 --group-size 128 --tune-cache "$tune_cache")

for shape in ${shapes//,/ }; do
  for i in 1 2; do  # twice: the in-process value's spread
    dequantd_bench --shapes "$shape" "${bench_args[@]}" --trials 1 --runs 3 --hardware-counters \
      >"$OUT/counters_${shape}_$i.log"
  done
  ncu --clock-control none -k regex:DequantVec16Kernel -c 1 --metrics "$metrics" --csv \
    --print-units base dequantd_bench --shapes "$shape" "${bench_args[@]}" --trials 1 --runs 1 \
    >"$OUT/ncu_$shape.csv"
done

python3 - "$OUT" "$shapes" <<'PY'
import csv, glob, os, sys
out, shapes = sys.argv[1], sys.argv[2].split(",")
print("| shape | metric | CUPTI in process (2 runs) | Nsight Compute | difference |")
print("| --- | --- | --- | --- | --- |")
for shape in shapes:
    cupti = {}
    for log in sorted(glob.glob(os.path.join(out, f"counters_{shape}_*.log"))):
        for line in open(log):
            if line.startswith("counters v4_vec16"):
                for kv in line.split(":", 1)[1].split():
                    k, v = kv.split("=")
                    cupti.setdefault(k, []).append(float(v))
    ncu = {}
    with open(os.path.join(out, f"ncu_{shape}.csv")) as f:
        rows = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(rows):
        ncu[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    for name in sorted(ncu):
        vals = cupti.get(name, [])
        mean = sum(vals) / len(vals) if vals else float("nan")
        pct = "pct" in name
        fmt = (lambda v: f"{v:.2f}%") if pct else (lambda v: f"{v / 1e6:.2f} MB")
        diff = (f"{mean - ncu[name]:+.2f} points" if pct
                else f"{100 * (mean - ncu[name]) / ncu[name]:+.1f}%")
        print(f"| {shape} | {name} | {' / '.join(fmt(v) for v in vals)} | {fmt(ncu[name])} | {diff} |")
PY
