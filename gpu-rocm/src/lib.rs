//! A small safe wrapper over the HIP runtime calls railtrace's AMD GPU runner needs
//! (`railtrace::gpu::rocm`): devices, a stream, timing events, device buffers, and the
//! two operations the runtime can run without a device compiler (memset and
//! device-to-device memcpy).
//!
//! Everything is behind the `hip` feature, which links `libamdhip64` through `hip-sys`
//! (building needs the HIP headers: Debian's `libamdhip64-dev` and `HIP_PATH=/usr`).
//! Without it the crate is empty, so that the workspace builds where HIP is missing.
//!
//! The workspace forbids unsafe code; this crate only denies it, and its one FFI module
//! allows it, with a SAFETY comment on each block.

#[cfg(feature = "hip")]
mod hip;

#[cfg(feature = "hip")]
pub use hip::{device_count, device_name, set_device, DeviceBuffer, Event, HipError, Stream};
