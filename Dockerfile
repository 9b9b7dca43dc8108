# Builds the wal2delta binary for docker-compose.yml.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin wal2delta

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/wal2delta /usr/local/bin/wal2delta
ENTRYPOINT ["wal2delta"]
