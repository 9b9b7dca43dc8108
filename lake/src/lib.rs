//! Delta Lake side of wal2delta: Bronze append with Kafka offsets in the commit, Silver
//! MERGE, masking and checks, Gold models and rules.
//!
//! Not built yet: the Bronze, Silver, Gold and rules stages come with their own issues.
//! The binary refuses to start those stages and says so.
