//! Framing: a 2-byte big-endian length `N`, then `N` bytes of a serialized
//! `UnixSocketProto`. Pure functions over byte buffers; an
//! *incomplete* buffer (wait for more bytes) is kept apart from a *malformed* one.

use prost::Message;

use super::google::rpc::Status;
use super::proto::{unix_socket_proto::Payload, UnixSocketProto};
use crate::types::status::StatusCode;

/// Largest body the 16-bit length can describe.
pub const MAX_FRAME_BODY: usize = u16::MAX as usize;
pub const HEADER_LEN: usize = 2;

/// The exact success reply of the rule, registry and uninstall endpoints.
pub const OK_REPLY: &[u8] = b"Ok.";

/// [`ok`] framed: length 5, then field 1 (`raw_bytes`, length-delimited) of 3 bytes.
pub const OK_FRAME: &[u8] = b"\x00\x05\x0a\x03Ok.";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("malformed protobuf: {0}")]
    Malformed(String),
    #[error("message of {0} bytes exceeds the 65535-byte frame limit")]
    TooLarge(usize),
}

/// Parses one frame from the front of `buf`. `Ok(None)`: not all of it has
/// arrived yet. On success returns the message and the bytes it consumed.
pub fn parse(buf: &[u8]) -> Result<Option<(UnixSocketProto, usize)>, FrameError> {
    let Some(body_len) = body_len(buf) else {
        return Ok(None);
    };
    let end = HEADER_LEN + body_len;
    if buf.len() < end {
        return Ok(None);
    }
    let msg =
        UnixSocketProto::decode(&buf[HEADER_LEN..end]).map_err(|e| FrameError::Malformed(e.to_string()))?;
    Ok(Some((msg, end)))
}

/// Length of the body announced by the header, if the header has arrived.
pub fn body_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| u16::from_be_bytes([buf[0], buf[1]]) as usize)
}

/// Appends the framed encoding of `msg` to `out`.
pub fn encode_into(msg: &UnixSocketProto, out: &mut Vec<u8>) -> Result<(), FrameError> {
    let len = msg.encoded_len();
    if len > MAX_FRAME_BODY {
        return Err(FrameError::TooLarge(len));
    }
    out.reserve(HEADER_LEN + len);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    msg.encode(out).expect("Vec<u8> grows as needed");
    Ok(())
}

pub fn encode(msg: &UnixSocketProto) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    encode_into(msg, &mut out)?;
    Ok(out)
}

/// A message carrying only `raw_bytes`.
pub fn raw(bytes: impl Into<Vec<u8>>) -> UnixSocketProto {
    UnixSocketProto { payload: Some(Payload::RawBytes(bytes.into())), status: None }
}

/// The `"Ok."` reply.
pub fn ok() -> UnixSocketProto {
    raw(OK_REPLY)
}

/// Longest error text a reply carries. Messages echo client input (an address,
/// a PCI string); the text is sent twice (status and `raw_bytes`), so without a
/// bound a long field would make the reply exceed the frame and go unsent.
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// `message` cut to at most [`MAX_ERROR_MESSAGE`] bytes on a character
/// boundary, saying how much was cut.
pub fn truncate_message(mut message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE {
        return message;
    }
    let total = message.len();
    // Room for the marker; it is at most 40 bytes.
    let mut keep = MAX_ERROR_MESSAGE - 40;
    while !message.is_char_boundary(keep) {
        keep -= 1;
    }
    message.truncate(keep);
    message.push_str(&format!("... ({} bytes cut)", total - keep));
    message
}

/// An error reply: `status{code, message}` plus the message as `raw_bytes`, so
/// clients that only look at `raw_bytes` see text that is not `"Ok."`. The
/// message is bounded by [`truncate_message`], so every error reply fits a frame.
pub fn error(code: StatusCode, message: impl Into<String>) -> UnixSocketProto {
    let message = truncate_message(message.into());
    UnixSocketProto {
        payload: Some(Payload::RawBytes(message.clone().into_bytes())),
        status: Some(Status { code: code as i32, message }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ok_reply_bytes_are_exact() {
        // field 1 (raw_bytes), wire type 2, length 3, "Ok."; framed with length 5.
        assert_eq!(encode(&ok()).unwrap(), vec![0, 5, 0x0a, 3, b'O', b'k', b'.']);
        assert_eq!(encode(&ok()).unwrap(), OK_FRAME);
    }

    #[test]
    fn error_reply_carries_status_and_text() {
        let bytes = encode(&error(StatusCode::ResourceExhausted, "full")).unwrap();
        let (msg, used) = parse(&bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(msg.status.as_ref().unwrap().code, 8);
        assert_eq!(msg.status.unwrap().message, "full");
        assert_eq!(msg.payload, Some(Payload::RawBytes(b"full".to_vec())));
    }

    #[test]
    fn incomplete_is_not_malformed() {
        let bytes = encode(&raw("0000:04:00.0")).unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        // Two frames back to back: the first is parsed, the rest is left.
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        let (_, used) = parse(&two).unwrap().unwrap();
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn garbage_is_malformed() {
        // Length 3, body: field 1 wire type 2 claiming 100 bytes.
        assert!(matches!(parse(&[0, 3, 0x0a, 100, 0]), Err(FrameError::Malformed(_))));
        // Wire type 7 does not exist.
        assert!(matches!(parse(&[0, 1, 0x0f]), Err(FrameError::Malformed(_))));
    }

    #[test]
    fn long_error_messages_are_cut_to_fit_a_frame() {
        // Multi-byte characters straddling the cut point must not split.
        for filler in ["x", "é", "\u{1F600}"] {
            let long = format!("dst.ip_address {:?} is not an IP address", filler.repeat(40_000));
            let bytes = encode(&error(StatusCode::InvalidArgument, long.clone())).expect("fits a frame");
            let (msg, _) = parse(&bytes).unwrap().unwrap();
            let status = msg.status.unwrap();
            assert!(status.message.len() <= MAX_ERROR_MESSAGE, "{}", status.message.len());
            assert!(status.message.starts_with("dst.ip_address"));
            assert!(status.message.ends_with("bytes cut)"), "{}", &status.message[900..]);
            assert_eq!(msg.payload, Some(Payload::RawBytes(status.message.into_bytes())));
        }
        // Short messages are untouched.
        assert_eq!(truncate_message("full".into()), "full");
        let exact = "y".repeat(MAX_ERROR_MESSAGE);
        assert_eq!(truncate_message(exact.clone()), exact);
    }

    #[test]
    fn oversize_is_refused() {
        assert_eq!(encode(&raw(vec![0u8; 70_000])), Err(FrameError::TooLarge(70_004)));
        assert!(encode(&raw(vec![0u8; MAX_FRAME_BODY - 4])).is_ok());
    }
}
