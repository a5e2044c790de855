//! CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final XOR
//! 0xFFFFFFFF. The check value of the ASCII bytes `123456789` is 0xE3069283.
//!
//! Slice-by-8: eight bytes a step through eight 256-entry tables (8 KiB, computed at
//! compile time; in flash on a microcontroller). `TABLES[0]` is the classic byte table;
//! `TABLES[k][b]` is the CRC register after byte `b` followed by `k` zero bytes, so one
//! lookup per byte of a little-endian word advances the register by the whole word.

const POLY: u32 = 0x82F6_3B78;

#[allow(clippy::indexing_slicing)] // i < 256 and k < 8 in [[u32; 256]; 8]
const TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            bit += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// One lookup: table `k` at the low byte of `x`.
#[allow(clippy::indexing_slicing)] // a u8 index into a 256-entry table, k < 8 by callers
#[inline(always)]
fn t(k: usize, x: u32) -> u32 {
    TABLES[k][(x & 0xFF) as usize]
}

/// CRC-32C of `data`. On a host (feature `std`) the processor's CRC-32C instruction does
/// it where it has one (SSE 4.2, ARMv8; the `crc32c` crate, twenty times the tables' speed
/// here), else these tables.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_continue(0, data)
}

/// CRC-32C of the bytes whose CRC-32C is `crc` followed by `data`:
/// `crc32c_continue(crc32c(a), b) == crc32c(a ++ b)`.
pub fn crc32c_continue(crc: u32, data: &[u8]) -> u32 {
    #[cfg(feature = "std")]
    return crc32c::crc32c_append(crc, data);
    #[cfg(not(feature = "std"))]
    return !crc32c_update(!crc, data);
}

/// Advances a CRC-32C register (no initial or final inversion) over `data`.
#[cfg_attr(feature = "std", allow(dead_code))] // the tables serve the firmware
pub(crate) fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let (lo, hi) = w.split_at(4);
        let lo = u32::from_le_bytes(lo.try_into().unwrap_or_default()) ^ crc;
        let hi = u32::from_le_bytes(hi.try_into().unwrap_or_default());
        crc = t(7, lo)
            ^ t(6, lo >> 8)
            ^ t(5, lo >> 16)
            ^ t(4, lo >> 24)
            ^ t(3, hi)
            ^ t(2, hi >> 8)
            ^ t(1, hi >> 16)
            ^ t(0, hi >> 24);
    }
    for &b in words.remainder() {
        crc = (crc >> 8) ^ t(0, crc ^ u32::from(b));
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slow, obviously-correct reference: one bit at a time, straight from the
    /// definition of a reflected CRC.
    fn crc32c_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                let lsb = crc & 1;
                crc >>= 1;
                if lsb != 0 {
                    crc ^= POLY;
                }
            }
        }
        !crc
    }

    #[test]
    fn check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// The tables and `crc32c` (on a host, the processor's instruction): every length
    /// 0..1100 at every alignment 0..8 of a random buffer (fixed-seed
    /// xorshift, so the inputs are reproducible), against the bitwise reference; and
    /// split in two anywhere, through `crc32c_update`.
    #[test]
    fn slice_by_8_matches_bitwise_reference() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut data = [0u8; 1100 + 8];
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for align in 0..8 {
            for len in 0..1100 {
                let d = &data[align..align + len];
                let want = crc32c_bitwise(d);
                assert_eq!(crc32c(d), want, "len {len} align {align}");
                assert_eq!(
                    !crc32c_update(!0, d),
                    want,
                    "tables: len {len} align {align}"
                );
                let cut = (len * 7 + align) % (len + 1);
                let (a, b) = d.split_at(cut);
                assert_eq!(!crc32c_update(crc32c_update(!0, a), b), want);
                assert_eq!(crc32c_continue(crc32c(a), b), want);
            }
        }
    }
}
