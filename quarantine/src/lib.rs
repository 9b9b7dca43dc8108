//! The quarantine record and table every stage uses, DLQ handling and replay.
//!
//! Not built yet beyond the capture DLQ (which lives in `wal2delta-stream`); the quarantine
//! table comes with the Bronze/Silver issues.
