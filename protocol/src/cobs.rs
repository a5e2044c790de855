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
pub fn encode(input: &[u8], output: &mut [u8]) -> Result<usize, CobsError> {
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

fn put(output: &mut [u8], at: usize, b: u8) -> Result<(), CobsError> {
    *output.get_mut(at).ok_or(CobsError::OutputTooShort)? = b;
    Ok(())
}

/// Decodes a COBS block (without its delimiter) in place, returning the decoded length.
/// The decoded bytes are `buf[..len]`.
pub fn decode_in_place(buf: &mut [u8]) -> Result<usize, CobsError> {
    let mut read = 0usize;
    let mut write = 0usize;
    while let Some(&code) = buf.get(read) {
        if code == 0 {
            return Err(CobsError::Invalid);
        }
        read += 1;
        for _ in 1..code {
            let b = *buf.get(read).ok_or(CobsError::Invalid)?;
            if b == 0 {
                return Err(CobsError::Invalid);
            }
            // write < read always holds, so this never overwrites unread input.
            put(buf, write, b).map_err(|_| CobsError::Invalid)?;
            write += 1;
            read += 1;
        }
        if code != 0xFF && read < buf.len() {
            put(buf, write, 0).map_err(|_| CobsError::Invalid)?;
            write += 1;
        }
    }
    Ok(write)
}

#[cfg(test)]
mod tests {
    use super::*;

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
