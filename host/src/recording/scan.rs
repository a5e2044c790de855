//! A recording's messages checked before Arrow decodes them: every message of the stream
//! is framed, its header parsed (a verified flatbuffer) and held against the bytes there
//! are (its body within the file, each buffer within its body, each row count and each
//! compressed buffer's stated size within what such a buffer can hold), so that a cut or
//! damaged file is read up to, and past, its damage, and never makes Arrow allocate what a
//! damaged length claims or read outside a buffer.
//!
//! A message that fails is skipped and named; where its framing itself is damaged, the
//! next place where a whole message checks out is found by looking for the next message
//! marker.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

/// The most rows in one record batch: 256 times what the writer puts in one.
const MAX_ROWS: i64 = 1 << 24;
/// The largest message header (the schema's, with the rig's text, is a few kB).
const MAX_HEADER: i64 = 16 << 20;
/// LZ4 expands at most 255 times (a run of one byte); a buffer claiming more is damaged.
const LZ4_MAX_RATIO: i64 = 255;

/// What a scan found.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scan {
    /// The byte ranges of the messages that check out, in order (the schema's first).
    pub ranges: Vec<(u64, u64)>,
    /// The end-of-stream marker was found.
    pub closed: bool,
    /// What is wrong, one entry per damaged stretch: the record batch it held (1-based,
    /// counting the batches before it) and where.
    pub damage: Vec<String>,
}

/// Why a message at some offset does not check out.
enum Bad {
    /// The file ends inside it.
    Cut,
    /// Its bytes are not a message.
    Damaged(String),
}

fn read_at(file: &mut File, at: u64, n: usize) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(at))?;
    let mut v = vec![0u8; n];
    file.read_exact(&mut v)?;
    Ok(v)
}

/// Checks the message at `at` of a file of `len` bytes; its end, or None for the
/// end-of-stream marker.
fn message(file: &mut File, at: u64, len: u64, first: bool) -> Result<Option<(u64, bool)>, Bad> {
    let io = |e: std::io::Error| Bad::Damaged(e.to_string());
    if at + 8 > len {
        return Err(Bad::Cut);
    }
    let head = read_at(file, at, 8).map_err(io)?;
    if head[..4] != [0xFF; 4] {
        return Err(Bad::Damaged("no message marker".into()));
    }
    let meta_len = i64::from(i32::from_le_bytes([head[4], head[5], head[6], head[7]]));
    if meta_len == 0 {
        return Ok(None);
    }
    if !(8..=MAX_HEADER).contains(&meta_len) || meta_len % 8 != 0 {
        return Err(Bad::Damaged(format!("a header length of {meta_len}")));
    }
    let body_at = at + 8 + meta_len as u64;
    if body_at > len {
        return Err(Bad::Cut);
    }
    let meta = read_at(file, at + 8, meta_len as usize).map_err(io)?;
    let msg = arrow_ipc::root_as_message(&meta).map_err(|e| {
        let e = e.to_string();
        let first = e.lines().next().unwrap_or("").trim_end_matches('.');
        Bad::Damaged(format!("its header does not parse: {first}"))
    })?;
    let body_len = msg.bodyLength();
    if body_len < 0 {
        return Err(Bad::Damaged(format!("a body length of {body_len}")));
    }
    let end = body_at + body_len as u64;
    if end > len {
        return Err(Bad::Cut);
    }
    let header = msg.header_type();
    let batch = match header {
        arrow_ipc::MessageHeader::Schema if first => return Ok(Some((end, false))),
        arrow_ipc::MessageHeader::RecordBatch if !first => msg.header_as_record_batch(),
        arrow_ipc::MessageHeader::DictionaryBatch if !first => {
            msg.header_as_dictionary_batch().and_then(|d| d.data())
        }
        _ => return Err(Bad::Damaged("not a message of a recording's stream".into())),
    }
    .ok_or_else(|| Bad::Damaged("a batch message without its batch".into()))?;
    let rows = batch.length();
    if !(0..=MAX_ROWS).contains(&rows) {
        return Err(Bad::Damaged(format!("{rows} rows")));
    }
    for n in batch.nodes().iter().flatten() {
        if n.length() != rows || !(0..=rows).contains(&n.null_count()) {
            return Err(Bad::Damaged(format!(
                "a column of {} rows ({} null) in a batch of {rows}",
                n.length(),
                n.null_count()
            )));
        }
    }
    let compressed = batch.compression().is_some();
    for b in batch.buffers().iter().flatten() {
        let (offset, length) = (b.offset(), b.length());
        if offset < 0 || length < 0 || offset.saturating_add(length) > body_len {
            return Err(Bad::Damaged(format!(
                "a buffer at {offset} of {length} bytes in a body of {body_len}"
            )));
        }
        if compressed && length >= 8 {
            let p = read_at(file, body_at + offset as u64, 8).map_err(io)?;
            let stated = i64::from_le_bytes(p.try_into().unwrap_or([0; 8]));
            // -1: stored uncompressed.
            if stated != -1 && !(0..=LZ4_MAX_RATIO * length).contains(&stated) {
                return Err(Bad::Damaged(format!(
                    "a compressed buffer of {length} bytes claiming {stated}"
                )));
            }
        } else if compressed && length != 0 {
            return Err(Bad::Damaged(format!(
                "a compressed buffer of {length} bytes"
            )));
        }
    }
    Ok(Some((end, header == arrow_ipc::MessageHeader::RecordBatch)))
}

/// Scans the first `len` bytes of `file`: the messages that check out, and the damage.
/// The schema message must check out (otherwise the file is not read at all).
pub(crate) fn scan(file: &mut File, len: u64) -> std::io::Result<Scan> {
    let mut s = Scan::default();
    let mut at = 0u64;
    let mut batches = 0usize;
    while at < len {
        match message(file, at, len, s.ranges.is_empty()) {
            Ok(None) => {
                s.closed = true;
                break;
            }
            Ok(Some((end, is_batch))) => {
                s.ranges.push((at, end));
                batches += usize::from(is_batch);
                at = end;
            }
            Err(Bad::Cut) => {
                s.damage.push(format!(
                    "the file ends inside record batch {} (at byte {at} of {len}); read up to the batch before",
                    batches + 1
                ));
                break;
            }
            Err(Bad::Damaged(_)) if s.ranges.is_empty() => break,
            Err(Bad::Damaged(why)) => {
                // The next place where a whole message checks out.
                let mut next = at + 1;
                let found = loop {
                    match find_marker(file, next, len)? {
                        None => break None,
                        Some(p) => match message(file, p, len, false) {
                            Ok(m) => break Some((p, m)),
                            Err(_) => next = p + 1,
                        },
                    }
                };
                s.damage.push(format!(
                    "record batch {} is damaged ({why}, at byte {at}){}",
                    batches + 1,
                    match found {
                        Some((p, _)) => format!("; skipped up to byte {p}"),
                        None => "; nothing after it reads".into(),
                    }
                ));
                batches += 1;
                match found {
                    Some((p, _)) => at = p,
                    None => break,
                }
            }
        }
    }
    Ok(s)
}

/// The offset of the next message marker (four 0xFF bytes) at or after `from`.
fn find_marker(file: &mut File, from: u64, len: u64) -> std::io::Result<Option<u64>> {
    let mut at = from;
    let mut buf = vec![0u8; 1 << 16];
    while at + 4 <= len {
        let n = ((len - at) as usize).min(buf.len());
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(i) = buf[..n].windows(4).position(|w| w == [0xFF; 4]) {
            return Ok(Some(at + i as u64));
        }
        if n < 4 {
            break;
        }
        at += (n - 3) as u64;
    }
    Ok(None)
}

/// The bytes of the ranges that checked out, one after the other, then the end-of-stream
/// marker: the stream Arrow reads.
pub(crate) struct Ranges {
    file: File,
    ranges: std::vec::IntoIter<(u64, u64)>,
    now: Option<(u64, u64)>,
    tail: &'static [u8],
}

impl Ranges {
    pub(crate) fn new(file: File, ranges: Vec<(u64, u64)>) -> Ranges {
        Ranges {
            file,
            ranges: ranges.into_iter(),
            now: None,
            tail: &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0],
        }
    }
}

impl Read for Ranges {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.now {
                Some((at, end)) if at < end => {
                    let n = ((end - at) as usize).min(buf.len());
                    self.file.seek(SeekFrom::Start(at))?;
                    let n = self.file.read(&mut buf[..n])?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    self.now = Some((at + n as u64, end));
                    return Ok(n);
                }
                _ => match self.ranges.next() {
                    Some(r) => self.now = Some(r),
                    None => {
                        let n = self.tail.len().min(buf.len());
                        buf[..n].copy_from_slice(&self.tail[..n]);
                        self.tail = &self.tail[n..];
                        return Ok(n);
                    }
                },
            }
        }
    }
}
