//! How a failure must be handled.

/// What a failure means for the pipeline. Every error type in wal2delta can say which of
/// these it is, and the stage loops act on the class, not on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The outside world is briefly unavailable (broker down, connection reset): wait and
    /// retry without acknowledging anything.
    Transient,
    /// One record cannot be handled (undecodable value, schema refused): send it to the
    /// quarantine or DLQ with a reason and go on.
    Record,
    /// Configuration or environment is wrong (bad password, missing privilege, slot gone):
    /// stop with a message that says how to fix it.
    Operator,
}
