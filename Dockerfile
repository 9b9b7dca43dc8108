# The wal2delta daemon for docker-compose.yml (or any container platform).
#
# Dependencies are compiled in a layer of their own (cargo-chef: a recipe made from the
# manifests and Cargo.lock only), so changing wal2delta's sources rebuilds only its crates.
# The image runs as the unprivileged user `wal2delta`, keeps the lake under
# /var/lib/wal2delta/lake, exposes the metrics port and checks /healthz.
# The toolchain is pinned (the one the repository is built and tested with).
FROM rust:1.95.0-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.71
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
# librdkafka is built from source with OpenSSL (TLS and SASL/SCRAM to Kafka).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libssl-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
COPY --from=planner /src/recipe.json recipe.json
# The dependency layer: rebuilt only when Cargo.toml or Cargo.lock change.
# Only what the daemon needs: not the tests', benchmarks' or development servers' crates.
RUN cargo chef cook --release --recipe-path recipe.json --bin wal2delta
COPY . .
# `wal2delta --version` names the commit; the build context has no .git, so pass it:
# docker build --build-arg WAL2DELTA_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG WAL2DELTA_COMMIT=unknown
RUN WAL2DELTA_COMMIT="$WAL2DELTA_COMMIT" cargo build --release --locked --bin wal2delta

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/wal2delta --create-home wal2delta \
 && mkdir -p /var/lib/wal2delta/lake /etc/wal2delta \
 && chown -R wal2delta:wal2delta /var/lib/wal2delta
COPY --from=build /src/target/release/wal2delta /usr/local/bin/wal2delta
USER wal2delta
WORKDIR /var/lib/wal2delta
ENV WAL2DELTA_CONFIG=/etc/wal2delta/wal2delta.toml
# [metrics] listen: set WAL2DELTA__METRICS__LISTEN=0.0.0.0:9187 to scrape from outside.
EXPOSE 9187
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD curl -fsS http://127.0.0.1:9187/healthz >/dev/null || exit 1
ENTRYPOINT ["wal2delta"]
CMD ["run"]
