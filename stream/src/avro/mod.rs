//! Avro schemas and values for change events, and their Arrow form for Bronze.

pub mod arrow;
pub mod binary;
pub mod columnar;
pub mod columns;
pub mod cursor;
pub mod dates;
pub mod decimal;
pub mod envelope;
#[cfg(test)]
mod proptests;
pub mod temporal;
pub mod types;
