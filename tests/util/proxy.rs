//! A TCP proxy that forwards faithfully until a connection has sent more than a byte
//! budget upstream, then cuts that connection (both ways). Small requests (HEAD,
//! CreateMultipartUpload, AbortMultipartUpload) get through; every attempt at sending a
//! large body fails part-way, however often it is retried. [`CuttingProxy::set_cutting`]
//! turns the cutting off (and on again), so one client can fail and then succeed.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const METHODS: [&[u8]; 5] = [b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE "];

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Set while the proxy forwards everything (cutting is on by default).
    passing: AtomicBool,
    cut: AtomicUsize,
    requests: Mutex<Vec<String>>,
}

/// A running proxy on 127.0.0.1; stopped when dropped.
pub struct CuttingProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl CuttingProxy {
    /// Proxies to `upstream_url` (`http://host:port`), cutting any connection once it has
    /// forwarded more than `limit` bytes upstream.
    pub fn start(upstream_url: &str, limit: u64) -> Self {
        let host_port = upstream_url
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let upstream = host_port
            .to_socket_addrs()
            .expect("resolve upstream")
            .next()
            .expect("upstream address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        let accept_thread = std::thread::spawn(move || {
            for client in listener.incoming() {
                if accept_shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let shared = accept_shared.clone();
                std::thread::spawn(move || serve(client, upstream, limit, shared));
            }
        });
        CuttingProxy {
            addr,
            shared,
            accept_thread: Some(accept_thread),
        }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
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

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(client: TcpStream, upstream: SocketAddr, limit: u64, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let (Ok(mut client_read), Ok(mut server_write)) = (client.try_clone(), server.try_clone())
    else {
        return;
    };
    let (mut server_read, mut client_write) = (server, client);
    let downstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut server_read, &mut client_write);
        let _ = client_write.shutdown(Shutdown::Write);
    });
    let mut forwarded: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client_read.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = server_write.shutdown(Shutdown::Write);
                break;
            }
            Ok(n) => n,
        };
        let chunk = &buf[..n];
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
        forwarded += n as u64;
        let over = forwarded > limit && !shared.passing.load(Ordering::SeqCst);
        if over || shared.stop.load(Ordering::SeqCst) {
            shared.cut.fetch_add(1, Ordering::SeqCst);
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
