//! The shape of a cache: model dimensions, page size, pool size and storage type.

use super::error::KvError;
use crate::kernels::Isa;

/// How the rows of K and V are stored in the pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvStorage {
    /// Exact: attention over f32 pages equals attention over the f32 rows appended.
    F32,
    /// IEEE half precision, rounded to nearest even on append.
    F16,
    /// Symmetric int8 codes with one f32 scale per token row and KV head:
    /// `scale = amax / 127`, `code = round_half_even(x / scale)` in [-127, 127]; a row of zeros
    /// has scale 0 and all codes 0.
    Int8,
}

impl KvStorage {
    /// Bytes one token row of one KV head takes in a page, for K or for V (the int8 scale
    /// included).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvStorage::F32 => 4 * head_dim,
            KvStorage::F16 => 2 * head_dim,
            KvStorage::Int8 => head_dim + 4,
        }
    }
}

/// Page rows used by [`KvCacheConfig::new`]. Measured on SmolLM2-135M int4, one thread, `npuc bench
/// --prompt-len N --gen-len 64`: 64-row pages decode at 84.6 tok/s at 1,024 rows of context and
/// 29.9 at 4,096, 16-row pages at 60.6 and 20.5 (fewer page merges, longer streams to prefetch),
/// and alike at 128. Prefix sharing and truncation keep whole pages, so sharing is coarser.
pub const DEFAULT_PAGE_ROWS: usize = 64;

/// Rows per sequence whose page tables [`KvCacheConfig::new`] reserves up front.
pub const DEFAULT_RESERVED_ROWS: usize = 4096;

/// The dimensions of a KV cache. A pool serves sequences of one model: every sequence has
/// `layers` page tables and every page holds `page_rows` rows of `head_dim` values of one layer
/// and one KV head, for K and for V.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    pub layers: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Token rows per page.
    pub page_rows: usize,
    /// Pages in the pool, shared by every sequence of the cache.
    pub pages: usize,
    pub storage: KvStorage,
    /// Rows per sequence and layer whose page table is allocated when the sequence is created, so
    /// that decoding up to that length never allocates. Longer sequences still work.
    pub reserved_rows: usize,
    /// The instruction-set path attention runs on (the executor passes its kernels' own).
    pub isa: Isa,
}

impl KvCacheConfig {
    /// A configuration with f32 storage, [`DEFAULT_PAGE_ROWS`] rows per page,
    /// [`DEFAULT_RESERVED_ROWS`] reserved rows per sequence and attention on the best path this
    /// CPU has ([`Isa::detect`]).
    pub fn new(layers: usize, q_heads: usize, kv_heads: usize, head_dim: usize, pages: usize) -> KvCacheConfig {
        KvCacheConfig {
            layers,
            q_heads,
            kv_heads,
            head_dim,
            page_rows: DEFAULT_PAGE_ROWS,
            pages,
            storage: KvStorage::F32,
            reserved_rows: DEFAULT_RESERVED_ROWS,
            isa: Isa::detect(),
        }
    }

    pub fn with_page_rows(mut self, page_rows: usize) -> KvCacheConfig {
        self.page_rows = page_rows;
        self
    }

    pub fn with_storage(mut self, storage: KvStorage) -> KvCacheConfig {
        self.storage = storage;
        self
    }

    pub fn with_isa(mut self, isa: Isa) -> KvCacheConfig {
        self.isa = isa;
        self
    }

    pub fn with_reserved_rows(mut self, reserved_rows: usize) -> KvCacheConfig {
        self.reserved_rows = reserved_rows;
        self
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// Bytes of one page: K and V, `page_rows` rows each.
    pub fn page_bytes(&self) -> usize {
        2 * self.page_rows * self.storage.row_bytes(self.head_dim)
    }

    pub(crate) fn validate(&self) -> Result<(), KvError> {
        let fail = |msg: String| Err(KvError::Config(msg));
        if self.layers == 0 || self.q_heads == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.page_rows == 0 {
            return fail(format!("layers, heads, head_dim and page_rows must be positive: {self:?}"));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return fail(format!("q_heads {} is not a multiple of kv_heads {}", self.q_heads, self.kv_heads));
        }
        if !self.isa.is_available() {
            return fail(format!("attention path {} is not available on this CPU", self.isa));
        }
        // Page ids are u32; the element offsets of the whole pool must fit in usize.
        let page_values = 2 * self.page_rows * self.head_dim;
        if self.pages > u32::MAX as usize || self.pages.checked_mul(page_values).is_none() {
            return fail(format!("{} pages of {page_values} values do not fit in memory", self.pages));
        }
        Ok(())
    }
}
