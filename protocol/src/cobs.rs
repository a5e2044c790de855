//! Consistent Overhead Byte Stuffing (Cheshire and Baker, 1999), the plain variant:
//! a code byte `n` (1..=255) is followed by `n - 1` non-zero data bytes, then an implied
//! zero unless `n` is 255 or the block is the last one. Encoding `len` bytes takes at most
//! [`max_encoded_len`]`(len)` bytes. Every function checks its lengths and returns an
//! error instead of panicking when a buffer is too short.

/// The most bytes that [`encode`] can write for `len` input bytes (no delimiter).
pub const fn max_encoded_len(len: usize) -> usize {
    len + len / 254 + 1
}

/// Why a COBS operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CobsError {
    /// The output buffer is shorter than the result.
    OutputTooShort,
    /// The input is not valid COBS: a zero byte inside it, or a code byte that points
    /// past its end.
    Invalid,
}

/// Encodes `input` into `output`, returning the number of bytes written. The result
/// contains no zero byte; the caller appends the 0x00 delimiter.
///
/// A machine word at a time: a word of non-zero bytes is stored whole; a word with a zero
/// is stored whole too, and the block ends at its first zero (the bytes stored past it
/// are overwritten by what follows, or lie past the result). Near the end of a block
/// (254 bytes), or where fewer than a word of input or output is left, byte by byte.
pub fn encode(input: &[u8], output: &mut [u8]) -> Result<usize, CobsError> {
    const W: usize = size_of::<usize>();
    if output.len() < max_encoded_len(input.len()) {
        return Err(CobsError::OutputTooShort);
    }
    // Whole-word stores go up to here.
    let word_end = output.len().saturating_sub(W);
    let mut rest = input;
    // The block being written: its code byte at `code_at`, `run` data bytes so far.
    let (mut dst, mut code_at, mut run) = (1usize, 0usize, 0usize);
    loop {
        if run + W <= 254 && dst <= word_end {
            if let (Some(&word), Some(to)) = (rest.first_chunk::<W>(), output.get_mut(dst..)) {
                if let Some(to) = to.first_chunk_mut::<W>() {
                    *to = word;
                }
                let zeros = zero_bytes(usize::from_le_bytes(word));
                if zeros == 0 {
                    rest = rest.get(W..).unwrap_or_default();
                    (dst, run) = (dst + W, run + W);
                    if run == 254 {
                        put(output, code_at, 0xFF)?;
                        (code_at, dst, run) = (dst, dst + 1, 0);
                    }
                } else {
                    let k = zeros.trailing_zeros() as usize / 8;
                    rest = rest.get(k + 1..).unwrap_or_default();
                    put(output, code_at, (run + k) as u8 + 1)?;
                    (code_at, dst, run) = (dst + k, dst + k + 1, 0);
                }
                continue;
            }
        }
        let Some((&b, tail)) = rest.split_first() else {
            put(output, code_at, run as u8 + 1)?;
            return Ok(dst);
        };
        rest = tail;
        if b == 0 {
            put(output, code_at, run as u8 + 1)?;
            (code_at, dst, run) = (dst, dst + 1, 0);
        } else {
            put(output, dst, b)?;
            (dst, run) = (dst + 1, run + 1);
            if run == 254 {
                put(output, code_at, 0xFF)?;
                (code_at, dst, run) = (dst, dst + 1, 0);
            }
        }
    }
}

/// A word with the high bit of each byte set where `w` has a zero byte, and possibly of
/// bytes above a zero byte (a borrow), never below: its lowest set bit marks the first
/// zero byte (in little-endian order), and it is 0 exactly when `w` has none.
fn zero_bytes(w: usize) -> usize {
    const LOW: usize = usize::MAX / 255; // 0x0101...01
    w.wrapping_sub(LOW) & !w & (LOW << 7)
}

/// The index of the first zero byte of `s`, or its length if it has none; a machine word
/// at a time, then byte by byte.
pub fn zero_or_len(s: &[u8]) -> usize {
    const W: usize = size_of::<usize>();
    let mut at = 0;
    for chunk in s.chunks_exact(W) {
        let zeros = zero_bytes(usize::from_le_bytes(chunk.try_into().unwrap_or([0; W])));
        if zeros != 0 {
            return at + zeros.trailing_zeros() as usize / 8;
        }
        at += W;
    }
    let tail = s.get(at..).unwrap_or(&[]);
    at + tail.iter().position(|&b| b == 0).unwrap_or(tail.len())
}

fn put(output: &mut [u8], at: usize, b: u8) -> Result<(), CobsError> {
    *output.get_mut(at).ok_or(CobsError::OutputTooShort)? = b;
    Ok(())
}

/// Decodes a COBS block (without its delimiter) in place, returning the decoded length.
/// The decoded bytes are `buf[..len]`.
pub fn decode_in_place(buf: &mut [u8]) -> Result<usize, CobsError> {
    let (mut read, mut write) = (0usize, 0usize);
    while let Some(&code) = buf.get(read) {
        // A code byte `n` is followed by `n - 1` data bytes, none of them zero; a run at a
        // time, moved down whole (`write <= read`, so it never overwrites unread input).
        let n = usize::from(code).checked_sub(1).ok_or(CobsError::Invalid)?;
        let run = read + 1..read + 1 + n;
        if zero_or_len(buf.get(run.clone()).ok_or(CobsError::Invalid)?) != n {
            return Err(CobsError::Invalid);
        }
        buf.copy_within(run, write);
        (read, write) = (read + 1 + n, write + n);
        if code != 0xFF && read < buf.len() {
            put(buf, write, 0)?;
            write += 1;
        }
    }
    Ok(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slow, obviously-correct reference: one byte at a time, as SPEC.md §3.2 writes it.
    fn encode_reference(input: &[u8], output: &mut [u8]) -> Result<usize, CobsError> {
        if output.len() < max_encoded_len(input.len()) {
            return Err(CobsError::OutputTooShort);
        }
        let mut code_at = 0usize;
        let mut out = 1usize;
        let mut code: u8 = 1;
        for &b in input {
            if b == 0 {
                put(output, code_at, code)?;
                code_at = out;
                out += 1;
                code = 1;
            } else {
                put(output, out, b)?;
                out += 1;
                code += 1;
                if code == 0xFF {
                    put(output, code_at, code)?;
                    code_at = out;
                    out += 1;
                    code = 1;
                }
            }
        }
        put(output, code_at, code)?;
        Ok(out)
    }

    fn roundtrip(data: &[u8]) {
        let mut enc = [0u8; 2048];
        let n = encode(data, &mut enc).unwrap();
        assert!(n <= max_encoded_len(data.len()));
        assert!(!enc[..n].contains(&0), "encoded form holds a zero");
        let dec = decode_in_place(&mut enc[..n]).unwrap();
        assert_eq!(&enc[..dec], data);
    }

    #[test]
    fn known_vectors() {
        // From the COBS paper / Wikipedia's table.
        let cases: &[(&[u8], &[u8])] = &[
            (&[], &[0x01]),
            (&[0x00], &[0x01, 0x01]),
            (&[0x00, 0x00], &[0x01, 0x01, 0x01]),
            (&[0x11, 0x22, 0x00, 0x33], &[0x03, 0x11, 0x22, 0x02, 0x33]),
            (&[0x11, 0x22, 0x33, 0x44], &[0x05, 0x11, 0x22, 0x33, 0x44]),
            (&[0x11, 0x00, 0x00, 0x00], &[0x02, 0x11, 0x01, 0x01, 0x01]),
        ];
        for (raw, enc) in cases {
            let mut out = [0u8; 16];
            let n = encode(raw, &mut out).unwrap();
            assert_eq!(&out[..n], *enc);
            roundtrip(raw);
        }
    }

    #[test]
    fn long_runs_and_boundaries() {
        for len in [253usize, 254, 255, 508, 509, 1034] {
            let nonzero: Vec<u8> = (0..len).map(|i| (i % 255 + 1) as u8).collect();
            roundtrip(&nonzero);
            let mut with_zeros = nonzero.clone();
            with_zeros[len / 2] = 0;
            roundtrip(&with_zeros);
        }
        // 254 non-zero bytes: a full block and a trailing empty one.
        let mut out = [0u8; 300];
        let n = encode(&[7u8; 254], &mut out).unwrap();
        assert_eq!(n, 256);
        assert_eq!((out[0], out[255]), (0xFF, 0x01));
    }

    /// Random bytes (fixed-seed xorshift) with zeros at a density that varies with the
    /// length, so short and full blocks both occur.
    fn random(len: usize, x: &mut u64) -> Vec<u8> {
        let density = [0u64, 2, 16, 250, 256][len % 5];
        (0..len)
            .map(|_| {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                if *x % 256 < density {
                    0
                } else {
                    (*x >> 8) as u8
                }
            })
            .collect()
    }

    /// Every length 0..1100, the input and the output each at every alignment of a word,
    /// the output as short as allowed and longer: byte for byte the reference's result.
    #[test]
    fn word_encoder_matches_reference() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for len in 0..1100 {
            let data = random(len + 8, &mut x);
            let max = max_encoded_len(len);
            let mut want = vec![0u8; max];
            let n = encode_reference(&data[..len], &mut want).unwrap();
            for align in 0..8 {
                let input = &data[align..align + len];
                let n = encode_reference(input, &mut want).unwrap();
                for (at, slack) in [(0, 0), (align, 0), (7 - align, 1), (3, 9)] {
                    let mut out = vec![0xAAu8; at + max + slack];
                    let got = encode(input, &mut out[at..]);
                    assert_eq!(got, Ok(n), "len {len} align {align} at {at}");
                    assert_eq!(out[at..at + n], want[..n], "len {len} align {align}");
                    assert!(
                        out[..at].iter().all(|&b| b == 0xAA),
                        "wrote before its output"
                    );
                }
            }
            let mut short = vec![0u8; max - 1];
            assert_eq!(
                encode(&data[..len], &mut short),
                Err(CobsError::OutputTooShort)
            );
            assert!(n <= max);
        }
    }

    #[test]
    fn zero_scan_matches_position() {
        let mut x: u64 = 0x1234_5678_9ABC_DEF1;
        let data = random(1100 + 16, &mut x);
        let mut ones = data.clone();
        ones.iter_mut().for_each(|b| *b |= 1);
        for start in 0..16 {
            for len in 0..300 {
                for s in [&data[start..start + len], &ones[start..start + len]] {
                    let want = s.iter().position(|&b| b == 0).unwrap_or(len);
                    assert_eq!(zero_or_len(s), want);
                }
            }
        }
        for zero_at in 0..40 {
            let mut s = [0x80u8; 40];
            s[zero_at] = 0;
            assert_eq!(zero_or_len(&s), zero_at);
            s[zero_at] = 0x01;
            assert_eq!(zero_or_len(&s), 40);
        }
    }

    #[test]
    fn short_output_is_an_error_not_a_panic() {
        let mut out = [0u8; 4];
        assert_eq!(
            encode(&[1, 2, 3, 4], &mut out),
            Err(CobsError::OutputTooShort)
        );
    }

    #[test]
    fn invalid_input_is_rejected() {
        assert_eq!(decode_in_place(&mut [0x05, 0x11]), Err(CobsError::Invalid));
        assert_eq!(
            decode_in_place(&mut [0x03, 0x11, 0x00]),
            Err(CobsError::Invalid)
        );
        assert_eq!(decode_in_place(&mut [0x00]), Err(CobsError::Invalid));
    }
}
