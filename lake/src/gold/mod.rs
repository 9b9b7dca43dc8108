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
