//! The fixed-size headers some targets read before their body: a reader
//! that never fails (missing bytes read as zero, so every input is a case)
//! and the writer the seeds use to build the same layout.

/// Reads little-endian fields from the front of a fuzz input.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts at the first byte of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        out
    }

    /// One byte.
    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }

    /// A `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    /// An `i32`.
    pub fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }

    /// An `i64`.
    pub fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }

    /// At most `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// Builds an input in the layout [`Reader`] reads (for seeds).
#[derive(Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    /// An empty input.
    pub fn new() -> Self {
        Self::default()
    }

    /// One byte.
    pub fn u8(mut self, v: u8) -> Self {
        self.out.push(v);
        self
    }

    /// A `u16`.
    pub fn u16(mut self, v: u16) -> Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An `i32`.
    pub fn i32(mut self, v: i32) -> Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An `i64`.
    pub fn i64(mut self, v: i64) -> Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Raw bytes.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.out.extend_from_slice(v);
        self
    }

    /// The input.
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_writer_writes_the_reader_reads_and_short_input_reads_as_zero() {
        let data = Writer::new()
            .u8(7)
            .u16(513)
            .i32(-2)
            .i64(i64::MIN)
            .bytes(b"body")
            .finish();
        let mut r = Reader::new(&data);
        assert_eq!((r.u8(), r.u16(), r.i32(), r.i64()), (7, 513, -2, i64::MIN));
        assert_eq!(r.rest(), b"body");
        let mut r = Reader::new(&[1, 2]);
        assert_eq!(r.i32(), 0x0201);
        assert_eq!(r.i64(), 0);
        assert_eq!(r.bytes(3), b"");
    }
}
