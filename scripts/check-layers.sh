#!/usr/bin/env bash
# Fails when a library folder includes a header of a folder above it (docs/architecture.md: layers
# depend only downward). Every target sees the project root, so an upward include would compile;
# this is the check. Order, lowest first; a folder may include its own and any earlier folder's.
set -euo pipefail
cd "$(dirname "$0")/.."
order=(proto kernels formats measure server/model server/backend server/regions server/metrics
  server/auth server/rpc server)
# Program and test folders: no library includes them.
programs=(bench client tests tools)
status=0
rank_of() {  # the rank of the deepest folder in `order` that holds path $1, or -1
  local best=-1 best_len=0 i
  for i in "${!order[@]}"; do
    local d=${order[$i]}
    if [[ $1 == "$d/"* && ${#d} -gt $best_len ]]; then best=$i best_len=${#d}; fi
  done
  echo "$best"
}
for i in "${!order[@]}"; do
  folder=${order[$i]}
  while IFS= read -r file; do
    [[ $(rank_of "$file") == "$i" ]] || continue  # a file of a deeper folder is checked there
    while IFS= read -r inc; do
      target=${inc#\"}
      target=${target%\"}
      for p in "${programs[@]}"; do
        if [[ $target == "$p/"* ]]; then
          echo "$file includes $target: a library includes a program folder ($p/)"
          status=1
        fi
      done
      r=$(rank_of "$target")
      if ((r > i)); then
        echo "$file includes $target: ${order[$r]}/ is above ${folder}/"
        status=1
      fi
    done < <(grep -ho '^#include "[^"]*"' "$file" | sed 's/^#include //')
  done < <(find "$folder" -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \))
done
if ((status == 0)); then echo "layering: every library include points down"; fi
exit $status
