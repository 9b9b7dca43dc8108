//! Reading Avro's binary encoding: the primitives, over a byte slice, without allocating.
//!
//! The twin of the writers in [`super::binary`]. Every read checks the bytes left and the
//! value's range and fails with a [`Malformed`] that names what was expected, never a
//! panic: the bytes come from Kafka and may be anything.

/// Why bytes are not the datum their schema describes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub &'static str);

/// A position in one datum.
pub struct Cursor<'b> {
    bytes: &'b [u8],
}

impl<'b> Cursor<'b> {
    pub fn new(bytes: &'b [u8]) -> Self {
        Cursor { bytes }
    }

    /// The bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'b [u8], Malformed> {
        if n > self.bytes.len() {
            return Err(Malformed("the datum ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// A `long`: zig-zag, variable length (at most 10 bytes).
    pub fn long(&mut self) -> Result<i64, Malformed> {
        let mut z: u64 = 0;
        for shift in (0..70).step_by(7) {
            let [b] = self.take(1)? else {
                return Err(Malformed("the datum ends early"));
            };
            let b = *b;
            if shift == 63 && b > 1 {
                return Err(Malformed("a long longer than 64 bits"));
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
            }
        }
        Err(Malformed("a long longer than 10 bytes"))
    }

    /// An `int`: encoded as a `long` that must fit 32 bits.
    pub fn int(&mut self) -> Result<i32, Malformed> {
        i32::try_from(self.long()?).map_err(|_| Malformed("an int out of the 32-bit range"))
    }

    pub fn boolean(&mut self) -> Result<bool, Malformed> {
        match self.take(1)? {
            [0] => Ok(false),
            [1] => Ok(true),
            _ => Err(Malformed("a boolean that is neither 0 nor 1")),
        }
    }

    pub fn float(&mut self) -> Result<f32, Malformed> {
        let b = self.take(4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn double(&mut self) -> Result<f64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }

    /// A length (of `bytes`, a `string`), checked against the bytes left.
    fn len(&mut self) -> Result<usize, Malformed> {
        let n = usize::try_from(self.long()?).map_err(|_| Malformed("a negative length"))?;
        if n > self.bytes.len() {
            return Err(Malformed("a length past the end of the datum"));
        }
        Ok(n)
    }

    pub fn bytes(&mut self) -> Result<&'b [u8], Malformed> {
        let n = self.len()?;
        self.take(n)
    }

    /// A `string`: `bytes` that must be UTF-8.
    pub fn str(&mut self) -> Result<&'b str, Malformed> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Malformed("a string that is not UTF-8"))
    }

    pub fn fixed(&mut self, size: usize) -> Result<&'b [u8], Malformed> {
        self.take(size)
    }

    /// A union's branch index, checked against its `branches`.
    pub fn branch(&mut self, branches: usize) -> Result<usize, Malformed> {
        usize::try_from(self.long()?)
            .ok()
            .filter(|&i| i < branches)
            .ok_or(Malformed("a union branch the schema does not have"))
    }

    /// The item count of the next block of an array or map; 0 ends it. A negative count is
    /// followed by the block's size in bytes (which is read and not needed).
    pub fn block(&mut self) -> Result<usize, Malformed> {
        let n = self.long()?;
        if n < 0 {
            self.long()?;
        }
        let n = usize::try_from(n.unsigned_abs()).map_err(|_| Malformed("a block too long"))?;
        // Every item takes at least... nothing (a null); bound the count by a sane figure so
        // a corrupt count cannot make a reader loop for long.
        if n > self.bytes.len().saturating_mul(8).saturating_add(1 << 16) {
            return Err(Malformed("an array block longer than the datum can hold"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::binary;

    #[test]
    fn longs_read_back_what_the_writer_wrote() {
        for v in [
            0,
            1,
            -1,
            63,
            -64,
            64,
            i64::from(i32::MAX),
            i64::MIN,
            i64::MAX,
        ] {
            let mut out = Vec::new();
            binary::long(&mut out, v);
            let mut c = Cursor::new(&out);
            assert_eq!(c.long(), Ok(v));
            assert_eq!(c.remaining(), 0);
        }
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(Cursor::new(&[0x80]).long().is_err());
        assert!(Cursor::new(&[0xff; 11]).long().is_err());
        assert!(
            Cursor::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])
                .long()
                .is_err()
        );
        let mut big = Vec::new();
        binary::long(&mut big, i64::from(i32::MAX) + 1);
        assert!(Cursor::new(&big).int().is_err());
        assert!(Cursor::new(&[2]).boolean().is_err());
        assert!(Cursor::new(&[1, 2, 3]).float().is_err());
        // A string of 3 bytes with 1 present, a negative length, bytes that are not UTF-8.
        assert!(Cursor::new(&[6, b'a']).str().is_err());
        assert!(Cursor::new(&[1]).bytes().is_err());
        assert!(Cursor::new(&[4, 0xff, 0xfe]).str().is_err());
        assert!(Cursor::new(&[4]).branch(2).is_err());
        assert_eq!(Cursor::new(&[2]).branch(2), Ok(1));
        // A block claiming far more items than bytes exist.
        let mut huge = Vec::new();
        binary::long(&mut huge, 1 << 40);
        assert!(Cursor::new(&huge).block().is_err());
    }
}
