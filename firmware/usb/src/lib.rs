//! The rig's host link over USB: a CDC-ACM serial port (usb-device 0.3, usbd-serial 0.2)
//! behind the embedded-io 0.6 traits that the firmware core's `Device::poll` takes, for
//! any chip with a `usb_device::bus::UsbBus` driver. The host sees an ordinary serial port
//! (`/dev/ttyACM*`, `COMn`); the line coding it sets is accepted and ignored.
//!
//! Transmit. Bytes written are queued in a buffer of `TX` bytes and leave through the bulk
//! IN endpoint as whole packets (64 bytes at full speed, 512 at high speed) whenever a
//! packet's worth is queued and the endpoint is free. What is left, less than a packet, goes
//! as a short packet only when the writer is idle: a call of [`UsbSerial::poll`] (once per
//! main-loop pass) with nothing written since the previous one. After a run of whole packets
//! an idle writer also sends a zero-length packet, so the host's transfer completes. So
//! frames are packed into whole packets while data flows, and a lone reply (a time-sync
//! answer, a command result) leaves within one pass.
//!
//! Flow control. [`embedded_io::WriteReady::write_ready`] is true while the buffer has
//! room; a host that does not take packets (busy, or the endpoint halted) fills it and
//! makes it false, never blocking, so the core counts the blocks it cannot send exactly as
//! it does for a slow UART. Nothing accepted is lost while the device stays configured. A
//! USB reset ends the session: what was queued for it is discarded (counted in
//! [`UsbSerial::discarded`]) and write_ready stays false until the host configures the
//! device again. Writes while unconfigured are discarded too, as a UART drops bytes
//! nobody listens to.
//!
//! Receive. One OUT packet at a time is taken from the endpoint, only once the previous
//! one has been read, so a core that is slow to read holds the host off (NAK) instead of
//! losing bytes.
//!
//! Why not usbd-serial's `SerialPort`: it fixes the bulk packet size at 64 bytes (illegal at
//! high speed, where bulk endpoints are 512) and sends every write at once as a short
//! packet. This adapter drives usbd-serial's packet-level `CdcAcmClass` instead, which does
//! the CDC-ACM descriptors and the SET_LINE_CODING / SET_CONTROL_LINE_STATE requests.
#![no_std]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![warn(missing_docs)]

use usb_device::bus::{UsbBus, UsbBusAllocator};
use usb_device::device::{
    StringDescriptors, UsbDevice, UsbDeviceBuilder, UsbDeviceState, UsbVidPid,
};
use usb_device::LangID;
pub use usb_device::UsbError;
use usbd_serial::{CdcAcmClass, USB_CLASS_CDC};

/// Largest bulk packet: 512 bytes at high speed.
pub const MAX_PACKET: usize = 512;

/// The bus speed the device enumerates at, which fixes the bulk packet size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speed {
    /// Full speed (12 Mbit/s): 64-byte bulk packets.
    Full,
    /// High speed (480 Mbit/s): 512-byte bulk packets.
    High,
}

impl Speed {
    /// The bulk endpoints' packet size.
    pub const fn packet_size(self) -> usize {
        match self {
            Speed::Full => 64,
            Speed::High => MAX_PACKET,
        }
    }
}

/// How the device describes itself to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// USB vendor id.
    pub vendor_id: u16,
    /// USB product id.
    pub product_id: u16,
    /// Manufacturer string.
    pub manufacturer: &'static str,
    /// Product string.
    pub product: &'static str,
    /// Serial number string.
    pub serial: &'static str,
}

/// Why the USB device could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupError {
    /// The transmit buffer must hold at least two packets of the chosen speed.
    BufferTooSmall {
        /// The buffer's size.
        tx: usize,
        /// The packet size.
        packet: usize,
    },
    /// usb-device refused the descriptors (strings or control packet size).
    Descriptor,
}

/// A USB error other than "would block" (a driver or class fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub UsbError);

impl embedded_io::Error for Error {
    fn kind(&self) -> embedded_io::ErrorKind {
        match self.0 {
            UsbError::Unsupported => embedded_io::ErrorKind::Unsupported,
            UsbError::BufferOverflow
            | UsbError::EndpointOverflow
            | UsbError::EndpointMemoryOverflow => embedded_io::ErrorKind::OutOfMemory,
            UsbError::InvalidState => embedded_io::ErrorKind::NotConnected,
            _ => embedded_io::ErrorKind::Other,
        }
    }
}

/// A CDC-ACM serial port over USB as an embedded-io byte link. `TX` is the transmit
/// buffer's size in bytes (at least two packets).
pub struct UsbSerial<'a, B: UsbBus, const TX: usize> {
    device: UsbDevice<'a, B>,
    class: CdcAcmClass<'a, B>,
    packet: usize,
    tx: [u8; TX],
    tx_start: usize,
    tx_end: usize,
    /// Something was written since the last [`UsbSerial::poll`].
    wrote: bool,
    /// The last packet sent was a whole one: an idle writer ends the transfer with a ZLP.
    zlp_due: bool,
    rx: [u8; MAX_PACKET],
    rx_start: usize,
    rx_end: usize,
    discarded: u64,
}

impl<B: UsbBus, const TX: usize> core::fmt::Debug for UsbSerial<'_, B, TX> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UsbSerial")
            .field("state", &self.device.state())
            .field("packet", &self.packet)
            .field("tx_pending", &self.pending())
            .field("rx_pending", &(self.rx_end - self.rx_start))
            .field("discarded", &self.discarded)
            .finish_non_exhaustive()
    }
}

impl<'a, B: UsbBus, const TX: usize> UsbSerial<'a, B, TX> {
    /// Builds the CDC-ACM function and the USB device on `alloc` (the driver's bus
    /// allocator; nothing else may allocate on it afterwards).
    pub fn new(
        alloc: &'a UsbBusAllocator<B>,
        speed: Speed,
        id: &Identity,
    ) -> Result<Self, SetupError> {
        let packet = speed.packet_size();
        if TX < 2 * packet {
            return Err(SetupError::BufferTooSmall { tx: TX, packet });
        }
        let class = CdcAcmClass::new(alloc, packet as u16);
        let device = UsbDeviceBuilder::new(alloc, UsbVidPid(id.vendor_id, id.product_id))
            .strings(&[StringDescriptors::new(LangID::EN_US)
                .manufacturer(id.manufacturer)
                .product(id.product)
                .serial_number(id.serial)])
            .map_err(|_| SetupError::Descriptor)?
            .max_packet_size_0(64)
            .map_err(|_| SetupError::Descriptor)?
            .device_class(USB_CLASS_CDC)
            .build();
        Ok(UsbSerial {
            device,
            class,
            packet,
            tx: [0; TX],
            tx_start: 0,
            tx_end: 0,
            wrote: false,
            zlp_due: false,
            rx: [0; MAX_PACKET],
            rx_start: 0,
            rx_end: 0,
            discarded: 0,
        })
    }

    /// Services the USB device and moves queued bytes to the endpoint. Call once per
    /// main-loop pass, after the core's `poll`: a pass that wrote nothing is idle, and
    /// then the last short packet (or the ZLP ending a transfer) goes out. Also call it at
    /// least every 10 ms while nothing else runs (USB requires it).
    pub fn poll(&mut self) -> Result<(), Error> {
        let idle = !self.wrote;
        self.wrote = false;
        self.service(idle)
    }

    /// The device's USB state (`Configured` once a host has set it up).
    pub fn state(&self) -> UsbDeviceState {
        self.device.state()
    }

    /// Whether the host has configured the device, so bytes can flow.
    pub fn is_configured(&self) -> bool {
        self.device.state() == UsbDeviceState::Configured
    }

    /// DTR as the host last set it (true while a program has the port open, on most hosts).
    pub fn dtr(&self) -> bool {
        self.class.dtr()
    }

    /// The baud rate the host last set (meaningless here: USB runs at its own speed).
    pub fn baud(&self) -> u32 {
        self.class.line_coding().data_rate()
    }

    /// Bytes accepted and not yet handed to the endpoint.
    pub fn pending(&self) -> usize {
        self.tx_end - self.tx_start
    }

    /// Bytes written that were dropped because no host had the device configured (queued
    /// before a USB reset, or written while unconfigured).
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// The USB device (for its bus, or its state).
    pub fn device(&self) -> &UsbDevice<'a, B> {
        &self.device
    }

    /// Polls the device and sends what may go: whole packets always, the remainder and a
    /// ZLP only when `idle`.
    fn service(&mut self, idle: bool) -> Result<(), Error> {
        self.device.poll(&mut [&mut self.class]);
        match self.device.state() {
            UsbDeviceState::Configured => {}
            // Suspended: the session goes on after resume, keep what is queued.
            UsbDeviceState::Suspend => return Ok(()),
            // Reset (or not yet configured): a new session, nothing of the old one.
            UsbDeviceState::Default | UsbDeviceState::Addressed => {
                self.discard();
                return Ok(());
            }
        }
        loop {
            let pending = self.pending();
            let n = if pending >= self.packet {
                self.packet
            } else if idle && (pending > 0 || self.zlp_due) {
                pending
            } else {
                break;
            };
            let chunk = self.tx.get(self.tx_start..self.tx_start + n).unwrap_or(&[]);
            match self.class.write_packet(chunk) {
                Ok(sent) => {
                    self.tx_start += sent;
                    self.zlp_due = sent == self.packet;
                    if sent < self.packet {
                        break; // a short packet or ZLP ends the transfer
                    }
                }
                Err(UsbError::WouldBlock) => break,
                Err(e) => return Err(Error(e)),
            }
        }
        if self.tx_start == self.tx_end {
            self.tx_start = 0;
            self.tx_end = 0;
        }
        Ok(())
    }

    fn discard(&mut self) {
        self.discarded += self.pending() as u64;
        self.tx_start = 0;
        self.tx_end = 0;
        self.zlp_due = false;
        self.rx_start = 0;
        self.rx_end = 0;
    }

    /// Room for more bytes, moving the queue to the front of the buffer when that makes
    /// room at its end.
    fn room(&mut self) -> usize {
        if self.tx_end == TX && self.tx_start > 0 {
            self.tx.copy_within(self.tx_start..self.tx_end, 0);
            self.tx_end -= self.tx_start;
            self.tx_start = 0;
        }
        TX - self.tx_end
    }

    /// Copies as much of `buf` as fits; returns the count.
    fn enqueue(&mut self, buf: &[u8]) -> usize {
        let n = buf.len().min(self.room());
        if let (Some(dst), Some(src)) =
            (self.tx.get_mut(self.tx_end..self.tx_end + n), buf.get(..n))
        {
            dst.copy_from_slice(src);
            self.tx_end += n;
        }
        n
    }

    /// Takes the next OUT packet into the receive buffer if it is empty; true if it holds
    /// bytes afterwards.
    fn fill_rx(&mut self) -> Result<bool, Error> {
        if self.rx_start < self.rx_end {
            return Ok(true);
        }
        if !self.is_configured() {
            return Ok(false);
        }
        match self.class.read_packet(&mut self.rx) {
            Ok(n) => {
                self.rx_start = 0;
                self.rx_end = n;
                Ok(n > 0)
            }
            Err(UsbError::WouldBlock) => Ok(false),
            Err(e) => Err(Error(e)),
        }
    }
}

impl<B: UsbBus, const TX: usize> embedded_io::ErrorType for UsbSerial<'_, B, TX> {
    type Error = Error;
}

impl<B: UsbBus, const TX: usize> embedded_io::ReadReady for UsbSerial<'_, B, TX> {
    fn read_ready(&mut self) -> Result<bool, Error> {
        self.service(false)?;
        self.fill_rx()
    }
}

impl<B: UsbBus, const TX: usize> embedded_io::Read for UsbSerial<'_, B, TX> {
    /// Waits, servicing USB, until at least one byte has arrived (the core reads only when
    /// `read_ready` said so, so it never waits here).
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        while !self.fill_rx()? {
            self.service(false)?;
        }
        let available = self.rx.get(self.rx_start..self.rx_end).unwrap_or(&[]);
        let n = available.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), available.get(..n)) {
            dst.copy_from_slice(src);
        }
        self.rx_start += n;
        Ok(n)
    }
}

impl<B: UsbBus, const TX: usize> embedded_io::WriteReady for UsbSerial<'_, B, TX> {
    /// True while configured and the transmit buffer has room. Never blocks.
    fn write_ready(&mut self) -> Result<bool, Error> {
        self.service(false)?;
        Ok(self.is_configured() && self.room() > 0)
    }
}

impl<B: UsbBus, const TX: usize> embedded_io::Write for UsbSerial<'_, B, TX> {
    /// Queues as much of `buf` as fits. With the buffer full it waits, servicing USB, for
    /// the host to take a packet (the core writes only when `write_ready` said so, so it
    /// never waits here). Without a configured host the bytes are discarded, counted.
    fn write(&mut self, buf: &[u8]) -> Result<usize, Error> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.is_configured() {
                self.discarded += buf.len() as u64;
                return Ok(buf.len());
            }
            let n = self.enqueue(buf);
            if n > 0 {
                self.wrote = true;
                return Ok(n);
            }
            self.service(false)?;
        }
    }

    /// Sends everything queued, short packet and ZLP included, waiting for the host to take
    /// it (returns at once without a configured host).
    fn flush(&mut self) -> Result<(), Error> {
        loop {
            self.service(true)?;
            if !self.is_configured() || (self.pending() == 0 && !self.zlp_due) {
                return Ok(());
            }
        }
    }
}
