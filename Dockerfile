# dequantd image: `docker run --gpus all -p 50051:50051 -p 9464:9464 dequantd` (GPU node, NVIDIA
# container toolkit) or without --gpus (CPU backend). Design and trade-offs: docs/container.md.
#
#   docker build -t dequantd .                      # from source, CUDA toolkit from PyPI wheels
#       (BuildKit, Docker's default builder, or Buildah: the pip steps take an optional build
#       secret pip_cert, a CA bundle for a TLS-intercepting proxy; release check:
#       scripts/check-image-from-source.sh)
#   docker build --build-arg CUDA=none -t dequantd .   # from source, CPU backend only
#   docker build --build-arg ARTIFACTS=prebuilt -t dequantd CONTEXT
#       # CONTEXT/out made by deploy/container/collect-artifacts.sh from a build on a Debian 12
#       # host (what CI does: scripts/test-container.sh); needs BuildKit or Buildah, which skip
#       # the unused from-source stage
#
# Both stages start from Debian 12, the distribution the project builds and is tested on, so the
# runtime stage installs exactly the Debian packages (packages.txt) whose libraries the binaries
# were linked against. The CUDA driver (libcuda) comes from the host through the NVIDIA container
# toolkit; the CUDA runtime and CUPTI the build used are carried in /usr/local/lib/dequantd.
ARG ARTIFACTS=from-source

# ---- from-source: build dequantd and dequantctl, make the bundled model, collect /out --------
FROM debian:12-slim AS from-source
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# pypi: nvcc and the CUDA runtime from NVIDIA's PyPI wheels (as on the project's build machines);
# none: the CPU backend only.
ARG CUDA=pypi
ENV DEBIAN_FRONTEND=noninteractive
# Not pinned (DL3008): Debian 12's current versions, as scripts/install-deps.sh installs them.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates python3 python3-venv \
      python3-pip libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libcivetweb-dev nlohmann-json3-dev libspdlog-dev \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/container/install-cuda-pypi.sh /usr/local/bin/
# The two steps that use pip (PyPI over HTTPS) read an extra CA bundle from the build secret
# pip_cert when one is given (behind a TLS-intercepting proxy: `docker build --secret
# id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt .`); it is not kept in the image.
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if [ "$CUDA" = pypi ]; then install-cuda-pypi.sh /usr/local/cuda; \
    elif [ "$CUDA" != none ]; then echo "CUDA must be pypi or none, got '$CUDA'" >&2; exit 1; fi
WORKDIR /src
COPY . .
RUN --mount=type=secret,id=pip_cert \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    cuda=OFF; if [ "$CUDA" = pypi ]; then cuda=ON; export PATH="/usr/local/cuda/bin:$PATH"; fi \
    && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
         -DDEQUANTD_CUDA="$cuda" \
    && ninja -C build dequantd dequantctl \
    && scripts/make-model.sh \
    && deploy/container/collect-artifacts.sh build models/smollm2-135m-awq /out

# ---- prebuilt: /out from the build context, made by collect-artifacts.sh ----------------------
FROM debian:12-slim AS prebuilt
COPY out/ /out/

FROM ${ARTIFACTS} AS artifacts

# ---- runtime: what users run (and CI runs) -----------------------------------------------------
FROM debian:12-slim AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=artifacts /out/packages.txt /tmp/packages.txt
# The Debian packages of the libraries the binaries link (versions: Debian 12's current ones, as
# in the build; not pinned (DL3008), so a rebuild picks up security updates).
# hadolint ignore=DL3008
RUN apt-get update \
    && xargs -a /tmp/packages.txt apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/packages.txt
COPY --from=artifacts /out/lib/ /usr/local/lib/dequantd/
# UID/GID 10001: not root, and not a UID a host or a cluster gives its own users. The tune cache
# ($XDG_CACHE_HOME/dequantd) is the one place dequantd writes: mount a volume there to keep it.
RUN echo /usr/local/lib/dequantd > /etc/ld.so.conf.d/dequantd.conf && ldconfig \
    && install -d -o 10001 -g 10001 /var/cache/dequantd
COPY --from=artifacts /out/bin/ /usr/local/bin/
COPY --from=artifacts /out/models/ /opt/dequantd/models/
# The NVIDIA container toolkit mounts the driver's compute libraries only when asked to (the
# nvidia/cuda images set the same). Which GPUs is left to `--gpus` or the device plugin.
ENV XDG_CACHE_HOME=/var/cache \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /opt/dequantd
EXPOSE 50051 9464
# SIGTERM (docker stop, Kubernetes): in-flight calls get --shutdown-deadline (5 s) to finish.
STOPSIGNAL SIGTERM
ENTRYPOINT ["dequantd", "--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9464"]
CMD ["--model=/opt/dequantd/models/smollm2-135m-awq"]
