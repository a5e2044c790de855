// The property the fuzzer checks, shared with `tests/fuzz_regressions.rs` by `include!`.
//
// Byte 0 picks the mode and the read size. In raw mode (bit 7 clear) the rest is fed to
// the decoder as it is. In framed mode (bit 7 set) the rest is a list of frame bodies, each
// `u16 length` then that many bytes, which get a valid CRC-32C, COBS and a delimiter, so
// the fuzzer reaches the payload parsers behind the CRC. Either way the decoder must not
// panic; every frame it returns must re-encode to a frame that decodes to the same
// message, byte for byte; every byte fed must be accounted for.

use railtrace_protocol::{cobs, crc32c, encode_frame_vec, Decoder, MAX_ENCODED_FRAME};

fn frame_bodies(mut data: &[u8]) -> Vec<u8> {
    let mut wire = Vec::new();
    while let [a, b, rest @ ..] = data {
        let n = usize::from(u16::from_le_bytes([*a, *b])).min(rest.len());
        let (body, tail) = rest.split_at(n);
        data = tail;
        let mut raw = body.to_vec();
        raw.extend(crc32c(body).to_le_bytes());
        let mut enc = vec![0u8; cobs::max_encoded_len(raw.len())];
        let len = cobs::encode(&raw, &mut enc).expect("buffer sized by max_encoded_len");
        wire.extend(&enc[..len]);
        wire.push(0);
    }
    wire
}

pub fn check(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let piece = usize::from(first & 0x7F) * 8 + 1;
    let framed;
    let stream = if first & 0x80 != 0 {
        framed = frame_bodies(rest);
        &framed[..]
    } else {
        rest
    };
    let mut dec = Decoder::<MAX_ENCODED_FRAME>::new();
    let mut frames = 0u64;
    for chunk in stream.chunks(piece) {
        let mut input = chunk;
        while let Some(result) = dec.next(&mut input) {
            let Ok(frame) = result else { continue };
            frames += 1;
            let wire = encode_frame_vec(frame.seq, &frame.message)
                .expect("a decoded message re-encodes");
            let mut again = Decoder::<MAX_ENCODED_FRAME>::new();
            let mut w = &wire[..];
            let back = again.next(&mut w).expect("one frame").expect("valid");
            assert!(w.is_empty());
            // Compared as text and as bytes, not with `==`: a NaN calibration is a valid
            // value that must survive, and NaN != NaN.
            assert_eq!(format!("{back:?}"), format!("{frame:?}"), "decodes differently");
            let wire2 = encode_frame_vec(back.seq, &back.message).expect("re-encodes");
            assert_eq!(wire2, wire, "re-encoding is not stable");
        }
        assert!(dec.pending() <= stream.len());
    }
    let s = dec.stats();
    assert_eq!(s.frames, frames);
    assert_eq!(
        s.bytes_accepted + s.bytes_rejected + s.delimiters + dec.pending() as u64,
        stream.len() as u64,
        "bytes unaccounted for: {s:?}"
    );
}
