//! Errors of the KV cache. Each names the sequence it concerns; a failed call changes nothing.

use super::SeqId;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("invalid KV cache configuration: {0}")]
    Config(String),
    #[error("{seq}: no such sequence (dropped, or from another cache)")]
    UnknownSequence { seq: SeqId },
    #[error("{seq}: layer {layer} is out of range, the cache has {layers} layers")]
    LayerOutOfRange { seq: SeqId, layer: usize, layers: usize },
    /// A tensor whose length does not fit the layout the call expects.
    #[error("{seq}, layer {layer}: `{tensor}` has {len} values, expected {expected}")]
    BadShape { seq: SeqId, layer: usize, tensor: &'static str, len: usize, expected: String },
    /// Appending `rows` rows needs `pages_needed` free pages (new pages plus copies of shared
    /// pages written into) and the pool has only `pages_free`.
    #[error(
        "{seq}, layer {layer}: KV pool exhausted appending {rows} rows: {pages_needed} pages needed, {pages_free} free"
    )]
    PoolExhausted { seq: SeqId, layer: usize, rows: usize, pages_needed: usize, pages_free: usize },
    /// Attention was asked for more query rows than the layer holds (queries are the last rows
    /// appended).
    #[error("{seq}, layer {layer}: {query_rows} query rows but the layer holds only {held_rows} rows")]
    QueryBeyondHeld { seq: SeqId, layer: usize, query_rows: usize, held_rows: usize },
    #[error("{seq}: cannot share a prefix of {rows} rows, layer {layer} holds only {held_rows}")]
    PrefixBeyondHeld { seq: SeqId, layer: usize, rows: usize, held_rows: usize },
    #[error("{seq}: cannot truncate to {rows} rows, layer {layer} holds only {held_rows}")]
    TruncateBeyondHeld { seq: SeqId, layer: usize, rows: usize, held_rows: usize },
}
