//! A recording's messages checked before Arrow decodes them: every message of the stream
//! is framed, its header parsed (a verified flatbuffer) and held against the bytes there
//! are (its body within the file, each buffer within its body, each row count and each
//! compressed buffer's stated size within what such a buffer can hold), so that a cut or
//! damaged file is read up to, and past, its damage, and never makes Arrow allocate what a
//! damaged length claims or read outside a buffer.
//!
//! The writer seals every message: the last 8 bytes of its metadata (which Arrow readers
//! skip as padding) are `RTc1` and the CRC-32C of its metadata before them and its body.
//! Every sealed message must match, and once one is, every message after it must be
//! sealed (a file another Arrow writer rewrote carries no seals, and is checked as above).
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

/// The last 8 bytes of a sealed message's metadata: these 4, then the CRC-32C.
const SEAL: [u8; 4] = *b"RTc1";
/// Bytes a seal adds to a message's metadata: 56 bytes (what it holds, then zeros), then
/// the seal, so that the body
/// stays 64-byte aligned as Arrow writes it.
const SEAL_LEN: usize = 64;

/// What a sealed message holds (the first of the seal's 56 bytes before its mark): the
/// recording's rows (its schema, dictionary and record batches).
pub(crate) const ROWS: u8 = 0;
/// ... or its overview, the last record batch of a closed recording: the coarse level's
/// summaries, for a plot that does not read the samples;
pub(crate) const OVERVIEW: u8 = 1;
/// ... and the batch before it, the fine level's.
pub(crate) const OVERVIEW_FINE: u8 = 2;

/// Seals the complete Arrow IPC stream messages in `bytes` (as an Arrow stream writer
/// wrote them) into `out`, as holding `content`.
pub(crate) fn seal(bytes: &[u8], out: &mut Vec<u8>, content: u8) -> Result<(), String> {
    let mut at = 0;
    while at < bytes.len() {
        let word = |i: usize| -> Result<[u8; 4], String> {
            bytes
                .get(i..i + 4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| "a message cut short".to_string())
        };
        let meta_len = i32::from_le_bytes(word(at + 4)?) as usize;
        if meta_len == 0 {
            out.extend_from_slice(&bytes[at..at + 8]);
            at += 8;
            continue;
        }
        let meta = bytes
            .get(at + 8..at + 8 + meta_len)
            .ok_or("a message cut short")?;
        let msg = arrow_ipc::root_as_message(meta).map_err(|e| e.to_string())?;
        let body_at = at + 8 + meta_len;
        let body = bytes
            .get(body_at..body_at + msg.bodyLength() as usize)
            .ok_or("a message cut short")?;
        let sealed_len = meta_len + SEAL_LEN;
        out.extend_from_slice(&[0xFF; 4]);
        out.extend_from_slice(&(sealed_len as i32).to_le_bytes());
        out.extend_from_slice(meta);
        let mut pad = [0; SEAL_LEN - 8];
        pad[0] = content;
        out.extend_from_slice(&pad);
        let crc = crc32c::crc32c(meta);
        let crc = crc32c::crc32c_append(crc, &pad);
        let crc = crc32c::crc32c_append(crc, body);
        out.extend_from_slice(&SEAL);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(body);
        at = body_at + body.len();
    }
    Ok(())
}

/// Where the last whole message of an Arrow stream writer's `bytes` starts.
pub(crate) fn last_message(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut last = None;
    while at + 8 <= bytes.len() && bytes[at..at + 4] == [0xFF; 4] {
        let meta_len = i32::from_le_bytes(bytes[at + 4..at + 8].try_into().ok()?) as usize;
        let msg = arrow_ipc::root_as_message(bytes.get(at + 8..at + 8 + meta_len)?).ok()?;
        let end = at + 8 + meta_len + usize::try_from(msg.bodyLength()).ok()?;
        if end > bytes.len() {
            break;
        }
        last = Some(at);
        at = end;
    }
    last
}

/// What a scan found.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scan {
    /// The byte ranges of the messages that check out, in order (the schema's first).
    pub ranges: Vec<(u64, u64)>,
    /// The end-of-stream marker was found.
    pub closed: bool,
    /// A message was sealed: every one from there on was checked against its CRC-32C.
    pub sealed: bool,
    /// What is wrong, one entry per damaged stretch: the record batch it held (1-based,
    /// counting the batches before it) and where.
    pub damage: Vec<String>,
    /// Where each damaged stretch of rows lies: the number of record batches that check
    /// out before it (a reader marks the samples it held as a gap there). A stretch after
    /// the last rows of a closed file counts only where the overview's fine level
    /// follows it (otherwise it may have been the overview).
    pub holes: Vec<usize>,
}

/// Why a message at some offset does not check out.
#[derive(Debug)]
pub(crate) enum Bad {
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

/// A message that checks out.
pub(crate) struct Message {
    pub end: u64,
    pub is_batch: bool,
    sealed: bool,
    /// What it holds ([`ROWS`], [`OVERVIEW`]; an unsealed one, rows).
    pub content: u8,
    /// For the schema: whether each column node of a record batch, in order, is of a
    /// top-level column (as many values as the batch has rows) or of a list's values.
    pub top: Vec<bool>,
}

/// The column nodes of a record batch of `schema`: see [`Message::top`].
pub(crate) fn layout(schema: arrow_ipc::Schema<'_>) -> Vec<bool> {
    fn walk(f: arrow_ipc::Field<'_>, top: bool, out: &mut Vec<bool>) {
        out.push(top);
        for c in f.children().iter().flatten() {
            walk(c, false, out);
        }
    }
    let mut out = Vec::new();
    for f in schema.fields().iter().flatten() {
        walk(f, true, &mut out);
    }
    out
}

/// Checks the message at `at` of a file of `len` bytes (the first, the schema's, or one
/// after it, which must be sealed if an earlier one was, and whose record batches have
/// the schema's column nodes `top`); None for the end-of-stream marker.
pub(crate) fn message(
    file: &mut File,
    at: u64,
    len: u64,
    first: bool,
    sealed: bool,
    top: &[bool],
) -> Result<Option<Message>, Bad> {
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
    let n = meta.len();
    let has_seal = n >= SEAL_LEN && meta[n - 8..n - 4] == SEAL;
    if has_seal {
        let stored = u32::from_le_bytes([meta[n - 4], meta[n - 3], meta[n - 2], meta[n - 1]]);
        let body = read_at(file, body_at, body_len as usize).map_err(io)?;
        let crc = crc32c::crc32c(&meta[..n - 8]);
        if crc32c::crc32c_append(crc, &body) != stored {
            return Err(Bad::Damaged("its checksum does not match".into()));
        }
    } else if sealed {
        return Err(Bad::Damaged("its checksum is missing".into()));
    }
    let sealed = has_seal;
    let content = if has_seal { meta[n - SEAL_LEN] } else { ROWS };
    let header = msg.header_type();
    let batch = match header {
        arrow_ipc::MessageHeader::Schema if first => {
            return Ok(Some(Message {
                end,
                is_batch: false,
                sealed,
                content,
                top: msg.header_as_schema().map(layout).unwrap_or_default(),
            }))
        }
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
    let is_batch = header == arrow_ipc::MessageHeader::RecordBatch;
    for (i, n) in batch.nodes().iter().flatten().enumerate() {
        // A list's values: any number, up to what a batch of codes can hold.
        let values = is_batch && top.get(i) == Some(&false);
        let length = if values { n.length() } else { rows };
        if (!values && n.length() != rows)
            || !(0..=MAX_ROWS * 16).contains(&n.length())
            || !(0..=length).contains(&n.null_count())
        {
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
    Ok(Some(Message {
        end,
        is_batch,
        sealed,
        content,
        top: Vec::new(),
    }))
}

/// Scans the first `len` bytes of `file`: the messages that check out, and the damage.
/// The schema message must check out (otherwise the file is not read at all).
pub(crate) fn scan(file: &mut File, len: u64) -> std::io::Result<Scan> {
    let mut s = Scan::default();
    let mut at = 0u64;
    let mut batches = 0usize;
    let mut good = 0usize;
    let mut pending = Vec::new();
    let mut top = Vec::new();
    while at < len {
        let first = s.ranges.is_empty();
        match message(file, at, len, first, s.sealed, &top) {
            Ok(None) => {
                s.closed = true;
                break;
            }
            Ok(Some(m)) if m.content != ROWS => {
                if m.content == OVERVIEW_FINE {
                    s.holes.append(&mut pending);
                }
                at = m.end
            }
            Ok(Some(m)) => {
                s.holes.append(&mut pending);
                if first {
                    top = m.top;
                }
                s.ranges.push((at, m.end));
                batches += usize::from(m.is_batch);
                good += usize::from(m.is_batch);
                s.sealed |= m.sealed;
                at = m.end;
            }
            Err(Bad::Damaged(_)) if s.ranges.is_empty() => break,
            Err(bad) => {
                // The next place where a whole message checks out, or (after a damaged
                // message, not a cut one) the end-of-stream marker that ends the file: the
                // same 8 bytes inside a batch's data are no end.
                let cut = matches!(bad, Bad::Cut);
                let mut next = at + 1;
                let found = loop {
                    match find_marker(file, next, len)? {
                        None => break None,
                        Some(p) => match message(file, p, len, false, s.sealed, &top) {
                            Ok(None) if cut || p + 8 < len => next = p + 1,
                            Ok(m) => break Some((p, m)),
                            Err(_) => next = p + 1,
                        },
                    }
                };
                let found = found.map(|(p, _)| p);
                let why = match (bad, found) {
                    // A message running past the end with nothing whole after it: the file
                    // was cut there.
                    (Bad::Cut, None) => {
                        s.damage.push(format!(
                            "the file ends inside record batch {} (at byte {at} of {len}); read up to the batch before",
                            batches + 1
                        ));
                        break;
                    }
                    (Bad::Cut, Some(_)) => "its length runs past the end of the file".to_string(),
                    (Bad::Damaged(why), _) => why,
                };
                s.damage.push(format!(
                    "record batch {} is damaged ({why}, at byte {at}){}",
                    batches + 1,
                    match found {
                        Some(p) => format!("; skipped up to byte {p}"),
                        None => "; nothing after it reads".into(),
                    }
                ));
                batches += 1;
                pending.push(good);
                match found {
                    Some(p) => at = p,
                    None => break,
                }
            }
        }
    }
    if !s.closed {
        s.holes.append(&mut pending);
    }
    Ok(s)
}

/// Record batches' byte ranges, and where the fine level starts: see [`walk`].
pub(crate) type Walk = (Vec<(u64, u64)>, Option<u64>);

/// The record batches of rows between `from` and `to` (a message's start and another's)
/// by their byte ranges, from their framing and headers alone: their bodies are neither
/// read nor checked (a reader checks those it reads). `None` where the messages do not
/// follow one another cleanly up to `to`.
/// Also where the overview's fine level starts, if it is there.
pub(crate) fn walk(file: &mut File, from: u64, to: u64) -> Option<Walk> {
    let mut out = Vec::new();
    let mut fine = None;
    let mut at = from;
    while at < to {
        let head = read_at(file, at, 8).ok()?;
        let meta_len = i64::from(i32::from_le_bytes([head[4], head[5], head[6], head[7]]));
        if head[..4] != [0xFF; 4] || !(8..=MAX_HEADER).contains(&meta_len) {
            return None;
        }
        let meta = read_at(file, at + 8, meta_len as usize).ok()?;
        let msg = arrow_ipc::root_as_message(&meta).ok()?;
        let end = (at + 8 + meta_len as u64).checked_add(u64::try_from(msg.bodyLength()).ok()?)?;
        if end > to {
            return None;
        }
        let n = meta.len();
        let content = (n >= SEAL_LEN && meta[n - 8..n - 4] == SEAL).then(|| meta[n - SEAL_LEN]);
        if msg.header_type() == arrow_ipc::MessageHeader::RecordBatch {
            match content {
                Some(ROWS) => out.push((at, end)),
                Some(OVERVIEW_FINE) => fine = Some(at),
                _ => {}
            }
        }
        at = end;
    }
    Some((out, fine))
}

/// The offset of the next message marker at or after `from`: four 0xFF bytes followed
/// by a header length (a multiple of 8, so its first byte is never 0xFF) or by the end
/// of the file. Inside a run of 0xFF bytes (a validity bitmap) only its last four can
/// start one.
fn find_marker(file: &mut File, from: u64, len: u64) -> std::io::Result<Option<u64>> {
    let mut at = from;
    let mut buf = vec![0u8; 1 << 16];
    while at + 4 <= len {
        let n = ((len - at) as usize).min(buf.len());
        file.seek(SeekFrom::Start(at))?;
        file.read_exact(&mut buf[..n])?;
        let ends = at + n as u64 == len;
        let chunk = &buf[..n];
        let found = (0..=n - 4).find(|&i| {
            chunk[i..i + 4] == [0xFF; 4] && chunk.get(i + 4).map_or(ends, |&b| b != 0xFF)
        });
        if let Some(i) = found {
            return Ok(Some(at + i as u64));
        }
        if ends {
            break;
        }
        at += (n - 4) as u64;
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
