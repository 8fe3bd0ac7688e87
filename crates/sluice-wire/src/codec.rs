//! Primitive encoders for the metadata section: little-endian integers and
//! length-prefixed UTF-8 strings.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use sluice_types::SluiceError;

/// Appends metadata fields.
pub struct MetaWriter<'a>(pub &'a mut BytesMut);

impl MetaWriter<'_> {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.put_u8(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.put_u16_le(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.put_u32_le(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.put_u64_le(v);
        self
    }
    pub fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            Some(x) => self.u8(1).u64(x),
            None => self.u8(0),
        }
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.0.put_u32_le(s.len() as u32);
        self.0.put_slice(s.as_bytes());
        self
    }
    pub fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(x) => self.u8(1).str(x),
            None => self.u8(0),
        }
    }
}

/// Reads metadata fields; every read is bounds-checked and a short or
/// malformed section is a `Protocol` error, never a panic.
pub struct MetaReader {
    buf: Bytes,
}

fn short(what: &str) -> SluiceError {
    SluiceError::protocol(format!("metadata ends before {what}"))
}

impl MetaReader {
    pub fn new(buf: Bytes) -> Self {
        MetaReader { buf }
    }
    pub fn u8(&mut self) -> Result<u8, SluiceError> {
        if self.buf.remaining() < 1 {
            return Err(short("a u8"));
        }
        Ok(self.buf.get_u8())
    }
    pub fn u16(&mut self) -> Result<u16, SluiceError> {
        if self.buf.remaining() < 2 {
            return Err(short("a u16"));
        }
        Ok(self.buf.get_u16_le())
    }
    pub fn u32(&mut self) -> Result<u32, SluiceError> {
        if self.buf.remaining() < 4 {
            return Err(short("a u32"));
        }
        Ok(self.buf.get_u32_le())
    }
    pub fn u64(&mut self) -> Result<u64, SluiceError> {
        if self.buf.remaining() < 8 {
            return Err(short("a u64"));
        }
        Ok(self.buf.get_u64_le())
    }
    pub fn bool(&mut self) -> Result<bool, SluiceError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(SluiceError::protocol(format!("bad boolean {t}"))),
        }
    }
    pub fn opt_u64(&mut self) -> Result<Option<u64>, SluiceError> {
        Ok(if self.bool()? {
            Some(self.u64()?)
        } else {
            None
        })
    }
    pub fn bytes(&mut self) -> Result<Bytes, SluiceError> {
        let n = self.u32()? as usize;
        if self.buf.remaining() < n {
            return Err(SluiceError::protocol(format!(
                "string of {n} bytes runs past the end of the metadata ({} left)",
                self.buf.remaining()
            )));
        }
        Ok(self.buf.split_to(n))
    }
    pub fn str(&mut self) -> Result<String, SluiceError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| SluiceError::protocol("string is not valid UTF-8"))
    }
    pub fn opt_str(&mut self) -> Result<Option<String>, SluiceError> {
        Ok(if self.bool()? {
            Some(self.str()?)
        } else {
            None
        })
    }
    /// Whether every byte was read (an optional trailing field is absent).
    pub fn at_end(&self) -> bool {
        !self.buf.has_remaining()
    }

    /// Call after the last field: trailing bytes mean a mismatched encoder.
    pub fn finish(&self) -> Result<(), SluiceError> {
        if self.buf.has_remaining() {
            return Err(SluiceError::protocol(format!(
                "{} unexpected trailing metadata bytes",
                self.buf.remaining()
            )));
        }
        Ok(())
    }
}
