//! Bounded numerics in a Bronze text column an earlier release wrote (docs/upgrading.md).
//!
//! Such a column keeps its text in Bronze; Bronze records the decimal type its values now
//! arrive as ([`crate::bronze::TEXT_DECIMAL_PROPERTY`]). Silver reads the column as that
//! decimal when it has no such column yet (a table created now, or rebuilt by `replay`)
//! or holds it as a decimal already, and as text when its column is text: a table of an
//! earlier release keeps working unchanged until it is rebuilt.
//!
//! The text is PostgreSQL's exact output of a `numeric(p,s)` value, so it converts
//! exactly ([`wal2delta_model::decimal::unscaled`]); `NaN` is NULL, as in a decimal column
//! written from the start. Text the type cannot hold exactly (more digits than it has: a
//! column whose type narrowed over its history) is an error naming the column, never
//! rounded.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::{Array, ArrayRef, AsArray, Decimal128Builder};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
use deltalake::arrow::error::ArrowError;
use wal2delta_model::bronze::{AFTER, BEFORE, KEY};
use wal2delta_model::decimal::unscaled;

use crate::widen::wider;

/// `fields` (Bronze's columns as Silver reads them) with the text columns of the row
/// images and the key that `decimals` records typed as decimals, where `silver` (the Silver table's schema,
/// `None` before it exists) has no such column or a decimal one (the wider of both then).
pub(super) fn read_types(
    fields: Vec<Field>,
    decimals: &BTreeMap<String, (u8, i8)>,
    silver: Option<&Schema>,
) -> Vec<Field> {
    if decimals.is_empty() {
        return fields;
    }
    fields
        .into_iter()
        .map(|f| {
            let DataType::Struct(children) = f.data_type() else {
                return f;
            };
            // The row images, and the key (a bounded numeric can be a key column).
            if ![AFTER, BEFORE, KEY].contains(&f.name().as_str()) {
                return f;
            }
            let children: Fields = children
                .iter()
                .map(|c| {
                    let ty = column_type(c, decimals, silver);
                    Arc::new(c.as_ref().clone().with_data_type(ty))
                })
                .collect();
            f.clone().with_data_type(DataType::Struct(children))
        })
        .collect()
}

fn column_type(
    column: &Field,
    decimals: &BTreeMap<String, (u8, i8)>,
    silver: Option<&Schema>,
) -> DataType {
    let text = column.data_type();
    let Some(&(p, s)) = decimals.get(column.name()) else {
        return text.clone();
    };
    if !matches!(
        text,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) {
        return text.clone();
    }
    let recorded = DataType::Decimal128(p, s);
    match silver.and_then(|s| s.field_with_name(column.name()).ok()) {
        None => recorded,
        Some(f) if matches!(f.data_type(), DataType::Decimal128(..)) => {
            wider(f.data_type(), &recorded).unwrap_or_else(|| f.data_type().clone())
        }
        Some(_) => text.clone(),
    }
}

/// The text values of `array` as `Decimal128(precision, scale)`, exactly; `NaN` and the
/// infinities NULL. An error (naming no value) when one has more digits than the type.
pub(super) fn to_decimal(
    array: &ArrayRef,
    precision: u8,
    scale: i8,
) -> Result<ArrayRef, ArrowError> {
    let refuse = |reason: &str| {
        ArrowError::CastError(format!(
            "a text value cannot be DECIMAL({precision},{scale}) exactly: {reason} (the column's type narrowed over its history: replay it as text, docs/upgrading.md)"
        ))
    };
    let Ok(scale_digits) = u8::try_from(scale) else {
        return Err(refuse("a negative scale"));
    };
    let text = cast(array, &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    let mut out = Decimal128Builder::with_capacity(text.len());
    for i in 0..text.len() {
        if text.is_null(i) {
            out.append_null();
            continue;
        }
        match unscaled(text.value(i), precision, scale_digits) {
            Ok(Some(v)) => out.append_value(v),
            Ok(None) => out.append_null(),
            Err(e) => return Err(refuse(e.0)),
        }
    }
    Ok(Arc::new(
        out.finish().with_precision_and_scale(precision, scale)?,
    ))
}

#[cfg(test)]
mod tests {
    use deltalake::arrow::array::{Decimal128Array, StringArray};

    use super::*;

    fn image(columns: Vec<Field>) -> Vec<Field> {
        vec![
            Field::new("op", DataType::Utf8, true),
            Field::new(AFTER, DataType::Struct(Fields::from(columns)), true),
        ]
    }

    fn after_type(fields: &[Field], column: &str) -> DataType {
        let DataType::Struct(c) = fields[1].data_type() else {
            panic!("no struct")
        };
        c.iter()
            .find(|f| f.name() == column)
            .unwrap()
            .data_type()
            .clone()
    }

    #[test]
    fn a_recorded_text_column_is_a_decimal_unless_silver_holds_text() {
        let bronze = image(vec![
            Field::new("amount", DataType::Utf8, true),
            Field::new("note", DataType::Utf8, true),
        ]);
        let decimals = BTreeMap::from([("amount".to_owned(), (18, 2))]);
        // A Silver table created now (a replay): the decimal.
        let fresh = read_types(bronze.clone(), &decimals, None);
        assert_eq!(after_type(&fresh, "amount"), DataType::Decimal128(18, 2));
        assert_eq!(after_type(&fresh, "note"), DataType::Utf8);
        // Silver of an earlier release holds text: it stays text.
        let text = Schema::new(vec![Field::new("amount", DataType::Utf8, true)]);
        let kept = read_types(bronze.clone(), &decimals, Some(&text));
        assert_eq!(after_type(&kept, "amount"), DataType::Utf8);
        // Silver holds a narrower decimal (the source column widened since): the wider.
        let narrow = Schema::new(vec![Field::new(
            "amount",
            DataType::Decimal128(10, 2),
            true,
        )]);
        let decimals = BTreeMap::from([("amount".to_owned(), (14, 4))]);
        let widened = read_types(bronze, &decimals, Some(&narrow));
        assert_eq!(after_type(&widened, "amount"), DataType::Decimal128(14, 4));
    }

    #[test]
    fn text_converts_exactly_nan_is_null_and_nothing_is_rounded() {
        let text: ArrayRef = Arc::new(StringArray::from(vec![
            Some("12.50"),
            Some("-0.01"),
            None,
            Some("NaN"),
        ]));
        let d = to_decimal(&text, 18, 2).unwrap();
        let d = d.as_any().downcast_ref::<Decimal128Array>().unwrap();
        assert_eq!(d.value(0), 1250);
        assert_eq!(d.value(1), -1);
        assert!(d.is_null(2) && d.is_null(3));
        assert_eq!(d.data_type(), &DataType::Decimal128(18, 2));
        let more: ArrayRef = Arc::new(StringArray::from(vec!["1.234"]));
        let err = to_decimal(&more, 18, 2).unwrap_err().to_string();
        assert!(
            err.contains("DECIMAL(18,2)") && !err.contains("1.234"),
            "{err}"
        );
    }
}
