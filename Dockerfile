# syntax=docker/dockerfile:1
# Images of sbx on Debian 12, built from this repository:
#
#   docker build -t sbx/sbx-server .                     # the default target: sbx-server
#   docker build --target sandboxd -t sbx/sbx-sandboxd .  # the daemon inside sandboxes
#
# The build stage compiles the release preset with scripts/build (gcc, -O2); the runtime
# stages are debian:12-slim with only the shared libraries the binaries load, running as
# the unprivileged user 65532 (the uid the Helm chart's securityContext expects).
# tests/chart/dockerfile_test.py checks this file statically: the packages exist, the
# runtime stage provides every shared library of the built binaries, and the files it
# copies are what the build makes.

# ---------------------------------------------------------------------------- build
FROM debian:12 AS build
ARG DEBIAN_FRONTEND=noninteractive
# The build and library packages of scripts/install-deps (not its test tools).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates cmake ninja-build ccache g++ pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev \
      librocksdb-dev libcpprest-dev libssl-dev prometheus-cpp-dev libgtest-dev libgmock-dev \
      libbenchmark-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libyaml-cpp-dev \
      libconcurrentqueue-dev libjemalloc-dev libseccomp-dev zlib1g-dev libc-ares-dev libre2-dev \
      libarchive-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/build release sbx-server sbx-sandboxd \
 && mkdir -p /out \
 && cp build/release/src/cmd/sbx-server build/release/src/cmd/sbx-sandboxd /out/ \
 && strip /out/sbx-server /out/sbx-sandboxd

# ---------------------------------------------------------------------------- sandboxd
# sbx-sandboxd links gRPC, protobuf and abseil statically (it starts once per sandbox);
# spdlog and fmt stay shared (Debian ships no static spdlog), and libarchive with its
# libraries (the tar streams of file transfers).
FROM debian:12-slim AS sandboxd
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends libstdc++6 libatomic1 libspdlog1.10 libfmt9 \
      libarchive13 libacl1 libicu72 liblzma5 libnettle8 libxml2 libzstd1 liblz4-1 libbz2-1.0 \
      zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/sbx-sandboxd /usr/local/bin/sbx-sandboxd
USER 65532:65532
# In a pod: serve on the container port named sbx-sandboxd (docs/kubernetes.md).
ENTRYPOINT ["/usr/local/bin/sbx-sandboxd"]
CMD ["--listen=0.0.0.0:7070", "--workspace=/tmp"]

# ---------------------------------------------------------------------------- server
FROM debian:12-slim AS server
ARG DEBIAN_FRONTEND=noninteractive
# The shared libraries sbx-server and sbx-sandboxd load (ldd), by Debian package.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates libstdc++6 zlib1g libbz2-1.0 liblz4-1 libzstd1 libsnappy1v5 \
      libgflags2.2 libabsl20220623 libprotobuf32 libgrpc29 libgrpc++1.51 libc-ares2 \
      libre2-9 libssl3 libcpprest2.10 libbrotli1 libspdlog1.10 libfmt9 libyaml-cpp0.7 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libatomic1 libjemalloc2 \
      libseccomp2 libarchive13 libacl1 libicu72 liblzma5 libnettle8 libxml2 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 sbx \
 && useradd --uid 65532 --gid 65532 --home-dir /var/lib/sbx --no-create-home \
      --shell /usr/sbin/nologin sbx \
 && mkdir -p /var/lib/sbx \
 && chown 65532:65532 /var/lib/sbx
COPY --from=build /out/sbx-server /usr/local/bin/sbx-server
# sbx-server finds sbx-sandboxd next to itself (used only by --runtime local).
COPY --from=build /out/sbx-sandboxd /usr/local/bin/sbx-sandboxd
USER 65532:65532
WORKDIR /var/lib/sbx
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/sbx-server"]
CMD ["--listen=0.0.0.0:50051", "--data_dir=/var/lib/sbx/data", "--runtime=none"]
