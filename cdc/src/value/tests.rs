//! Round trips over texts PostgreSQL 15 printed (session: DateStyle=ISO, MDY,
//! IntervalStyle=iso_8601, TimeZone=UTC, extra_float_digits=3, bytea_output=hex), and
//! malformed-input checks.

use super::*;
use wal2delta_model::Special;

pub(crate) fn base(b: BaseType, name: &str) -> ColumnType {
    let oid = match b {
        BaseType::Bool => 16,
        BaseType::Bytea => 17,
        BaseType::Char => 18,
        BaseType::Name => 19,
        BaseType::Int8 => 20,
        BaseType::Int2 => 21,
        BaseType::Int4 => 23,
        BaseType::Text => 25,
        BaseType::Oid => 26,
        BaseType::Json => 114,
        BaseType::Xml => 142,
        BaseType::Cidr => 650,
        BaseType::Float4 => 700,
        BaseType::Float8 => 701,
        BaseType::Macaddr8 => 774,
        BaseType::Money => 790,
        BaseType::Macaddr => 829,
        BaseType::Inet => 869,
        BaseType::Bpchar => 1042,
        BaseType::Varchar => 1043,
        BaseType::Date => 1082,
        BaseType::Time => 1083,
        BaseType::Timestamp => 1114,
        BaseType::TimestampTz => 1184,
        BaseType::Interval => 1186,
        BaseType::TimeTz => 1266,
        BaseType::Bit => 1560,
        BaseType::Varbit => 1562,
        BaseType::Numeric => 1700,
        BaseType::Uuid => 2950,
        BaseType::Jsonb => 3802,
    };
    ColumnType {
        oid,
        typmod: -1,
        name: name.to_owned(),
        kind: TypeKind::Base(b),
    }
}

fn other(name: &str, oid: u32) -> ColumnType {
    ColumnType {
        oid,
        typmod: -1,
        name: name.to_owned(),
        kind: TypeKind::Other,
    }
}

fn domain(name: &str, over: ColumnType) -> ColumnType {
    ColumnType {
        oid: 90_000,
        typmod: -1,
        name: name.to_owned(),
        kind: TypeKind::Domain {
            base: Box::new(over),
        },
    }
}

/// (type, text PostgreSQL printed for it).
fn samples() -> Vec<(ColumnType, String)> {
    use BaseType::*;
    let mut out: Vec<(ColumnType, String)> = Vec::new();
    let mut add = |ty: &ColumnType, texts: &[&str]| {
        for t in texts {
            out.push((ty.clone(), (*t).to_owned()));
        }
    };
    add(&base(Bool, "boolean"), &["t", "f"]);
    add(&base(Int2, "smallint"), &["0", "-32768", "32767"]);
    add(&base(Int4, "integer"), &["-2147483648", "2147483647", "42"]);
    add(
        &base(Int8, "bigint"),
        &["-9223372036854775808", "9223372036854775807"],
    );
    add(&base(Oid, "oid"), &["0", "4294967295"]);
    add(
        &base(Float8, "double precision"),
        &[
            "1e+15",
            "1e+16",
            "1.2345678901234568e+17",
            "999999999999999",
            "0.001",
            "0.0001",
            "1e-05",
            "0.00012345",
            "1.1",
            "1e+100",
            "-0",
            "0",
            "NaN",
            "Infinity",
            "-Infinity",
            "1e-100",
            "5e-324",
            "1.7976931348623157e+308",
            "100",
            "1.0000000000000002e+16",
            "-1.5",
            "0.1",
            "0.30000000000000004",
        ],
    );
    add(
        &base(Float4, "real"),
        &[
            "1e+06",
            "1.5e+09",
            "1.2345679e+08",
            "0.0001",
            "1e-05",
            "1.1",
            "3.4028235e+38",
            "1e-45",
            "-0",
            "123456",
            "1.234567e+06",
            "999999",
            "NaN",
            "-Infinity",
        ],
    );
    add(
        &base(Numeric, "numeric"),
        &[
            "123.4500",
            "NaN",
            "-Infinity",
            "Infinity",
            "0",
            "0.00",
            "0.00001",
            "-42",
        ],
    );
    add(
        &base(Text, "text"),
        &["", "hello", "ünïcödé \"q\" \\ {}", "NULL", " padded "],
    );
    add(&base(Bpchar, "character"), &["ab   "]);
    add(&base(Varchar, "character varying"), &["x"]);
    add(&base(Name, "name"), &["pg_class"]);
    add(&base(Char, "\"char\""), &["a", "\\377"]);
    add(&base(Xml, "xml"), &["<a>1</a>"]);
    add(&base(Bytea, "bytea"), &["\\x", "\\x0102ff", "\\xdeadbeef"]);
    add(
        &base(Uuid, "uuid"),
        &["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    );
    add(&base(Json, "json"), &["{\"a\" :  1}", "null", "[1, 2]"]);
    add(&base(Jsonb, "jsonb"), &["{\"a\": 1}"]);
    add(
        &base(Date, "date"),
        &[
            "0044-03-15 BC",
            "infinity",
            "-infinity",
            "12345-01-02",
            "4713-11-24 BC",
            "4714-11-24 BC",
            "5874897-12-31",
            "0001-01-01",
            "0001-12-31 BC",
            "1970-01-01",
            "2024-02-29",
        ],
    );
    add(
        &base(TimestampTz, "timestamp with time zone"),
        &[
            "0044-03-15 12:00:00+00 BC",
            "infinity",
            "-infinity",
            "12345-01-02 03:04:05.5+00",
            "2024-01-02 03:04:05.123456+00",
            "2024-01-02 03:04:05.12+00",
            "4713-11-24 00:00:00+00 BC",
            "4714-11-24 00:00:00+00 BC",
            "294247-01-10 04:00:54.775806+00",
            "1969-12-31 23:59:59.999999+00",
            "1970-01-01 00:00:00+00",
        ],
    );
    add(
        &base(Timestamp, "timestamp without time zone"),
        &[
            "0044-03-15 12:00:00 BC",
            "infinity",
            "-infinity",
            "12345-01-02 03:04:05.5",
            "2024-01-02 03:04:05",
            "0001-01-01 00:00:00",
            "0001-12-31 23:59:59.999999 BC",
        ],
    );
    add(
        &base(Time, "time without time zone"),
        &["24:00:00", "00:00:00", "12:34:56.789", "23:59:59.999999"],
    );
    add(
        &base(TimeTz, "time with time zone"),
        &[
            "12:34:56.789+05:30",
            "12:34:56-08",
            "24:00:00+00",
            "00:00:00+05:30:15",
            "01:02:03-15:59:59",
            "01:02:03+15:59:59",
        ],
    );
    add(
        &base(Interval, "interval"),
        &[
            "P1Y2M3DT4H5M6.789S",
            "P-1Y-2M3DT-4H-5M-6.789S",
            "PT0S",
            "PT-0.5S",
            "PT1000000H",
            "P-178000000Y",
            "P1DT-1S",
            "P2M-30D",
            "PT0.000001S",
            "PT-0.000001S",
            "PT1.1S",
        ],
    );
    add(&base(Money, "money"), &["$12.50"]);
    add(
        &base(Inet, "inet"),
        &["192.168.0.1", "192.168.0.1/24", "::1"],
    );
    add(&base(Cidr, "cidr"), &["10.0.0.0/8"]);
    add(&base(Macaddr, "macaddr"), &["08:00:2b:01:02:03"]);
    add(&base(Macaddr8, "macaddr8"), &["08:00:2b:01:02:03:04:05"]);
    add(&base(Bit, "bit"), &["101"]);
    add(&base(Varbit, "bit varying"), &["1"]);
    add(&other("point", 600), &["(1,2)"]);
    let mood = ColumnType {
        oid: 90_001,
        typmod: -1,
        name: "public.mood".into(),
        kind: TypeKind::Enum {
            labels: vec!["sad".into(), "ok".into()],
        },
    };
    add(&mood, &["sad"]);
    let range = ColumnType {
        oid: 3904,
        typmod: -1,
        name: "int4range".into(),
        kind: TypeKind::Range {
            subtype: Box::new(base(Int4, "integer")),
        },
    };
    add(&range, &["[1,5)", "empty"]);
    add(
        &domain("public.price", base(Numeric, "numeric")),
        &["12.50"],
    );
    add(&ColumnType::array_of(base(Text, "text")), &[
        "{a,\"\",\"NULL\",NULL,\"a \\\"b\\\"\",\"back\\\\slash\",\"x y\",\"{}\",\"null\",\"NuLl\",\"comma,\",\"tab\t\",é}",
        "{}",
    ]);
    add(
        &ColumnType::array_of(base(Float8, "double precision")),
        &["{1.5,NaN,Infinity}"],
    );
    add(
        &ColumnType::array_of(base(TimestampTz, "timestamp with time zone")),
        &["{\"2024-01-02 03:04:05+00\",infinity}"],
    );
    add(
        &ColumnType::array_of(base(Bytea, "bytea")),
        &["{\"\\\\x0102\",\"\\\\x\"}"],
    );
    add(
        &ColumnType::array_of(base(Interval, "interval")),
        &["{P1D}"],
    );
    add(
        &ColumnType::array_of(base(Numeric, "numeric")),
        &["{1.2,NaN}"],
    );
    add(
        &ColumnType::array_of(base(Bool, "boolean")),
        &["{t,NULL,f}"],
    );
    add(
        &ColumnType::array_of(base(Int4, "integer")),
        &["{1,2,NULL,-3}"],
    );
    add(&ColumnType::array_of(other("point", 600)), &["{\"(1,2)\"}"]);
    add(&ColumnType::array_of(range), &["{\"[1,2)\"}"]);
    add(
        &ColumnType::array_of(other("box", 603)),
        &["{(3,4),(1,2);(1,1),(0,0)}"],
    );
    add(
        &ColumnType::array_of(domain("public.price", base(Numeric, "numeric"))),
        &["{1.50,NULL}"],
    );
    add(&ColumnType::array_of(mood), &["{sad,ok}"]);
    out
}

#[test]
fn round_trip_postgres_samples() {
    for (ty, text) in samples() {
        let datum = parse_text(&ty, &text).unwrap_or_else(|e| panic!("{} {text:?}: {e}", ty.name));
        assert_eq!(render_text(&ty, &datum), text, "type {}", ty.name);
    }
}

#[test]
fn decoded_values() {
    use BaseType::*;
    let cases: Vec<(ColumnType, &str, Datum)> = vec![
        (base(Oid, "oid"), "4294967295", Datum::Int64(4_294_967_295)),
        (base(Int2, "smallint"), "-32768", Datum::Int16(i16::MIN)),
        (
            base(Uuid, "uuid"),
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            Datum::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into()),
        ),
        (base(Bytea, "bytea"), "\\x0aff", Datum::Bytes(vec![10, 255])),
        (
            base(Date, "date"),
            "0044-03-15 BC",
            Datum::Date(Special::Value(-735_160)),
        ),
        (
            base(Date, "date"),
            "-infinity",
            Datum::Date(Special::NegInfinity),
        ),
        (base(Time, "time"), "24:00:00", Datum::Time(86_400_000_000)),
        (
            base(TimeTz, "timetz"),
            "12:34:56.789+05:30:15",
            Datum::TimeTz {
                micros: 45_296_789_000,
                offset_seconds: 19_815,
            },
        ),
        (
            base(Timestamp, "timestamp"),
            "2024-01-02 03:04:05.123456",
            Datum::Timestamp(Special::Value(1_704_164_645_123_456)),
        ),
        (
            base(TimestampTz, "timestamptz"),
            "2024-01-02 03:04:05.123456+00",
            Datum::TimestampTz(Special::Value(1_704_164_645_123_456)),
        ),
        (
            base(TimestampTz, "timestamptz"),
            "infinity",
            Datum::TimestampTz(Special::Infinity),
        ),
        (
            base(Timestamp, "timestamp"),
            "0001-01-01 00:00:00 BC",
            Datum::Timestamp(Special::Value(-62_167_219_200_000_000)),
        ),
        (
            base(Interval, "interval"),
            "P-1Y-2M3DT-4H-5M-6.789S",
            Datum::Interval {
                months: -14,
                days: 3,
                micros: -14_706_789_000,
            },
        ),
        (base(Money, "money"), "$1.00", Datum::PgText("$1.00".into())),
        (base(Xml, "xml"), "<a/>", Datum::Text("<a/>".into())),
        (
            domain("public.price", base(Numeric, "numeric")),
            "1.50",
            Datum::Numeric("1.50".into()),
        ),
        (
            ColumnType::array_of(base(Int4, "integer")),
            "{1,NULL,3}",
            Datum::Array(vec![Some(Datum::Int32(1)), None, Some(Datum::Int32(3))]),
        ),
        (
            ColumnType::array_of(base(Text, "text")),
            "{\"a \\\"b\\\"\",NULL,\"NULL\"}",
            Datum::Array(vec![
                Some(Datum::Text("a \"b\"".into())),
                None,
                Some(Datum::Text("NULL".into())),
            ]),
        ),
    ];
    for (ty, text, want) in cases {
        assert_eq!(parse_text(&ty, text), Ok(want), "{} {text}", ty.name);
    }
}

#[test]
fn huge_numerics_are_kept_exactly() {
    let ty = base(BaseType::Numeric, "numeric");
    let digits: String = (0..1500)
        .map(|i| char::from(b'0' + (i * 7 % 10) as u8))
        .collect();
    for text in [
        format!("1{digits}"),
        format!("-{digits}.{digits}"),
        format!("0.{digits}1"),
    ] {
        let datum = parse_text(&ty, &text).unwrap();
        assert_eq!(datum, Datum::Numeric(text.clone()));
        assert_eq!(render_text(&ty, &datum), text);
    }
}

#[test]
fn errors_name_the_type_but_not_the_value() {
    use BaseType::*;
    let secret = "4111-1111-1111-1111";
    for ty in [
        base(Int8, "bigint"),
        base(Float8, "double precision"),
        base(Numeric, "numeric"),
        base(Uuid, "uuid"),
        base(Date, "date"),
        base(Timestamp, "timestamp without time zone"),
        base(TimeTz, "time with time zone"),
        base(Interval, "interval"),
        base(Bool, "boolean"),
        ColumnType::array_of(base(Int4, "integer")),
    ] {
        let err = parse_text(&ty, secret).expect_err(&ty.name);
        let msg = err.to_string();
        assert!(msg.contains(&ty.name), "{msg}");
        assert!(!msg.contains("4111") && !msg.contains("1111"), "{msg}");
        assert_eq!(err.class(), ErrorClass::Record);
    }
    let err = parse_text(&domain("public.price", base(Numeric, "numeric")), "x").unwrap_err();
    assert_eq!(err.type_name(), "public.price (domain over numeric)");
    let err = parse_text(&ColumnType::array_of(base(Int4, "integer")), "{{1},{2}}").unwrap_err();
    assert_eq!(err.code(), "unsupported_value");
    let err = parse_text(&ColumnType::array_of(base(Int4, "integer")), "[0:1]={1,2}").unwrap_err();
    assert_eq!(err.code(), "unsupported_value");
    let err = parse_text(&ColumnType::array_of(base(Int4, "integer")), "{1,x}").unwrap_err();
    assert_eq!(err.type_name(), "integer");
}

#[test]
fn malformed_inputs_are_errors() {
    use BaseType::*;
    let cases: &[(BaseType, &[&str])] = &[
        (Bool, &["", "yes", "T ", "1"]),
        (Int4, &["", "2147483648", "1.0", " 1", "0x1"]),
        (Oid, &["-1", "4294967296"]),
        (Float8, &["", "1e999", "abc", "inf"]),
        (Numeric, &["", "1e5", "abc", "+1"]),
        (Bytea, &["\\x1", "\\xgg"]),
        (Uuid, &["", "not-a-uuid"]),
        (Date, &["", "2024-02-30", "2024/01/01", "infinity "]),
        (Time, &["", "25:00:00", "12:00", "12:00:00+00"]),
        (TimeTz, &["", "12:00:00", "12:00:00+"]),
        (
            Timestamp,
            &[
                "",
                "2024-01-01",
                "2024-01-01 00:00:00+00",
                "2024-01-01T00:00:00",
            ],
        ),
        (
            TimestampTz,
            &["", "2024-01-01 00:00:00", "2024-01-01 00:00:00 UTC"],
        ),
        (Interval, &["", "1 day", "P", "@ 1 day"]),
    ];
    for (b, texts) in cases {
        let ty = base(*b, "t");
        for text in *texts {
            assert!(parse_text(&ty, text).is_err(), "{b:?} {text:?}");
        }
    }
}

/// A small deterministic generator (xorshift) so the loop below is reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_inputs_never_panic() {
    use BaseType::*;
    let mut types: Vec<ColumnType> = [
        Bool,
        Int2,
        Int4,
        Int8,
        Oid,
        Float4,
        Float8,
        Numeric,
        Text,
        Bytea,
        Uuid,
        Json,
        Date,
        Time,
        TimeTz,
        Timestamp,
        TimestampTz,
        Interval,
        Money,
    ]
    .iter()
    .map(|b| base(*b, "t"))
    .collect();
    let element_types = types.clone();
    types.extend(element_types.into_iter().map(ColumnType::array_of));
    types.push(ColumnType::array_of(other("box", 603)));
    // Bytes biased toward the characters the parsers care about.
    const ALPHABET: &[u8] = b"0123456789-+:.,;{}\"\\ PYMDTHSNULLnulaIfinty BCx\te\x0b[]=";
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut decoded = 0usize;
    for round in 0..60_000u32 {
        let len = (rng.next() % 40) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                let r = rng.next();
                match r % 5 {
                    0 => (r >> 8) as u8,
                    _ => ALPHABET[((r >> 8) as usize) % ALPHABET.len()],
                }
            })
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        let ty = &types[round as usize % types.len()];
        if let Ok(datum) = parse_text(ty, &text) {
            decoded += 1;
            // Whatever decodes must render and decode again to the same value.
            let again = render_text(ty, &datum);
            let reparsed = parse_text(ty, &again).expect("rendered text decodes");
            assert_eq!(render_text(ty, &reparsed), again);
        }
    }
    assert!(decoded > 0);
}

#[test]
fn render_never_panics_on_extreme_datums() {
    let ty = base(BaseType::Text, "text");
    for datum in [
        Datum::Date(Special::Value(i32::MIN)),
        Datum::Date(Special::Value(i32::MAX)),
        Datum::Time(i64::MIN),
        Datum::Time(i64::MAX),
        Datum::TimeTz {
            micros: -1,
            offset_seconds: i32::MIN,
        },
        Datum::Timestamp(Special::Value(i64::MIN)),
        Datum::TimestampTz(Special::Value(i64::MAX)),
        Datum::Interval {
            months: i32::MIN,
            days: i32::MIN,
            micros: i64::MIN,
        },
        Datum::Float32(f32::MIN_POSITIVE),
        Datum::Float64(f64::MAX),
        Datum::Array(vec![Some(Datum::Array(vec![None]))]),
    ] {
        let _ = render_text(&ty, &datum);
    }
}
