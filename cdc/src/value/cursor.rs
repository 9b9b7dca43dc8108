//! A tiny byte cursor for the hand-written parsers: no indexing that can fail, no
//! arithmetic that can overflow.

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(text: &'a str) -> Cursor<'a> {
        Cursor {
            bytes: text.as_bytes(),
            pos: 0,
        }
    }

    pub(crate) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    pub(crate) fn bump(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos = self.pos.saturating_add(1);
        Some(b)
    }

    /// Consumes `b` if it is next.
    pub(crate) fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos = self.pos.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// Consumes `s` if it comes next.
    pub(crate) fn eat_str(&mut self, s: &str) -> bool {
        let rest = self.bytes.get(self.pos..).unwrap_or_default();
        if rest.starts_with(s.as_bytes()) {
            self.pos = self.pos.saturating_add(s.len());
            true
        } else {
            false
        }
    }

    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    /// Reads between `min` and `max` ASCII digits (`max` <= 19) as a number and how many
    /// digits there were. `None` when fewer than `min` digits follow; stops after `max`.
    pub(crate) fn digits(&mut self, min: usize, max: usize) -> Option<(u64, usize)> {
        let mut value: u64 = 0;
        let mut count = 0usize;
        while count < max {
            match self.peek() {
                Some(b @ b'0'..=b'9') => {
                    value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                    count += 1;
                    self.pos = self.pos.saturating_add(1);
                }
                _ => break,
            }
        }
        (count >= min).then_some((value, count))
    }

    /// Reads exactly `n` digits.
    pub(crate) fn fixed(&mut self, n: usize) -> Option<u64> {
        let (v, _) = self.digits(n, n)?;
        Some(v)
    }

    /// Reads an optional fraction of a second (`.` and 1 to 6 digits) as microseconds.
    /// `Err(())` when a `.` is not followed by 1..=6 digits.
    pub(crate) fn micros_fraction(&mut self) -> Result<u32, ()> {
        if !self.eat(b'.') {
            return Ok(0);
        }
        let (mut v, count) = self.digits(1, 6).ok_or(())?;
        if matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(());
        }
        for _ in count..6 {
            v = v.saturating_mul(10);
        }
        u32::try_from(v).map_err(|_| ())
    }
}
