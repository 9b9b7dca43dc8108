//! Committing one micro-batch: each table prepared against its current schema, the events
//! that cannot be stored put into the quarantine table first, then one Bronze commit per
//! table, tables in parallel, each outcome settled on its own (a table's failure pauses
//! that table only).

use std::collections::BTreeMap;

use wal2delta_lake::bronze::OffsetRange;

use super::*;
use crate::events::BronzeEventsQuarantined;

/// A table whose events are ready to append.
struct Ready {
    topic: String,
    ranges: BTreeMap<i32, OffsetRange>,
    table: BronzeTable,
    prepared: batch::Prepared,
}

/// An append running in a task of its own.
struct Appending {
    topic: String,
    name: String,
    ranges: BTreeMap<i32, OffsetRange>,
    payload_bytes: usize,
    task: tokio::task::JoinHandle<Appended>,
}

/// What an append task gives back: the table handle, and what happened.
struct Appended {
    table: BronzeTable,
    rows: usize,
    /// Commits another writer won while this one retried.
    conflicts: u64,
    outcome: Result<AppendOutcome, LakeError>,
}

impl Session<'_> {
    /// Commits the micro-batch: quarantine records first, then one Bronze commit per table
    /// (tables in parallel).
    pub(super) async fn flush(&mut self) -> Result<(), SessionError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let events = self.batch.events;
        let topics = self.batch.take();
        let ready = self.prepare(topics).await?;
        // Each table commits in a task of its own: a panic in the writer (deltalake-core
        // panics on some values it cannot describe in file statistics) ends that task only,
        // and becomes that table's failure.
        let appending: Vec<Appending> = ready.into_iter().map(spawn_append).collect();
        for a in appending {
            self.settle(a).await?;
        }
        metrics::histogram!(m::BRONZE_BATCH_SECONDS).record(started.elapsed().as_secs_f64());
        tracing::debug!(
            events,
            ms = started.elapsed().as_millis() as u64,
            "micro-batch committed"
        );
        self.report_lag();
        Ok(())
    }

    /// Prepares each topic's events against its table's current schema, and stores what
    /// cannot go into a table in the quarantine table.
    async fn prepare(
        &mut self,
        topics: BTreeMap<String, TopicBuffer>,
    ) -> Result<Vec<Ready>, SessionError> {
        let mut ready = Vec::new();
        let mut quarantined = Vec::new();
        for (topic, mut buf) in topics {
            let mut table = match self.tables.remove(&topic) {
                Some(t) => t,
                None => match LakeOffsets::table_for(self.lake, &self.topics, &topic) {
                    Some(t) => {
                        // At 0 from the start, so an alert or a panel on their increase
                        // sees the first.
                        for kind in ["error", "panic"] {
                            metrics::counter!(m::BRONZE_TABLE_FAILURES, "table" => t.name().to_owned(), "kind" => kind)
                                .increment(0);
                        }
                        metrics::counter!(m::BRONZE_COMMIT_CONFLICTS, "table" => t.name().to_owned())
                            .increment(0);
                        t
                    }
                    None => continue, // not a table topic; the subscription excludes these
                },
            };
            if let Err(e) = table.load().await {
                let name = table.name().to_owned();
                self.tables.insert(topic.clone(), table);
                self.table_failed(&topic, &name, e.into())?;
                continue;
            }
            let schema = table.arrow_schema();
            let prepared = buf.prepare(schema.as_deref());
            quarantined.extend(prepared.quarantined.iter().cloned());
            ready.push(Ready {
                topic,
                ranges: buf.ranges,
                table,
                prepared,
            });
        }
        self.store_quarantined(quarantined).await?;
        Ok(ready)
    }

    async fn store_quarantined(
        &mut self,
        records: Vec<wal2delta_quarantine::QuarantineRecord>,
    ) -> Result<(), SessionError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut by_reason: HashMap<String, u64> = HashMap::new();
        for r in &records {
            *by_reason.entry(r.reason_code.clone()).or_default() += 1;
        }
        let stored = self
            .quarantine
            .append(QuarantineStage::Bronze, records)
            .await?;
        for (reason, events) in by_reason {
            BronzeEventsQuarantined {
                reason: &reason,
                events,
            }
            .emit();
        }
        tracing::debug!(stored, "quarantine records appended");
        Ok(())
    }

    /// Takes one table's append result: records the commit, re-reads what another writer
    /// stored first, or pauses the table after a failure.
    async fn settle(&mut self, a: Appending) -> Result<(), SessionError> {
        let Appending {
            topic,
            name,
            ranges,
            payload_bytes,
            task,
        } = a;
        let done = match task.await {
            Ok(done) => done,
            Err(e) => {
                let reason = match e.try_into_panic() {
                    Ok(p) => panic_message(p.as_ref()),
                    Err(e) => e.to_string(),
                };
                // The handle went down with the task; a new one reloads the table.
                if let Some(t) = LakeOffsets::table_for(self.lake, &self.topics, &topic) {
                    self.tables.insert(topic.clone(), t);
                }
                return self.table_failed(&topic, &name, TableFailure::Panicked(reason));
            }
        };
        self.tables.insert(topic.clone(), done.table);
        if done.conflicts > 0 {
            metrics::counter!(m::BRONZE_COMMIT_CONFLICTS, "table" => name.clone())
                .increment(done.conflicts);
        }
        match done.outcome {
            Ok(AppendOutcome::Committed {
                version,
                schema_changed,
                widened,
                ..
            }) => {
                self.supervisor.healthy();
                if self.failing.succeeded(self.supervisor, &topic) {
                    tracing::info!(table = %name, "Bronze table committing again");
                }
                metrics::counter!(m::BRONZE_ROWS, "table" => name.clone())
                    .increment(done.rows as u64);
                metrics::counter!(m::BRONZE_BYTES, "table" => name.clone())
                    .increment(payload_bytes as u64);
                metrics::counter!(m::BRONZE_COMMITS, "table" => name.clone()).increment(1);
                if !widened.is_empty() {
                    metrics::counter!(m::TYPE_WIDENINGS, "layer" => "bronze", "table" => name.clone())
                        .increment(1);
                }
                if version == 0 {
                    tracing::info!(table = %name, "Bronze table created");
                } else if schema_changed {
                    tracing::info!(table = %name, version, "Bronze table schema evolved (columns added)");
                }
                for (p, r) in &ranges {
                    if let Some(o) = self.owned.get_mut(&(topic.clone(), *p)) {
                        o.committed_next = Some(r.last + 1);
                    }
                }
                tracing::debug!(table = %name, version, rows = done.rows, "Bronze commit");
                Ok(())
            }
            Ok(AppendOutcome::NoTable) => {
                // Every event was quarantined and the table does not exist yet: the
                // quarantine table's own offsets keep them from being stored twice.
                Ok(())
            }
            Ok(AppendOutcome::Stale { stored }) => {
                metrics::counter!(m::BRONZE_COMMIT_CONFLICTS, "table" => name.clone()).increment(1);
                tracing::info!(table = %name, "another writer stored these offsets first; re-reading from the table's offsets");
                for p in ranges.keys() {
                    let next = stored.get(p).copied().flatten().map(|s| s + 1);
                    self.reseek(&topic, *p, next);
                }
                Ok(())
            }
            Err(LakeError::SchemaConflict { reason, .. }) => {
                // The table changed under us (another writer evolved it): re-read and
                // prepare against the new schema.
                tracing::info!(table = %name, reason = %reason, "table schema changed during the commit; re-reading");
                let partitions: Vec<i32> = ranges.keys().copied().collect();
                let stored = match self.tables.get_mut(&topic) {
                    Some(t) => t.stored_offsets(&topic, &partitions).await,
                    None => Ok(Default::default()),
                };
                match stored {
                    Ok(stored) => {
                        for p in partitions {
                            let next = stored.get(&p).copied().flatten().map(|s| s + 1);
                            self.reseek(&topic, p, next);
                        }
                        Ok(())
                    }
                    Err(e) => self.table_failed(&topic, &name, e.into()),
                }
            }
            Err(e) => self.table_failed(&topic, &name, e.into()),
        }
    }
}

fn spawn_append(r: Ready) -> Appending {
    let Ready {
        topic,
        ranges,
        mut table,
        prepared,
    } = r;
    let name = table.name().to_owned();
    let append = Append {
        topic: topic.clone(),
        batches: prepared.batches,
        ranges: ranges.clone(),
    };
    let task = tokio::spawn(async move {
        let rows: usize = append.batches.iter().map(|b| b.num_rows()).sum();
        let conflicts_before = table.conflicts();
        let outcome = table.append(append).await;
        let conflicts = table.conflicts() - conflicts_before;
        Appended {
            table,
            rows,
            conflicts,
            outcome,
        }
    });
    Appending {
        topic,
        name,
        ranges,
        payload_bytes: prepared.payload_bytes,
        task,
    }
}
