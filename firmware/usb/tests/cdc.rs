//! The adapter on a scripted USB bus: a fake `UsbBus` whose host side enumerates the
//! device with real control transfers (through usb-device's control pipe and usbd-serial's
//! CDC-ACM class), then moves bulk packets one at a time, as a host controller does.

use std::sync::{Arc, Mutex, MutexGuard};

use embedded_io::{Read, ReadReady, Write, WriteReady};
use railtrace_protocol::{encode_frame_vec, Codes, Decoder, Message, SampleBlock};
use railtrace_usb::{Identity, Speed, UsbSerial};
use usb_device::bus::{PollResult, UsbBus, UsbBusAllocator};
use usb_device::device::UsbDeviceState;
use usb_device::endpoint::{EndpointAddress, EndpointType};
use usb_device::{UsbDirection, UsbError};

const EPS: usize = 8;

#[derive(Debug, Default, Clone)]
struct Ep {
    allocated: bool,
    max_packet: u16,
    stalled: bool,
    /// IN: the packet the device wrote, until the host takes it. OUT: the packet the host
    /// sent, until the device reads it.
    packet: Option<Vec<u8>>,
}

#[derive(Debug, Default)]
struct State {
    ins: [Ep; EPS],
    outs: [Ep; EPS],
    setup: Option<[u8; 8]>,
    in_complete: u16,
    reset: bool,
    address: u8,
}

/// The device side, given to usb-device.
struct FakeBus(Arc<Mutex<State>>);

/// The host side, kept by the test.
#[derive(Clone)]
struct Host(Arc<Mutex<State>>);

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap()
}

impl UsbBus for FakeBus {
    fn alloc_ep(
        &mut self,
        dir: UsbDirection,
        addr: Option<EndpointAddress>,
        ep_type: EndpointType,
        max_packet: u16,
        _interval: u8,
    ) -> usb_device::Result<EndpointAddress> {
        let mut s = lock(&self.0);
        let eps = match dir {
            UsbDirection::In => &mut s.ins,
            UsbDirection::Out => &mut s.outs,
        };
        let index = match (addr, ep_type) {
            (Some(a), _) => a.index(),
            (None, EndpointType::Control) => 0,
            (None, _) => (1..EPS)
                .find(|&i| !eps[i].allocated)
                .ok_or(UsbError::EndpointOverflow)?,
        };
        let ep = eps.get_mut(index).ok_or(UsbError::InvalidEndpoint)?;
        if ep.allocated {
            return Err(UsbError::InvalidEndpoint);
        }
        ep.allocated = true;
        ep.max_packet = max_packet;
        Ok(EndpointAddress::from_parts(index, dir))
    }
    fn enable(&mut self) {}
    fn reset(&self) {
        let mut guard = lock(&self.0);
        let s = &mut *guard;
        for ep in s.ins.iter_mut().chain(s.outs.iter_mut()) {
            ep.stalled = false;
            ep.packet = None;
        }
        s.in_complete = 0;
        s.address = 0;
    }
    fn set_device_address(&self, addr: u8) {
        lock(&self.0).address = addr;
    }
    fn write(&self, addr: EndpointAddress, buf: &[u8]) -> usb_device::Result<usize> {
        let mut s = lock(&self.0);
        let ep = s
            .ins
            .get_mut(addr.index())
            .filter(|e| e.allocated)
            .ok_or(UsbError::InvalidEndpoint)?;
        if buf.len() > usize::from(ep.max_packet) {
            return Err(UsbError::BufferOverflow);
        }
        if ep.packet.is_some() {
            return Err(UsbError::WouldBlock);
        }
        ep.packet = Some(buf.to_vec());
        Ok(buf.len())
    }
    fn read(&self, addr: EndpointAddress, buf: &mut [u8]) -> usb_device::Result<usize> {
        let mut s = lock(&self.0);
        if addr.index() == 0 {
            if let Some(setup) = s.setup.take() {
                buf.get_mut(..8)
                    .ok_or(UsbError::BufferOverflow)?
                    .copy_from_slice(&setup);
                return Ok(8);
            }
        }
        let ep = s
            .outs
            .get_mut(addr.index())
            .filter(|e| e.allocated)
            .ok_or(UsbError::InvalidEndpoint)?;
        let Some(packet) = ep.packet.take() else {
            return Err(UsbError::WouldBlock);
        };
        if packet.len() > buf.len() {
            ep.packet = Some(packet);
            return Err(UsbError::BufferOverflow);
        }
        buf[..packet.len()].copy_from_slice(&packet);
        Ok(packet.len())
    }
    fn set_stalled(&self, addr: EndpointAddress, stalled: bool) {
        let mut s = lock(&self.0);
        let eps = if addr.is_in() {
            &mut s.ins
        } else {
            &mut s.outs
        };
        if let Some(ep) = eps.get_mut(addr.index()) {
            ep.stalled = stalled;
        }
    }
    fn is_stalled(&self, addr: EndpointAddress) -> bool {
        let s = lock(&self.0);
        let eps = if addr.is_in() { &s.ins } else { &s.outs };
        eps.get(addr.index()).is_some_and(|e| e.stalled)
    }
    fn suspend(&self) {}
    fn resume(&self) {}
    fn poll(&self) -> PollResult {
        let mut s = lock(&self.0);
        if std::mem::take(&mut s.reset) {
            return PollResult::Reset;
        }
        let ep_setup = u16::from(s.setup.is_some());
        let mut ep_out = 0;
        for (i, ep) in s.outs.iter().enumerate() {
            if ep.packet.is_some() {
                ep_out |= 1 << i;
            }
        }
        let ep_in_complete = std::mem::take(&mut s.in_complete);
        if ep_setup | ep_out | ep_in_complete == 0 {
            PollResult::None
        } else {
            PollResult::Data {
                ep_out,
                ep_in_complete,
                ep_setup,
            }
        }
    }
}

/// A control transfer the device answered with STALL.
#[derive(Debug, PartialEq)]
struct Stalled;

impl Host {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.0)
    }
    fn bus_reset(&self) {
        self.state().reset = true;
    }
    fn address(&self) -> u8 {
        self.state().address
    }
    /// Takes the packet waiting on IN endpoint `ep`, if it is not halted.
    fn take_in(&self, ep: usize) -> Option<Vec<u8>> {
        let mut s = self.state();
        if s.ins[ep].stalled {
            return None;
        }
        let p = s.ins[ep].packet.take()?;
        s.in_complete |= 1 << ep;
        Some(p)
    }
    /// Sends a packet to OUT endpoint `ep`; false (NAK) while the last one is unread.
    fn send_out(&self, ep: usize, data: &[u8]) -> bool {
        let mut s = self.state();
        if s.outs[ep].packet.is_some() {
            return false;
        }
        s.outs[ep].packet = Some(data.to_vec());
        true
    }
    fn stalled_ep0(&self) -> bool {
        let s = self.state();
        s.ins[0].stalled || s.outs[0].stalled
    }
    fn setup(&self, setup: [u8; 8]) {
        let mut s = self.state();
        s.ins[0].stalled = false;
        s.outs[0].stalled = false;
        s.setup = Some(setup);
    }
}

type Serial<'a, const TX: usize> = UsbSerial<'a, FakeBus, TX>;

fn poll<const TX: usize>(serial: &mut Serial<'_, TX>) {
    serial.poll().expect("no USB error");
}

fn control_out<const TX: usize>(
    host: &Host,
    serial: &mut Serial<'_, TX>,
    setup: [u8; 8],
    data: &[u8],
) -> Result<(), Stalled> {
    host.setup(setup);
    poll(serial);
    for chunk in data.chunks(64) {
        assert!(host.send_out(0, chunk));
        poll(serial);
    }
    for _ in 0..10 {
        if host.stalled_ep0() {
            return Err(Stalled);
        }
        if let Some(status) = host.take_in(0) {
            assert!(status.is_empty(), "status stage is a ZLP");
            poll(serial);
            return Ok(());
        }
        poll(serial);
    }
    panic!("no status stage");
}

fn control_in<const TX: usize>(
    host: &Host,
    serial: &mut Serial<'_, TX>,
    setup: [u8; 8],
) -> Result<Vec<u8>, Stalled> {
    host.setup(setup);
    poll(serial);
    let mut data = Vec::new();
    for _ in 0..100 {
        if host.stalled_ep0() {
            return Err(Stalled);
        }
        match host.take_in(0) {
            Some(p) => {
                data.extend_from_slice(&p);
                poll(serial);
                if p.len() < 64 {
                    assert!(host.send_out(0, &[]), "status stage");
                    poll(serial);
                    return Ok(data);
                }
            }
            None => poll(serial),
        }
    }
    panic!("no data stage end");
}

const ID: Identity = Identity {
    vendor_id: 0x1209,
    product_id: 0x7274,
    manufacturer: "railtrace",
    product: "railtrace rig",
    serial: "0001",
};

/// Bulk IN and OUT endpoint numbers, as the configuration descriptor gives them.
struct Bulk {
    ep_in: usize,
    ep_out: usize,
}

/// Enumerates as a host does, checking each answer, and opens the port (line coding,
/// DTR). Returns the bulk endpoints.
fn enumerate<const TX: usize>(host: &Host, serial: &mut Serial<'_, TX>, speed: Speed) -> Bulk {
    host.bus_reset();
    poll(serial);
    assert_eq!(serial.state(), UsbDeviceState::Default);

    let dev = control_in(host, serial, [0x80, 6, 0, 1, 0, 0, 18, 0]).unwrap();
    assert_eq!(dev.len(), 18);
    assert_eq!(&dev[..2], &[18, 1], "device descriptor");
    assert_eq!(dev[4], 0x02, "device class CDC");
    assert_eq!(dev[7], 64, "EP0 packet size");
    assert_eq!(u16::from_le_bytes([dev[8], dev[9]]), ID.vendor_id);
    assert_eq!(u16::from_le_bytes([dev[10], dev[11]]), ID.product_id);

    control_out(host, serial, [0x00, 5, 7, 0, 0, 0, 0, 0], &[]).unwrap();
    assert_eq!(host.address(), 7);
    assert_eq!(serial.state(), UsbDeviceState::Addressed);

    let head = control_in(host, serial, [0x80, 6, 0, 2, 0, 0, 9, 0]).unwrap();
    let total = u16::from_le_bytes([head[2], head[3]]);
    let le = total.to_le_bytes();
    let config = control_in(host, serial, [0x80, 6, 0, 2, 0, 0, le[0], le[1]]).unwrap();
    assert_eq!(config.len(), usize::from(total));
    // Walk the descriptors: the ACM and data interfaces and the two bulk endpoints.
    let (mut classes, mut ep_in, mut ep_out) = (Vec::new(), None, None);
    let mut rest = &config[..];
    while let [len, kind, ..] = *rest {
        let d = &rest[..usize::from(len)];
        match kind {
            4 => classes.push((d[5], d[6])),
            5 if d[3] & 3 == 2 => {
                let size = usize::from(u16::from_le_bytes([d[4], d[5]]));
                assert_eq!(size, speed.packet_size(), "bulk packet size");
                if d[2] & 0x80 != 0 {
                    ep_in = Some(usize::from(d[2] & 0x7F));
                } else {
                    ep_out = Some(usize::from(d[2]));
                }
            }
            _ => {}
        }
        rest = &rest[usize::from(len)..];
    }
    assert_eq!(classes, vec![(0x02, 0x02), (0x0A, 0x00)], "ACM + data");

    control_out(host, serial, [0x00, 9, 1, 0, 0, 0, 0, 0], &[]).unwrap();
    assert_eq!(serial.state(), UsbDeviceState::Configured);

    // The port opened at 921600 8N1, DTR and RTS up.
    let coding = [0x00, 0x10, 0x0E, 0x00, 0, 0, 8];
    control_out(host, serial, [0x21, 0x20, 0, 0, 0, 0, 7, 0], &coding).unwrap();
    assert_eq!(serial.baud(), 921_600);
    let back = control_in(host, serial, [0xA1, 0x21, 0, 0, 0, 0, 7, 0]).unwrap();
    assert_eq!(back, coding);
    control_out(host, serial, [0x21, 0x22, 3, 0, 0, 0, 0, 0], &[]).unwrap();
    assert!(serial.dtr());
    // A request the class does not know is refused with STALL.
    assert_eq!(
        control_out(host, serial, [0x21, 0x7F, 0, 0, 0, 0, 0, 0], &[]),
        Err(Stalled)
    );

    Bulk {
        ep_in: ep_in.expect("bulk IN"),
        ep_out: ep_out.expect("bulk OUT"),
    }
}

fn setup() -> (Host, UsbBusAllocator<FakeBus>) {
    let state = Arc::new(Mutex::new(State::default()));
    (Host(state.clone()), UsbBusAllocator::new(FakeBus(state)))
}

/// A sample-block frame of `samples` 8-channel samples, as the firmware sends them.
fn frame(seq: u32, samples: u16) -> Vec<u8> {
    let codes: Vec<u8> = (0..u32::from(samples) * 8)
        .flat_map(|i| ((i.wrapping_mul(2654435761) >> 16) as i16).to_le_bytes())
        .collect();
    let frame = encode_frame_vec(
        seq,
        &Message::SampleBlock(SampleBlock {
            first_index: u64::from(seq) * 100,
            first_tick: u64::from(seq) * 1000,
            period_ticks: 120,
            channel_mask: 0xFF,
            averaging: 1,
            sample_count: samples,
            codes: Codes::from_le_bytes(&codes).unwrap(),
        }),
    )
    .unwrap();
    frame
}

/// Writes `bytes` as the core does: only while write_ready says so. Returns the count
/// accepted.
fn write_ready_bytes<const TX: usize>(serial: &mut Serial<'_, TX>, bytes: &[u8]) -> usize {
    let mut done = 0;
    while done < bytes.len() && serial.write_ready().unwrap() {
        done += serial.write(&bytes[done..]).unwrap();
    }
    done
}

#[test]
fn enumerates_as_cdc_acm_at_full_and_high_speed() {
    for speed in [Speed::Full, Speed::High] {
        let (host, alloc) = setup();
        let mut serial: Serial<'_, 1024> = UsbSerial::new(&alloc, speed, &ID).unwrap();
        assert!(!serial.write_ready().unwrap(), "not configured yet");
        let bulk = enumerate(&host, &mut serial, speed);
        assert_ne!(bulk.ep_in, 0);
        assert_ne!(bulk.ep_out, 0);
        assert!(serial.write_ready().unwrap());
    }
}

#[test]
fn a_buffer_under_two_packets_is_refused() {
    let (_host, alloc) = setup();
    let err = Serial::<'_, 768>::new(&alloc, Speed::High, &ID).unwrap_err();
    assert_eq!(
        err,
        railtrace_usb::SetupError::BufferTooSmall {
            tx: 768,
            packet: 512
        }
    );
}

#[test]
fn frames_leave_in_order_byte_exact_in_whole_packets() {
    let (host, alloc) = setup();
    let mut serial: Serial<'_, 4096> = UsbSerial::new(&alloc, Speed::High, &ID).unwrap();
    let bulk = enumerate(&host, &mut serial, Speed::High);

    let frames: Vec<Vec<u8>> = (0..200u32).map(|s| frame(s, (s % 37 + 1) as u16)).collect();
    let sent: Vec<u8> = frames.concat();
    let mut packets = Vec::new();
    // A main loop that has a frame to write on every pass, and a host that takes one
    // packet per pass: the link is the bottleneck, and the core writes only when ready.
    let mut pending = frames.iter().flatten().copied().collect::<Vec<u8>>();
    let mut pos = 0;
    let mut passes = 0;
    while pos < pending.len() {
        pos += write_ready_bytes(&mut serial, &pending[pos..(pos + 700).min(pending.len())]);
        poll(&mut serial);
        if let Some(p) = host.take_in(bulk.ep_in) {
            packets.push(p);
        }
        passes += 1;
        assert!(passes < 10_000);
    }
    pending.clear();
    // Idle passes: the rest leaves, then the transfer is ended.
    for _ in 0..100 {
        poll(&mut serial);
        if let Some(p) = host.take_in(bulk.ep_in) {
            packets.push(p);
        }
    }
    let received: Vec<u8> = packets.concat();
    assert_eq!(received.len(), sent.len());
    assert!(received == sent, "byte-exact and in order");
    let (last, whole) = packets.split_last().unwrap();
    assert!(
        whole.iter().all(|p| p.len() == 512),
        "whole packets while data flows"
    );
    assert!(last.len() < 512, "one short packet (or ZLP) when idle");
    assert_eq!(serial.pending(), 0);
    assert_eq!(serial.discarded(), 0);

    // The host decodes every frame, numbered 0..200 without a gap.
    let mut decoder: Decoder = Decoder::new();
    let mut input = &received[..];
    let mut seqs = Vec::new();
    while let Some(f) = decoder.next(&mut input) {
        let f = f.unwrap();
        assert!(matches!(f.message, Message::SampleBlock(_)));
        seqs.push(f.seq);
    }
    assert_eq!(seqs, (0..200).collect::<Vec<_>>());
}

#[test]
fn an_idle_writer_sends_its_short_packet_and_ends_a_transfer_with_a_zlp() {
    let (host, alloc) = setup();
    let mut serial: Serial<'_, 256> = UsbSerial::new(&alloc, Speed::Full, &ID).unwrap();
    let bulk = enumerate(&host, &mut serial, Speed::Full);

    assert_eq!(serial.write(b"0123456789").unwrap(), 10);
    poll(&mut serial); // this pass wrote: the 10 bytes wait for more
    assert_eq!(host.take_in(bulk.ep_in), None);
    poll(&mut serial); // an idle pass: they go
    assert_eq!(host.take_in(bulk.ep_in).unwrap(), b"0123456789");

    let block: Vec<u8> = (0..64).collect();
    assert_eq!(serial.write(&block).unwrap(), 64);
    poll(&mut serial); // a whole packet goes at once
    assert_eq!(host.take_in(bulk.ep_in).unwrap(), block);
    poll(&mut serial); // idle after a whole packet: a ZLP ends the transfer
    assert_eq!(host.take_in(bulk.ep_in).unwrap(), Vec::<u8>::new());
    poll(&mut serial);
    assert_eq!(host.take_in(bulk.ep_in), None, "nothing more");
}

#[test]
fn host_bytes_reach_read_in_order_and_a_slow_reader_holds_the_host_off() {
    let (host, alloc) = setup();
    let mut serial: Serial<'_, 256> = UsbSerial::new(&alloc, Speed::Full, &ID).unwrap();
    let bulk = enumerate(&host, &mut serial, Speed::Full);

    assert!(!serial.read_ready().unwrap());
    let sent: Vec<u8> = (0..200u32).map(|i| (i * 7) as u8).collect();
    let mut chunks = sent.chunks(64);
    assert!(host.send_out(bulk.ep_out, chunks.next().unwrap()));
    assert!(serial.read_ready().unwrap());
    // The first packet is in the adapter; the second waits in the endpoint; a third is
    // refused (NAK) until the reader catches up.
    assert!(host.send_out(bulk.ep_out, chunks.next().unwrap()));
    poll(&mut serial);
    let third = chunks.next().unwrap();
    assert!(!host.send_out(bulk.ep_out, third));

    let mut got = Vec::new();
    let mut buf = [0u8; 10];
    let mut third_sent = false;
    let mut last = chunks.next();
    for _ in 0..200 {
        if serial.read_ready().unwrap() {
            let n = serial.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        if !third_sent {
            third_sent = host.send_out(bulk.ep_out, third);
        } else if let Some(p) = last {
            if host.send_out(bulk.ep_out, p) {
                last = None;
            }
        }
    }
    assert_eq!(got, sent);
}

#[test]
fn a_busy_or_halted_endpoint_makes_write_ready_false_and_loses_nothing_accepted() {
    const TX: usize = 2048;
    let (host, alloc) = setup();
    let mut serial: Serial<'_, TX> = UsbSerial::new(&alloc, Speed::High, &ID).unwrap();
    let bulk = enumerate(&host, &mut serial, Speed::High);

    // The host takes nothing: one packet fills the endpoint, then the buffer fills.
    let stream: Vec<u8> = (0..40u32).flat_map(|s| frame(s, 30)).collect();
    let mut accepted = 0;
    for _ in 0..50 {
        accepted += write_ready_bytes(&mut serial, &stream[accepted..]);
        poll(&mut serial);
    }
    assert_eq!(accepted, TX + 512, "buffer plus the packet in the endpoint");
    assert!(!serial.write_ready().unwrap());

    // Now the host halts the endpoint (SET_FEATURE ENDPOINT_HALT): still nothing moves.
    let ep = 0x80 | bulk.ep_in as u8;
    control_out(&host, &mut serial, [0x02, 3, 0, 0, ep, 0, 0, 0], &[]).unwrap();
    assert_eq!(host.take_in(bulk.ep_in), None, "halted");
    for _ in 0..20 {
        assert!(!serial.write_ready().unwrap());
        poll(&mut serial);
    }
    assert_eq!(write_ready_bytes(&mut serial, &stream[accepted..]), 0);

    // CLEAR_FEATURE: the host reads again and gets every accepted byte, in order, while
    // the writer goes on.
    control_out(&host, &mut serial, [0x02, 1, 0, 0, ep, 0, 0, 0], &[]).unwrap();
    let mut received = Vec::new();
    for _ in 0..200 {
        accepted += write_ready_bytes(&mut serial, &stream[accepted..]);
        poll(&mut serial);
        if let Some(p) = host.take_in(bulk.ep_in) {
            received.extend_from_slice(&p);
        }
    }
    assert_eq!(accepted, stream.len());
    assert!(received == stream, "nothing lost, nothing reordered");
    assert_eq!(serial.discarded(), 0);
}

#[test]
fn a_usb_reset_ends_the_session_and_discards_what_was_queued_for_it() {
    let (host, alloc) = setup();
    let mut serial: Serial<'_, 256> = UsbSerial::new(&alloc, Speed::Full, &ID).unwrap();
    let bulk = enumerate(&host, &mut serial, Speed::Full);

    assert_eq!(serial.write(&[0xAA; 100]).unwrap(), 100);
    poll(&mut serial); // one 64-byte packet into the endpoint, 36 bytes queued
    host.bus_reset();
    poll(&mut serial);
    assert_eq!(serial.state(), UsbDeviceState::Default);
    assert!(!serial.write_ready().unwrap());
    assert_eq!(serial.discarded(), 36);
    assert_eq!(
        serial.write(&[1, 2, 3]).unwrap(),
        3,
        "unconfigured: dropped"
    );
    assert_eq!(serial.discarded(), 39);

    let bulk2 = enumerate(&host, &mut serial, Speed::Full);
    assert_eq!(bulk2.ep_in, bulk.ep_in);
    assert!(serial.write_ready().unwrap());
    assert_eq!(serial.write(b"new").unwrap(), 3);
    poll(&mut serial);
    poll(&mut serial);
    assert_eq!(
        host.take_in(bulk.ep_in).unwrap(),
        b"new",
        "only the new session's bytes"
    );
}
