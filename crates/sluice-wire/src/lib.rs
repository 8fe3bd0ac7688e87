//! Sluice's binary wire protocol.
//!
//! A frame is a fixed 24-byte header, a metadata section and a value section:
//!
//! ```text
//! offset size  field
//! 0      2     magic 0x51CE (little-endian)
//! 2      1     opcode (requests 0x01..=0x3f, responses 0x80..=0xff)
//! 3      1     flags  (bit 0: NO_REPLY, for put_and_forget; others must be 0)
//! 4      4     meta_len   (bytes of the metadata section)
//! 8      4     value_len  (bytes of the value section)
//! 12     4     reserved, 0
//! 16     8     request_id (responses echo it; notifications carry the watch's id)
//! 24     ...   metadata, then the value bytes, unencoded
//! ```
//!
//! Value bytes are never re-encoded: the decoder hands them out as a
//! `Bytes` slice of the read buffer, and the encoder queues them as their own
//! chunk for a vectored write. Architecture invariant: this crate knows
//! nothing about tokio or sockets; it turns bytes into messages and back.

mod codec;
mod frame;
mod message;
mod out;

pub use codec::{MetaReader, MetaWriter};
pub use frame::{
    encode_part, trigger_put_key, Frame, FrameDecoder, FrameError, FLAG_NO_REPLY, FLAG_PART,
    HEADER_LEN, MAGIC,
};
pub use message::{
    encode_object, encode_objects, op, DeliveryKindWire, MultiGetItem, ObjRef, Request, Response,
    ServerInfo, WatchFrom, WireObject,
};
pub use out::{OutQueue, ZERO_COPY_THRESHOLD};

/// Protocol version spoken by this build; the handshake rejects others.
pub const PROTOCOL_VERSION: u16 = 2;
