//! Little-endian cursors over byte slices that return errors instead of panicking.

/// The payload ended before a field, or a field's value is out of its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short;

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if n > self.buf.len() {
            return Err(Short);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        self.bytes(N)?.try_into().map_err(|_| Short)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Short> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Short> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn f32(&mut self) -> Result<f32, Short> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    /// A string: u8 byte length, then that many bytes of UTF-8.
    pub(crate) fn str(&mut self, max: usize) -> Result<&'a str, Short> {
        let n = usize::from(self.u8()?);
        if n > max {
            return Err(Short);
        }
        core::str::from_utf8(self.bytes(n)?).map_err(|_| Short)
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.buf)
    }
    /// Succeeds only if every byte was consumed: payloads have exact lengths.
    pub(crate) fn finish(self) -> Result<(), Short> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Short)
        }
    }
}

pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
    pub(crate) fn bytes(&mut self, data: &[u8]) -> Result<(), Short> {
        let end = self.pos.checked_add(data.len()).ok_or(Short)?;
        self.buf
            .get_mut(self.pos..end)
            .ok_or(Short)?
            .copy_from_slice(data);
        self.pos = end;
        Ok(())
    }
    pub(crate) fn u8(&mut self, v: u8) -> Result<(), Short> {
        self.bytes(&[v])
    }
    pub(crate) fn u16(&mut self, v: u16) -> Result<(), Short> {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn u32(&mut self, v: u32) -> Result<(), Short> {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn u64(&mut self, v: u64) -> Result<(), Short> {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn f32(&mut self, v: f32) -> Result<(), Short> {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn str(&mut self, s: &str, max: usize) -> Result<(), Short> {
        if s.len() > max {
            return Err(Short);
        }
        self.u8(u8::try_from(s.len()).map_err(|_| Short)?)?;
        self.bytes(s.as_bytes())
    }
}
