// The property the fuzzer checks, shared with `tests/fuzz_regressions.rs` by `include!`.
// Any input: the first byte picks the read size, the rest is fed to the decoder in pieces
// of that size. The decoder must not panic; every frame it returns must re-encode to a
// frame that decodes to the same message; every byte fed must be accounted for.

use railtrace_protocol::{encode_frame_vec, Decoder, MAX_WIRE_FRAME};

pub fn check(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(first) + 1;
    let mut dec = Decoder::<MAX_WIRE_FRAME>::new();
    let mut frames = 0u64;
    for chunk in stream.chunks(piece) {
        let mut input = chunk;
        while let Some(result) = dec.next(&mut input) {
            let Ok(frame) = result else { continue };
            frames += 1;
            let wire = encode_frame_vec(frame.seq, &frame.message)
                .expect("a decoded message re-encodes");
            let mut again = Decoder::<MAX_WIRE_FRAME>::new();
            let mut w = &wire[..];
            let back = again.next(&mut w).expect("one frame").expect("valid");
            assert_eq!(back, frame, "re-encoded frame decodes differently");
            assert!(w.is_empty());
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
