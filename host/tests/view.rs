//! `railtrace view` as a user runs it: the twin viewed live while its recording is written,
//! then that recording browsed, every answer read over real HTTP from the server the
//! command starts. The page itself is checked in a real browser by `view_browser.py`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

mod common;
use common::TempDir;

/// Starts `railtrace view ARGS --listen 127.0.0.1:0` and reads the address it prints.
fn view(dir: &TempDir, args: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_railtrace"))
        .current_dir(&dir.0)
        .arg("view")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("http://")
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("not an address: {line:?}"));
    (child, addr.parse().unwrap())
}

/// GET `path` with `host` as the Host header: (status, body).
fn get(addr: SocketAddr, path: &str, host: &str) -> (u16, String) {
    get_from(addr, path, host, "")
}

/// GET `path` with `host` as the Host header and `more` headers (each ending in CRLF).
fn get_from(addr: SocketAddr, path: &str, host: &str, more: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{more}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn finish(mut child: Child) -> String {
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    err
}

/// The twin viewed for a few seconds records exactly as a capture does; the recording
/// then browses whole and zoomed, its edges and gaps with it; and the page is served
/// to this machine only.
#[test]
fn a_live_view_records_and_its_recording_browses() {
    let dir = TempDir::new("view");
    let (child, addr) = view(&dir, &["--twin", "--seconds", "3", "-o", "live.arrow"]);
    let local = format!("127.0.0.1:{}", addr.port());
    let (status, page) = get(addr, "/", &local);
    assert_eq!(status, 200);
    assert!(page.contains("<canvas id=\"plot\">") && page.contains("view.js"));
    // Another site's page, reaching it by a name of its own that resolves here: refused.
    let (status, body) = get(addr, "/", &format!("attacker.example:{}", addr.port()));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--listen"), "{body}");
    // A page of another site open in the browser, opening the websocket: refused; the
    // view's own page may.
    let upgrade = "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let (status, body) = get_from(
        addr,
        "/ws",
        &local,
        &format!("Origin: http://attacker.example\r\n{upgrade}"),
    );
    assert_eq!(status, 403, "{body}");
    let (status, _) = get_from(addr, "/", &local, &format!("Origin: http://{local}\r\n"));
    assert_eq!(status, 200);
    // Not reachable from another machine: nothing listens on the other addresses.
    if let Some(ip) = outward_ip() {
        assert!(
            TcpStream::connect((ip, addr.port())).is_err(),
            "{ip} reached it"
        );
    } else {
        println!("SKIPPED the outward address check: this machine has no outward address");
    }
    let err = finish(child);
    assert!(err.contains("recorded in live.arrow"), "{err}");
    assert!(err.contains("gaps 0"), "{err}");

    let (child, addr) = view(&dir, &["live.arrow", "--seconds", "20"]);
    let local = format!("127.0.0.1:{}", addr.port());
    let (status, body) = get(addr, "/range?t0=0&t1=3&columns=300", &local);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let series = v["series"].as_array().unwrap();
    // The fast rig's four rails and the total, each with a column in most of the 300.
    assert_eq!(series.len(), 5, "{v}");
    for s in series {
        let points: usize = (s["runs"].as_array().unwrap().iter())
            .map(|r| r.as_array().unwrap().len())
            .sum();
        assert!(points > 150, "{}: {points}", s["name"]);
        for run in s["runs"].as_array().unwrap() {
            for p in run.as_array().unwrap() {
                let p: Vec<f64> = p
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect();
                assert!(p[1] <= p[3] && p[3] <= p[2], "min ≤ mean ≤ max: {p:?}");
            }
        }
    }
    // The view drove the twin's trigger line 0 around every train: its edges are there.
    let edges = v["edges"].as_array().unwrap();
    assert!(edges.len() > 20, "{} edges", edges.len());
    assert!(edges.iter().all(|e| e[1] == 0), "{edges:?}");
    let (status, body) = get(addr, "/range?t0=2&t1=1", &local);
    assert_eq!(status, 400, "{body}");
    // A peer that starts a request and sends no more is cut off: its headers have 10 s.
    let mut silent = TcpStream::connect(addr).unwrap();
    write!(silent, "GET / HTTP/1.1\r\nHost: {local}\r\n").unwrap();
    silent
        .set_read_timeout(Some(std::time::Duration::from_secs(15)))
        .unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let closed = match silent.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    assert!(closed, "still open after {:?}", started.elapsed());
    let (status, _) = get(addr, "/", &local);
    assert_eq!(status, 200, "the server serves on after closing it");
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// This machine's address towards the outside, if it has one (no packet is sent).
fn outward_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("10.255.255.255:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}
