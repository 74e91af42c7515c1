//! A TCP proxy in front of the S3 server that holds one object's download half-way
//! until the test opens the gate. While held, the mount is provably in the middle of
//! verifying that checkpoint, for as long as the test needs: no timing guesses.
//!
//! A connection is *armed* when it carries a `GET` whose request line contains the
//! pattern (the object's key); requests on one connection are sequential, so from then
//! on its response bytes are that object's. An armed response is forwarded up to
//! `hold_after` bytes, then stalls until [`GatedProxy::open`]. Everything else passes.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::util::proxy::{Connection, Proxy};

struct Shared {
    pattern: Vec<u8>,
    hold_after: u64,
    open: Mutex<bool>,
    opened: Condvar,
    /// Responses currently stalled at the gate.
    held: AtomicUsize,
    /// `GET`s of the pattern seen.
    gets: AtomicUsize,
}

/// A running proxy on 127.0.0.1; the gate opens and the proxy stops when dropped.
pub struct GatedProxy {
    proxy: Proxy,
    shared: Arc<Shared>,
}

impl GatedProxy {
    /// Proxies to `upstream_url` (`http://host:port`), holding responses to `GET`s whose
    /// request line contains `pattern` after `hold_after` bytes.
    pub fn start(upstream_url: &str, pattern: &str, hold_after: u64) -> Self {
        let shared = Arc::new(Shared {
            pattern: pattern.as_bytes().to_vec(),
            hold_after,
            open: Mutex::new(false),
            opened: Condvar::new(),
            held: AtomicUsize::new(0),
            gets: AtomicUsize::new(0),
        });
        let serve_shared = Arc::clone(&shared);
        let proxy = Proxy::start(upstream_url, move |connection| {
            serve(connection, Arc::clone(&serve_shared))
        });
        GatedProxy { proxy, shared }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// Waits until a response is stalled at the gate; false after `timeout`.
    pub fn wait_held(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shared.held.load(Ordering::SeqCst) == 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Responses stalled at the gate right now.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// How many `GET`s of the pattern went through (or are under way).
    pub fn gets(&self) -> usize {
        self.shared.gets.load(Ordering::SeqCst)
    }

    /// Lets every held response, and all later ones, through.
    pub fn open(&self) {
        *self.shared.open.lock().unwrap() = true;
        self.shared.opened.notify_all();
    }
}

impl Drop for GatedProxy {
    fn drop(&mut self) {
        // Then the proxy stops, as it is dropped.
        self.open();
    }
}

fn serve(connection: Connection, shared: Arc<Shared>) {
    let armed = Arc::new(AtomicBool::new(false));
    let down_armed = Arc::clone(&armed);
    let down_shared = Arc::clone(&shared);
    connection.relay(
        move |server_read, client_write| {
            let mut sent_armed: u64 = 0;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match server_read.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut chunk = &buf[..n];
                if down_armed.load(Ordering::SeqCst) && !*down_shared.open.lock().unwrap() {
                    let room = down_shared.hold_after.saturating_sub(sent_armed) as usize;
                    if chunk.len() > room {
                        if client_write.write_all(&chunk[..room]).is_err() {
                            break;
                        }
                        let _ = client_write.flush();
                        chunk = &chunk[room..];
                        down_shared.held.fetch_add(1, Ordering::SeqCst);
                        let mut open = down_shared.open.lock().unwrap();
                        while !*open {
                            open = down_shared.opened.wait(open).unwrap();
                        }
                        drop(open);
                        down_shared.held.fetch_sub(1, Ordering::SeqCst);
                    }
                    sent_armed += chunk.len() as u64;
                }
                if client_write.write_all(chunk).is_err() {
                    break;
                }
            }
        },
        |chunk| {
            if chunk.starts_with(b"GET ") {
                let line_end = chunk
                    .windows(2)
                    .position(|w| w == b"\r\n")
                    .unwrap_or(chunk.len());
                if chunk[..line_end]
                    .windows(shared.pattern.len())
                    .any(|w| w == shared.pattern.as_slice())
                {
                    shared.gets.fetch_add(1, Ordering::SeqCst);
                    armed.store(true, Ordering::SeqCst);
                }
            }
            true
        },
    );
}

/// Opens the gate when dropped: declared after the mount, it lets a stalled download
/// finish before the mount is torn down, also when a test fails half-way.
pub struct OpenOnDrop<'a>(pub &'a GatedProxy);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        self.0.open();
    }
}
