//! The secrets the suite hands the daemon, listed so `tests/secrets_in_logs.rs` can look
//! for each in every log the suite wrote. A test that gives the daemon a new secret (a
//! password, a token or mask key) takes it from here or adds it here.

/// Password of the TLS-only role (`tests/source_tls.rs`).
pub const TLS_PASSWORD: &str = "tls-Pw-7f3kQz";
/// Password of the roles `tests/setup_privileges.rs` makes.
pub const LEAST_PRIVILEGE_PASSWORD: &str = "least-Priv-9dX2";
/// Password, token key and mask key of `tests/secrets_in_logs.rs` itself.
pub const REDACTION_PASSWORD: &str = "redact-Pw-4hT8w";
pub const REDACTION_TOKEN_KEY: &str = "redaction token key 5Gq1-never-logged";
pub const REDACTION_MASK_KEY: &str = "redaction mask key 8Lp3-never-logged";
/// The SCRAM password of the private Kafka broker (`tests/kafka_security.rs`) and the
/// wrong one it is refused with.
pub const KAFKA_PASSWORD: &str = "kafka-Pw-2mR9vZ";
pub const KAFKA_WRONG_PASSWORD: &str = "kafka-Wrong-6nB1";
/// The basic-auth password of the private schema registry (`tests/registry_security.rs`).
pub const REGISTRY_PASSWORD: &str = "registry-Pw-8sK3q";

/// Every secret above, and the keys other tests pass literally.
pub const ALL: &[&str] = &[
    TLS_PASSWORD,
    LEAST_PRIVILEGE_PASSWORD,
    REDACTION_PASSWORD,
    REDACTION_TOKEN_KEY,
    REDACTION_MASK_KEY,
    KAFKA_PASSWORD,
    KAFKA_WRONG_PASSWORD,
    REGISTRY_PASSWORD,
    // tests/registry_security.rs, refused
    "registry-Wrong-2xV",
    // tests/capture_tokenize.rs
    "a secret key for the test, 32b!",
    // tests/silver_reconcile.rs
    "masking key of the reconcile test",
    "token key of the reconcile test!",
];
