# Sourced by the ops/bench scripts: the binaries a benchmark measures.
#
# By default the benchmarks build the release profile and measure it. With
# WAL2DELTA_BENCH_BIN_DIR set they build nothing and take every binary (wal2delta,
# wal2delta-drain, wal2delta-bench-silver) from that directory instead: a build made with
# another profile, or of another commit, measured by this commit's script against the same
# floor. Sets BINS to the directory the binaries come from.
bench_binaries() {
  if [ -n "${WAL2DELTA_BENCH_BIN_DIR:-}" ]; then
    BINS=$WAL2DELTA_BENCH_BIN_DIR
    echo "== measuring the binaries in $BINS (not building)"
    for bin in wal2delta wal2delta-drain wal2delta-bench-silver; do
      [ -x "$BINS/$bin" ] || { echo "WAL2DELTA_BENCH_BIN_DIR=$BINS has no executable $bin; build it there or unset the variable" >&2; exit 1; }
    done
  else
    echo "== building (release)"
    # The three binaries built together: Cargo then resolves the same dependency features
    # for each benchmark and reuses their build (one binary alone would rebuild DataFusion).
    cargo build -q --release --bin wal2delta --bin wal2delta-drain --bin wal2delta-bench-silver
    BINS=$CARGO_TARGET_DIR/release
  fi
}
