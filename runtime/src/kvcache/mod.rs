//! The paged KV cache and attention over it.
//!
//! A [`KvCache`] owns a pool of pages and the sequences that use it. A page holds `page_rows`
//! token rows (default 16) of one layer and one KV head, for K and for V, stored as f32, f16 or
//! int8 with one f32 scale per row ([`KvStorage`]). Each sequence has one page table per layer:
//! for block `b` of `page_rows` positions and KV head `h`, entry `b·kv_heads + h` is the page
//! holding those rows. Pages are reference-counted: [`KvCache::fork`] gives a new sequence the
//! parent's pages without copying them, and the first write into a page that is still shared
//! copies that page alone (copy on write). Dropping a sequence releases its references; a page
//! nobody references returns to the pool.
//!
//! Per layer and step the executor calls [`KvCache::append`] with the new tokens' K and V
//! (`[kv_heads, S, head_dim]`), then [`KvCache::attend`] with their queries
//! (`[q_heads, S, head_dim]`): causal grouped-query attention of those S tokens over everything
//! the layer holds, query head `i` reading KV head `i / (q_heads / kv_heads)`, token `i` of the
//! block seeing positions up to its own. Attention reads the pages where they are, one page at a
//! time, and merges per-page softmax partials exactly (see `attend.rs`); nothing of the past is
//! gathered or copied, and decoding allocates nothing once a sequence exists.
//!
//! A failed call changes nothing: in particular an exhausted pool is reported to the sequence
//! that asked for pages ([`KvError::PoolExhausted`]), and every other sequence keeps its pages
//! and its results.

mod attend;
mod config;
mod error;
mod pool;
mod stats;

use std::fmt;

pub use attend::{AttendScratch, Scoring};
pub use config::{KvCacheConfig, KvStorage, DEFAULT_PAGE_ROWS, DEFAULT_RESERVED_ROWS};
pub use error::KvError;
pub use stats::{KvTraffic, PoolStats, SequenceStats};

use attend::GroupQueries;
use pool::{PageId, PagePool};
use stats::TrafficCounters;

/// How far ahead of its merge attention asks the CPU to load a page. Measured on SmolLM2-135M at
/// 1,024 rows of context with 16-row pages: four pages ahead decoded faster than one or two, and
/// as fast as eight; with the 64-row pages of [`DEFAULT_PAGE_ROWS`], one and four pages ahead
/// measured alike within this machine's noise (66–86 against 69–72 tok/s over two runs each).
const PREFETCH_PAGES: usize = 4;

/// A sequence of a [`KvCache`]. Ids of dropped sequences are never valid again, even when their
/// slot is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId {
    slot: u32,
    generation: u32,
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}.{}", self.slot, self.generation)
    }
}

/// One layer of a sequence: the rows it holds and the pages holding them,
/// `pages[block · kv_heads + kv_head]`, `ceil(rows / page_rows)` blocks.
struct LayerTable {
    rows: usize,
    pages: Vec<PageId>,
}

struct Sequence {
    layers: Vec<LayerTable>,
    scratch: AttendScratch,
    traffic: TrafficCounters,
}

struct Slot {
    generation: u32,
    sequence: Option<Sequence>,
}

/// A page pool and the sequences paging into it. See the module documentation.
pub struct KvCache {
    config: KvCacheConfig,
    pool: PagePool,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    traffic: TrafficCounters,
}

fn lookup(slots: &[Slot], seq: SeqId) -> Result<&Sequence, KvError> {
    slots
        .get(seq.slot as usize)
        .filter(|s| s.generation == seq.generation)
        .and_then(|s| s.sequence.as_ref())
        .ok_or(KvError::UnknownSequence { seq })
}

fn lookup_mut(slots: &mut [Slot], seq: SeqId) -> Result<&mut Sequence, KvError> {
    slots
        .get_mut(seq.slot as usize)
        .filter(|s| s.generation == seq.generation)
        .and_then(|s| s.sequence.as_mut())
        .ok_or(KvError::UnknownSequence { seq })
}

impl KvCache {
    /// A cache with its whole pool allocated (zeroed, so backed by memory only once written).
    pub fn new(config: KvCacheConfig) -> Result<KvCache, KvError> {
        config.validate()?;
        Ok(KvCache {
            pool: PagePool::new(&config),
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            traffic: TrafficCounters::default(),
        })
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.config
    }

    /// A new empty sequence, its page tables reserved for `reserved_rows` rows and its attention
    /// scratch sized for decoding one token at a time.
    pub fn create_sequence(&mut self) -> SeqId {
        let layers = (0..self.config.layers).map(|_| self.empty_table()).collect();
        self.insert(layers)
    }

    /// A new sequence sharing every page of `parent` (all the rows each layer holds). No page is
    /// copied until one of the two writes into a shared, partly filled page.
    pub fn fork(&mut self, parent: SeqId) -> Result<SeqId, KvError> {
        let rows: Vec<usize> = lookup(&self.slots, parent)?.layers.iter().map(|t| t.rows).collect();
        Ok(self.share(parent, |layer| rows[layer]))
    }

    /// A new sequence sharing the first `rows` rows of every layer of `parent`.
    pub fn fork_prefix(&mut self, parent: SeqId, rows: usize) -> Result<SeqId, KvError> {
        let sequence = lookup(&self.slots, parent)?;
        if let Some((layer, t)) = sequence.layers.iter().enumerate().find(|(_, t)| t.rows < rows) {
            return Err(KvError::PrefixBeyondHeld { seq: parent, layer, rows, held_rows: t.rows });
        }
        Ok(self.share(parent, |_| rows))
    }

    /// Drops a sequence: its page references are released and pages no other sequence uses return
    /// to the pool. Its id is invalid afterwards.
    pub fn drop_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        lookup(&self.slots, seq)?;
        let slot = &mut self.slots[seq.slot as usize];
        let sequence = slot.sequence.take().expect("looked up above");
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(seq.slot);
        for page in sequence.layers.iter().flat_map(|t| &t.pages) {
            self.pool.release(*page);
        }
        Ok(())
    }

    /// Keeps the first `rows` rows of every layer of `seq` and gives up the rest: pages past the
    /// last kept block are released (to the pool when no other sequence holds them) and nothing is
    /// copied; the next append writes after row `rows`. This is how rejected speculative rows
    /// leave the cache. Refused, changing nothing, when a layer holds fewer than `rows` rows.
    pub fn truncate(&mut self, seq: SeqId, rows: usize) -> Result<(), KvError> {
        let (kv_heads, page_rows) = (self.config.kv_heads, self.config.page_rows);
        let row_bytes = self.config.storage.row_bytes(self.config.head_dim);
        let sequence = lookup_mut(&mut self.slots, seq)?;
        if let Some((layer, t)) = sequence.layers.iter().enumerate().find(|(_, t)| t.rows < rows) {
            return Err(KvError::TruncateBeyondHeld { seq, layer, rows, held_rows: t.rows });
        }
        for table in &mut sequence.layers {
            let dropped = table.rows - rows;
            for page in table.pages.drain(rows.div_ceil(page_rows) * kv_heads..) {
                self.pool.release(page);
            }
            table.rows = rows;
            let bytes = dropped * kv_heads * 2 * row_bytes;
            sequence.traffic.add_truncated(bytes);
            self.traffic.add_truncated(bytes);
        }
        Ok(())
    }

    /// Rows (tokens) layer `layer` of `seq` holds.
    pub fn rows(&self, seq: SeqId, layer: usize) -> Result<usize, KvError> {
        let sequence = lookup(&self.slots, seq)?;
        self.check_layer(seq, layer)?;
        Ok(sequence.layers[layer].rows)
    }

    /// Appends S tokens to layer `layer` of `seq`: `k_new` and `v_new` are `[kv_heads, S,
    /// head_dim]` (for one token simply `[kv_heads, head_dim]`). Only the new rows are written;
    /// the pages they need come from the pool, and a shared page being written is copied first.
    /// When the pool cannot supply every page the call needs, nothing is written and the error
    /// names the sequence, the layer and the pages asked for.
    pub fn append(&mut self, seq: SeqId, layer: usize, k_new: &[f32], v_new: &[f32]) -> Result<(), KvError> {
        self.check_layer(seq, layer)?;
        let (kv_heads, d, page_rows) = (self.config.kv_heads, self.config.head_dim, self.config.page_rows);
        let row_bytes = self.config.storage.row_bytes(d);
        let row_values = kv_heads * d;
        let sequence = lookup_mut(&mut self.slots, seq)?;
        if k_new.is_empty() || !k_new.len().is_multiple_of(row_values) {
            let expected = format!("[kv_heads={kv_heads}, S, head_dim={d}] with S ≥ 1");
            return Err(KvError::BadShape { seq, layer, tensor: "k_new", len: k_new.len(), expected });
        }
        if v_new.len() != k_new.len() {
            let expected = format!("{} like k_new", k_new.len());
            return Err(KvError::BadShape { seq, layer, tensor: "v_new", len: v_new.len(), expected });
        }
        let tokens = k_new.len() / row_values;
        let table = &mut sequence.layers[layer];
        let (start, end) = (table.rows, table.rows + tokens);
        let (blocks_held, blocks_after) = (start.div_ceil(page_rows), end.div_ceil(page_rows));
        // The rows already in the last, partly filled block; its pages are written first.
        let filled = start % page_rows;
        let last_block = &table.pages[blocks_held.saturating_sub(1) * kv_heads..];
        let shared_written =
            if filled > 0 { last_block.iter().filter(|&&p| self.pool.refcount(p) > 1).count() } else { 0 };
        let pages_needed = (blocks_after - blocks_held) * kv_heads + shared_written;
        if pages_needed > self.pool.pages_free() {
            let pages_free = self.pool.pages_free();
            return Err(KvError::PoolExhausted { seq, layer, rows: tokens, pages_needed, pages_free });
        }
        if shared_written > 0 {
            for page in &mut table.pages[(blocks_held - 1) * kv_heads..] {
                if self.pool.refcount(*page) > 1 {
                    let copy = self.pool.allocate().expect("free pages counted above");
                    self.pool.copy_rows(*page, copy, filled);
                    self.pool.release(*page);
                    *page = copy;
                }
            }
            let copied = shared_written * 2 * filled * row_bytes;
            sequence.traffic.add_copied(copied);
            self.traffic.add_copied(copied);
        }
        for _ in 0..(blocks_after - blocks_held) * kv_heads {
            table.pages.push(self.pool.allocate().expect("free pages counted above"));
        }
        for i in 0..tokens {
            let (block, row) = ((start + i) / page_rows, (start + i) % page_rows);
            for h in 0..kv_heads {
                let src = (h * tokens + i) * d;
                let page = table.pages[block * kv_heads + h];
                self.pool.write_row(page, row, &k_new[src..src + d], &v_new[src..src + d]);
            }
        }
        table.rows = end;
        let appended = tokens * kv_heads * 2 * row_bytes;
        sequence.traffic.add_appended(appended);
        self.traffic.add_appended(appended);
        Ok(())
    }

    /// Causal grouped-query attention of the last S rows appended to layer `layer` of `seq`: `q`
    /// and `out` are `[q_heads, S, head_dim]` (for one token `[q_heads, head_dim]`); query token
    /// `i` sits at position `p = rows − S + i` and attends to positions `0..=p` (with a sliding
    /// window of w, `p + 1 − w..=p`); `out = softmax(scale · q·Kᵀ) · V` per query head over its
    /// KV head. `scoring` is the scale, or a [`Scoring`] with a window. Uses the sequence's own
    /// scratch.
    pub fn attend<'s>(
        &mut self,
        seq: SeqId,
        layer: usize,
        q: &[f32],
        scoring: impl Into<Scoring<'s>>,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        let mut scratch = std::mem::take(&mut lookup_mut(&mut self.slots, seq)?.scratch);
        let result = self.attend_with(seq, layer, q, scoring, out, &mut scratch);
        lookup_mut(&mut self.slots, seq).expect("looked up above").scratch = scratch;
        result
    }

    /// [`KvCache::attend`] with the caller's scratch, through a shared reference: workers may
    /// attend for different sequences (or the same one) at once, each with its own scratch.
    pub fn attend_with<'s>(
        &self,
        seq: SeqId,
        layer: usize,
        q: &[f32],
        scoring: impl Into<Scoring<'s>>,
        out: &mut [f32],
        scratch: &mut AttendScratch,
    ) -> Result<(), KvError> {
        self.attend_heads(seq, layer, q, scoring, 0..self.config.kv_heads, out, scratch)
    }

    /// [`KvCache::attend_with`] for the KV heads `heads` only: `out` holds the query heads those
    /// KV heads serve, `[group·heads.len(), S, head_dim]` (a contiguous part of the whole output),
    /// so workers can each take some heads of one call.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_heads<'s>(
        &self,
        seq: SeqId,
        layer: usize,
        q: &[f32],
        scoring: impl Into<Scoring<'s>>,
        heads: std::ops::Range<usize>,
        out: &mut [f32],
        scratch: &mut AttendScratch,
    ) -> Result<(), KvError> {
        let Scoring { scale, window, sinks } = scoring.into();
        let sequence = lookup(&self.slots, seq)?;
        self.check_layer(seq, layer)?;
        let config = &self.config;
        let (kv_heads, d, page_rows) = (config.kv_heads, config.head_dim, config.page_rows);
        let row_values = config.q_heads * d;
        if q.is_empty() || !q.len().is_multiple_of(row_values) {
            let expected = format!("[q_heads={}, S, head_dim={d}] with S ≥ 1", config.q_heads);
            return Err(KvError::BadShape { seq, layer, tensor: "q", len: q.len(), expected });
        }
        if heads.start > heads.end || heads.end > kv_heads || out.len() * kv_heads != q.len() * heads.len() {
            let expected =
                format!("{} like q's rows of KV heads {heads:?} of {kv_heads}", q.len() / kv_heads * heads.len());
            return Err(KvError::BadShape { seq, layer, tensor: "out", len: out.len(), expected });
        }
        if let Some(s) = sinks.filter(|s| s.len() != config.q_heads) {
            let expected = format!("one sink per query head, {}", config.q_heads);
            return Err(KvError::BadShape { seq, layer, tensor: "sinks", len: s.len(), expected });
        }
        let tokens = q.len() / row_values;
        let table = &sequence.layers[layer];
        if tokens > table.rows {
            return Err(KvError::QueryBeyondHeld { seq, layer, query_rows: tokens, held_rows: table.rows });
        }
        let group = config.group();
        for h in heads.clone() {
            let queries = GroupQueries {
                q,
                head_dim: d,
                first_q_head: h * group,
                group,
                tokens,
                first_position: table.rows - tokens,
                scale,
                window,
                sinks,
            };
            attend::begin(scratch, &queries, page_rows);
            // Pages wholly before the first query's window hold no visible row.
            let first_visible = window.map_or(0, |w| (table.rows - tokens + 1).saturating_sub(w.get()));
            let blocks = first_visible / page_rows..table.rows.div_ceil(page_rows);
            let valid_rows = |block: usize| page_rows.min(table.rows - block * page_rows);
            // The pages of a sequence lie apart in the pool: ask for each some pages ahead of its
            // use, the first ones before the loop.
            let prefetch = |block: usize| {
                if block < blocks.end {
                    attend::prefetch_page(self.pool.view(table.pages[block * kv_heads + h]), valid_rows(block), d);
                }
            };
            (blocks.start + 1..blocks.start + PREFETCH_PAGES).for_each(prefetch);
            for block in blocks.clone() {
                prefetch(block + PREFETCH_PAGES);
                let page = self.pool.view(table.pages[block * kv_heads + h]);
                let rows = attend::PageRows { page_rows, valid_rows: valid_rows(block) };
                attend::merge_page(config.isa, scratch, &queries, page, rows, block * page_rows);
            }
            attend::finish(scratch, &queries, heads.start * group, out);
        }
        // The last query sees every row held (within its window), so each row read is read
        // once per KV head.
        let first_read =
            window.map_or(0, |w| ((table.rows - tokens + 1).saturating_sub(w.get()) / page_rows) * page_rows);
        let read = (table.rows - first_read) * heads.len() * 2 * config.storage.row_bytes(d);
        sequence.traffic.add_read(read);
        self.traffic.add_read(read);
        Ok(())
    }

    /// A scratch for [`KvCache::attend_with`] sized for decoding one token at a time.
    pub fn new_scratch(&self) -> AttendScratch {
        AttendScratch::with_capacity(self.config.group(), self.config.head_dim, self.config.page_rows)
    }

    /// Traffic and pages of one sequence.
    pub fn sequence_stats(&self, seq: SeqId) -> Result<SequenceStats, KvError> {
        let sequence = lookup(&self.slots, seq)?;
        let pages = || sequence.layers.iter().flat_map(|t| &t.pages);
        Ok(SequenceStats {
            traffic: sequence.traffic.snapshot(),
            pages_in_use: pages().count(),
            pages_shared: pages().filter(|&&p| self.pool.refcount(p) > 1).count(),
        })
    }

    /// Traffic of the whole pool since creation, and its pages in use now.
    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            traffic: self.traffic.snapshot(),
            pages_in_use: self.pool.pages_total() - self.pool.pages_free(),
            pages_total: self.pool.pages_total(),
            page_bytes: self.config.page_bytes(),
            sequences: self.slots.iter().filter(|s| s.sequence.is_some()).count(),
        }
    }

    fn check_layer(&self, seq: SeqId, layer: usize) -> Result<(), KvError> {
        if layer >= self.config.layers {
            return Err(KvError::LayerOutOfRange { seq, layer, layers: self.config.layers });
        }
        Ok(())
    }

    fn empty_table(&self) -> LayerTable {
        let blocks = self.config.reserved_rows.div_ceil(self.config.page_rows);
        LayerTable { rows: 0, pages: Vec::with_capacity(blocks * self.config.kv_heads) }
    }

    /// A new sequence whose layer `l` shares the first `rows(l)` rows of `parent`'s.
    fn share(&mut self, parent: SeqId, rows: impl Fn(usize) -> usize) -> SeqId {
        let mut layers = Vec::with_capacity(self.config.layers);
        let parent_layers = &lookup(&self.slots, parent).expect("checked by the caller").layers;
        for (l, parent_table) in parent_layers.iter().enumerate() {
            let mut table = self.empty_table();
            table.rows = rows(l);
            let blocks = table.rows.div_ceil(self.config.page_rows);
            table.pages.extend_from_slice(&parent_table.pages[..blocks * self.config.kv_heads]);
            layers.push(table);
        }
        for page in layers.iter().flat_map(|t: &LayerTable| &t.pages) {
            self.pool.retain(*page);
        }
        self.insert(layers)
    }

    fn insert(&mut self, layers: Vec<LayerTable>) -> SeqId {
        let sequence = Sequence { layers, scratch: self.new_scratch(), traffic: TrafficCounters::default() };
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot { generation: 0, sequence: None });
                (self.slots.len() - 1) as u32
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.sequence = Some(sequence);
        SeqId { slot, generation: entry.generation }
    }
}
