//! Gold: business tables built by SQL over Silver (and over other models).
//!
//! A model is `{[gold] models_dir}/{name}.sql`, one SELECT in DataFusion SQL naming Silver
//! tables by their source names (`public.transactions`) and other models by name; it is
//! materialised as `gold/{name}`. [`model`] reads and orders the models (a cycle, an
//! unknown table or model is refused naming the model); [`refresh`] writes one (its
//! invariant: every version records the input versions it was computed from).

mod incremental;
pub mod model;
pub mod refresh;

pub use model::{Input, Model, ModelKey, Models};
pub use refresh::{GoldTable, Refreshed, GOLD_KEY};

/// The error of running `model`'s SQL over rows, without the row values the engine's
/// message may quote (a failed cast quotes the value): it reaches logs, `/readyz` and
/// `status`, which never hold row values (docs/security.md).
pub(crate) fn run_failed(model: &str, e: impl std::fmt::Display) -> crate::LakeError {
    crate::LakeError::Model {
        model: model.to_owned(),
        reason: crate::conditions::without_values(&e.to_string()),
    }
}

/// A Delta write of `table` that ran a model's SQL (a MERGE whose source is the model's
/// query), without the row values the message may quote; still retried (transient).
pub(crate) fn write_failed(
    table: &str,
) -> impl FnOnce(deltalake::DeltaTableError) -> crate::LakeError + '_ {
    move |e| crate::LakeError::Delta {
        table: table.to_owned(),
        source: deltalake::DeltaTableError::Generic(crate::conditions::without_values(
            &e.to_string(),
        )),
    }
}
