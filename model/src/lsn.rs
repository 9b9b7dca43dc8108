//! PostgreSQL log sequence numbers.

use std::fmt;
use std::str::FromStr;

/// A position in the PostgreSQL write-ahead log.
///
/// Displayed and parsed in PostgreSQL's own `XXXXXXXX/XXXXXXXX` form so that every log
/// line and `status` figure can be pasted into `pg_replication_slots` queries.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text was not an LSN of the form `XXX/XXX`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Invalid LSN {0:?}: expected two hexadecimal numbers separated by '/', like 0/16B3748")]
pub struct LsnParseError(pub String);

impl FromStr for Lsn {
    type Err = LsnParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || LsnParseError(s.to_owned());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<Lsn> for String {
    fn from(l: Lsn) -> String {
        l.to_string()
    }
}

impl TryFrom<String> for Lsn {
    type Error = LsnParseError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let lsn = Lsn(0x0000_0001_16B3_7480);
        assert_eq!(lsn.to_string(), "1/16B37480");
        assert_eq!("1/16B37480".parse::<Lsn>().unwrap(), lsn);
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::ZERO);
    }

    #[test]
    fn rejects_garbage() {
        assert!("16B37480".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        assert!("1/".parse::<Lsn>().is_err());
        assert!("100000000/0".parse::<Lsn>().is_err());
    }
}
