//! The PostgreSQL type of a captured column, resolved once from the catalog.
//!
//! pgoutput only sends a type OID and a type modifier per column. The capture stage
//! resolves each OID (including user-defined enums, domains, arrays, ranges and composite
//! types) into a [`ColumnType`] so that value decoding and the Avro/Arrow mapping never
//! have to query the database again.

/// A column's PostgreSQL type with everything needed to decode and map its values.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ColumnType {
    /// The type's OID in the source database.
    pub oid: u32,
    /// The type modifier from pgoutput's Relation message (`-1` when none), e.g. the
    /// precision and scale of `numeric(12,2)`.
    pub typmod: i32,
    /// The type's name as `format_type` spells it without modifier, schema-qualified when it
    /// is not in `pg_catalog` (`numeric`, `timestamp with time zone`, `public.mood`).
    pub name: String,
    pub kind: TypeKind,
}

/// How values of a type are structured.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum TypeKind {
    /// A built-in scalar type with a native mapping.
    Base(BaseType),
    /// A user-defined enum, with its labels in sort order.
    Enum { labels: Vec<String> },
    /// A domain over another type; values are decoded as the base type.
    Domain { base: Box<ColumnType> },
    /// An array of another type. Element typmod is the column's typmod.
    Array { element: Box<ColumnType> },
    /// A range over a subtype. Travels as PostgreSQL text.
    Range { subtype: Box<ColumnType> },
    /// A composite (row) type. Travels as PostgreSQL text.
    Composite,
    /// Any other type (extensions such as PostGIS, tsvector, hstore...). Travels as
    /// PostgreSQL text with its type name recorded in the schema.
    Other,
}

/// Built-in scalar types that have a native Avro/Arrow mapping (see `docs/types.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BaseType {
    Bool,
    Int2,
    Int4,
    Int8,
    Oid,
    Float4,
    Float8,
    Numeric,
    Text,
    Varchar,
    Bpchar,
    Name,
    Char,
    Bytea,
    Uuid,
    Json,
    Jsonb,
    Date,
    Time,
    TimeTz,
    Timestamp,
    TimestampTz,
    Interval,
    Inet,
    Cidr,
    Macaddr,
    Macaddr8,
    Money,
    Bit,
    Varbit,
    Xml,
}

impl BaseType {
    /// The built-in type with this OID, if it has a native mapping.
    pub fn from_oid(oid: u32) -> Option<BaseType> {
        Some(match oid {
            16 => BaseType::Bool,
            17 => BaseType::Bytea,
            18 => BaseType::Char,
            19 => BaseType::Name,
            20 => BaseType::Int8,
            21 => BaseType::Int2,
            23 => BaseType::Int4,
            25 => BaseType::Text,
            26 => BaseType::Oid,
            114 => BaseType::Json,
            142 => BaseType::Xml,
            650 => BaseType::Cidr,
            700 => BaseType::Float4,
            701 => BaseType::Float8,
            774 => BaseType::Macaddr8,
            790 => BaseType::Money,
            829 => BaseType::Macaddr,
            869 => BaseType::Inet,
            1042 => BaseType::Bpchar,
            1043 => BaseType::Varchar,
            1082 => BaseType::Date,
            1083 => BaseType::Time,
            1114 => BaseType::Timestamp,
            1184 => BaseType::TimestampTz,
            1186 => BaseType::Interval,
            1266 => BaseType::TimeTz,
            1560 => BaseType::Bit,
            1562 => BaseType::Varbit,
            1700 => BaseType::Numeric,
            2950 => BaseType::Uuid,
            3802 => BaseType::Jsonb,
            _ => return None,
        })
    }
}

impl ColumnType {
    /// A built-in type known by its base type and name alone, not read from a catalog
    /// (OID 0, no type modifier): for fixtures, tests and fuzz targets.
    pub fn base(b: BaseType, name: &str) -> ColumnType {
        ColumnType {
            oid: 0,
            typmod: -1,
            name: name.to_owned(),
            kind: TypeKind::Base(b),
        }
    }

    /// The array type of `element` (`name[]`); the column's type modifier applies to the
    /// elements, as PostgreSQL reports it.
    pub fn array_of(element: ColumnType) -> ColumnType {
        ColumnType {
            oid: 0,
            typmod: element.typmod,
            name: format!("{}[]", element.name),
            kind: TypeKind::Array {
                element: Box::new(element),
            },
        }
    }

    /// The precision and scale of a `numeric(p,s)` column, or `None` when unconstrained.
    pub fn numeric_precision_scale(&self) -> Option<(u32, u32)> {
        if self.typmod < 4 {
            return None;
        }
        let t = (self.typmod - 4) as u32;
        let precision = (t >> 16) & 0xFFFF;
        // PostgreSQL 15 allows a negative scale; it is stored in 11 bits, sign-extended.
        let scale = t & 0x7FF;
        if scale & 0x400 != 0 {
            return None;
        }
        Some((precision, scale))
    }

    /// The type at the bottom of any domain chain.
    pub fn resolved(&self) -> &ColumnType {
        match &self.kind {
            TypeKind::Domain { base } => base.resolved(),
            _ => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(typmod: i32) -> ColumnType {
        ColumnType {
            oid: 1700,
            typmod,
            name: "numeric".into(),
            kind: TypeKind::Base(BaseType::Numeric),
        }
    }

    #[test]
    fn numeric_typmod_decodes_precision_and_scale() {
        // numeric(12,2): ((12 << 16) | 2) + 4
        assert_eq!(
            numeric((12 << 16 | 2) + 4).numeric_precision_scale(),
            Some((12, 2))
        );
        assert_eq!(numeric(-1).numeric_precision_scale(), None);
    }
}
