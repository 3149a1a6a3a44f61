#!/usr/bin/env bash
# Collects what the runtime stage of the Dockerfile installs, from a finished build:
#   deploy/container/collect-artifacts.sh BUILD_DIR MODEL_DIR OUT_DIR
# OUT_DIR gets bin/ (dequantd, dequantctl, stripped), models/<name of MODEL_DIR>/ (the checkpoint),
# packages.txt (the Debian packages that own the shared libraries the binaries link, one per
# line: the runtime stage installs them with apt, so they get Debian's security updates) and
# lib/ (shared libraries no Debian package owns: libcudart/libcupti from the CUDA toolkit, with
# libnvperf_host.so, which libcupti loads at run time and ldd cannot see). Runs on Debian 12: in
# the Dockerfile's from-source stage, and on a Debian 12 host for the prebuilt stage
# (scripts/test-container.sh). Needs ldd, dpkg and strip (binutils).
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 BUILD_DIR MODEL_DIR OUT_DIR" >&2
  exit 2
fi
build=$1 model=${2%/} out=$3
for f in "$build/server/dequantd" "$build/client/dequantctl" "$model/config.json"; do
  [[ -f $f ]] || { echo "collect-artifacts: $f is missing" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/models"
cp "$build/server/dequantd" "$build/client/dequantctl" "$out/bin/"
strip --strip-unneeded "$out/bin/dequantd" "$out/bin/dequantctl"
cp -r "$model" "$out/models/"

# The package that owns each library, with one dpkg query: dpkg knows the path the package
# shipped (/lib or /usr/lib on a merged-/usr system), so each library is asked for as ldd prints
# it, without and with /usr, and resolved.
mapfile -t libs < <(ldd "$out/bin/dequantd" "$out/bin/dequantctl" | awk '/=> \// {print $3}' |
                    sort -u)
candidates() { printf '%s\n' "$1" "${1#/usr}" "/usr${1#/usr}" "$(readlink -f "$1")"; }
mapfile -t queries < <(for lib in "${libs[@]}"; do candidates "$lib"; done | sort -u)
owners=$(dpkg -S "${queries[@]}" 2>/dev/null || true)  # "pkg:arch: /path" per known path
: > "$out/packages.unsorted"
for lib in "${libs[@]}"; do
  package=""
  while read -r candidate; do
    package=$(awk -v path="$candidate" '$NF == path {sub(/:.*/, "", $1); print $1; exit}' \
              <<< "$owners")
    [[ -n $package ]] && break
  done < <(candidates "$lib")
  if [[ -n $package ]]; then
    echo "$package" >> "$out/packages.unsorted"
  else
    cp -L "$lib" "$out/lib/"
    if [[ $(basename "$lib") == libcupti.so* && -f $(dirname "$lib")/libnvperf_host.so ]]; then
      cp -L "$(dirname "$lib")/libnvperf_host.so" "$out/lib/"
    fi
  fi
done
sort -u "$out/packages.unsorted" > "$out/packages.txt"
rm "$out/packages.unsorted"
echo "collect-artifacts: $out: $(wc -l < "$out/packages.txt") Debian packages," \
     "$(find "$out/lib" -type f | wc -l) other libraries, $(du -sh "$out" | cut -f1)"
