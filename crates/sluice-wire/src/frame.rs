use bytes::{Buf, Bytes, BytesMut};

pub const MAGIC: u16 = 0x51CE;
pub const HEADER_LEN: usize = 24;
/// put_and_forget: the server sends no reply on success.
pub const FLAG_NO_REPLY: u8 = 0x01;
/// A part of a large value sent ahead of its request (QoS: so small
/// requests on the same connection go out between the parts). The frame
/// has no metadata; its value is the next part of the value of the request
/// with the same id, which follows as an ordinary frame carrying the last
/// part (`encode_part`).
pub const FLAG_PART: u8 = 0x02;

/// One decoded frame. `meta` and `value` share the read buffer's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub opcode: u8,
    pub flags: u8,
    pub request_id: u64,
    pub meta: Bytes,
    pub value: Bytes,
}

/// Why the byte stream cannot be read as frames. After any of these the
/// stream position is lost, so the connection must be closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    BadMagic(u16),
    BadHeader {
        request_id: u64,
        reason: String,
    },
    TooLarge {
        request_id: u64,
        meta_len: u64,
        value_len: u64,
        max_meta: u64,
        max_value: u64,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::BadMagic(m) => write!(f, "bad frame magic {m:#06x} (expected {MAGIC:#06x}); is this a Sluice client?"),
            FrameError::BadHeader { reason, .. } => write!(f, "bad frame header: {reason}"),
            FrameError::TooLarge { meta_len, value_len, max_meta, max_value, .. } => write!(
                f,
                "frame too large: metadata {meta_len} bytes (max {max_meta}), value {value_len} bytes (max {max_value})"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameError {
    /// The request id from the header, when it could be read, so the error
    /// reply can be matched to its request.
    pub fn request_id(&self) -> u64 {
        match self {
            FrameError::BadMagic(_) => 0,
            FrameError::BadHeader { request_id, .. } | FrameError::TooLarge { request_id, .. } => {
                *request_id
            }
        }
    }
}

/// Splits frames off a read buffer, enforcing size limits before buffering.
#[derive(Clone, Copy, Debug)]
pub struct FrameDecoder {
    pub max_meta: u32,
    pub max_value: u32,
}

/// The key of the trigger put whose frame begins `buf`, as soon as the
/// header and the key are in (the value may still be on its way); None
/// for any other frame, for a value sent in parts (its key comes last), or
/// for bytes that are not a frame. Lets a node ready the lambdas that the
/// put will reach while a large value arrives. Never panics, whatever
/// `buf` holds.
pub fn trigger_put_key(buf: &[u8]) -> Option<&str> {
    let header = buf.get(..HEADER_LEN)?;
    if u16::from_le_bytes([header[0], header[1]]) != MAGIC
        || header[2] != crate::op::TRIGGER_PUT
        || header[3] & FLAG_PART != 0
    {
        return None;
    }
    let meta_len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let len = buf.get(HEADER_LEN..HEADER_LEN + 4)?;
    let key_len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if key_len > meta_len.saturating_sub(4) {
        return None;
    }
    let key = buf.get(HEADER_LEN + 4..HEADER_LEN + 4 + key_len)?;
    std::str::from_utf8(key).ok()
}

impl FrameDecoder {
    pub fn new(max_meta: u32, max_value: u32) -> Self {
        FrameDecoder {
            max_meta,
            max_value,
        }
    }

    /// Bytes the frame at the head of `buf` needs in total, once its header
    /// is in; lets the reader reserve exactly once for a large frame.
    pub fn needed(&self, buf: &[u8]) -> Option<usize> {
        let value_at = self.value_at(buf)?;
        let value = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
        Some(value_at + value)
    }

    /// Where the value of the frame at the head of `buf` starts, once its
    /// header is in (the header and the metadata come first).
    pub fn value_at(&self, buf: &[u8]) -> Option<usize> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        let meta = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
        Some(HEADER_LEN + meta)
    }

    /// Checks the header at the front of `buf`: `Ok(None)` until the whole
    /// header is in. Never panics, whatever `buf` holds.
    fn header(&self, buf: &[u8]) -> Result<Option<Header>, FrameError> {
        if buf.len() < 2 {
            return Ok(None);
        }
        let magic = u16::from_le_bytes([buf[0], buf[1]]);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut h = &buf[2..HEADER_LEN];
        let opcode = h.get_u8();
        let flags = h.get_u8();
        let meta_len = h.get_u32_le();
        let value_len = h.get_u32_le();
        let reserved = h.get_u32_le();
        let request_id = h.get_u64_le();
        if flags & !(FLAG_NO_REPLY | FLAG_PART) != 0 || reserved != 0 {
            return Err(FrameError::BadHeader {
                request_id,
                reason: format!("unknown flags {flags:#04x} or non-zero reserved field {reserved}"),
            });
        }
        if meta_len > self.max_meta || value_len > self.max_value {
            return Err(FrameError::TooLarge {
                request_id,
                meta_len: meta_len.into(),
                value_len: value_len.into(),
                max_meta: self.max_meta.into(),
                max_value: self.max_value.into(),
            });
        }
        Ok(Some(Header {
            opcode,
            flags,
            request_id,
            meta_len: meta_len as usize,
            total: HEADER_LEN + meta_len as usize + value_len as usize,
        }))
    }

    /// Takes one whole frame off the front of `buf`, or returns Ok(None)
    /// when more bytes are needed. Never panics, whatever `buf` holds.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(h) = self.header(buf)? else {
            return Ok(None);
        };
        if buf.len() < h.total {
            return Ok(None);
        }
        Ok(Some(h.split(buf.split_to(h.total).freeze())))
    }

    /// Decodes `frame`, which holds exactly one whole frame (read into a
    /// buffer of its own, e.g. a recycled one): the metadata and value are
    /// slices of it.
    pub fn decode_whole(&self, frame: Bytes) -> Result<Frame, FrameError> {
        match self.header(&frame)? {
            Some(h) if h.total == frame.len() => Ok(h.split(frame)),
            _ => Err(FrameError::BadHeader {
                request_id: 0,
                reason: format!(
                    "a buffer of {} bytes that is not one whole frame",
                    frame.len()
                ),
            }),
        }
    }
}

/// A checked frame header.
struct Header {
    opcode: u8,
    flags: u8,
    request_id: u64,
    meta_len: usize,
    total: usize,
}

impl Header {
    /// The frame in `whole` (exactly `total` bytes), without copying.
    fn split(&self, mut whole: Bytes) -> Frame {
        whole.advance(HEADER_LEN);
        let meta = whole.split_to(self.meta_len);
        Frame {
            opcode: self.opcode,
            flags: self.flags,
            request_id: self.request_id,
            meta,
            value: whole,
        }
    }
}

/// Writes a frame header.
pub fn write_header(
    out: &mut BytesMut,
    opcode: u8,
    flags: u8,
    request_id: u64,
    meta_len: usize,
    value_len: usize,
) {
    use bytes::BufMut;
    out.put_u16_le(MAGIC);
    out.put_u8(opcode);
    out.put_u8(flags);
    out.put_u32_le(meta_len as u32);
    out.put_u32_le(value_len as u32);
    out.put_u32_le(0);
    out.put_u64_le(request_id);
}

/// Queues a part of request `request_id`'s value (`FLAG_PART`): a header
/// and the part, by reference.
pub fn encode_part(out: &mut crate::OutQueue, opcode: u8, request_id: u64, part: &Bytes) {
    write_header(out.buf(), opcode, FLAG_PART, request_id, 0, part.len());
    out.push_value(part);
}
