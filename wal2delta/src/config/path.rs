//! Source names in policy entries (`[silver.mask]`, `[[silver.checks]]`, `[tokenize]`):
//! `schema.table` and `schema.table.column`, spelled as in PostgreSQL.
//!
//! Policies are matched against the real (source) names, never against the escaped names
//! of topics and lake tables: a policy naming `"Card No"` must reach that column. A part is
//! either bare — taken exactly as written, capitals and spaces included (no case folding:
//! `public.Orders.card` names the table `"Orders"`) — or double-quoted, with `""` for a
//! quote inside, which is needed only when a name holds a `.` or a `"`.

/// The parts of `path`, which must have exactly `n` non-empty parts.
pub fn parse(path: &str, n: usize) -> Option<Vec<String>> {
    let mut parts = Vec::with_capacity(n);
    let mut chars = path.chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    '"' => break,
                    c => part.push(c),
                }
            }
            if !matches!(chars.peek(), None | Some('.')) {
                return None;
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                if c == '"' {
                    return None;
                }
                part.push(c);
                chars.next();
            }
        }
        if part.is_empty() {
            return None;
        }
        parts.push(part);
        match chars.next() {
            None => break,
            Some(_) => continue, // the '.'
        }
    }
    (parts.len() == n).then_some(parts)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn bare_and_quoted_parts() {
        assert_eq!(
            parse("public.pay.card", 3),
            Some(vec!["public".into(), "pay".into(), "card".into()])
        );
        assert_eq!(
            parse("public.Order Items.Card No", 3),
            Some(vec![
                "public".into(),
                "Order Items".into(),
                "Card No".into()
            ])
        );
        assert_eq!(
            parse("\"a.b\".\"we\"\"ird\".c", 3),
            Some(vec!["a.b".into(), "we\"ird".into(), "c".into()])
        );
        assert_eq!(
            parse("public.t", 2),
            Some(vec!["public".into(), "t".into()])
        );
        for bad in [
            "public.t",
            "public..c",
            "public.t.",
            "\"public.t.c",
            "\"p\"x.t.c",
            "p\"x.t.c",
            "a.b.c.d",
        ] {
            assert_eq!(parse(bad, 3), None, "{bad}");
        }
    }
}
