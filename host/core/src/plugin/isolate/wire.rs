//! The messages between the host and an isolated EP's process: frames of
//! `[u32 length][u8 tag][payload]` over pipes, little-endian, every read checked. Tensor data and
//! model bytes do not travel here; they go through the shared memory ([`super::shm`]).

use std::io::{Read, Write};

/// Requests (host → child).
pub(super) mod ask {
    pub const CREATE: u8 = 1;
    pub const CAPABILITY: u8 = 2;
    pub const COMPILE: u8 = 3;
    pub const EXECUTE: u8 = 4;
    pub const RELEASE: u8 = 5;
}

/// Replies (child → host).
pub(super) mod reply {
    pub const OK: u8 = 0x80;
    pub const ERR: u8 = 0x81;
    /// The child's first frame: the library opened, and its EPs.
    pub const HELLO: u8 = 0x82;
    /// The child's first frame when the library was refused.
    pub const REFUSED: u8 = 0x83;
}

/// The largest frame either side accepts: a message describes calls, not data.
pub(super) const MAX_FRAME: usize = 64 << 20;

/// Builds one frame's payload.
#[derive(Default)]
pub(super) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.u32(v.len() as u32);
        for &x in v {
            self.u32(x);
        }
        self
    }
}

/// Reads one frame's payload; every accessor fails on a short or malformed frame.
pub(super) struct Reader<'a>(&'a [u8]);

pub(super) type WireResult<T> = std::result::Result<T, String>;

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader(b)
    }
    fn take(&mut self, n: usize) -> WireResult<&'a [u8]> {
        if self.0.len() < n {
            return Err(format!(
                "malformed message: {n} more bytes expected, {} left",
                self.0.len()
            ));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub fn u8(&mut self) -> WireResult<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> WireResult<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn i32(&mut self) -> WireResult<i32> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u64(&mut self) -> WireResult<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn usize(&mut self) -> WireResult<usize> {
        usize::try_from(self.u64()?).map_err(|_| "malformed message: size out of range".into())
    }
    /// A count of items of at least `min_bytes` each, checked against what is left.
    pub fn count(&mut self, min_bytes: usize) -> WireResult<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_bytes.max(1)) > self.0.len() {
            return Err(format!("malformed message: {n} items cannot fit"));
        }
        Ok(n)
    }
    pub fn str(&mut self) -> WireResult<String> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    pub fn u32s(&mut self) -> WireResult<Vec<u32>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
}

/// Writes one frame.
pub(super) fn send(w: &mut impl Write, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len() + 1)
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("message too large"))?;
    let mut frame = Vec::with_capacity(payload.len() + 5);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.push(tag);
    frame.extend_from_slice(payload);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame: `Ok(None)` at a clean end of the stream.
pub(super) fn receive(r: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "malformed frame of {len} bytes"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let tag = body.remove(0);
    Ok(Some((tag, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_short_ones_are_errors() {
        let mut w = Writer::default();
        w.u8(7).u32(1).i32(-2).u64(3).str("héllo").u32s(&[4, 5]);
        let mut pipe = Vec::new();
        send(&mut pipe, ask::EXECUTE, &w.0).unwrap();
        let (tag, body) = receive(&mut pipe.as_slice()).unwrap().unwrap();
        assert_eq!(tag, ask::EXECUTE);
        let mut r = Reader::new(&body);
        assert_eq!(r.u8().unwrap(), 7);
        assert_eq!(r.u32().unwrap(), 1);
        assert_eq!(r.i32().unwrap(), -2);
        assert_eq!(r.u64().unwrap(), 3);
        assert_eq!(r.str().unwrap(), "héllo");
        assert_eq!(r.u32s().unwrap(), vec![4, 5]);
        assert!(r.u8().is_err());
        // A count larger than the bytes left is refused before anything is allocated.
        let mut huge = Writer::default();
        huge.u32(u32::MAX);
        assert!(Reader::new(&huge.0).u32s().is_err());
        // A stream ending inside a frame is an error; ending between frames is the end.
        assert!(receive(&mut &pipe[..pipe.len() - 1]).is_err());
        assert!(receive(&mut &[][..]).unwrap().is_none());
    }
}
