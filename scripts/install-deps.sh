#!/usr/bin/env bash
# Installs the Debian 12 packages dequantd builds and tests with. Run as root (or with sudo).
# The CUDA toolkit is not a Debian package here: the build uses nvcc when it is on PATH.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
# Another apt run (unattended upgrades, a parallel job) holds the lock for a while: wait for it.
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates python3 python3-venv python3-pip \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
  prometheus-cpp-dev libcivetweb-dev nlohmann-json3-dev libspdlog-dev libgtest-dev libgmock-dev \
  prometheus libssl-dev openssl >/dev/null  # openssl: tests/security make certificates
echo "install-deps: done"
