//! The format version carried by every record of the state topics (positions, snapshot
//! progress): written as a `format` field beside the record's own, checked on read
//! ([`wal2delta_model::format`]). A record of a newer format stops the reader instead of
//! being misread; one without the field (an earlier release's) has the same shape.

use serde::{Deserialize, Serialize};
use wal2delta_model::format::{check_state, FormatCheck, STATE_FORMAT};

use crate::StreamError;

#[derive(Serialize)]
struct Stamped<'a, T: Serialize> {
    format: u32,
    #[serde(flatten)]
    record: &'a T,
}

#[derive(Deserialize)]
struct FormatOnly {
    #[serde(default)]
    format: Option<u32>,
}

/// `record` as JSON with this binary's state format.
pub(crate) fn to_json<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(&Stamped {
        format: STATE_FORMAT,
        record,
    })
    .unwrap_or_default()
}

/// The record in `payload`, `None` when it is not one (not JSON, another shape); an error
/// when a newer release wrote it.
pub(crate) fn from_json<T: for<'de> Deserialize<'de>>(
    topic: &str,
    payload: &[u8],
) -> Result<Option<T>, StreamError> {
    if let Ok(FormatOnly { format }) = serde_json::from_slice::<FormatOnly>(payload) {
        if let FormatCheck::Newer(found) = check_state(format) {
            return Err(StreamError::StateFormat {
                topic: topic.to_owned(),
                found,
                ours: STATE_FORMAT,
            });
        }
    }
    Ok(serde_json::from_slice::<T>(payload).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::positions::PositionRecord;

    #[test]
    fn records_carry_the_format_and_a_newer_one_is_refused() {
        let rec = PositionRecord::new("s", "db/s", wal2delta_model::Lsn(42), 7);
        let json = to_json(&rec);
        let doc: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(doc["format"], STATE_FORMAT);
        assert_eq!(
            from_json::<PositionRecord>("t", &json).unwrap(),
            Some(rec.clone())
        );
        // An earlier release's record, without the field.
        let old = serde_json::to_vec(&rec).unwrap();
        assert_eq!(from_json::<PositionRecord>("t", &old).unwrap(), Some(rec));
        let newer = br#"{"format": 99, "slot": "s", "lsn": "0/2A", "ts_ms": 7}"#;
        let err = from_json::<PositionRecord>("cdc.positions", newer).unwrap_err();
        assert!(err.to_string().contains("cdc.positions") && err.to_string().contains("99"));
        assert_eq!(err.class(), wal2delta_model::ErrorClass::Operator);
        assert_eq!(from_json::<PositionRecord>("t", b"not json").unwrap(), None);
    }
}
