#!/usr/bin/env bash
# The release check of the image a new user builds first: `docker build -t dequantd .`, the
# Dockerfile's default from-source stage (compiles dequantd and dequantctl in the image with the
# CUDA toolkit from PyPI, makes the bundled model there), then the checks CI runs on the prebuilt
# image (scripts/test-container.sh): `dequantd --help`, gRPC health, `dequantctl list`, a
# Dequantize through the published port byte for byte against the reference weights, /metrics,
# the UID, a clean SIGTERM. Too slow for CI (docs/container.md has the times); run it as root on
# Debian 12 before a release, from a clean clone (`git clone REPO /tmp/x && /tmp/x/scripts/...`):
#
#   scripts/check-image-from-source.sh [--cuda pypi|none] [--warm]
#
#   --cuda none   the CPU-only image (--build-arg CUDA=none); default pypi, as README.md builds it
#   --warm        then builds it a second time with the first build's layer cache and reports
#                 both times
#
# Needs network access to Debian's mirror and PyPI (the base image is made with debootstrap when
# no registry is reachable, as in CI). Without build/client/dequantctl the checks use the image's
# own dequantctl. The reference weights come from $DEQUANTD_MODEL_DIR-reference (default
# models/smollm2-135m-awq, made with scripts/make-model.sh when missing). Leaves no image behind
# but the base; $DEQUANTD_CONTAINER_CACHE/build.log keeps the last build's log, timed per line.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 [--cuda pypi|none] [--warm]" >&2; exit 2; }
cuda=pypi warm=0
while (($#)); do
  case $1 in
    --cuda) (($# >= 2)) || usage; cuda=$2; shift 2 ;;
    --cuda=*) cuda=${1#--cuda=}; shift ;;
    --warm) warm=1; shift ;;
    *) usage ;;
  esac
done
[[ $cuda == pypi || $cuda == none ]] || { echo "$0: --cuda must be pypi or none, got '$cuda'" >&2; usage; }
[[ $(id -u) == 0 ]] || { echo "$0: run as root (rootful Podman)" >&2; exit 1; }

model=${DEQUANTD_MODEL_DIR:-$PWD/models/smollm2-135m-awq}
[[ -f $model-reference/original.safetensors ]] || scripts/make-model.sh "$model"
export DEQUANTD_MODEL_DIR=$model DEQUANTD_CONTAINER_FROM_SOURCE=1 DEQUANTD_CONTAINER_CUDA=$cuda
export DEQUANTD_CONTAINER_BUILD_TIMEOUT=${DEQUANTD_CONTAINER_BUILD_TIMEOUT:-14400}

if ((warm == 0)); then
  exec scripts/test-container.sh
fi
# Both builds, the second over the first's layers; the layers are removed afterwards.
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
if ! command -v podman >/dev/null; then
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends podman buildah runc >/dev/null
fi
images_before=$("${podman[@]}" images -a -q --no-trunc | sort -u)
remove_layers() {
  comm -13 <(echo "$images_before") <("${podman[@]}" images -a -q --no-trunc | sort -u) |
    xargs -r "${podman[@]}" rmi -f >/dev/null 2>&1 || true
}
trap remove_layers EXIT
echo "check-image-from-source: first build (CUDA=$cuda)"
DEQUANTD_CONTAINER_KEEP_LAYERS=1 scripts/test-container.sh
echo "check-image-from-source: second build, warm layer cache (CUDA=$cuda)"
DEQUANTD_CONTAINER_KEEP_LAYERS=1 scripts/test-container.sh
