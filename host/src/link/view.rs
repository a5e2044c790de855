//! The live view (`railtrace view`): a web page, served by railtrace itself, that shows a
//! rig's rails, trigger edges, gaps and status as they are captured, or a recording over
//! its whole length.
//!
//! Live, the capture's [`Tap`] hands every block to [`Live`], which decimates it in Rust
//! to one min/max/mean bucket per [`BUCKET_S`] and series (each rail and the total): 8
//! channels at 200 kS/s reach the page as 1 000 buckets a second, whatever the rate. A
//! gap closes the bucket it falls in, so the page draws it as a gap. The capture writes
//! its recording exactly as `railtrace capture` does; the view only watches.
//!
//! A recording is browsed through [`plot::window_json`](crate::store::decimate::window_json): its summaries (the overview)
//! where they are fine enough for the window asked, else its samples.
//!
//! The server listens on 127.0.0.1 unless told otherwise, and then refuses any peer that
//! is not on this machine, and any request whose `Host` is not a loopback name (a page
//! elsewhere cannot reach it by a DNS name that resolves to 127.0.0.1).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::broadcast;

use anyhow::Context;

use crate::gpu::{PowerLogger, Stamp};
use crate::link::capture::{capture, Config, Counters, Progress, Tap};
use crate::link::stop;
use crate::store::decimate::{self as plot, Bin};
use crate::store::recording::{self, Event, Kind};

/// The live buckets' width, s.
pub const BUCKET_S: f64 = 1e-3;
/// How much of the past a page that opens late is sent, s.
const HISTORY_S: f64 = 60.0;
/// How often the page is sent what came in, s.
const TICK_S: f64 = 0.1;

/// The page and its script, embedded: the view needs nothing from the network.
const PAGE: &str = include_str!("../../assets/view/index.html");
const SCRIPT: &str = include_str!("../../assets/view/view.js");

/// What came in since the page was last sent it.
#[derive(Debug, Default)]
struct Pending {
    /// `[t, then min, max, mean per series]`, as JSON arrays.
    buckets: Vec<String>,
    edges: Vec<String>,
    gaps: Vec<String>,
    logger: Vec<String>,
    executions: Vec<String>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.buckets.is_empty()
            && self.edges.is_empty()
            && self.gaps.is_empty()
            && self.logger.is_empty()
            && self.executions.is_empty()
    }
}

#[derive(Debug, Default)]
struct LiveState {
    /// The recording's time 0, host UTC ns; rails' names (the total is the last series).
    epoch_ns: Option<i64>,
    rails: Vec<String>,
    /// The open bucket: its index (`t / BUCKET_S`) and one accumulator per series.
    open: Option<(i64, Vec<Bin>)>,
    pending: Pending,
    /// Data messages sent, with their last bucket's time, for a page that opens later.
    history: VecDeque<(f64, Arc<String>)>,
    /// The device's latest status report (JSON), and the newest sample's time.
    status: Option<String>,
    last_t: f64,
}

/// The capture's live side: decimates what the capture writes into buckets for the page.
#[derive(Debug, Default)]
pub struct Live {
    state: Mutex<LiveState>,
}

/// Times go to the page to 0.1 µs, watts to the mW.
const T: f64 = 1e7;
const W: f64 = 1e3;

/// Writes `v` rounded to `1/per` (watts to the mW, times to 0.1 µs), or `null`.
fn num(out: &mut String, v: f64, per: f64) {
    if v.is_finite() {
        let _ = write!(out, "{}", (v * per).round() / per);
    } else {
        out.push_str("null");
    }
}

impl LiveState {
    fn close(&mut self) {
        let Some((b, bins)) = self.open.take() else {
            return;
        };
        let mut row = String::from("[");
        num(&mut row, (b as f64 + 0.5) * BUCKET_S, T);
        for a in &bins {
            for v in [f64::from(a.min), f64::from(a.max), a.mean()] {
                row.push(',');
                num(&mut row, if a.n > 0 { v } else { f64::NAN }, W);
            }
        }
        row.push(']');
        self.pending.buckets.push(row);
    }
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recording's time 0 in host UTC ns, once the capture has started.
    pub fn epoch_ns(&self) -> Option<i64> {
        self.lock().epoch_ns
    }

    /// The GPU's side, from elsewhere than the rig (the twin's GPU): its logger's readings
    /// `(s, W)` and its kernel executions `(start s, end s)`, on the recording's timeline.
    pub fn gpu(&self, logger: &[(f64, f64)], executions: &[(f64, f64)]) {
        let pair = |a: f64, b: f64, per_b: f64| {
            let mut row = String::from("[");
            num(&mut row, a, T);
            row.push(',');
            num(&mut row, b, per_b);
            row.push(']');
            row
        };
        let mut s = self.lock();
        (s.pending.logger).extend(logger.iter().map(|&(t, w)| pair(t, w, W)));
        (s.pending.executions).extend(executions.iter().map(|&(a, b)| pair(a, b, T)));
    }

    /// What came in since the last call, as the page's `data` message (`None` if
    /// nothing did); kept for pages that open later.
    pub fn drain(&self) -> Option<Arc<String>> {
        let mut s = self.lock();
        let p = std::mem::take(&mut s.pending);
        if p.is_empty() {
            return None;
        }
        let list = |v: &[String]| format!("[{}]", v.join(","));
        let msg = Arc::new(format!(
            r#"{{"type":"data","buckets":{},"edges":{},"gaps":{},"logger":{},"executions":{}}}"#,
            list(&p.buckets),
            list(&p.edges),
            list(&p.gaps),
            list(&p.logger),
            list(&p.executions)
        ));
        let t = s.last_t;
        s.history.push_back((t, msg.clone()));
        while s.history.front().is_some_and(|(t0, _)| *t0 < t - HISTORY_S) {
            s.history.pop_front();
        }
        Some(msg)
    }

    fn history(&self) -> Vec<Arc<String>> {
        self.lock().history.iter().map(|(_, m)| m.clone()).collect()
    }

    fn rails(&self) -> Vec<String> {
        self.lock().rails.clone()
    }

    fn device_status(&self) -> Option<String> {
        self.lock().status.clone()
    }
}

impl Tap for Live {
    fn start(&self, epoch_utc_ns: i64, rails: &[String]) {
        let mut s = self.lock();
        s.epoch_ns = Some(epoch_utc_ns);
        s.rails = rails.to_vec();
    }

    fn samples(&self, t_s: f64, period_s: f64, watts: &[f32]) {
        let mut s = self.lock();
        let rails = s.rails.len().max(1);
        for (i, row) in watts.chunks_exact(rails).enumerate() {
            let t = t_s + i as f64 * period_s;
            let b = (t / BUCKET_S).floor() as i64;
            if s.open.as_ref().is_some_and(|(ob, _)| *ob != b) {
                s.close();
            }
            let (_, bins) = s
                .open
                .get_or_insert_with(|| (b, vec![Bin::EMPTY; rails + 1]));
            for (a, &w) in bins.iter_mut().zip(row) {
                a.add(w);
            }
            bins[rails].add(recording::total_w(row.iter().copied()));
            s.last_t = t;
        }
    }

    fn event(&self, e: &Event) {
        let mut s = self.lock();
        match e {
            Event::Gap {
                time_s,
                duration_s,
                cause,
                ..
            } => {
                // The bucket before the gap ends at it: the page breaks its lines there.
                s.close();
                let mut row = String::from("[");
                num(&mut row, *time_s, T);
                row.push(',');
                num(&mut row, *duration_s, T);
                let _ = write!(row, ",{}]", serde_json::Value::from(cause.as_str()));
                s.pending.gaps.push(row);
            }
            Event::Edge {
                time_s,
                line,
                rising,
                ..
            } => {
                let mut row = String::from("[");
                num(&mut row, *time_s, T);
                let _ = write!(row, ",{line},{rising}]");
                s.pending.edges.push(row);
            }
            Event::Text {
                kind: Kind::Status,
                text,
                ..
            } => s.status = Some(text.clone()),
            _ => {}
        }
    }
}

/// What the page shows.
#[derive(Debug, Clone)]
pub enum Source {
    /// A capture going on.
    Live {
        /// Its live side.
        live: Arc<Live>,
        /// Its counters.
        counters: Arc<Counters>,
        /// What the page names it (the port, the twin).
        name: String,
        /// The recording it writes, where the user asked for one.
        recording: Option<PathBuf>,
    },
    /// A recording to browse.
    File(PathBuf),
}

#[derive(Debug)]
struct App {
    source: Source,
    /// Data messages for every page open.
    data: broadcast::Sender<Arc<String>>,
    /// Peers and `Host` names other than loopback ones are let in (a `--listen`
    /// address that is not loopback was asked for).
    open: bool,
    /// A recording's first message, read once when the server starts (a live capture's
    /// is made for each page: its rails are known only once the capture has started).
    file_hello: Option<String>,
    /// A closed recording, opened for browsing at any span.
    browse: Option<Arc<recording::Browse>>,
    started: std::time::Instant,
}

/// Whether `ip` is this machine's loopback, an IPv4 one written as IPv6
/// (`::ffff:127.0.0.1`) too.
fn loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Whether a request from a page of `origin` (its `Origin` header, where a browser sent
/// one) to the server its `Host` header names may be served: only the server's own page
/// (the same host and port) or a page with no origin to tell (`null`, as a file has). A
/// page of another site, open in the user's browser, would otherwise read the rails and
/// the recording's path over the websocket, which no same-origin rule guards.
pub fn same_origin(origin: Option<&str>, host: Option<&str>) -> bool {
    let Some(origin) = origin else {
        return true; // not a browser's cross-site request
    };
    if origin == "null" {
        return true;
    }
    let own = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((own, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// Whether a request from `peer` naming `host` may be served: any where the server was
/// asked to listen beyond this machine, else only loopback peers naming a loopback host.
pub fn allowed(open: bool, peer: &SocketAddr, host: Option<&str>) -> bool {
    if open {
        return true;
    }
    if !loopback(peer.ip()) {
        return false;
    }
    let Some(host) = host else {
        return false;
    };
    // `name:port`, `[v6]:port`, or a name alone.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse().is_ok_and(loopback)
}

/// Refuses every request the server is not to serve ([`allowed`]), before any route.
async fn guard(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let host = (request.headers().get(header::HOST)).and_then(|h| h.to_str().ok());
    if !allowed(app.open, &peer, host) {
        return (
            StatusCode::FORBIDDEN,
            "railtrace view serves this machine only (loopback); start it with --listen ADDRESS to serve others\n",
        )
            .into_response();
    }
    let origin = (request.headers().get(header::ORIGIN)).map(|o| o.to_str().unwrap_or("?"));
    if !same_origin(origin, host) {
        return (
            StatusCode::FORBIDDEN,
            "railtrace view serves its own page only: a page of another site may not read it\n",
        )
            .into_response();
    }
    next.run(request).await
}

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

/// The first message a page gets: what it shows (for a recording, read once, here).
fn hello(source: &Source, browse: Option<&recording::Browse>) -> String {
    let v = match source {
        Source::Live {
            live,
            name,
            recording,
            ..
        } => serde_json::json!({
            "type": "hello",
            "mode": "live",
            "source": name,
            "rails": live.rails(),
            "bucket_s": BUCKET_S,
            "recording": recording.as_ref().map(|p| p.display().to_string()),
        }),
        Source::File(path) => {
            let (rails, extent) = match file_extent(path, browse) {
                Ok((rails, extent)) => (rails, Ok(extent)),
                Err(e) => (Vec::new(), Err(format!("{e:#}"))),
            };
            serde_json::json!({
                "type": "hello",
                "mode": "file",
                "source": path.display().to_string(),
                "rails": rails,
                "extent": extent.as_ref().ok(),
                "error": extent.err(),
                "recording": path.display().to_string(),
            })
        }
    };
    v.to_string()
}

/// A recording's rails and the span of its samples (from its coarse summaries where it
/// was closed).
fn file_extent(
    path: &std::path::Path,
    browse: Option<&recording::Browse>,
) -> anyhow::Result<(Vec<String>, (f64, f64))> {
    if let Some(b) = browse {
        return Ok((b.meta().rails.clone(), plot::extent(b.coarse())?));
    }
    let rec = recording::open(path)?;
    let extent = match recording::overview(path)? {
        Some(ov) => plot::extent(&ov.recording)?,
        None => plot::extent(&rec)?,
    };
    Ok((rec.meta.rails.clone(), extent))
}

/// The status message: the capture's counters, its sample rate over the last second, and
/// the device's latest report.
fn status(app: &App, previous: &mut Option<(f64, u64)>) -> Option<String> {
    let Source::Live { live, counters, .. } = &app.source else {
        return None;
    };
    let p: Progress = counters.progress(app.started.elapsed());
    let rate = previous
        .filter(|(t, _)| p.elapsed_s > *t)
        .map_or(0.0, |(t, n)| {
            p.samples.saturating_sub(n) as f64 / (p.elapsed_s - t)
        });
    if previous.is_none_or(|(t, _)| p.elapsed_s - t >= 1.0) {
        *previous = Some((p.elapsed_s, p.samples));
    }
    let device: Option<serde_json::Value> = live
        .device_status()
        .and_then(|s| serde_json::from_str(&s).ok());
    Some(
        serde_json::json!({
            "type": "status",
            "progress": p,
            "rate_hz": rate,
            "device": device,
        })
        .to_string(),
    )
}

async fn socket(State(app): State<Arc<App>>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |s| serve_socket(app, s))
}

async fn serve_socket(app: Arc<App>, mut ws: WebSocket) {
    let mut rx = app.data.subscribe();
    let hello = (app.file_hello.clone()).unwrap_or_else(|| hello(&app.source, None));
    if ws.send(Message::Text(hello.into())).await.is_err() {
        return;
    }
    if let Source::Live { live, .. } = &app.source {
        for m in live.history() {
            if ws.send(Message::Text(m.as_str().into())).await.is_err() {
                return;
            }
        }
    }
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut previous = None;
    loop {
        tokio::select! {
            m = rx.recv() => match m {
                Ok(m) => {
                    if ws.send(Message::Text(m.as_str().into())).await.is_err() {
                        return;
                    }
                }
                // A page too slow to keep up misses data, not the capture.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = tick.tick() => {
                if let Some(s) = status(&app, &mut previous) {
                    if ws.send(Message::Text(s.into())).await.is_err() {
                        return;
                    }
                }
            }
            r = ws.recv() => if !matches!(r, Some(Ok(_))) { return },
        }
    }
}

/// A window of a recording: `t0`, `t1` (s) and `columns`.
#[derive(Debug, serde::Deserialize)]
struct RangeQuery {
    t0: f64,
    t1: f64,
    columns: Option<usize>,
}

async fn range(State(app): State<Arc<App>>, Query(q): Query<RangeQuery>) -> Response {
    let Source::File(path) = app.source.clone() else {
        return (StatusCode::NOT_FOUND, "not browsing a recording\n").into_response();
    };
    let columns = q.columns.unwrap_or(1000).clamp(10, 8000);
    if !(q.t0.is_finite() && q.t1.is_finite() && q.t1 > q.t0) {
        return (
            StatusCode::BAD_REQUEST,
            "t0 and t1 must be times in s, t0 before t1\n",
        )
            .into_response();
    }
    let browse = app.browse.clone();
    let r = tokio::task::spawn_blocking(move || {
        plot::window_json(&path, browse.as_deref(), q.t0, q.t1, columns)
    })
    .await;
    match r {
        Ok(Ok(v)) => ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response(),
        Ok(Err(e)) => (StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The server, bound: [`Server::run`] serves until `done`.
#[derive(Debug)]
pub struct Server {
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    rt: tokio::runtime::Runtime,
}

impl Server {
    /// Binds `addr` for `source`. Peers beyond this machine are served only when `addr`
    /// is not a loopback address.
    pub fn bind(addr: SocketAddr, source: Source) -> anyhow::Result<Server> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let (data, _) = broadcast::channel(256);
        let browse = match &source {
            Source::File(path) => recording::Browse::open(path)?.map(Arc::new),
            Source::Live { .. } => None,
        };
        if let Some(b) = browse.clone() {
            // The fine summaries read while the page first paints from the coarse ones.
            std::thread::spawn(move || b.fine().is_some());
        }
        let app = Arc::new(App {
            file_hello: matches!(source, Source::File(_))
                .then(|| hello(&source, browse.as_deref())),
            browse,
            source,
            data,
            open: !loopback(addr.ip()),
            started: std::time::Instant::now(),
        });
        Ok(Server { listener, app, rt })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `done` is set or Ctrl-C (the stop flag of [`stop::install`]), sending
    /// the pages what the live side gathered every 0.1 s.
    pub fn run(
        self,
        done: Arc<AtomicBool>,
        stop: Option<&'static AtomicBool>,
    ) -> anyhow::Result<()> {
        let Server { listener, app, rt } = self;
        let router = Router::new()
            .route("/", get(page))
            .route("/view.js", get(script))
            .route("/ws", get(socket))
            .route("/range", get(range))
            .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
            .with_state(app.clone());
        let should_stop =
            move || done.load(Ordering::Relaxed) || stop.is_some_and(|s| s.load(Ordering::Relaxed));
        rt.block_on(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(TICK_S));
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        match accepted {
                            Ok((socket, peer)) => {
                                tokio::spawn(connection(socket, peer, router.clone()));
                            }
                            // Out of descriptors, or a connection reset before it was
                            // taken: the next may succeed.
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                    _ = tick.tick() => {
                        if let Source::Live { live, .. } = &app.source {
                            if let Some(m) = live.drain() {
                                let _ = app.data.send(m);
                            }
                        }
                        if should_stop() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

/// How long a connection may take to send a request's headers before it is closed (a
/// peer that opens connections and sends nothing holds no more than this each).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one connection (HTTP/1, with the websocket's upgrade) with `peer` known to the
/// routes, closing it when a request's headers take longer than [`HEADER_READ_TIMEOUT`].
async fn connection(socket: tokio::net::TcpStream, peer: SocketAddr, router: Router) {
    let service = hyper_util::service::TowerToHyperService::new(
        router.layer(axum::Extension(ConnectInfo(peer))),
    );
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
        .with_upgrades()
        .await;
}

/// The stop flag of a `railtrace` command (Ctrl-C), for [`Server::run`].
pub fn ctrl_c() -> anyhow::Result<&'static AtomicBool> {
    stop::install().map_err(anyhow::Error::msg)
}

/// What `railtrace view` shows live.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// The twin's scenario and rig files (`Some`: view the twin; the built-in default
    /// scenario when its scenario is `None`).
    pub twin: Option<(Option<PathBuf>, Option<PathBuf>)>,
    /// A real rig's serial port (without the twin).
    pub port: Option<PathBuf>,
    /// A real rig's description file.
    pub rig: Option<PathBuf>,
    /// The sample rate, Hz; the device's highest when `None`.
    pub rate_hz: Option<u32>,
    /// The recording to write; a temporary one, removed at the end, when `None`.
    pub output: Option<PathBuf>,
    /// Replace `output` if it exists.
    pub force: bool,
    /// Capture at a rate the rig's link cannot carry (see
    /// [`crate::link::capture::Config::allow_drops`]).
    pub allow_drops: bool,
    /// Where the page is served.
    pub listen: SocketAddr,
    /// Stop after this long, s.
    pub seconds: Option<f64>,
}

/// Serves `file` for browsing until Ctrl-C (`ctrl_c`) or `seconds`; `announce` is told
/// the address once the server listens.
pub fn browse(
    file: &std::path::Path,
    listen: SocketAddr,
    seconds: Option<f64>,
    ctrl_c: &'static AtomicBool,
    announce: impl FnOnce(SocketAddr, &str),
) -> anyhow::Result<()> {
    // A missing or foreign file is said here, not only on the page (a closed one is
    // checked as the page reads it; one that was not is read whole now).
    if recording::Browse::open(file)?.is_none() {
        recording::open(file)?;
    }
    let server = Server::bind(listen, Source::File(file.to_path_buf()))?;
    announce(
        server.local_addr()?,
        &format!("browsing {}", file.display()),
    );
    let done = Arc::new(AtomicBool::new(false));
    stop_after(seconds, &done);
    server.run(done, Some(ctrl_c))
}

/// Views a rig (or the twin's) live until Ctrl-C (`ctrl_c`), `seconds`, or the capture's
/// end, recording as `railtrace capture` does; `announce` is told the address once the
/// server listens. The capture's summary, and whether its recording was a temporary one
/// (removed).
pub fn live(
    opts: &LiveOptions,
    logger: Option<Box<dyn PowerLogger + Send>>,
    ctrl_c: &'static AtomicBool,
    announce: impl FnOnce(SocketAddr, &str),
) -> anyhow::Result<(crate::link::capture::Summary, bool)> {
    let done = Arc::new(AtomicBool::new(false));
    // Live: the twin's rig or a real one, captured as `railtrace capture` does.
    let twin = match &opts.twin {
        Some((scenario, rig)) => {
            let loaded = railtrace_twin::scenario::load_with(scenario.as_deref(), rig.as_deref())?;
            Some(
                railtrace_twin::Twin::start_with(&loaded, None)
                    .context("the twin did not start")?,
            )
        }
        None => None,
    };
    let port = match (&twin, &opts.port) {
        (Some(t), _) => t.path().to_path_buf(),
        (None, Some(p)) => p.clone(),
        (None, None) => anyhow::bail!("nothing to view: a port or the twin"),
    };
    // Without an output, the recording goes into a new folder only this user may enter
    // (a guessable name in $TMPDIR could be a link planted to overwrite another file).
    let (output, temporary) = match &opts.output {
        Some(o) => (o.clone(), None),
        None => {
            let dir = railtrace_twin::mcu::private_temp_dir("railtrace-view-")
                .context("the live view's temporary recording")?;
            (dir.join("live.arrow"), Some(dir))
        }
    };
    let live = Arc::new(Live::default());
    let counters = Arc::new(Counters::default());
    let config = Config {
        rig: match (&twin, &opts.rig) {
            (None, Some(r)) => Some(crate::link::capture::RigFile::read(r)?),
            _ => None,
        },
        rate_hz: opts.rate_hz,
        reconnect_wait: Duration::from_secs(600),
        replace: opts.force,
        allow_drops: opts.allow_drops,
        tap: Some(live.clone() as Arc<dyn Tap>),
        ..Config::new(port.clone(), output.clone())
    };
    let name = match &twin {
        Some(_) => format!("the twin's rig on {}", port.display()),
        None => port.display().to_string(),
    };
    let source = Source::Live {
        live: live.clone(),
        counters: counters.clone(),
        name: name.clone(),
        recording: opts.output.clone(),
    };
    let server = Server::bind(opts.listen, source)?;
    let capturing = {
        let (done, counters) = (done.clone(), counters.clone());
        std::thread::spawn(move || {
            let r = capture(&config, &done, &counters, |_| {});
            done.store(true, Ordering::Relaxed);
            r
        })
    };
    // The stop flags: Ctrl-C and --seconds end the capture, which ends the server.
    {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if ctrl_c.load(Ordering::Relaxed) {
                    done.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    stop_after(opts.seconds, &done);
    announce(server.local_addr()?, &format!("viewing {name} live"));
    // The twin's GPU driven beside the server; the twin stopped only once the capture has
    // stopped its rig (so that its rig answers the capture's Stop).
    // A real GPU's logger, polled beside them.
    let (served, driven, polled) = std::thread::scope(|s| {
        let gpu = twin.as_ref().map(|t| s.spawn(|| twin_gpu(t, &live, &done)));
        let (live, done) = (&live, &done);
        let polling = logger.map(|mut l| s.spawn(move || poll_logger(l.as_mut(), live, done)));
        let served = server.run(done.clone(), None);
        done.store(true, Ordering::Relaxed);
        (served, gpu.map(|g| g.join()), polling.map(|p| p.join()))
    });
    if let Some(p) = polled {
        p.map_err(|_| anyhow::anyhow!("the GPU logger panicked"))??;
    }
    let captured = capturing
        .join()
        .map_err(|_| anyhow::anyhow!("the capture panicked"))?;
    if let Some(twin) = twin {
        twin.stop().context("the twin failed")?;
    }
    if let Some(d) = driven {
        d.map_err(|_| anyhow::anyhow!("the twin's GPU panicked"))?
            .context("the twin's GPU failed")?;
    }
    let summary = captured.with_context(|| format!("capture from {name} stopped"));
    if let Some(dir) = &temporary {
        let _ = std::fs::remove_dir_all(dir);
    }
    let summary = summary?;
    served?;
    Ok((summary, temporary.is_some()))
}

fn stop_after(seconds: Option<f64>, done: &Arc<AtomicBool>) {
    if let Some(s) = seconds {
        let done = done.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(s));
            done.store(true, Ordering::Relaxed);
        });
    }
}

/// A GPU's own logger polled for the page every 10 ms until `done`: each reading drawn
/// at the host time it was taken where the logger stamps it so, else when the host read it.
fn poll_logger(logger: &mut dyn PowerLogger, live: &Live, done: &AtomicBool) -> anyhow::Result<()> {
    while !done.load(Ordering::Relaxed) {
        let readings = logger
            .poll()
            .with_context(|| format!("the GPU's logger ({})", logger.describe()))?;
        if let Some(epoch) = live.epoch_ns() {
            let points: Vec<(f64, f64)> = (readings.iter())
                .map(|r| {
                    let ns = match r.stamp {
                        Stamp::HostNs(ns) => ns,
                        _ => r.host_ns,
                    };
                    ((ns - epoch) as f64 * 1e-9, r.power_w)
                })
                .collect();
            live.gpu(&points, &[]);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The twin driven as a bench's runner drives a GPU, for the page: a train of 10 of its
/// first kernel every 10-30 ms, the trigger line 0 high from just before the launch to
/// just after the train; its kernels' executions and its logger's readings go to the page
/// on the recording's timeline. Until `done`.
fn twin_gpu(twin: &railtrace_twin::Twin, live: &Live, done: &AtomicBool) -> anyhow::Result<()> {
    let kernel = twin
        .kernels()
        .first()
        .cloned()
        .context("the twin's scenario has no kernel")?;
    let mut draw = 0x9e37_79b9_7f4a_7c15u64;
    while !done.load(Ordering::Relaxed) && twin.is_running() {
        twin.trigger(0, true);
        twin.launch(&kernel, 10, None)?;
        std::thread::sleep(Duration::from_millis(3));
        twin.trigger(0, false);
        draw ^= draw << 13;
        draw ^= draw >> 7;
        draw ^= draw << 17;
        std::thread::sleep(Duration::from_millis(7 + draw % 20));
        let out = twin.take_outputs();
        let Some(epoch) = live.epoch_ns() else {
            continue;
        };
        let at = |t: f64| (twin.unix_ns(t) - epoch) as f64 * 1e-9;
        let logger: Vec<(f64, f64)> = (out.logger.iter())
            .map(|r| (at(r.true_time_s), r.power_w))
            .collect();
        let executions: Vec<(f64, f64)> = (out.executions.iter())
            .map(|e| (at(e.start_s), at(e.end_s)))
            .collect();
        live.gpu(&logger, &executions);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::LoggerReading;

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// By default only this machine is served, by a loopback name: a page of another
    /// site that resolves its own name to 127.0.0.1 is refused too.
    #[test]
    fn only_loopback_is_served_unless_asked() {
        let lo = peer("127.0.0.1:50000");
        assert!(allowed(false, &lo, Some("127.0.0.1:8050")));
        assert!(allowed(false, &lo, Some("localhost:8050")));
        assert!(allowed(false, &peer("[::1]:5"), Some("[::1]:8050")));
        assert!(!allowed(
            false,
            &peer("192.168.1.20:50000"),
            Some("127.0.0.1:8050")
        ));
        assert!(!allowed(false, &lo, Some("evil.example:8050")));
        assert!(!allowed(false, &lo, None));
        assert!(allowed(
            true,
            &peer("192.168.1.20:50000"),
            Some("bench:8050")
        ));
        // An IPv4 loopback written as IPv6 is loopback too.
        let mapped = peer("[::ffff:127.0.0.1]:50000");
        assert!(allowed(false, &mapped, Some("[::ffff:127.0.0.1]:8050")));
        assert!(!allowed(
            false,
            &peer("[::ffff:192.168.1.20]:5"),
            Some("127.0.0.1:8050")
        ));
    }

    /// A page of another site may not read the view (its websocket, its ranges); its own
    /// page, a page with no origin (`null`) and a client that is not a browser may.
    #[test]
    fn only_the_views_own_page_is_served() {
        let host = Some("127.0.0.1:8050");
        assert!(same_origin(Some("http://127.0.0.1:8050"), host));
        assert!(same_origin(Some("null"), host));
        assert!(same_origin(None, host));
        assert!(!same_origin(Some("http://evil.example"), host));
        assert!(!same_origin(Some("http://127.0.0.1:8051"), host));
        assert!(!same_origin(Some("http://localhost:8050"), host));
        assert!(!same_origin(Some("http://evil.example"), None));
    }

    /// A logger that gives two readings, then stops the view.
    #[derive(Debug)]
    struct TwoReadings<'a>(&'a AtomicBool, u32);

    impl PowerLogger for TwoReadings<'_> {
        fn describe(&self) -> String {
            "two readings".into()
        }
        fn poll(&mut self) -> Result<Vec<LoggerReading>, crate::gpu::GpuError> {
            self.1 += 1;
            if self.1 == 2 {
                self.0.store(true, Ordering::Relaxed);
            }
            let at = |ns: i64, stamp: Stamp| LoggerReading {
                stamp,
                host_ns: ns,
                power_w: 250.0,
                instant_w: None,
                temperature_c: None,
                energy_j: None,
                source: "hwmon",
            };
            Ok(match self.1 {
                1 => vec![at(2_500_000_000, Stamp::HostNs(2_000_000_000))],
                _ => vec![at(3_000_000_000, Stamp::Own { ticks: 7, hz: 1e6 })],
            })
        }
    }

    /// A real GPU's logger on the page: each reading at its host stamp, or when read.
    #[test]
    fn a_gpu_loggers_readings_reach_the_page_on_the_recordings_timeline() {
        let live = Live::default();
        live.start(1_000_000_000, &["a".into()]);
        let done = AtomicBool::new(false);
        poll_logger(&mut TwoReadings(&done, 0), &live, &done).unwrap();
        let v: serde_json::Value = serde_json::from_str(&live.drain().unwrap()).unwrap();
        assert_eq!(v["logger"], serde_json::json!([[1, 250], [2, 250]]));
    }

    /// Samples land in 1 ms buckets with each series' least, most and mean, the total
    /// the sum of the rails; a gap closes the bucket it falls in.
    #[test]
    fn samples_are_decimated_into_buckets() {
        let live = Live::default();
        live.start(0, &["a".into(), "b".into()]);
        // 10 samples 0.2 ms apart from 0.1 ms: a = i, b = 1.
        let watts: Vec<f32> = (0..10).flat_map(|i| [i as f32, 1.0]).collect();
        live.samples(1e-4, 2e-4, &watts);
        live.event(&Event::Gap {
            time_s: 2e-3,
            index: None,
            samples: None,
            duration_s: 1e-3,
            cause: "link".into(),
        });
        let m = live.drain().unwrap();
        let v: serde_json::Value = serde_json::from_str(&m).unwrap();
        let b = v["buckets"].as_array().unwrap();
        assert_eq!(b.len(), 2, "{v}");
        // Bucket 0: samples 0-4 (a = 0..4), bucket 1: samples 5-9.
        let row: Vec<f64> = b[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(row, [0.0005, 0.0, 4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 5.0, 3.0]);
        let row: Vec<f64> = b[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(row[1..4], [5.0, 9.0, 7.0]);
        assert_eq!(v["gaps"][0][2], "link");
        assert!(live.drain().is_none());
    }
}
