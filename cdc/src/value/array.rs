//! One-dimensional PostgreSQL array literals: `{1,2,NULL,"a \"b\""}`.
//!
//! Follows `array_in` / `array_out`: elements are separated by the element type's delimiter
//! (`,`; `;` for `box`); an element is either double-quoted (with `\` escaping the next
//! character) or unquoted (with `\` escapes, surrounding whitespace dropped, and the bare
//! word `NULL` in any case meaning a NULL element). Multi-dimensional arrays and arrays with
//! explicit bounds (`[0:2]={...}`) are valid PostgreSQL values that wal2delta does not
//! capture: they are reported as unsupported and the record goes to the DLQ.

use wal2delta_model::ColumnType;

use super::Bad;

/// `box` (OID 603) is the only built-in type whose array delimiter is not a comma.
const BOX_OID: u32 = 603;

/// The delimiter PostgreSQL uses between elements of this type.
pub(crate) fn delimiter(element: &ColumnType) -> u8 {
    if element.resolved().oid == BOX_OID {
        b';'
    } else {
        b','
    }
}

/// `array_isspace`: ASCII whitespace only.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}

/// Splits an array literal into its dequoted elements (`None` for NULL).
pub(crate) fn parse(text: &str, delim: u8) -> Result<Vec<Option<String>>, Bad> {
    let bytes = text.as_bytes();
    let mut i = 0usize;
    let at = |i: usize| bytes.get(i).copied();
    while at(i).is_some_and(is_space) {
        i += 1;
    }
    match at(i) {
        Some(b'[') => {
            return Err(Bad::Unsupported(
                "arrays with explicit bounds are not captured",
            ))
        }
        Some(b'{') => i += 1,
        _ => return Err(Bad::Invalid("array literal must start with {")),
    }
    let mut items = Vec::new();
    // Empty array: `{}` possibly with whitespace inside.
    let mut j = i;
    while at(j).is_some_and(is_space) {
        j += 1;
    }
    if at(j) == Some(b'}') {
        return finish(bytes, j + 1).map(|()| items);
    }
    loop {
        while at(i).is_some_and(is_space) {
            i += 1;
        }
        // Each element is collected as bytes: escapes only ever remove ASCII backslashes and
        // quotes, so the result is valid UTF-8 whenever the input is.
        let mut element: Vec<u8> = Vec::new();
        let mut is_null = false;
        match at(i) {
            Some(b'{') => {
                return Err(Bad::Unsupported(
                    "multi-dimensional arrays are not captured",
                ));
            }
            Some(b'"') => {
                i += 1;
                loop {
                    match at(i) {
                        None => return Err(Bad::Invalid("unterminated quoted array element")),
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let escaped = at(i + 1)
                                .ok_or(Bad::Invalid("unterminated quoted array element"))?;
                            element.push(escaped);
                            i += 2;
                        }
                        Some(b) => {
                            element.push(b);
                            i += 1;
                        }
                    }
                }
                while at(i).is_some_and(is_space) {
                    i += 1;
                }
            }
            _ => {
                // Unquoted: up to the delimiter or `}`; trailing unescaped whitespace dropped.
                let mut keep = 0usize;
                let mut escaped_any = false;
                loop {
                    match at(i) {
                        None => return Err(Bad::Invalid("unterminated array literal")),
                        Some(b) if b == delim || b == b'}' => break,
                        Some(b'"') | Some(b'{') => {
                            return Err(Bad::Invalid("unexpected quote or brace in array element"));
                        }
                        Some(b'\\') => {
                            let escaped =
                                at(i + 1).ok_or(Bad::Invalid("unterminated array literal"))?;
                            element.push(escaped);
                            keep = element.len();
                            escaped_any = true;
                            i += 2;
                        }
                        Some(b) => {
                            element.push(b);
                            if !is_space(b) {
                                keep = element.len();
                            }
                            i += 1;
                        }
                    }
                }
                element.truncate(keep);
                if element.is_empty() && !escaped_any {
                    return Err(Bad::Invalid("empty unquoted array element"));
                }
                is_null = !escaped_any && element.eq_ignore_ascii_case(b"NULL");
            }
        }
        items.push(if is_null {
            None
        } else {
            Some(
                String::from_utf8(element)
                    .map_err(|_| Bad::Invalid("array element is not valid UTF-8"))?,
            )
        });
        match at(i) {
            Some(b) if b == delim => i += 1,
            Some(b'}') => return finish(bytes, i + 1).map(|()| items),
            _ => {
                return Err(Bad::Invalid(
                    "expected a delimiter or } after an array element",
                ))
            }
        }
    }
}

/// Only whitespace may follow the closing brace.
fn finish(bytes: &[u8], from: usize) -> Result<(), Bad> {
    if bytes
        .get(from..)
        .unwrap_or_default()
        .iter()
        .all(|b| is_space(*b))
    {
        Ok(())
    } else {
        Err(Bad::Invalid(
            "unexpected characters after the array literal",
        ))
    }
}

/// Renders rendered element texts (`None` for NULL) like `array_out`.
pub(crate) fn render(items: &[Option<String>], delim: u8) -> String {
    let mut out = String::from("{");
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(char::from(delim));
        }
        match item {
            None => out.push_str("NULL"),
            Some(text) => {
                let needs_quotes = text.is_empty()
                    || text.eq_ignore_ascii_case("NULL")
                    || text.bytes().any(|b| {
                        matches!(b, b'"' | b'\\' | b'{' | b'}') || b == delim || is_space(b)
                    });
                if needs_quotes {
                    out.push('"');
                    for ch in text.chars() {
                        if ch == '"' || ch == '\\' {
                            out.push('\\');
                        }
                        out.push(ch);
                    }
                    out.push('"');
                } else {
                    out.push_str(text);
                }
            }
        }
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(items: &[Option<&str>]) -> Vec<Option<String>> {
        items.iter().map(|i| i.map(str::to_owned)).collect()
    }

    #[test]
    fn postgres_text_array_sample() {
        // SELECT array['a','','NULL',null,'a "b"','back\slash','x y','{}','null','NuLl',
        //               'comma,',E'tab\t','é']::text
        let text = "{a,\"\",\"NULL\",NULL,\"a \\\"b\\\"\",\"back\\\\slash\",\"x y\",\"{}\",\"null\",\"NuLl\",\"comma,\",\"tab\t\",é}";
        let items = strs(&[
            Some("a"),
            Some(""),
            Some("NULL"),
            None,
            Some("a \"b\""),
            Some("back\\slash"),
            Some("x y"),
            Some("{}"),
            Some("null"),
            Some("NuLl"),
            Some("comma,"),
            Some("tab\t"),
            Some("é"),
        ]);
        assert_eq!(parse(text, b','), Ok(items.clone()));
        assert_eq!(render(&items, b','), text);
    }

    #[test]
    fn input_forms_postgres_accepts() {
        // '{  a  ,  "b"  , c\ d ,NULL, "NULL" }'::text[] is {a,b,"c d",NULL,"NULL"}
        let parsed = parse("{  a  ,  \"b\"  , c\\ d ,NULL, \"NULL\" }", b',');
        assert_eq!(
            parsed,
            Ok(strs(&[
                Some("a"),
                Some("b"),
                Some("c d"),
                None,
                Some("NULL")
            ]))
        );
        assert_eq!(parse("  {a}  ", b','), Ok(strs(&[Some("a")])));
        assert_eq!(parse("{}", b','), Ok(vec![]));
        assert_eq!(parse("{ }", b','), Ok(vec![]));
        assert_eq!(parse("{nuLL}", b','), Ok(vec![None]));
        assert_eq!(parse("{\\NULL}", b','), Ok(strs(&[Some("NULL")])));
        assert_eq!(parse("{a\\ }", b','), Ok(strs(&[Some("a ")])));
        assert_eq!(
            parse("{(3,4),(1,2);(1,1),(0,0)}", b';'),
            Ok(strs(&[Some("(3,4),(1,2)"), Some("(1,1),(0,0)")]))
        );
    }

    #[test]
    fn unsupported_and_malformed() {
        assert!(matches!(
            parse("[0:1]={1,2}", b','),
            Err(Bad::Unsupported(_))
        ));
        assert!(matches!(
            parse("{{1,2},{3,4}}", b','),
            Err(Bad::Unsupported(_))
        ));
        for bad in [
            "",
            "1,2",
            "{",
            "{1,2",
            "{1,}",
            "{,1}",
            "{1,,2}",
            "{\"a}",
            "{a\"b\"}",
            "{1}x",
            "{\"a\" b}",
            "{a\\",
            "{\"a\\",
            "}",
            "{a{}",
        ] {
            assert!(matches!(parse(bad, b','), Err(Bad::Invalid(_))), "{bad}");
        }
    }
}
