//! CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, initial value and final XOR
//! 0xFFFFFFFF. The check value of the ASCII bytes `123456789` is 0xE3069283.

const POLY: u32 = 0x82F6_3B78;

/// Byte-at-a-time lookup table, computed at compile time.
#[allow(clippy::indexing_slicing)] // i < 256 in a 256-entry array
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32C of `data`.
#[allow(clippy::indexing_slicing)] // a u8 index into a 256-entry table
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = (crc >> 8) ^ TABLE[usize::from((crc as u8) ^ b)];
    }
    !crc
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

    #[test]
    fn table_matches_bitwise_reference() {
        // Fixed-seed xorshift so the inputs are reproducible.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut data = [0u8; 1100];
        for len in (0..data.len()).step_by(37) {
            for b in data.iter_mut().take(len) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            assert_eq!(
                crc32c(&data[..len]),
                crc32c_bitwise(&data[..len]),
                "len {len}"
            );
        }
    }
}
