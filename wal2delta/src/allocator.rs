//! The process's malloc arenas.
//!
//! glibc gives threads their own malloc arenas (up to 8 per core) and keeps memory freed
//! in them for reuse, so a long-running process's RSS creeps towards the sum of every
//! thread's peak: a Silver round that merges 300,000 changes into a 10M-row table keeps
//! 1.5 GiB resident with the default arenas and 0.9 GiB with two, 5% slower
//! (docs/benchmarks.md, "Silver: one transaction of 5,000,000 changes"). The daemon caps
//! them at [`ARENAS`] unless `MALLOC_ARENA_MAX` is set, which glibc reads itself.

/// Arenas when the environment does not say.
const ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`ARENAS`] unless `MALLOC_ARENA_MAX` is set. Call before
/// any thread starts. Does nothing on other C libraries.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; called before any other
        // thread exists, so nothing allocates concurrently.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}
