//! Per-operation latency histograms, shown in `.status`, so that a slow path shows
//! where it is: time from a request's arrival to its reply, including any wait for a
//! checkpoint to load. Recording is a few atomic additions; nothing is locked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The operations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Readlink,
    Readdir,
    Open,
    Read,
    Write,
    Create,
    Setattr,
    Mkdir,
    Mknod,
    Symlink,
    Link,
    Unlink,
    Rmdir,
    Rename,
    CopyFileRange,
    Fsync,
    Release,
}

const OPS: [(Op, &str); 19] = [
    (Op::Lookup, "lookup"),
    (Op::Getattr, "getattr"),
    (Op::Readlink, "readlink"),
    (Op::Readdir, "readdir"),
    (Op::Open, "open"),
    (Op::Read, "read"),
    (Op::Write, "write"),
    (Op::Create, "create"),
    (Op::Setattr, "setattr"),
    (Op::Mkdir, "mkdir"),
    (Op::Mknod, "mknod"),
    (Op::Symlink, "symlink"),
    (Op::Link, "link"),
    (Op::Unlink, "unlink"),
    (Op::Rmdir, "rmdir"),
    (Op::Rename, "rename"),
    (Op::CopyFileRange, "copy_file_range"),
    (Op::Fsync, "fsync"),
    (Op::Release, "release"),
];

/// Bucket `i` counts latencies below 2^i microseconds (the last one, anything).
const BUCKETS: usize = 28;

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    /// The sum of all samples, to tell the daemon's share of a job's time.
    total_nanos: AtomicU64,
}

impl Histogram {
    fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.total_nanos.fetch_add(nanos, Ordering::Relaxed);
        let micros = elapsed.as_micros().max(1) as u64;
        let bucket = (64 - micros.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The bound under which a fraction `q` of the samples fell, and the count.
    fn quantile(&self, counts: &[u64; BUCKETS], q: f64) -> Duration {
        let total: u64 = counts.iter().sum();
        let wanted = (total as f64 * q).ceil() as u64;
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= wanted {
                return Duration::from_micros(1 << i);
            }
        }
        Duration::from_micros(1 << (BUCKETS - 1))
    }

    fn counts(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }
}

#[derive(Default)]
pub struct Latencies {
    histograms: [Histogram; OPS.len()],
}

impl Latencies {
    pub fn record(&self, op: Op, elapsed: Duration) {
        let i = OPS
            .iter()
            .position(|(o, _)| *o == op)
            .expect("every op is listed");
        self.histograms[i].record(elapsed);
    }

    /// One `#` line per operation seen: count, the bounds (powers of two) under
    /// which half and 99% of them answered, and the time they took in all.
    pub fn render(&self) -> String {
        let mut text = String::new();
        for ((_, name), histogram) in OPS.iter().zip(&self.histograms) {
            let counts = histogram.counts();
            let total: u64 = counts.iter().sum();
            if total == 0 {
                continue;
            }
            let (p50, p99) = (
                histogram.quantile(&counts, 0.5),
                histogram.quantile(&counts, 0.99),
            );
            let requests = if total == 1 { "request" } else { "requests" };
            let busy = Duration::from_nanos(histogram.total_nanos.load(Ordering::Relaxed));
            text += &format!(
                "# latency {name}: {total} {requests}, p50 < {p50:?}, p99 < {p99:?}, \
                 total {:.3} s\n",
                busy.as_secs_f64()
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_power_of_two_bounds() {
        let latencies = Latencies::default();
        for _ in 0..98 {
            latencies.record(Op::Lookup, Duration::from_micros(30));
        }
        latencies.record(Op::Lookup, Duration::from_millis(3));
        latencies.record(Op::Lookup, Duration::from_millis(40));
        let text = latencies.render();
        assert_eq!(
            text,
            "# latency lookup: 100 requests, p50 < 32µs, p99 < 4.096ms, total 0.046 s\n"
        );
    }
}
