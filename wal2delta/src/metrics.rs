//! Every metric name wal2delta exports, in one place (served by [`crate::endpoint`]).

/// Sessions (or rounds) of a stage started again after a transient failure, by `stage`.
pub const STAGE_RESTARTS: &str = "wal2delta_stage_restarts_total";
/// Failures that ended a stage's session or round, by `stage` and `class` (transient,
/// record, operator).
pub const STAGE_FAILURES: &str = "wal2delta_stage_failures_total";
/// 1 while a stage runs healthy, by `stage`.
pub const STAGE_UP: &str = "wal2delta_stage_up";
/// 1 once a stage stopped for an error that needs an operator, by `stage`.
pub const STAGE_FAILED: &str = "wal2delta_stage_failed";
/// Tables whose own work keeps failing while their stage goes on, by `stage`.
pub const STAGE_FAILING_TABLES: &str = "wal2delta_stage_failing_tables";
/// Change events published to Kafka, by table and op.
pub const CAPTURE_EVENTS: &str = "wal2delta_capture_events_total";
/// Events sent to the dead-letter topic, by table and reason kind.
pub const CAPTURE_DLQ_EVENTS: &str = "wal2delta_capture_dlq_events_total";
/// TRUNCATEs not published because `[capture] skip_truncate` is set, by table.
pub const CAPTURE_TRUNCATES_SKIPPED: &str = "wal2delta_capture_truncates_skipped_total";
/// Transactions whose every event Kafka acknowledged.
pub const CAPTURE_TRANSACTIONS: &str = "wal2delta_capture_transactions_total";
/// Events sent and not yet acknowledged by Kafka.
pub const CAPTURE_IN_FLIGHT: &str = "wal2delta_capture_in_flight_events";
/// The LSN confirmed to the slot, as a number (bytes).
pub const CAPTURE_CONFIRMED_LSN: &str = "wal2delta_capture_confirmed_lsn";
/// Tables capture added to the publication because they match `[source] tables`.
pub const CAPTURE_TABLES_ADDED: &str = "wal2delta_capture_tables_added_total";
/// Tables matching `[source] tables` that capture could not add to the publication, at its
/// last look.
pub const CAPTURE_TABLES_NOT_ADDED: &str = "wal2delta_capture_tables_not_added";
/// Tables that left the publication while capture ran: dropped, removed by hand, or removed
/// by capture because they no longer match `[source] tables`.
pub const CAPTURE_TABLES_REMOVED: &str = "wal2delta_capture_tables_removed_total";
/// Tables the publication holds, as capture last saw it.
pub const CAPTURE_TABLES: &str = "wal2delta_capture_tables";
/// Schemas the registry refused, by table.
pub const CAPTURE_SCHEMA_REFUSED: &str = "wal2delta_capture_schema_refused_total";
/// WAL bytes between the server's current position and the slot's confirmed position.
pub const SLOT_LAG_BYTES: &str = "wal2delta_slot_lag_bytes";
/// WAL bytes the slot makes the server retain (current − restart_lsn).
pub const SLOT_RETAINED_BYTES: &str = "wal2delta_slot_retained_bytes";
/// `safe_wal_size` of the slot: bytes that can still be written before it is invalidated
/// (absent when `max_slot_wal_keep_size` is unlimited).
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "wal2delta_slot_safe_wal_size_bytes";
/// 1 when the slot's wal_status is `lost`.
pub const SLOT_LOST: &str = "wal2delta_slot_lost";
/// 1 for the slot's current `wal_status` (label `status`: reserved, extended, unreserved, lost).
pub const SLOT_WAL_STATUS: &str = "wal2delta_slot_wal_status";
/// 1 when a walsender serves the slot.
pub const SLOT_ACTIVE: &str = "wal2delta_slot_active";
/// The server's effective `max_slot_wal_keep_size` in bytes (absent when unlimited).
pub const SLOT_MAX_WAL_KEEP_SIZE_BYTES: &str = "wal2delta_slot_max_wal_keep_size_bytes";
/// WAL written per second on the server, observed between health samples.
pub const SLOT_WAL_RATE_BYTES_PER_SECOND: &str = "wal2delta_slot_wal_rate_bytes_per_second";
/// Estimated seconds until the slot is invalidated: safe_wal_size ÷ WAL rate.
pub const SLOT_SECONDS_TO_INVALIDATION: &str = "wal2delta_slot_seconds_to_invalidation";
/// Logical decoding spill to disk on the server (`pg_stat_replication_slots`).
pub const SLOT_SPILL_BYTES: &str = "wal2delta_slot_spill_bytes";
pub const SLOT_SPILL_TRANSACTIONS: &str = "wal2delta_slot_spill_transactions";
/// Bytes of in-progress transactions streamed by the server (`pg_stat_replication_slots`).
pub const SLOT_STREAM_BYTES: &str = "wal2delta_slot_stream_bytes";
/// Streamed (large, in-progress) transactions that aborted: nothing of them is published.
pub const CAPTURE_STREAMED_ABORTED: &str = "wal2delta_capture_streamed_transactions_aborted_total";
/// Bytes of in-progress streamed transactions held by capture (disk and memory).
pub const CAPTURE_STREAM_BUFFER_BYTES: &str = "wal2delta_capture_stream_buffer_bytes";
/// Rows of a table read by the snapshot so far (label `table`).
pub const SNAPSHOT_ROWS_READ: &str = "wal2delta_snapshot_rows_read";
/// The planner's row estimate of a table being snapshotted (label `table`).
pub const SNAPSHOT_ROWS_ESTIMATE: &str = "wal2delta_snapshot_rows_estimate";
/// Rows of a table whose snapshot events Kafka acknowledged (label `table`).
pub const SNAPSHOT_ROWS_PUBLISHED: &str = "wal2delta_snapshot_rows_published";
/// Tables whose snapshot is not complete.
pub const SNAPSHOT_TABLES_PENDING: &str = "wal2delta_snapshot_tables_pending";
/// Seconds the snapshot waited because the slot retained more WAL than its budget.
pub const SNAPSHOT_THROTTLED: &str = "wal2delta_snapshot_throttled_seconds_total";
/// Heartbeat messages written to the source's WAL.
pub const CAPTURE_HEARTBEATS: &str = "wal2delta_capture_heartbeats_total";

/// Keys upserted into Silver, per table.
pub const SILVER_UPSERTS: &str = "wal2delta_silver_upserts_total";
/// Keys deleted from Silver, per table.
pub const SILVER_DELETES: &str = "wal2delta_silver_deletes_total";
/// Rows a Silver MERGE copied unchanged into new files, per table: a MERGE rewrites every
/// data file holding a changed key (copy-on-write), so this over the upserts and deletes
/// is what a change costs beyond itself (docs/silver.md, "Metrics").
pub const SILVER_ROWS_COPIED: &str = "wal2delta_silver_rows_copied_total";
/// Data files a Silver MERGE rewrote, per table.
pub const SILVER_FILES_REWRITTEN: &str = "wal2delta_silver_files_rewritten_total";
/// Silver's watermark per table: every source transaction at or below it is applied.
pub const SILVER_WATERMARK_LSN: &str = "wal2delta_silver_watermark_lsn";
/// Source transactions read from Bronze but not yet whole there, per table.
pub const SILVER_WAITING_TRANSACTIONS: &str = "wal2delta_silver_waiting_transactions";
/// Seconds one Silver round of one table took.
pub const SILVER_ROUND_SECONDS: &str = "wal2delta_silver_round_seconds";
/// Silver rounds that failed, per table and class.
pub const SILVER_ERRORS: &str = "wal2delta_silver_errors_total";
/// Rows appended to Bronze tables (label `table`).
pub const BRONZE_ROWS: &str = "wal2delta_bronze_rows_total";
/// Payload bytes of the events appended to Bronze (label `table`).
pub const BRONZE_BYTES: &str = "wal2delta_bronze_bytes_total";
/// Bronze commits (label `table`).
pub const BRONZE_COMMITS: &str = "wal2delta_bronze_commits_total";
/// Seconds from the start of a micro-batch commit to its end.
pub const BRONZE_BATCH_SECONDS: &str = "wal2delta_bronze_batch_seconds";
/// Events in Kafka not yet committed to Bronze (labels `topic`, `partition`).
pub const BRONZE_CONSUMER_LAG: &str = "wal2delta_bronze_consumer_lag_events";
/// Commits refused because another writer committed the same partitions first.
pub const BRONZE_COMMIT_CONFLICTS: &str = "wal2delta_bronze_commit_conflicts_total";
/// Offsets the broker no longer held when Bronze reached them.
pub const BRONZE_OFFSET_GAPS: &str = "wal2delta_bronze_offset_gaps_total";
/// Tombstones (null-value messages capture sends after deletes) Bronze passed over
/// (label `table`): not change events, stored as no row.
pub const BRONZE_TOMBSTONES: &str = "wal2delta_bronze_tombstones_skipped_total";
/// Tables rewritten under a wider column type (`int` → `bigint`), labels `layer` and
/// `table`.
pub const TYPE_WIDENINGS: &str = "wal2delta_type_widenings_total";
/// Commits of one Bronze table that failed (labels `table`, `kind`: `error` or `panic`);
/// the table retries with its own backoff while the others go on.
pub const BRONZE_TABLE_FAILURES: &str = "wal2delta_bronze_table_failures_total";
/// Partitions this bronze writer holds.
pub const BRONZE_PARTITIONS: &str = "wal2delta_bronze_partitions_assigned";
/// Events waiting in Kafka while this bronze writer has held no partition for 30 s or more
/// (0 otherwise): a writer left idle by its consumer group.
pub const BRONZE_UNOWNED_EVENTS: &str = "wal2delta_bronze_unowned_events";
/// Streamed changes Silver read again at or below its watermark and dropped as copies
/// (label `table`).
pub const SILVER_DUPLICATES: &str = "wal2delta_silver_duplicates_dropped_total";
/// Quarantine records no resolution names yet (label `stage`).
pub const QUARANTINE_OPEN: &str = "wal2delta_quarantine_open_records";
/// Records quarantined (labels `stage`, `reason`).
pub const QUARANTINED: &str = "wal2delta_quarantined_records_total";
/// Small files removed by compaction (labels `layer`: bronze, silver, gold or quarantine;
/// `table`).
pub const LAKE_FILES_COMPACTED: &str = "wal2delta_lake_files_compacted_total";
/// Compaction/checkpoint passes that failed (labels `layer`, `table`).
pub const LAKE_MAINTENANCE_FAILURES: &str = "wal2delta_lake_maintenance_failures_total";
/// Gold model versions written (labels `model`, `mode`: `full` when rewritten whole,
/// `incremental` when the changed keys of a keyed model were merged).
pub const GOLD_REFRESHES: &str = "wal2delta_gold_refreshes_total";
/// Keys of keyed Gold models recomputed by incremental refreshes (label `model`).
pub const GOLD_KEYS_RECOMPUTED: &str = "wal2delta_gold_keys_recomputed_total";
/// Rows of a Gold model's last version written whole (label `model`).
pub const GOLD_ROWS: &str = "wal2delta_gold_rows";
/// Time to refresh one Gold model (label `model`).
pub const GOLD_REFRESH_SECONDS: &str = "wal2delta_gold_refresh_seconds";
/// Gold model refreshes that failed (label `model`); the model retries after a backoff.
pub const GOLD_FAILURES: &str = "wal2delta_gold_failures_total";
/// Rule evaluations: row versions × rules evaluated on them (label `table`; every active
/// rule of a table sees every changed row).
pub const RULES_EVALUATIONS: &str = "wal2delta_rules_evaluations_total";
/// Rows entering or leaving a rule (labels `rule`, `origin`: stream or backfill).
pub const RULES_TRANSITIONS: &str = "wal2delta_rules_transitions_total";
/// Rows a rule could not be evaluated on, quarantined (label `rule`).
pub const RULES_ERRORS: &str = "wal2delta_rules_errors_total";
/// Row versions one rule was evaluated on (label `rule`).
pub const RULES_RULE_EVALUATIONS: &str = "wal2delta_rules_rule_evaluations_total";
/// Seconds one rule's condition took in a round (label `rule`; the casts several rules
/// share are computed once and counted in none): which rules cost the most.
pub const RULES_RULE_SECONDS: &str = "wal2delta_rules_rule_evaluation_seconds";
/// Time to evaluate a round's rules and compute its transitions (label `table`).
pub const RULES_EVAL_SECONDS: &str = "wal2delta_rules_evaluation_seconds";
/// Source commit → transition committed, seconds, for the newest transition of a round
/// (label `table`).
pub const RULES_LAG_SECONDS: &str = "wal2delta_rules_lag_seconds";
/// Backfills run (a rule set installed on a table; label `table`).
pub const RULES_BACKFILLS: &str = "wal2delta_rules_backfills_total";
/// Active rules that cannot be compiled against their table, or are disabled past their
/// evaluation budget, and are skipped (label `table`).
pub const RULES_INVALID: &str = "wal2delta_rules_invalid";
/// Rules disabled because their condition cost more than `[rules] max_eval_us_per_row`
/// per row (label `rule`).
pub const RULES_DISABLED: &str = "wal2delta_rules_disabled_total";
/// Rule files that failed validation and were not installed (the running set goes on).
pub const RULES_RELOAD_FAILURES: &str = "wal2delta_rules_reload_failures_total";
/// Early filter: change events of the stream the rules saw (row versions, deletes
/// included), per table, in rounds Silver committed (label `table`).
pub const RULES_FILTER_EVENTS_IN: &str = "wal2delta_rules_filter_events_in_total";
/// Early filter: change events that matched at least one rule and were published to
/// `[rules] filter_topic` (label `table`).
pub const RULES_FILTER_EVENTS_OUT: &str = "wal2delta_rules_filter_events_out_total";
/// Early filter: events in ÷ events out since the daemon started (label `table`; absent
/// until an event passes).
pub const RULES_FILTER_REDUCTION: &str = "wal2delta_rules_filter_reduction";
/// Messages Kafka acknowledged on a rules output topic (label `topic`), repeats included
/// (a round that failed after publishing publishes again).
pub const RULES_PUBLISHED: &str = "wal2delta_rules_published_total";
/// Lookups (docs/rules.md, "Lookups"): rows looked up in a related table, per row and
/// related table, after passing their rules' own conditions (label `table`).
pub const RULES_LOOKUPS: &str = "wal2delta_rules_lookups_total";
/// Rows whose rules' own conditions failed, so their related row was never looked up
/// (label `table`).
pub const RULES_LOOKUPS_AVOIDED: &str = "wal2delta_rules_lookups_avoided_total";
/// Rows looked up while the related table's Silver watermark was behind their commit
/// (after a lookup timeout, or a backfill while the related table lags; label `table`).
pub const RULES_LOOKUPS_STALE: &str = "wal2delta_rules_lookups_stale_total";
/// Rows whose related row had changed again after their own commit when looked up (the
/// related table was applied further): the lookup saw a later state (label `table`).
pub const RULES_LOOKUPS_NEWER: &str = "wal2delta_rules_lookups_newer_total";
/// Times a table's changes were held for `[rules] lookup_timeout_ms` waiting for a table
/// its rules look up, then evaluated against it as it was (label `table`).
pub const RULES_LOOKUP_TIMEOUTS: &str = "wal2delta_rules_lookup_timeouts_total";
