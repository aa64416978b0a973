//! The page pool: one preallocated buffer of pages, their reference counts and a free list.
//!
//! Page `p` occupies the values `[p·2·R·D, (p+1)·2·R·D)` of the pool's buffer (R rows per page,
//! D = head_dim): first its R rows of K, transposed (`[D, R]`: value `j` of row `t` at `j·R + t`,
//! so the attention kernels score a vector of keys at a time without horizontal sums), then its R
//! rows of V, row-major (a weighted sum of value rows reads them whole). Int8 pools keep a scale
//! per row in a second buffer with the same shape minus D: `[p·2·R, p·2·R + R)` for the K rows,
//! the next R for the V rows. The buffers are zero-initialised at creation, so the operating
//! system backs only the pages that are actually written.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::config::{KvCacheConfig, KvStorage};

/// Page index into the pool.
pub(crate) type PageId = u32;

enum PageData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Int8 { codes: Vec<i8>, scales: Vec<f32> },
}

/// One page's K and V rows, borrowed from the pool, in its storage type. Slices cover the whole
/// page (`page_rows` rows); only the rows a sequence holds are meaningful.
pub(crate) enum PageView<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    F16 { k: &'a [f16], v: &'a [f16] },
    Int8 { k: &'a [i8], v: &'a [i8], k_scales: &'a [f32], v_scales: &'a [f32] },
}

pub(crate) struct PagePool {
    page_rows: usize,
    head_dim: usize,
    data: PageData,
    refcounts: Vec<u32>,
    /// Free page ids; allocation pops the most recently freed page.
    free: Vec<PageId>,
}

impl PagePool {
    pub(crate) fn new(config: &KvCacheConfig) -> PagePool {
        let values = config.pages * 2 * config.page_rows * config.head_dim;
        let data = match config.storage {
            KvStorage::F32 => PageData::F32(vec![0.0; values]),
            KvStorage::F16 => PageData::F16(vec![f16::ZERO; values]),
            KvStorage::Int8 => {
                PageData::Int8 { codes: vec![0; values], scales: vec![0.0; config.pages * 2 * config.page_rows] }
            }
        };
        PagePool {
            page_rows: config.page_rows,
            head_dim: config.head_dim,
            data,
            refcounts: vec![0; config.pages],
            free: (0..config.pages as PageId).rev().collect(),
        }
    }

    pub(crate) fn pages_total(&self) -> usize {
        self.refcounts.len()
    }

    pub(crate) fn pages_free(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn refcount(&self, page: PageId) -> u32 {
        self.refcounts[page as usize]
    }

    /// A free page with reference count 1, or `None` when the pool is exhausted.
    pub(crate) fn allocate(&mut self) -> Option<PageId> {
        let page = self.free.pop()?;
        self.refcounts[page as usize] = 1;
        Some(page)
    }

    /// One more reference to a page in use.
    pub(crate) fn retain(&mut self, page: PageId) {
        let count = &mut self.refcounts[page as usize];
        assert!(*count > 0, "retaining free page {page}");
        *count += 1;
    }

    /// Drops one reference; the page returns to the free list when none is left.
    pub(crate) fn release(&mut self, page: PageId) {
        let count = &mut self.refcounts[page as usize];
        assert!(*count > 0, "releasing free page {page}");
        *count -= 1;
        if *count == 0 {
            self.free.push(page);
        }
    }

    fn half_values(&self) -> usize {
        self.page_rows * self.head_dim
    }

    /// Stores one token row of K and one of V (`head_dim` values each) at `row` of `page`,
    /// converting to the pool's storage: K's values into the row's column of the page's K.
    pub(crate) fn write_row(&mut self, page: PageId, row: usize, k: &[f32], v: &[f32]) {
        let (d, r, half) = (self.head_dim, self.page_rows, self.half_values());
        let base = page as usize * 2 * half;
        let (k_column, v_base) = ((base + row..base + half).step_by(r), base + half + row * d);
        let scale_base = page as usize * 2 * r + row;
        match &mut self.data {
            PageData::F32(values) => {
                k_column.zip(k).for_each(|(i, &x)| values[i] = x);
                values[v_base..v_base + d].copy_from_slice(v);
            }
            PageData::F16(values) => {
                k_column.zip(k).for_each(|(i, &x)| values[i] = f16::from_f32(x));
                values[v_base..v_base + d].convert_from_f32_slice(v);
            }
            PageData::Int8 { codes, scales } => {
                let k_scale = row_scale(k);
                k_column.zip(k).for_each(|(i, &x)| codes[i] = code(x, k_scale));
                scales[scale_base] = k_scale;
                let v_scale = row_scale(v);
                codes[v_base..v_base + d].iter_mut().zip(v).for_each(|(c, &x)| *c = code(x, v_scale));
                scales[scale_base + r] = v_scale;
            }
        }
    }

    /// Copies rows `0..rows` of K and V (and their scales) from page `src` to page `dst`.
    pub(crate) fn copy_rows(&mut self, src: PageId, dst: PageId, rows: usize) {
        let (d, r) = (self.head_dim, self.page_rows);
        let page_values = 2 * self.half_values();
        let (src, dst) = (src as usize, dst as usize);
        // The first `rows` of every K column, then the first `rows` V rows.
        let runs = (0..d).map(|j| (j * r, rows)).chain(std::iter::once((page_values / 2, rows * d)));
        fn copy<T: Copy>(values: &mut [T], src: usize, dst: usize, (offset, n): (usize, usize)) {
            values.copy_within(src + offset..src + offset + n, dst + offset);
        }
        match &mut self.data {
            PageData::F32(values) => runs.for_each(|run| copy(values, src * page_values, dst * page_values, run)),
            PageData::F16(values) => runs.for_each(|run| copy(values, src * page_values, dst * page_values, run)),
            PageData::Int8 { codes, scales } => {
                runs.for_each(|run| copy(codes, src * page_values, dst * page_values, run));
                for offset in [0, r] {
                    copy(scales, src * 2 * r, dst * 2 * r, (offset, rows));
                }
            }
        }
    }

    pub(crate) fn view(&self, page: PageId) -> PageView<'_> {
        let half = self.half_values();
        let base = page as usize * 2 * half;
        match &self.data {
            PageData::F32(values) => {
                PageView::F32 { k: &values[base..base + half], v: &values[base + half..base + 2 * half] }
            }
            PageData::F16(values) => {
                PageView::F16 { k: &values[base..base + half], v: &values[base + half..base + 2 * half] }
            }
            PageData::Int8 { codes, scales } => {
                let (r, s) = (self.page_rows, page as usize * 2 * self.page_rows);
                PageView::Int8 {
                    k: &codes[base..base + half],
                    v: &codes[base + half..base + 2 * half],
                    k_scales: &scales[s..s + r],
                    v_scales: &scales[s + r..s + 2 * r],
                }
            }
        }
    }
}

/// Symmetric int8 quantisation of one row: its scale `amax / 127` (0 for a row of zeros), and
/// each value's code under it, [`code`].
pub(crate) fn row_scale(row: &[f32]) -> f32 {
    row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0
}

/// `round_half_even(x / scale)` clamped to [-127, 127]; 0 under a zero scale.
pub(crate) fn code(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8
}
