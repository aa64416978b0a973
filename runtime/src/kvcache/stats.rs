//! Traffic counters of the cache, per sequence and for the whole pool.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes moved by the cache, counted in the pages' storage type (an int8 row counts its codes and
/// its f32 scale).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvTraffic {
    /// K and V rows written by `append`.
    pub appended_bytes: u64,
    /// Rows of the past copied because a shared page was written (copy on write). Zero in normal
    /// decoding: only a sequence that shares a partly filled page copies, once, that page's rows.
    pub copied_bytes: u64,
    /// K and V rows read by `attend` (each page once per KV head and call, whatever the number of
    /// query heads and new tokens reading it).
    pub attention_read_bytes: u64,
    /// K and V rows dropped by `truncate` (rejected speculative rows): given up, never copied.
    pub truncated_bytes: u64,
}

/// Counters of one sequence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceStats {
    pub traffic: KvTraffic,
    /// Pages in the sequence's page tables, shared ones included.
    pub pages_in_use: usize,
    /// Of those, pages another sequence also references.
    pub pages_shared: usize,
}

/// Counters of the whole pool since the cache was created (dropped sequences included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub traffic: KvTraffic,
    /// Pages referenced by at least one sequence (a shared page counts once).
    pub pages_in_use: usize,
    pub pages_total: usize,
    pub page_bytes: usize,
    pub sequences: usize,
}

impl fmt::Display for KvTraffic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "appended {} B, copied {} B, attention read {} B, truncated {} B",
            self.appended_bytes, self.copied_bytes, self.attention_read_bytes, self.truncated_bytes
        )
    }
}

impl fmt::Display for SequenceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} pages ({} shared), {}", self.pages_in_use, self.pages_shared, self.traffic)
    }
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} pages in use ({} B each), {} sequences, {}",
            self.pages_in_use, self.pages_total, self.page_bytes, self.sequences, self.traffic
        )
    }
}

/// Counters updated through shared references, so attention can run on `&KvCache` from several
/// threads.
#[derive(Debug, Default)]
pub(crate) struct TrafficCounters {
    appended: AtomicU64,
    copied: AtomicU64,
    read: AtomicU64,
    truncated: AtomicU64,
}

impl TrafficCounters {
    pub(crate) fn add_appended(&self, bytes: usize) {
        self.appended.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_copied(&self, bytes: usize) {
        self.copied.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_read(&self, bytes: usize) {
        self.read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_truncated(&self, bytes: usize) {
        self.truncated.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> KvTraffic {
        KvTraffic {
            appended_bytes: self.appended.load(Ordering::Relaxed),
            copied_bytes: self.copied.load(Ordering::Relaxed),
            attention_read_bytes: self.read.load(Ordering::Relaxed),
            truncated_bytes: self.truncated.load(Ordering::Relaxed),
        }
    }
}
