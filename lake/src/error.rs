//! Errors of the lake side, each classified.

use wal2delta_model::ErrorClass;

#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// `[lake] uri` cannot be used.
    #[error("Invalid lake URI {uri:?}: {reason}")]
    Uri { uri: String, reason: String },
    /// Reading or writing a Delta table failed (storage unavailable, I/O): retried.
    #[error("Delta table {table}: {source}")]
    Delta {
        table: String,
        #[source]
        source: deltalake::DeltaTableError,
    },
    /// The batch's schema cannot be merged into the table's: its rows go to quarantine.
    #[error("the schema of {table} cannot take the batch: {reason}")]
    SchemaConflict { table: String, reason: String },
    /// Rows could not be turned into a record batch: its rows go to quarantine.
    #[error("cannot build the rows of {table}: {reason}")]
    Rows { table: String, reason: String },
    /// A masking policy or quality check of the table cannot run: fix `[silver]` config.
    #[error("the [silver] policy of {table} cannot be applied: {reason} (fix [silver] mask/checks in the config and restart)")]
    Policy { table: String, reason: String },
    /// A Gold model cannot be read, planned or run: fix its SQL file.
    #[error("gold model {model}: {reason} (fix {model}.sql in [gold] models_dir)")]
    Model { model: String, reason: String },
    /// The table was written in a lake format this binary does not write
    /// ([`wal2delta_model::format`]): a newer one (run the newer release) or an older one
    /// (`wal2delta upgrade`).
    #[error("{table} is in lake format {found}, this binary writes format {ours}: {fix}")]
    Format {
        table: String,
        found: String,
        ours: u32,
        fix: &'static str,
    },
    /// The table holds another source's rows (docs/operations.md, "Several databases,
    /// one lake"): writing it would mix two databases in one table.
    #[error("{table} is written by source {found:?}, and this daemon is source {ours:?}: two sources share one lake; give each its own [source] name (its tables then live under {{[lake] uri}}/{{name}}/), or its own [lake] uri")]
    Source {
        table: String,
        found: String,
        ours: String,
    },
    /// A rules output (a Kafka topic, docs/rules.md) did not take a round: the round is
    /// not committed and is tried again (`transient`), or it needs an operator.
    #[error("rules output {output} of {table}: {reason}")]
    Output {
        output: String,
        table: String,
        reason: String,
        transient: bool,
    },
}

impl LakeError {
    pub fn class(&self) -> ErrorClass {
        match self {
            LakeError::Uri { .. }
            | LakeError::Policy { .. }
            | LakeError::Model { .. }
            | LakeError::Format { .. }
            | LakeError::Source { .. } => ErrorClass::Operator,
            LakeError::Delta { .. } => ErrorClass::Transient,
            LakeError::SchemaConflict { .. } | LakeError::Rows { .. } => ErrorClass::Record,
            LakeError::Output { transient, .. } => {
                if *transient {
                    ErrorClass::Transient
                } else {
                    ErrorClass::Operator
                }
            }
        }
    }

    pub(crate) fn delta(
        table: &impl std::fmt::Display,
    ) -> impl FnOnce(deltalake::DeltaTableError) -> LakeError + '_ {
        move |source| LakeError::Delta {
            table: table.to_string(),
            source,
        }
    }
}
