//! Merging a batch's schema into a Bronze table's.
//!
//! Bronze evolves by *adding* columns (top level or inside the `before`/`after` structs):
//! a column a new schema version adds appears in the table, and earlier rows read it as
//! NULL; a column a version no longer has stays in the table and new rows hold NULL. A
//! column whose type widens (`int` → `bigint`) takes the wider type ([`crate::widen`]:
//! the table is rewritten under it before the events are appended); events of the
//! narrower type cast into it. Any other type change cannot be merged: Delta cannot hold
//! both in one column, so the events are quarantined with the reason rather than
//! rewritten or dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
use wal2delta_model::bronze::{AFTER, BEFORE};

/// The table property recording, for a text column an earlier release wrote, the decimal
/// type its values now arrive as: `wal2delta.decimal.<column>` = `"<precision>,<scale>"`.
/// Silver reads it to give a table it creates (a replay) the `DECIMAL` column
/// (docs/upgrading.md).
pub const TEXT_DECIMAL_PROPERTY: &str = "wal2delta.decimal.";

/// The source columns of the row images a text column of `table` holds while `batch`
/// brings them as decimals (a table an earlier release wrote as text), with the decimal
/// type: precision and scale.
pub fn decimals_into_text(table: &Schema, batch: &Schema) -> BTreeMap<String, (u8, i8)> {
    let mut out = BTreeMap::new();
    for image in [AFTER, BEFORE] {
        let (Ok(t), Ok(b)) = (table.field_with_name(image), batch.field_with_name(image)) else {
            continue;
        };
        let (DataType::Struct(t), DataType::Struct(b)) = (t.data_type(), b.data_type()) else {
            continue;
        };
        for bf in b.iter() {
            if let (DataType::Decimal128(p, s), Some(tf)) =
                (bf.data_type(), t.iter().find(|f| f.name() == bf.name()))
            {
                if matches!(
                    tf.data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                ) {
                    out.insert(bf.name().clone(), (*p, *s));
                }
            }
        }
    }
    out
}

/// The decimal types a table's properties record for its text columns
/// ([`TEXT_DECIMAL_PROPERTY`]); a malformed entry is left out.
pub fn text_decimals(configuration: &HashMap<String, String>) -> BTreeMap<String, (u8, i8)> {
    configuration
        .iter()
        .filter_map(|(k, v)| {
            let column = k.strip_prefix(TEXT_DECIMAL_PROPERTY)?;
            let (p, s) = v.split_once(',')?;
            Some((
                column.to_owned(),
                (p.trim().parse().ok()?, s.trim().parse().ok()?),
            ))
        })
        .collect()
}

/// The schema holding every column of `table` and of `batch`, table columns first.
pub fn merge_schemas(table: &Schema, batch: &Schema) -> Result<Schema, String> {
    let fields = merge_fields(table.fields(), batch.fields(), "")?;
    Ok(Schema::new_with_metadata(fields, table.metadata().clone()))
}

fn merge_fields(table: &Fields, batch: &Fields, path: &str) -> Result<Fields, String> {
    let mut out: Vec<Field> = Vec::with_capacity(table.len().max(batch.len()));
    for t in table.iter() {
        match batch.iter().find(|b| b.name() == t.name()) {
            Some(b) => {
                let ty = merge_type(t.data_type(), b.data_type(), &format!("{path}{}", t.name()))?;
                out.push(Field::new(t.name(), ty, true).with_metadata(t.metadata().clone()));
            }
            None => out.push(t.as_ref().clone().with_nullable(true)),
        }
    }
    for b in batch.iter() {
        if !table.iter().any(|t| t.name() == b.name()) {
            out.push(b.as_ref().clone().with_nullable(true));
        }
    }
    Ok(Fields::from(out))
}

fn merge_type(table: &DataType, batch: &DataType, path: &str) -> Result<DataType, String> {
    use DataType::*;
    let string = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let binary = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView);
    match (table, batch) {
        (Struct(t), Struct(b)) => Ok(Struct(merge_fields(t, b, &format!("{path}."))?)),
        (List(t) | LargeList(t), List(b) | LargeList(b)) => {
            let item = merge_type(t.data_type(), b.data_type(), &format!("{path}[]"))?;
            let field = Arc::new(Field::new(t.name(), item, true));
            Ok(match table {
                LargeList(_) => LargeList(field),
                _ => List(field),
            })
        }
        (t, b) if string(t) && string(b) => Ok(t.clone()),
        // A bounded numeric that an earlier release wrote as exact text: the table keeps the
        // text and the decimals cast into it, exactly (a decimal prints its scale's digits,
        // as PostgreSQL does). `replay` or a rebuilt table gives the decimal column
        // (docs/upgrading.md).
        (t, Decimal128(..)) if string(t) => Ok(t.clone()),
        (t, b) if binary(t) && binary(b) => Ok(t.clone()),
        (Timestamp(_, tz_t), Timestamp(_, tz_b)) if tz_t.is_some() == tz_b.is_some() => {
            Ok(table.clone())
        }
        (t, b) if t == b => Ok(t.clone()),
        (t, b) => crate::widen::wider(t, b).ok_or_else(|| crate::widen::refusal(path, t, b)),
    }
}

/// True when `merged` adds nothing to `table` (same columns, same nesting).
pub fn adds_nothing(table: &Schema, merged: &Schema) -> bool {
    fn same(a: &Fields, b: &Fields) -> bool {
        a.len() == b.len()
            && a.iter().zip(b.iter()).all(|(x, y)| {
                x.name() == y.name()
                    && match (x.data_type(), y.data_type()) {
                        (DataType::Struct(p), DataType::Struct(q)) => same(p, q),
                        (
                            DataType::List(p) | DataType::LargeList(p),
                            DataType::List(q) | DataType::LargeList(q),
                        ) => match (p.data_type(), q.data_type()) {
                            (DataType::Struct(p), DataType::Struct(q)) => same(p, q),
                            _ => true,
                        },
                        _ => true,
                    }
            })
    }
    same(table.fields(), merged.fields())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(fields: Vec<Field>) -> Schema {
        Schema::new(fields)
    }

    #[test]
    fn added_nested_columns_merge_and_missing_ones_stay() {
        let v1 = s(vec![
            Field::new("op", DataType::Utf8, true),
            Field::new(
                "after",
                DataType::Struct(Fields::from(vec![
                    Field::new("id", DataType::Int64, true),
                    Field::new("old", DataType::Utf8, true),
                ])),
                true,
            ),
        ]);
        let v2 = s(vec![
            Field::new("op", DataType::Utf8View, true),
            Field::new(
                "after",
                DataType::Struct(Fields::from(vec![
                    Field::new("id", DataType::Int64, true),
                    Field::new("new", DataType::Boolean, true),
                ])),
                true,
            ),
        ]);
        let m = merge_schemas(&v1, &v2).unwrap();
        let DataType::Struct(after) = m.field(1).data_type() else {
            panic!()
        };
        let names: Vec<&str> = after.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "old", "new"]);
        assert!(!adds_nothing(&v1, &m));
        assert!(adds_nothing(&m, &merge_schemas(&m, &v1).unwrap()));
    }

    #[test]
    fn a_widened_type_merges_and_a_changed_one_is_refused_naming_the_column() {
        let after = |t: DataType| {
            s(vec![Field::new(
                "after",
                DataType::Struct(Fields::from(vec![Field::new("n", t, true)])),
                true,
            )])
        };
        let wide = merge_schemas(&after(DataType::Int32), &after(DataType::Int64)).unwrap();
        assert_eq!(wide, after(DataType::Int64));
        // Events of the narrower type (written before the ALTER) cast into the wider.
        assert_eq!(merge_schemas(&wide, &after(DataType::Int32)).unwrap(), wide);
        // A text column of an earlier release keeps taking the decimals of bounded numerics.
        let text = after(DataType::Utf8);
        assert_eq!(
            merge_schemas(&text, &after(DataType::Decimal128(18, 2))).unwrap(),
            text
        );
        // ... and says which decimal type they came as, for a table Silver creates later.
        let found = decimals_into_text(&text, &after(DataType::Decimal128(18, 2)));
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            [("n".to_owned(), (18, 2))]
        );
        let props = HashMap::from([
            (format!("{TEXT_DECIMAL_PROPERTY}n"), "18,2".to_owned()),
            (format!("{TEXT_DECIMAL_PROPERTY}bad"), "x".to_owned()),
            ("delta.appendOnly".to_owned(), "true".to_owned()),
        ]);
        assert_eq!(
            text_decimals(&props).into_iter().collect::<Vec<_>>(),
            [("n".to_owned(), (18, 2))]
        );
        assert!(decimals_into_text(&wide, &after(DataType::Decimal128(18, 2))).is_empty());
        let err = merge_schemas(&after(DataType::Int32), &after(DataType::Utf8)).unwrap_err();
        assert!(err.contains("after.n") && err.contains("rebuild"), "{err}");
    }
}
