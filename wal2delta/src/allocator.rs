//! The process's allocator: jemalloc.
//!
//! Arrow, Parquet and DataFusion allocate and free buffers per batch, per column and per
//! value (Parquet's dictionary interner, the statistics of every file). Under the
//! end-to-end load glibc's malloc took 20–45% of Bronze's and Silver's CPU, much of it
//! consolidating and unlinking free chunks (docs/benchmarks.md, "The allocator"). jemalloc
//! keeps size-classed thread caches and returns freed pages to the system after a decay,
//! so a long-running process's RSS follows its working set (glibc kept what every
//! thread's arena had held at its peak, which the daemon used to cap at two arenas).
//!
//! Tunable without a rebuild through `_RJEM_MALLOC_CONF` (jemalloc's `MALLOC_CONF`, named
//! for the prefixed build), e.g. `narenas:2,dirty_decay_ms:1000`.

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
