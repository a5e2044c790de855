//! The HIP runtime calls, made safe. Every `unsafe` block in the crate is here.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::ptr;

use hip_sys::hiprt::{self as rt, hipError_t};

/// A failed HIP call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipError {
    /// The HIP function.
    pub call: &'static str,
    /// Its `hipError_t` code.
    pub code: u32,
    /// The runtime's description of the code.
    pub message: String,
}

impl HipError {
    /// Whether the error says there is no usable device (`hipErrorNoDevice`,
    /// `hipErrorInvalidDevice` or `hipErrorInsufficientDriver`).
    pub fn is_no_device(&self) -> bool {
        [
            hipError_t::hipErrorNoDevice,
            hipError_t::hipErrorInvalidDevice,
            hipError_t::hipErrorInsufficientDriver,
        ]
        .iter()
        .any(|&e| e as u32 == self.code)
    }
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (hipError {})",
            self.call, self.message, self.code
        )
    }
}

impl std::error::Error for HipError {}

/// `Ok` for `hipSuccess`, else the error with the runtime's description.
fn check(call: &'static str, e: hipError_t) -> Result<(), HipError> {
    if e == hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorString takes any code and returns a pointer to a static,
    // NUL-terminated string (or null, which is checked).
    let text = unsafe { rt::hipGetErrorString(e) };
    let message = if text.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated and static, as above.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(HipError {
        call,
        code: e as u32,
        message,
    })
}

/// The number of HIP devices; 0 where the runtime reports none (`hipErrorNoDevice`).
pub fn device_count() -> Result<usize, HipError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid place for the count.
    let e = unsafe { rt::hipGetDeviceCount(&mut n) };
    if e == hipError_t::hipErrorNoDevice {
        return Ok(0);
    }
    check("hipGetDeviceCount", e)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Makes `device` the calling thread's current device.
pub fn set_device(device: usize) -> Result<(), HipError> {
    let d = c_int::try_from(device).unwrap_or(c_int::MAX);
    // SAFETY: plain value argument; an invalid index is an error code, not UB.
    check("hipSetDevice", unsafe { rt::hipSetDevice(d) })
}

/// The device's name (e.g. "AMD Instinct MI300X").
pub fn device_name(device: usize) -> Result<String, HipError> {
    let d = c_int::try_from(device).unwrap_or(c_int::MAX);
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is writable for the length passed; HIP NUL-terminates within it.
    check("hipDeviceGetName", unsafe {
        rt::hipDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, d)
    })?;
    let last = buf.len() - 1;
    buf[last] = 0;
    // SAFETY: NUL-terminated (the last byte forced to 0 above), and lives until here.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// A non-blocking HIP stream (no implicit synchronisation with the null stream).
#[derive(Debug)]
pub struct Stream(rt::hipStream_t);

impl Stream {
    /// Creates a stream on the current device.
    pub fn new() -> Result<Stream, HipError> {
        let mut s: rt::hipStream_t = ptr::null_mut();
        // SAFETY: `s` is a valid place for the handle.
        check("hipStreamCreateWithFlags", unsafe {
            rt::hipStreamCreateWithFlags(&mut s, rt::hipStreamNonBlocking)
        })?;
        Ok(Stream(s))
    }

    /// Waits until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // SAFETY: the handle is live until drop.
        check("hipStreamSynchronize", unsafe {
            rt::hipStreamSynchronize(self.0)
        })
    }

    /// Queues setting every byte of `dst` to `value`.
    pub fn memset(&self, dst: &mut DeviceBuffer, value: u8) -> Result<(), HipError> {
        // SAFETY: `dst` is a live device allocation of `dst.len` bytes and the stream is
        // live; the buffer cannot be freed before the work is done, since hipFree
        // synchronises the device first.
        check("hipMemsetAsync", unsafe {
            rt::hipMemsetAsync(dst.ptr, c_int::from(value), dst.len, self.0)
        })
    }

    /// Queues copying `src` into `dst` (the shorter length), device to device.
    pub fn memcpy(&self, dst: &mut DeviceBuffer, src: &DeviceBuffer) -> Result<(), HipError> {
        let n = dst.len.min(src.len);
        // SAFETY: both are live device allocations of at least `n` bytes and distinct
        // (`&mut` and `&` cannot alias); the stream is live; see `memset` on lifetimes.
        check("hipMemcpyDtoDAsync", unsafe {
            rt::hipMemcpyDtoDAsync(dst.ptr, src.ptr, n, self.0)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once; errors cannot be reported here.
        let _ = unsafe { rt::hipStreamDestroy(self.0) };
    }
}

/// A timing event.
#[derive(Debug)]
pub struct Event(rt::hipEvent_t);

impl Event {
    /// Creates an event that records timestamps (`hipEventDefault`).
    pub fn new() -> Result<Event, HipError> {
        let mut e: rt::hipEvent_t = ptr::null_mut();
        // SAFETY: `e` is a valid place for the handle.
        check("hipEventCreateWithFlags", unsafe {
            rt::hipEventCreateWithFlags(&mut e, rt::hipEventDefault)
        })?;
        Ok(Event(e))
    }

    /// Queues the event on `stream`: it completes, and takes its timestamp, when the work
    /// queued before it has finished.
    pub fn record(&self, stream: &Stream) -> Result<(), HipError> {
        // SAFETY: both handles are live.
        check("hipEventRecord", unsafe {
            rt::hipEventRecord(self.0, stream.0)
        })
    }

    /// Waits until the event has completed.
    pub fn synchronize(&self) -> Result<(), HipError> {
        // SAFETY: the handle is live.
        check("hipEventSynchronize", unsafe {
            rt::hipEventSynchronize(self.0)
        })
    }

    /// The time from this event to `later`, ms (`hipEventElapsedTime`: an f32, so its
    /// resolution coarsens as the interval grows: about 60 ns at 1 s).
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32, HipError> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid place for the result; both handles are live.
        check("hipEventElapsedTime", unsafe {
            rt::hipEventElapsedTime(&mut ms, self.0, later.0)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        let _ = unsafe { rt::hipEventDestroy(self.0) };
    }
}

/// Device memory.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

impl DeviceBuffer {
    /// Allocates `len` bytes on the current device (contents undefined).
    pub fn new(len: usize) -> Result<DeviceBuffer, HipError> {
        let mut p: *mut std::ffi::c_void = ptr::null_mut();
        // SAFETY: `p` is a valid place for the pointer.
        check("hipMalloc", unsafe { rt::hipMalloc(&mut p, len) })?;
        Ok(DeviceBuffer { ptr: p, len })
    }

    /// Its size, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by hipMalloc and freed once; hipFree waits for the device's
        // queued work first, so no queued operation still uses it.
        let _ = unsafe { rt::hipFree(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on any machine with the HIP runtime: no device is a count of 0, not an error.
    #[test]
    fn device_count_works_without_a_device() {
        let n = device_count().expect("hipGetDeviceCount");
        if n == 0 {
            println!("SKIPPED (no HIP device): device_count() == 0");
            return;
        }
        set_device(0).unwrap();
        println!("{n} HIP device(s); 0 is {}", device_name(0).unwrap());
        let s = Stream::new().unwrap();
        let (a, b) = (Event::new().unwrap(), Event::new().unwrap());
        let mut buf = DeviceBuffer::new(1 << 20).unwrap();
        a.record(&s).unwrap();
        s.memset(&mut buf, 7).unwrap();
        b.record(&s).unwrap();
        b.synchronize().unwrap();
        assert!(a.elapsed_ms(&b).unwrap() >= 0.0);
    }

    #[test]
    fn errors_read_well() {
        let e = check("hipSetDevice", hipError_t::hipErrorInvalidDevice).unwrap_err();
        assert!(e.is_no_device());
        assert!(e.to_string().starts_with("hipSetDevice: "), "{e}");
        assert!(e.to_string().ends_with("(hipError 101)"), "{e}");
    }
}
