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
