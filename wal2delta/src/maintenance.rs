//! Scheduled compaction and checkpoints of the lake's tables (`[bronze]`, `[silver]`,
//! `[gold]` `maintenance_interval_s`).
//!
//! Bronze tables are maintained by a task beside ingestion: Bronze only appends, and a
//! compaction (`dataChange = false`) never conflicts with an append. Silver and Gold
//! tables are rewritten by MERGE, which does conflict with a concurrent compaction of the
//! same files, so their stages maintain them between rounds, in the same task. The
//! quarantine tables, appended to by every stage, go with Silver's.

use std::time::{Duration, Instant};

use url::Url;
use wal2delta_lake::maintenance::maintain;

use crate::metrics as m;

/// When the next pass is due; never with an interval of 0.
pub struct Schedule {
    every: Option<Duration>,
    next: Instant,
}

impl Schedule {
    /// The first pass one interval from now (a restarting daemon does not compact at once).
    pub fn every_s(interval_s: u64) -> Self {
        let every = (interval_s > 0).then(|| Duration::from_secs(interval_s));
        Schedule {
            every,
            next: Instant::now() + every.unwrap_or_default(),
        }
    }

    /// Whether a pass is due now; if so, the next one is one interval later.
    pub fn due(&mut self) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        if Instant::now() < self.next {
            return false;
        }
        self.next = Instant::now() + every;
        true
    }
}

/// Compacts (into files of about `target` bytes) and checkpoints each table of `layer`,
/// removing the log entries older than its retention (`[lake] log_retention_s` where
/// set and shorter than the table's own); a failure is logged and counted per table and
/// never stops the caller.
pub async fn maintain_tables(
    layer: &'static str,
    tables: Vec<(String, Url)>,
    target: u64,
    log_retention: Option<Duration>,
) {
    for (name, url) in tables {
        let started = Instant::now();
        // In a task of its own: a panic in the writer (compaction rewrites files and their
        // statistics) fails this table's maintenance, not the stage.
        let task = {
            let name = name.clone();
            tokio::spawn(async move { maintain(&name, &url, target, log_retention).await })
        };
        let outcome = match task.await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(format!("maintenance task ended: {e}")),
        };
        match outcome {
            // No table there yet (maintain leaves a missing table alone).
            Ok(r) if r.checkpoint_version.is_none() => {
                tracing::debug!(layer, table = %name, "no table to maintain yet");
            }
            Ok(r) => {
                metrics::counter!(m::LAKE_FILES_COMPACTED, "layer" => layer, "table" => name.clone())
                    .increment(r.files_removed);
                // At 0 once the table was maintained, so an alert on its increase sees the
                // first failure.
                metrics::counter!(m::LAKE_MAINTENANCE_FAILURES, "layer" => layer, "table" => name.clone())
                    .increment(0);
                tracing::info!(layer, table = %name, files_removed = r.files_removed, files_added = r.files_added, checkpoint = ?r.checkpoint_version, log_entries_removed = r.log_entries_removed, ms = started.elapsed().as_millis() as u64, "{} table compacted and checkpointed", capitalized(layer));
            }
            Err(e) => {
                metrics::counter!(m::LAKE_MAINTENANCE_FAILURES, "layer" => layer, "table" => name.clone())
                    .increment(1);
                tracing::warn!(layer, table = %name, error = %e, "{layer} maintenance failed; the stage goes on, retrying next interval");
            }
        }
    }
}

fn capitalized(layer: &str) -> String {
    let mut c = layer.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_of_zero_is_never_due_and_others_wait_one_interval() {
        assert!(!Schedule::every_s(0).due());
        let mut s = Schedule::every_s(3600);
        assert!(!s.due(), "not at once");
        s.next = Instant::now();
        assert!(s.due());
        assert!(!s.due(), "then one interval later");
        assert_eq!(capitalized("silver"), "Silver");
    }
}
