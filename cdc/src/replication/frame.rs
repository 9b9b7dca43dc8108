//! Splitting the byte stream from the server into messages.

use bytes::{Buf, BytesMut};

use crate::CdcError;

/// The server never sends a single message this large; a bigger length means corrupt data.
const MAX_FRAME: usize = 1 << 30;

/// One backend message: its tag and body (without the length word).
pub(crate) struct Frame {
    pub tag: u8,
    pub body: BytesMut,
}

/// Takes one complete message off the front of `buf`, or `None` when more bytes are needed.
pub(crate) fn take_frame(buf: &mut BytesMut) -> Result<Option<Frame>, CdcError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let tag = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if !(4..=MAX_FRAME).contains(&len) {
        return Err(CdcError::Protocol(format!(
            "message {:?} with invalid length {len}",
            tag as char
        )));
    }
    if buf.len() < 1 + len {
        buf.reserve(1 + len - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(1 + len);
    frame.advance(5);
    Ok(Some(Frame { tag, body: frame }))
}

/// Reads the fields of an ErrorResponse/NoticeResponse body into (code, message, detail).
pub(crate) fn error_fields(body: &[u8]) -> (String, String, Option<String>) {
    let mut code = String::new();
    let mut message = String::new();
    let mut detail = None;
    for field in body.split(|b| *b == 0) {
        if field.is_empty() {
            continue;
        }
        let value = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'C' => code = value,
            b'M' => message = value,
            b'D' => detail = Some(value),
            _ => {}
        }
    }
    (code, message, detail)
}

pub(crate) fn server_error(body: &[u8]) -> CdcError {
    let (code, message, detail) = error_fields(body);
    CdcError::Server {
        code,
        message,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_and_invalid_frames() {
        let mut buf = BytesMut::from(&b"Z\x00\x00\x00\x05I"[..]);
        let f = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!(f.tag, b'Z');
        assert_eq!(&f.body[..], b"I");
        assert!(buf.is_empty());

        let mut partial = BytesMut::from(&b"Z\x00\x00\x00\x05"[..]);
        assert!(take_frame(&mut partial).unwrap().is_none());

        let mut bad = BytesMut::from(&b"Z\x00\x00\x00\x01"[..]);
        assert!(take_frame(&mut bad).is_err());
    }

    #[test]
    fn error_fields_are_read() {
        let body = b"SERROR\0C42704\0Mreplication slot \"x\" does not exist\0\0";
        let (code, message, detail) = error_fields(body);
        assert_eq!(code, "42704");
        assert!(message.contains("does not exist"));
        assert!(detail.is_none());
    }
}
