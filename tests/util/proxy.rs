//! TCP proxies in front of the S3 server. [`Proxy`] is the common part: it listens on
//! 127.0.0.1, opens a connection upstream for every client and hands both to a handler
//! on a thread of their own, which relays them with [`Connection::relay`].
//!
//! [`CuttingProxy`] forwards faithfully until a connection has sent more than a byte
//! budget upstream, then cuts that connection (both ways). Small requests (HEAD,
//! CreateMultipartUpload, AbortMultipartUpload) get through; every attempt at sending a
//! large body fails part-way, however often it is retried. [`CuttingProxy::set_cutting`]
//! turns the cutting off (and on again), so one client can fail and then succeed.
//!
//! [`CorruptingProxy`] forwards everything, but flips one byte at a fixed offset of
//! what each connection sends upstream: a request body damaged in transit, which a
//! server that checks `x-amz-checksum-sha256` must refuse.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A running proxy on 127.0.0.1; it stops accepting connections when dropped.
pub struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Proxies to `upstream_url` (`http://host:port`): every client connection, with
    /// its own connection to the upstream, goes to `serve` on a thread of its own.
    pub fn start<F>(upstream_url: &str, serve: F) -> Self
    where
        F: Fn(Connection) + Send + Sync + 'static,
    {
        let upstream = upstream_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_socket_addrs()
            .expect("resolve upstream")
            .next()
            .expect("upstream address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let stop = Arc::new(AtomicBool::new(false));
        let accept_stop = Arc::clone(&stop);
        let serve = Arc::new(serve);
        let accept_thread = std::thread::spawn(move || {
            for client in listener.incoming() {
                if accept_stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let stop = Arc::clone(&accept_stop);
                let serve = Arc::clone(&serve);
                std::thread::spawn(move || {
                    if let Some(connection) = Connection::open(client, upstream, stop) {
                        serve(connection);
                    }
                });
            }
        });
        Proxy {
            addr,
            stop,
            accept_thread: Some(accept_thread),
        }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

/// One client connection of a [`Proxy`] and its connection to the upstream.
pub struct Connection {
    client: TcpStream,
    server: TcpStream,
    stop: Arc<AtomicBool>,
}

impl Connection {
    fn open(client: TcpStream, upstream: SocketAddr, stop: Arc<AtomicBool>) -> Option<Self> {
        let server = TcpStream::connect(upstream).ok()?;
        Some(Connection {
            client,
            server,
            stop,
        })
    }

    /// Set once the proxy is being dropped.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Relays the connection both ways and returns once both directions are done.
    ///
    /// `downstream(server, client)` copies the server's answers to the client on a
    /// thread of its own; the client's write side is shut down when it returns. What the
    /// client sends goes to the server chunk by chunk (each read as it came) until
    /// either side closes, or until `upstream` returns false for a chunk: that chunk is
    /// not sent and the connection is cut both ways. `upstream` may change the chunk.
    pub fn relay<D, U>(self, downstream: D, mut upstream: U)
    where
        D: FnOnce(&mut TcpStream, &mut TcpStream) + Send + 'static,
        U: FnMut(&mut [u8]) -> bool,
    {
        let (Ok(mut client_read), Ok(mut server_write)) =
            (self.client.try_clone(), self.server.try_clone())
        else {
            return;
        };
        let (mut server_read, mut client_write) = (self.server, self.client);
        let downstream = std::thread::spawn(move || {
            downstream(&mut server_read, &mut client_write);
            let _ = client_write.shutdown(Shutdown::Write);
        });
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = server_write.shutdown(Shutdown::Write);
                    break;
                }
                Ok(n) => n,
            };
            let chunk = &mut buf[..n];
            if !upstream(chunk) {
                let _ = client_read.shutdown(Shutdown::Both);
                let _ = server_write.shutdown(Shutdown::Both);
                break;
            }
            if server_write.write_all(chunk).is_err() {
                let _ = client_read.shutdown(Shutdown::Both);
                break;
            }
        }
        let _ = downstream.join();
    }
}

const METHODS: [&[u8]; 5] = [b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE "];

#[derive(Default)]
struct Shared {
    /// Set while the proxy forwards everything (cutting is on by default).
    passing: AtomicBool,
    cut: AtomicUsize,
    requests: Mutex<Vec<String>>,
}

/// A running cutting proxy on 127.0.0.1; stopped when dropped.
pub struct CuttingProxy {
    proxy: Proxy,
    shared: Arc<Shared>,
}

impl CuttingProxy {
    /// Proxies to `upstream_url` (`http://host:port`), cutting any connection once it has
    /// forwarded more than `limit` bytes upstream.
    pub fn start(upstream_url: &str, limit: u64) -> Self {
        let shared = Arc::new(Shared::default());
        let serve_shared = Arc::clone(&shared);
        let proxy = Proxy::start(upstream_url, move |connection| {
            serve(connection, limit, &serve_shared)
        });
        CuttingProxy { proxy, shared }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// How many connections were cut so far.
    pub fn connections_cut(&self) -> usize {
        self.shared.cut.load(Ordering::SeqCst)
    }

    /// Cuts connections over the budget (`true`, the default) or forwards everything
    /// (`false`). Connections already cut stay cut.
    pub fn set_cutting(&self, on: bool) {
        self.shared.passing.store(!on, Ordering::SeqCst);
    }

    /// HTTP request lines seen (best effort: those at the start of a read).
    pub fn request_lines(&self) -> Vec<String> {
        self.shared.requests.lock().unwrap().clone()
    }
}

fn serve(connection: Connection, limit: u64, shared: &Shared) {
    let stop = connection.stop_flag();
    let mut forwarded: u64 = 0;
    connection.relay(
        |server_read, client_write| {
            let _ = std::io::copy(server_read, client_write);
        },
        |chunk| {
            if METHODS.iter().any(|m| chunk.starts_with(m)) {
                let end = chunk
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .unwrap_or(chunk.len().min(200));
                shared
                    .requests
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&chunk[..end]).into_owned());
            }
            forwarded += chunk.len() as u64;
            let over = forwarded > limit && !shared.passing.load(Ordering::SeqCst);
            if over || stop.load(Ordering::SeqCst) {
                shared.cut.fetch_add(1, Ordering::SeqCst);
                return false;
            }
            true
        },
    );
}

/// A running proxy that damages one byte of every connection's upstream stream.
pub struct CorruptingProxy {
    proxy: Proxy,
    flipped: Arc<AtomicUsize>,
}

impl CorruptingProxy {
    /// Proxies to `upstream_url`, flipping the byte at offset `at` of what each
    /// connection sends (choose it inside the request body: past the headers).
    pub fn start(upstream_url: &str, at: u64) -> Self {
        let flipped = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&flipped);
        let proxy = Proxy::start(upstream_url, move |connection| {
            let mut sent: u64 = 0;
            connection.relay(
                |server_read, client_write| {
                    let _ = std::io::copy(server_read, client_write);
                },
                |chunk| {
                    let start = sent;
                    sent += chunk.len() as u64;
                    if (start..sent).contains(&at) {
                        chunk[(at - start) as usize] ^= 0x55;
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    true
                },
            );
        });
        CorruptingProxy { proxy, flipped }
    }

    pub fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// How many bytes were damaged so far (one per connection that got that far).
    pub fn bytes_flipped(&self) -> usize {
        self.flipped.load(Ordering::SeqCst)
    }
}

/// What a [`FaultProxy`] does to new connections and to responses in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Close every new connection at once: the server has gone away.
    Down,
    /// Answer every request with this HTTP status (500, 503) and an S3 error body,
    /// without asking the server.
    Status(u16),
    /// Cut every response after this many bytes (of that connection).
    CutAfter(u64),
    /// Hold every response (after its first bytes) until the fault changes.
    Stall,
    /// Forward responses at about this many bytes per second.
    Slow(u64),
    /// Hold what clients send, once a connection has sent this many bytes: an
    /// upload stalled part-way.
    StallUploads(u64),
    /// Forward uploads (PUT, POST), then hold the server's answer to them: the
    /// object is stored, the client does not know yet.
    HoldUploadAnswers,
}

/// A proxy whose fault the test changes while clients use it.
pub struct FaultProxy {
    proxy: Proxy,
    fault: Arc<Mutex<Fault>>,
    /// Requests answered by a fault rather than by the server.
    faulted: Arc<AtomicUsize>,
    /// Client sides of the connections relayed so far, to cut them when the server
    /// "goes away" (clients keep connections alive between requests).
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    pub fn start(upstream_url: &str) -> Self {
        let fault = Arc::new(Mutex::new(Fault::Pass));
        let faulted = Arc::new(AtomicUsize::new(0));
        let live = Arc::new(Mutex::new(Vec::new()));
        let (serve_fault, serve_faulted, serve_live) =
            (Arc::clone(&fault), Arc::clone(&faulted), Arc::clone(&live));
        let proxy = Proxy::start(upstream_url, move |connection| {
            if let Ok(client) = connection.client.try_clone() {
                serve_live.lock().unwrap().push(client);
            }
            serve_faulty(connection, &serve_fault, &serve_faulted)
        });
        FaultProxy {
            proxy,
            fault,
            faulted,
            live,
        }
    }

    pub fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// Changes the fault. A server that goes away, or starts answering errors, also
    /// drops the connections clients keep open.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
        if matches!(fault, Fault::Down | Fault::Status(_)) {
            for client in self.live.lock().unwrap().drain(..) {
                let _ = client.shutdown(Shutdown::Both);
            }
        }
    }

    pub fn faulted(&self) -> usize {
        self.faulted.load(Ordering::SeqCst)
    }
}

fn serve_faulty(mut connection: Connection, fault: &Arc<Mutex<Fault>>, faulted: &Arc<AtomicUsize>) {
    let current = *fault.lock().unwrap();
    match current {
        Fault::Down => {
            faulted.fetch_add(1, Ordering::SeqCst);
            let _ = connection.client.shutdown(Shutdown::Both);
        }
        Fault::Status(code) => answer_with_status(&mut connection.client, code, faulted),
        _ => {
            let (fault, faulted) = (Arc::clone(fault), Arc::clone(faulted));
            let (up_fault, up_faulted) = (Arc::clone(&fault), Arc::clone(&faulted));
            // Whether the request in flight on this connection is an upload.
            let uploading = Arc::new(AtomicBool::new(false));
            let up_uploading = Arc::clone(&uploading);
            let mut sent_up: u64 = 0;
            connection.relay(
                move |server_read, client_write| {
                    let mut sent: u64 = 0;
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut chunk = &buf[..n];
                        loop {
                            let now = *fault.lock().unwrap();
                            match now {
                                Fault::HoldUploadAnswers if uploading.load(Ordering::SeqCst) => {
                                    std::thread::sleep(std::time::Duration::from_millis(20));
                                    continue;
                                }
                                Fault::CutAfter(limit) if sent + chunk.len() as u64 > limit => {
                                    let keep = limit.saturating_sub(sent) as usize;
                                    let _ = client_write.write_all(&chunk[..keep]);
                                    faulted.fetch_add(1, Ordering::SeqCst);
                                    let _ = client_write.shutdown(Shutdown::Both);
                                    let _ = server_read.shutdown(Shutdown::Both);
                                    return;
                                }
                                Fault::Stall if sent > 0 => {
                                    std::thread::sleep(std::time::Duration::from_millis(20));
                                    continue;
                                }
                                Fault::Slow(rate) => {
                                    let part = chunk.len().min((rate / 10).max(1) as usize);
                                    if client_write.write_all(&chunk[..part]).is_err() {
                                        return;
                                    }
                                    sent += part as u64;
                                    chunk = &chunk[part..];
                                    std::thread::sleep(std::time::Duration::from_millis(100));
                                    if chunk.is_empty() {
                                        break;
                                    }
                                    continue;
                                }
                                _ => {}
                            }
                            if client_write.write_all(chunk).is_err() {
                                return;
                            }
                            sent += chunk.len() as u64;
                            break;
                        }
                    }
                },
                move |chunk| {
                    if METHODS.iter().any(|m| chunk.starts_with(m)) {
                        let upload = chunk.starts_with(b"PUT ") || chunk.starts_with(b"POST ");
                        up_uploading.store(upload, Ordering::SeqCst);
                        if upload && *up_fault.lock().unwrap() == Fault::HoldUploadAnswers {
                            up_faulted.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    sent_up += chunk.len() as u64;
                    loop {
                        match *up_fault.lock().unwrap() {
                            Fault::StallUploads(limit) if sent_up > limit => {
                                up_faulted.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_millis(20));
                            }
                            _ => return true,
                        }
                    }
                },
            );
        }
    }
}

/// Reads one request (headers, then a body of its Content-Length) and answers it with
/// `code` and an S3 error document; closes the connection.
fn answer_with_status(client: &mut TcpStream, code: u16, faulted: &AtomicUsize) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let _ = std::io::copy(&mut client.take(length), &mut std::io::sink());
    let (reason, s3_code) = match code {
        503 => ("Service Unavailable", "SlowDown"),
        _ => ("Internal Server Error", "InternalError"),
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{s3_code}</Code><Message>injected by the test</Message></Error>"
    );
    let reply = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    faulted.fetch_add(1, Ordering::SeqCst);
    let _ = client.write_all(reply.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}
