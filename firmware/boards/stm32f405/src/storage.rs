//! The channels' calibration in flash sector 11 (0x080E_0000, 128 KiB), which `memory.x`
//! keeps out of the image.
//!
//! Record: the magic `RTC1`, the channel count (8), then per channel the `f32` bits of
//! scale and offset, then a CRC-32C of those 18 words: 19 little-endian words. A sector
//! that does not hold a valid record (blank, torn write, other data) gives no calibration
//! and the defaults are used.
//!
//! Writing erases the whole sector (1-2 s on silicon; the CPU stalls on flash reads
//! meanwhile, so do it only while not sampling, as the protocol requires) and programs the
//! record word by word, then reads it back. QEMU models no flash controller: there the
//! write has no effect, the read-back differs and the result is a storage fault.

use railtrace_firmware::{Calibration, ErrorKind, CHANNELS};
use railtrace_protocol::crc32c;
use stm32f4::stm32f405 as pac;

const BASE: usize = 0x080E_0000;
const SECTOR: u8 = 11;
const MAGIC: u32 = u32::from_le_bytes(*b"RTC1");
const WORDS: usize = 3 + 2 * CHANNELS;
/// Polls of BSY before giving up: far above the 2 s worst-case sector erase at 168 MHz.
const BUSY_POLLS: u32 = 400_000_000;

fn record(cal: &[Calibration; CHANNELS]) -> [u32; WORDS] {
    let mut w = [0u32; WORDS];
    let (head, rest) = w.split_at_mut(2);
    head.copy_from_slice(&[MAGIC, CHANNELS as u32]);
    for (pair, c) in rest.chunks_exact_mut(2).zip(cal) {
        pair.copy_from_slice(&[c.scale.to_bits(), c.offset.to_bits()]);
    }
    let crc = crc(&w[..WORDS - 1]);
    if let Some(last) = w.last_mut() {
        *last = crc;
    }
    w
}

fn crc(words: &[u32]) -> u32 {
    let mut bytes = [0u8; 4 * WORDS];
    for (chunk, w) in bytes.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    crc32c(bytes.get(..4 * words.len()).unwrap_or(&[]))
}

fn read() -> [u32; WORDS] {
    let mut w = [0u32; WORDS];
    for (i, word) in w.iter_mut().enumerate() {
        // SAFETY: flash is always readable; sector 11 lies within the STM32F405's 1 MiB.
        *word = unsafe { core::ptr::read_volatile((BASE + 4 * i) as *const u32) };
    }
    w
}

/// The stored calibration, if the sector holds a valid record.
pub fn load() -> Option<[Calibration; CHANNELS]> {
    let w = read();
    if w[..2] != [MAGIC, CHANNELS as u32] || w.last() != Some(&crc(&w[..WORDS - 1])) {
        return None;
    }
    let mut cal = [Calibration {
        scale: 1.0,
        offset: 0.0,
    }; CHANNELS];
    for (c, pair) in cal.iter_mut().zip(w[2..].chunks_exact(2)) {
        if let [scale, offset] = *pair {
            *c = Calibration {
                scale: f32::from_bits(scale),
                offset: f32::from_bits(offset),
            };
        }
    }
    Some(cal)
}

fn wait(flash: &pac::FLASH) -> Result<(), ErrorKind> {
    for _ in 0..BUSY_POLLS {
        if flash.sr().read().bsy().bit_is_clear() {
            let sr = flash.sr().read();
            let failed = sr.operr().bit_is_set()
                || sr.wrperr().bit_is_set()
                || sr.pgaerr().bit_is_set()
                || sr.pgperr().bit_is_set()
                || sr.pgserr().bit_is_set();
            return if failed {
                Err(ErrorKind::Storage)
            } else {
                Ok(())
            };
        }
    }
    Err(ErrorKind::Storage)
}

/// Erases sector 11 and writes `cal` to it; checks it by reading it back.
pub fn store(flash: &pac::FLASH, cal: &[Calibration; CHANNELS]) -> Result<(), ErrorKind> {
    let words = record(cal);
    if flash.cr().read().lock().bit_is_set() {
        // SAFETY: the documented unlock sequence (RM0090 §3.5.1).
        flash.keyr().write(|w| unsafe { w.key().bits(0x4567_0123) });
        flash.keyr().write(|w| unsafe { w.key().bits(0xCDEF_89AB) });
    }
    // Clear stale error flags (write 1 to clear).
    // SAFETY: only the error and EOP flags are set; writing 1 clears them.
    flash.sr().write(|w| unsafe { w.bits(0xF3) });
    let result = (|| {
        wait(flash)?;
        // SAFETY: SNB 11 is sector 11 of the STM32F405 (RM0090 Table 5).
        flash
            .cr()
            .write(|w| unsafe { w.psize().psize32().ser().set_bit().snb().bits(SECTOR) });
        flash.cr().modify(|_, w| w.strt().set_bit());
        wait(flash)?;
        flash.cr().write(|w| w.psize().psize32().pg().set_bit());
        for (i, &word) in words.iter().enumerate() {
            // SAFETY: programming a word of the erased sector, PG set, x32 parallelism.
            unsafe { core::ptr::write_volatile((BASE + 4 * i) as *mut u32, word) };
            wait(flash)?;
        }
        Ok(())
    })();
    flash.cr().write(|w| w.lock().set_bit());
    result?;
    if read() == words {
        Ok(())
    } else {
        Err(ErrorKind::Storage)
    }
}
