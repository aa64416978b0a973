//! The paged KV cache against `ir::fused::attention` (the semantics of the fused `Attention` op)
//! on the concatenated past: prefill blocks and decode steps, GQA 2:1 and 3:1, head_dim 64 and
//! 128, page sizes 1, 7 and 16, f32/f16/int8 pages, sliding windows; copy on write, prefix sharing, pool
//! exhaustion, dropping, traffic counters and allocation-free decoding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use half::f16;
use ir::{Attr, Attrs, DType, Domain, OpRef, Tensor};
use runtime::kernels::Isa;
use runtime::kvcache::{KvCache, KvCacheConfig, KvError, KvStorage, Scoring, SeqId};
use std::num::NonZeroUsize;

/// Counts the allocations of the current thread, so a test can prove a loop allocates nothing.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

/// SplitMix64: deterministic test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn value(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.value()).collect()
    }
}

/// What one layer of a sequence holds, kept outside the cache: per KV head, its rows appended
/// in order (`[rows, D]`), exactly as given and as the storage type rounds them.
#[derive(Clone)]
struct Shadow {
    kv_heads: usize,
    d: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    k_stored: Vec<Vec<f32>>,
    v_stored: Vec<Vec<f32>>,
}

impl Shadow {
    fn new(kv_heads: usize, d: usize) -> Shadow {
        Shadow {
            kv_heads,
            d,
            k: vec![vec![]; kv_heads],
            v: vec![vec![]; kv_heads],
            k_stored: vec![vec![]; kv_heads],
            v_stored: vec![vec![]; kv_heads],
        }
    }

    fn rows(&self) -> usize {
        self.k[0].len() / self.d
    }

    /// Records `[kv_heads, S, D]` blocks of K and V.
    fn append(&mut self, storage: KvStorage, k: &[f32], v: &[f32]) {
        let per_head = k.len() / self.kv_heads;
        for h in 0..self.kv_heads {
            let (kh, vh) = (&k[h * per_head..(h + 1) * per_head], &v[h * per_head..(h + 1) * per_head]);
            self.k[h].extend_from_slice(kh);
            self.v[h].extend_from_slice(vh);
            for (src, dst) in [(kh, &mut self.k_stored[h]), (vh, &mut self.v_stored[h])] {
                for row in src.chunks(self.d) {
                    dst.extend(stored(storage, row));
                }
            }
        }
    }

    /// `ir::fused::attention` of `q` ([Hq, S, D]) over the rows held (the last S as the new
    /// block, the rest as the past), on the exact or on the stored values.
    fn reference(&self, q: &[f32], q_heads: usize, scoring: Scoring, on_stored: bool) -> Vec<f32> {
        let (k, v) = if on_stored { (&self.k_stored, &self.v_stored) } else { (&self.k, &self.v) };
        let d = self.d;
        let tokens = q.len() / (q_heads * d);
        let past = self.rows() - tokens;
        let split = |rows: &Vec<Vec<f32>>, range: std::ops::Range<usize>| -> Tensor {
            let values: Vec<f32> =
                rows.iter().flat_map(|h| h[range.start * d..range.end * d].iter().copied()).collect();
            Tensor::from_f32(DType::F32, vec![1, self.kv_heads, range.len(), d], values)
        };
        let q_t = Tensor::from_f32(DType::F32, vec![1, q_heads, tokens, d], q.to_vec());
        let (k_new, v_new) = (split(k, past..past + tokens), split(v, past..past + tokens));
        let (k_past, v_past) = (split(k, 0..past), split(v, 0..past));
        let mut attrs = Attrs::default();
        attrs.set("scale", Attr::Float(scoring.scale));
        if let Some(w) = scoring.window {
            attrs.set("window", Attr::Int(w.get() as i64));
        }
        let op = OpRef { node: "attention", domain: Domain::Npuc, op: "Attention", opset: 1, attrs: &attrs };
        let sinks = scoring.sinks.map(|s| Tensor::from_f32(DType::F32, vec![s.len()], s.to_vec()));
        let inputs = if past == 0 {
            vec![Some(&q_t), Some(&k_new), Some(&v_new), None, None, None, sinks.as_ref()]
        } else {
            vec![Some(&q_t), Some(&k_new), Some(&v_new), Some(&k_past), Some(&v_past), None, sinks.as_ref()]
        };
        ir::fused::attention(&op, &inputs, 1).unwrap().remove(0).as_f32().unwrap().to_vec()
    }
}

/// A row as the storage type keeps it: f16-rounded, or int8 codes (symmetric, amax/127, round
/// half to even) times their scale.
fn stored(storage: KvStorage, row: &[f32]) -> Vec<f32> {
    match storage {
        KvStorage::F32 => row.to_vec(),
        KvStorage::F16 => row.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        KvStorage::Int8 => {
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            if amax == 0.0 {
                return vec![0.0; row.len()];
            }
            let scale = amax / 127.0;
            row.iter().map(|&x| (x / scale).round_ties_even().clamp(-127.0, 127.0) * scale).collect()
        }
    }
}

/// Largest error of any output row relative to that row's largest reference magnitude:
/// `max_rows max_i |got_i − want_i| / max_i |want_i|`.
fn row_relative_error(got: &[f32], want: &[f32], d: usize) -> f64 {
    assert_eq!(got.len(), want.len());
    got.chunks(d)
        .zip(want.chunks(d))
        .map(|(g, w)| {
            let scale = w.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
            let err = g.iter().zip(w).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
            err / scale.max(f64::MIN_POSITIVE)
        })
        .fold(0.0, f64::max)
}

/// Largest absolute error of any output value.
fn abs_error(got: &[f32], want: &[f32]) -> f64 {
    got.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()))
}

#[derive(Clone, Copy, Debug)]
struct Case {
    storage: KvStorage,
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    page_rows: usize,
    window: Option<NonZeroUsize>,
    /// Sink logits ([`SINKS`]'s first `q_heads`) join every softmax.
    sinks: bool,
}

/// Sink logits per query head: around the scores' range, above and below it.
const SINKS: [f32; 8] = [0.5, -1.0, 2.5, -8.0, 0.0, 1.25, -0.3, 4.0];

impl Case {
    fn config(&self, layers: usize, pages: usize) -> KvCacheConfig {
        KvCacheConfig::new(layers, self.q_heads, self.kv_heads, self.d, pages)
            .with_page_rows(self.page_rows)
            .with_storage(self.storage)
    }

    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    fn scoring(&self) -> Scoring<'static> {
        Scoring { scale: self.scale(), window: self.window, sinks: self.sinks.then(|| &SINKS[..self.q_heads]) }
    }
}

/// Errors measured over a run: against the exact f32 reference, and against the reference on
/// the values the storage type keeps.
#[derive(Default, Debug)]
struct Measured {
    exact_rel: f64,
    exact_abs: f64,
    stored_rel: f64,
    attends: usize,
}

/// One step of a sequence in every layer: appends `tokens` random rows, attends with random
/// queries and compares with the references. Every 11th K row is all zeros (int8 scale 0).
fn step(
    cache: &mut KvCache,
    seq: SeqId,
    shadows: &mut [Shadow],
    case: Case,
    tokens: usize,
    rng: &mut Rng,
    m: &mut Measured,
) {
    let d = case.d;
    for (layer, shadow) in shadows.iter_mut().enumerate() {
        let mut k = rng.values(case.kv_heads * tokens * d);
        let v = rng.values(case.kv_heads * tokens * d);
        for (t, row) in k.chunks_mut(d).enumerate() {
            if (shadow.rows() * case.kv_heads + t) % 11 == 5 {
                row.fill(0.0);
            }
        }
        let q = rng.values(case.q_heads * tokens * d);
        cache.append(seq, layer, &k, &v).unwrap();
        shadow.append(case.storage, &k, &v);
        let mut out = vec![0f32; q.len()];
        cache.attend(seq, layer, &q, case.scoring(), &mut out).unwrap();
        let exact = shadow.reference(&q, case.q_heads, case.scoring(), false);
        let on_stored = shadow.reference(&q, case.q_heads, case.scoring(), true);
        m.exact_rel = m.exact_rel.max(row_relative_error(&out, &exact, d));
        m.exact_abs = m.exact_abs.max(abs_error(&out, &exact));
        m.stored_rel = m.stored_rel.max(row_relative_error(&out, &on_stored, d));
        m.attends += 1;
    }
}

/// Prefill 19 rows, a second block of 5, then 30 single-token steps (54 rows: every page size
/// tested is crossed several times), over two layers.
fn run_case(case: Case) -> Measured {
    let mut cache = KvCache::new(case.config(2, 1024)).unwrap();
    let seq = cache.create_sequence();
    let mut shadows = vec![Shadow::new(case.kv_heads, case.d); 2];
    let mut rng = Rng(0x5EED ^ (case.d * 31 + case.page_rows * 7 + case.q_heads) as u64);
    let mut m = Measured::default();
    step(&mut cache, seq, &mut shadows, case, 19, &mut rng, &mut m);
    step(&mut cache, seq, &mut shadows, case, 5, &mut rng, &mut m);
    for _ in 0..30 {
        step(&mut cache, seq, &mut shadows, case, 1, &mut rng, &mut m);
    }
    assert_eq!(cache.rows(seq, 1).unwrap(), 54);
    m
}

fn cases(storage: KvStorage, q_heads: usize, kv_heads: usize) -> Vec<Case> {
    let mut all = vec![];
    for d in [64, 128] {
        for page_rows in [1, 7, 16] {
            all.push(Case { storage, q_heads, kv_heads, d, page_rows, window: None, sinks: false });
        }
    }
    all
}

const F32_TOLERANCE: f64 = 1e-5;

#[test]
fn f32_pages_match_reference_gqa_2_to_1() {
    for case in cases(KvStorage::F32, 4, 2) {
        let m = run_case(case);
        assert!(m.exact_rel <= F32_TOLERANCE, "{case:?}: {m:?}");
    }
}

#[test]
fn f32_pages_match_reference_gqa_3_to_1() {
    for case in cases(KvStorage::F32, 6, 2) {
        let m = run_case(case);
        assert!(m.exact_rel <= F32_TOLERANCE, "{case:?}: {m:?}");
    }
}

/// f16 pages: equal to the reference on f16-rounded K/V to f32 accuracy, and within
/// `F16_TOLERANCE` (row-relative) of the exact reference.
const F16_TOLERANCE: f64 = 1e-3;

#[test]
fn f16_pages_within_tolerance() {
    let mut worst = Measured::default();
    for case in cases(KvStorage::F16, 4, 2).into_iter().chain(cases(KvStorage::F16, 6, 2)) {
        let m = run_case(case);
        assert!(m.stored_rel <= F32_TOLERANCE, "{case:?}: {m:?}");
        assert!(m.exact_rel <= F16_TOLERANCE, "{case:?}: {m:?}");
        worst = Measured {
            exact_rel: worst.exact_rel.max(m.exact_rel),
            exact_abs: worst.exact_abs.max(m.exact_abs),
            stored_rel: worst.stored_rel.max(m.stored_rel),
            attends: worst.attends + m.attends,
        };
    }
    println!("f16 pages: {worst:?}");
}

/// Int8 pages: equal to the reference on dequantised K/V (codes × scale) to f32 accuracy, and
/// within `INT8_TOLERANCE` (row-relative) of the exact reference.
const INT8_TOLERANCE: f64 = 2e-2;

#[test]
fn int8_pages_within_tolerance() {
    let mut worst = Measured::default();
    for case in cases(KvStorage::Int8, 4, 2).into_iter().chain(cases(KvStorage::Int8, 6, 2)) {
        let m = run_case(case);
        assert!(m.stored_rel <= F32_TOLERANCE, "{case:?}: {m:?}");
        assert!(m.exact_rel <= INT8_TOLERANCE, "{case:?}: {m:?}");
        worst = Measured {
            exact_rel: worst.exact_rel.max(m.exact_rel),
            exact_abs: worst.exact_abs.max(m.exact_abs),
            stored_rel: worst.stored_rel.max(m.stored_rel),
            attends: worst.attends + m.attends,
        };
    }
    println!("int8 pages: {worst:?}");
}

/// Sliding windows shorter than a page, a page long and longer than several pages: the prefill
/// block, the second block and the decode steps all cross window edges.
#[test]
fn sliding_windows_match_reference() {
    for window in [1, 5, 7, 13, 40] {
        for page_rows in [1, 7, 16] {
            let mut case = f32_case(page_rows);
            case.window = NonZeroUsize::new(window);
            let m = run_case(case);
            assert!(m.exact_rel < F32_TOLERANCE, "window {window}, pages of {page_rows}: {m:?}");
        }
    }
}

/// Sink logits per query head (gpt-oss) on f32 and int8 pages, with and without a window: the
/// reference's softmax with the sink in its denominator; a sink per KV head instead of per query
/// head is refused.
#[test]
fn sinks_match_reference() {
    for (storage, window) in [(KvStorage::F32, None), (KvStorage::F32, NonZeroUsize::new(7)), (KvStorage::Int8, None)] {
        for page_rows in [1, 7, 16] {
            let case = Case { storage, q_heads: 6, kv_heads: 2, d: 64, page_rows, window, sinks: true };
            let m = run_case(case);
            assert!(m.stored_rel < F32_TOLERANCE, "{case:?}: {m:?}");
        }
    }
    let case = f32_case(7);
    let mut cache = KvCache::new(case.config(1, 16)).unwrap();
    let s = cache.create_sequence();
    let (k, v) = (vec![0.5; case.kv_heads * case.d], vec![1.0; case.kv_heads * case.d]);
    cache.append(s, 0, &k, &v).unwrap();
    let (q, mut out) = (vec![0.1; case.q_heads * case.d], vec![0.0; case.q_heads * case.d]);
    let scoring = Scoring { sinks: Some(&SINKS[..case.kv_heads]), ..case.scoring() };
    let err = cache.attend(s, 0, &q, scoring, &mut out);
    assert!(matches!(err, Err(KvError::BadShape { tensor: "sinks", .. })), "{err:?}");
}

fn f32_case(page_rows: usize) -> Case {
    Case { storage: KvStorage::F32, q_heads: 4, kv_heads: 2, d: 64, page_rows, window: None, sinks: false }
}

#[test]
fn long_decode_copies_nothing_and_counts_its_traffic() {
    let case = f32_case(16);
    let layers = 2;
    let mut cache = KvCache::new(case.config(layers, 256)).unwrap();
    let seq = cache.create_sequence();
    let mut shadows = vec![Shadow::new(case.kv_heads, case.d); layers];
    let mut rng = Rng(7);
    let mut m = Measured::default();
    step(&mut cache, seq, &mut shadows, case, 12, &mut rng, &mut m);
    let mut read_rows = 12;
    for _ in 0..300 {
        step(&mut cache, seq, &mut shadows, case, 1, &mut rng, &mut m);
        read_rows += cache.rows(seq, 0).unwrap();
    }
    assert!(m.exact_rel <= F32_TOLERANCE, "{m:?}");
    let rows = 312;
    let row_bytes = 4 * case.d as u64;
    let stats = cache.sequence_stats(seq).unwrap();
    assert_eq!(stats.traffic.copied_bytes, 0);
    assert_eq!(stats.traffic.appended_bytes, layers as u64 * rows * case.kv_heads as u64 * 2 * row_bytes);
    assert_eq!(
        stats.traffic.attention_read_bytes,
        layers as u64 * read_rows as u64 * case.kv_heads as u64 * 2 * row_bytes
    );
    let pages = layers * case.kv_heads * (rows as usize).div_ceil(16);
    assert_eq!((stats.pages_in_use, stats.pages_shared), (pages, 0));
    let pool = cache.pool_stats();
    assert_eq!(pool.traffic, stats.traffic);
    assert_eq!((pool.pages_in_use, pool.pages_total, pool.sequences), (pages, 256, 1));
    assert_eq!(pool.page_bytes, 2 * 16 * 4 * case.d);
}

#[test]
fn shared_prefix_shares_pages_and_diverges_correctly() {
    // 23 rows over pages of 16: one full page and one partly filled page per layer and KV head.
    let case = f32_case(16);
    let layers = 2;
    let per_block = layers * case.kv_heads;
    let mut cache = KvCache::new(case.config(layers, 64)).unwrap();
    let a = cache.create_sequence();
    let mut shadow_a = vec![Shadow::new(case.kv_heads, case.d); layers];
    let mut rng = Rng(11);
    let mut m = Measured::default();
    step(&mut cache, a, &mut shadow_a, case, 23, &mut rng, &mut m);
    assert_eq!(cache.pool_stats().pages_in_use, 2 * per_block);

    let b = cache.fork(a).unwrap();
    let mut shadow_b = shadow_a.clone();
    assert_eq!(cache.pool_stats().pages_in_use, 2 * per_block, "a fork allocates no page");
    assert_eq!(cache.sequence_stats(b).unwrap().pages_shared, 2 * per_block);
    assert_eq!(cache.rows(b, 1).unwrap(), 23);

    // A writes first into the shared partial page: it copies that page alone (7 rows of K and V
    // per layer and KV head); B is then its only owner and writes in place.
    step(&mut cache, a, &mut shadow_a, case, 1, &mut rng, &mut m);
    let copied = (per_block * 2 * 7 * 4 * case.d) as u64;
    assert_eq!(cache.sequence_stats(a).unwrap().traffic.copied_bytes, copied);
    assert_eq!(cache.pool_stats().pages_in_use, 3 * per_block);
    step(&mut cache, b, &mut shadow_b, case, 1, &mut rng, &mut m);
    assert_eq!(cache.sequence_stats(b).unwrap().traffic.copied_bytes, 0);
    assert_eq!(cache.pool_stats().pages_in_use, 3 * per_block);
    let a_stats = cache.sequence_stats(a).unwrap();
    assert_eq!(
        (a_stats.pages_in_use, a_stats.pages_shared),
        (2 * per_block, per_block),
        "the full first page stays shared"
    );

    // Each continues on its own; each equals its own unshared reference (checked in `step`).
    for _ in 0..20 {
        step(&mut cache, a, &mut shadow_a, case, 1, &mut rng, &mut m);
        step(&mut cache, b, &mut shadow_b, case, 1, &mut rng, &mut m);
    }
    assert!(m.exact_rel <= F32_TOLERANCE, "{m:?}");
    assert_eq!(cache.pool_stats().traffic.copied_bytes, copied, "only the first divergent write copied");
    // 44 rows each: 3 pages per layer and KV head each, the first one shared.
    assert_eq!(cache.pool_stats().pages_in_use, 5 * per_block);

    // Dropping A keeps the shared page alive for B, whose results do not change.
    cache.drop_sequence(a).unwrap();
    assert_eq!(cache.pool_stats().pages_in_use, 3 * per_block);
    assert_eq!(cache.sequence_stats(b).unwrap().pages_shared, 0);
    step(&mut cache, b, &mut shadow_b, case, 1, &mut rng, &mut m);
    assert!(m.exact_rel <= F32_TOLERANCE, "{m:?}");
}

#[test]
fn fork_prefix_mid_page_shares_the_prefix_only() {
    let case =
        Case { storage: KvStorage::Int8, q_heads: 6, kv_heads: 2, d: 64, page_rows: 7, window: None, sinks: false };
    let mut cache = KvCache::new(case.config(1, 64)).unwrap();
    let a = cache.create_sequence();
    let mut shadow_a = vec![Shadow::new(case.kv_heads, case.d)];
    let mut rng = Rng(13);
    let mut m = Measured::default();
    step(&mut cache, a, &mut shadow_a, case, 30, &mut rng, &mut m);

    // The first 10 rows: one full page and 3 rows of the second, per KV head.
    let b = cache.fork_prefix(a, 10).unwrap();
    assert_eq!(cache.rows(b, 0).unwrap(), 10);
    assert_eq!(cache.sequence_stats(b).unwrap().pages_in_use, 2 * case.kv_heads);
    let mut shadow_b = vec![Shadow::new(case.kv_heads, case.d)];
    for h in 0..case.kv_heads {
        let s = &shadow_a[0];
        let range = 0..10 * case.d;
        shadow_b[0].k[h] = s.k[h][range.clone()].to_vec();
        shadow_b[0].v[h] = s.v[h][range.clone()].to_vec();
        shadow_b[0].k_stored[h] = s.k_stored[h][range.clone()].to_vec();
        shadow_b[0].v_stored[h] = s.v_stored[h][range].to_vec();
    }
    // B writes row 10 into the shared second page: 3 rows per KV head are copied.
    step(&mut cache, b, &mut shadow_b, case, 4, &mut rng, &mut m);
    let int8_row_bytes = case.d + 4;
    let copied = (case.kv_heads * 2 * 3 * int8_row_bytes) as u64;
    assert_eq!(cache.sequence_stats(b).unwrap().traffic.copied_bytes, copied);
    for _ in 0..10 {
        step(&mut cache, a, &mut shadow_a, case, 1, &mut rng, &mut m);
        step(&mut cache, b, &mut shadow_b, case, 1, &mut rng, &mut m);
    }
    assert!(m.stored_rel <= F32_TOLERANCE, "{m:?}");
    assert_eq!(cache.fork_prefix(a, 41), Err(KvError::PrefixBeyondHeld { seq: a, layer: 0, rows: 41, held_rows: 40 }));
}

/// Attention outputs of `seq` for a fixed query in every layer.
fn outputs(cache: &mut KvCache, seq: SeqId, case: Case, layers: usize) -> Vec<Vec<f32>> {
    let q = Rng(99).values(case.q_heads * case.d);
    (0..layers)
        .map(|layer| {
            let mut out = vec![0f32; q.len()];
            cache.attend(seq, layer, &q, case.scale(), &mut out).unwrap();
            out
        })
        .collect()
}

#[test]
fn pool_exhaustion_is_reported_to_its_sequence_and_spares_the_others() {
    let case = f32_case(7);
    let layers = 2;
    let per_block = layers * case.kv_heads;
    // A takes 3 blocks (20 rows), B takes 2 (10 rows); one block's worth of pages is left.
    let mut cache = KvCache::new(case.config(layers, 6 * per_block)).unwrap();
    let (a, b) = (cache.create_sequence(), cache.create_sequence());
    let mut shadow_a = vec![Shadow::new(case.kv_heads, case.d); layers];
    let mut shadow_b = shadow_a.clone();
    let mut rng = Rng(17);
    let mut m = Measured::default();
    step(&mut cache, a, &mut shadow_a, case, 20, &mut rng, &mut m);
    step(&mut cache, b, &mut shadow_b, case, 10, &mut rng, &mut m);
    let a_before = outputs(&mut cache, a, case, layers);
    let b_before = outputs(&mut cache, b, case, layers);

    // B asks for 12 more rows in layer 0: rows 10..22 need blocks 2 and 3, 4 pages; 4 are free.
    let block = |rng: &mut Rng, rows: usize| rng.values(case.kv_heads * rows * case.d);
    let (k, v) = (block(&mut rng, 12), block(&mut rng, 12));
    cache.append(b, 0, &k, &v).unwrap();
    // Layer 1 needs the same 4 pages, and none is left.
    let err = cache.append(b, 1, &k, &v).unwrap_err();
    assert_eq!(err, KvError::PoolExhausted { seq: b, layer: 1, rows: 12, pages_needed: 4, pages_free: 0 });
    assert_eq!(err.to_string(), format!("{b}, layer 1: KV pool exhausted appending 12 rows: 4 pages needed, 0 free"));
    // The failed call changed nothing for B, and A is untouched, bit for bit.
    assert_eq!(cache.rows(b, 1).unwrap(), 10);
    assert_eq!(outputs(&mut cache, b, case, layers)[1], b_before[1]);
    assert_eq!(outputs(&mut cache, a, case, layers), a_before);
    // A's next row still fits in its last page (20 rows of 21); its 22nd row needs a page.
    step(&mut cache, a, &mut shadow_a, case, 1, &mut rng, &mut m);
    let (k1, v1) = (block(&mut rng, 1), block(&mut rng, 1));
    assert_eq!(
        cache.append(a, 0, &k1, &v1),
        Err(KvError::PoolExhausted { seq: a, layer: 0, rows: 1, pages_needed: 2, pages_free: 0 })
    );
    // Dropping B returns its pages, and A goes on.
    cache.drop_sequence(b).unwrap();
    step(&mut cache, a, &mut shadow_a, case, 1, &mut rng, &mut m);
    assert!(m.exact_rel <= F32_TOLERANCE, "{m:?}");
}

#[test]
fn dropping_sequences_returns_their_pages() {
    let case = f32_case(16);
    let mut cache = KvCache::new(case.config(3, 64)).unwrap();
    let a = cache.create_sequence();
    let (k, v) = (Rng(1).values(case.kv_heads * 40 * case.d), Rng(2).values(case.kv_heads * 40 * case.d));
    for layer in 0..3 {
        cache.append(a, layer, &k, &v).unwrap();
    }
    let b = cache.fork(a).unwrap();
    let c = cache.fork_prefix(b, 16).unwrap();
    let pages = 3 * case.kv_heads * 3;
    assert_eq!(cache.pool_stats().pages_in_use, pages);
    cache.drop_sequence(a).unwrap();
    cache.drop_sequence(b).unwrap();
    assert_eq!(cache.pool_stats().pages_in_use, 3 * case.kv_heads, "C keeps the first block alive");
    assert_eq!(cache.pool_stats().sequences, 1);
    cache.drop_sequence(c).unwrap();
    let pool = cache.pool_stats();
    assert_eq!((pool.pages_in_use, pool.sequences), (0, 0));
    // Dropped ids stay invalid, also once their slot is reused.
    assert_eq!(cache.drop_sequence(a), Err(KvError::UnknownSequence { seq: a }));
    let d = cache.create_sequence();
    assert_ne!(d, c);
    assert_eq!(cache.rows(c, 0), Err(KvError::UnknownSequence { seq: c }));
    // The whole pool is usable again: 32 blocks of 16 rows, 2 KV heads, fill its 64 pages.
    let all = Rng(3).values(case.kv_heads * 32 * 16 * case.d);
    cache.append(d, 0, &all, &all).unwrap();
    assert_eq!(cache.pool_stats().pages_in_use, 64);
    let one = &all[..case.kv_heads * case.d];
    assert_eq!(
        cache.append(d, 1, one, one),
        Err(KvError::PoolExhausted { seq: d, layer: 1, rows: 1, pages_needed: 2, pages_free: 0 })
    );
}

#[test]
fn bad_calls_are_errors_that_change_nothing() {
    let case = f32_case(16);
    let mut cache = KvCache::new(case.config(2, 8)).unwrap();
    let s = cache.create_sequence();
    let row = vec![0.5f32; case.kv_heads * case.d];
    assert_eq!(cache.append(s, 2, &row, &row), Err(KvError::LayerOutOfRange { seq: s, layer: 2, layers: 2 }));
    assert!(matches!(
        cache.append(s, 0, &row[1..], &row[1..]),
        Err(KvError::BadShape { tensor: "k_new", len: 127, .. })
    ));
    assert!(matches!(cache.append(s, 0, &row, &row[..64]), Err(KvError::BadShape { tensor: "v_new", len: 64, .. })));
    let mut out = vec![0f32; case.q_heads * case.d];
    let q = vec![0.1f32; case.q_heads * case.d];
    assert_eq!(
        cache.attend(s, 0, &q, 0.125, &mut out),
        Err(KvError::QueryBeyondHeld { seq: s, layer: 0, query_rows: 1, held_rows: 0 })
    );
    cache.append(s, 0, &row, &row).unwrap();
    assert!(matches!(cache.attend(s, 0, &q, 0.125, &mut out[1..]), Err(KvError::BadShape { tensor: "out", .. })));
    assert!(matches!(cache.attend(s, 0, &q[..100], 0.125, &mut out), Err(KvError::BadShape { tensor: "q", .. })));
    assert_eq!(cache.rows(s, 0).unwrap(), 1);
    cache.attend(s, 0, &q, 0.125, &mut out).unwrap();
    // One row: attention returns its V row.
    assert!(out.iter().all(|&x| x == 0.5));
    assert!(matches!(
        KvCache::new(KvCacheConfig::new(1, 6, 4, 64, 8)),
        Err(KvError::Config(msg)) if msg.contains("not a multiple")
    ));
    assert!(matches!(KvCache::new(case.config(1, 8).with_page_rows(0)), Err(KvError::Config(_))));
}

#[test]
fn decoding_does_not_allocate() {
    for storage in [KvStorage::F32, KvStorage::F16, KvStorage::Int8] {
        let case = Case { storage, q_heads: 6, kv_heads: 2, d: 128, page_rows: 16, window: None, sinks: false };
        let layers = 2;
        let mut cache = KvCache::new(case.config(layers, 512).with_reserved_rows(512)).unwrap();
        let seq = cache.create_sequence();
        let mut rng = Rng(23);
        let prompt = rng.values(case.kv_heads * 10 * case.d);
        let q_prompt = rng.values(case.q_heads * 10 * case.d);
        let mut out_prompt = vec![0f32; q_prompt.len()];
        for layer in 0..layers {
            cache.append(seq, layer, &prompt, &prompt).unwrap();
            cache.attend(seq, layer, &q_prompt, case.scale(), &mut out_prompt).unwrap();
        }
        let (k, v, q) =
            (rng.values(case.kv_heads * case.d), rng.values(case.kv_heads * case.d), rng.values(case.q_heads * case.d));
        let mut out = vec![0f32; q.len()];
        let mut worker_scratch = cache.new_scratch();
        let probe = allocations();
        drop(std::hint::black_box(Vec::<u8>::with_capacity(1)));
        assert_eq!(allocations() - probe, 1, "the counting allocator counts");
        let before = allocations();
        for _ in 0..200 {
            for layer in 0..layers {
                cache.append(seq, layer, &k, &v).unwrap();
                cache.attend(seq, layer, &q, case.scale(), &mut out).unwrap();
                cache.attend_with(seq, layer, &q, case.scale(), &mut out, &mut worker_scratch).unwrap();
            }
        }
        assert_eq!(allocations() - before, 0, "{storage:?}");
        assert_eq!(cache.rows(seq, 1).unwrap(), 210);
    }
}

#[test]
fn workers_attend_in_parallel_with_their_own_scratch() {
    let case =
        Case { storage: KvStorage::F16, q_heads: 6, kv_heads: 2, d: 64, page_rows: 7, window: None, sinks: false };
    let mut cache = KvCache::new(case.config(1, 256)).unwrap();
    let mut rng = Rng(29);
    let seqs: Vec<SeqId> = (0..4).map(|_| cache.create_sequence()).collect();
    for (i, &s) in seqs.iter().enumerate() {
        let rows = 5 + 9 * i;
        let (k, v) = (rng.values(case.kv_heads * rows * case.d), rng.values(case.kv_heads * rows * case.d));
        cache.append(s, 0, &k, &v).unwrap();
    }
    let q = rng.values(case.q_heads * case.d);
    let serial: Vec<Vec<f32>> = seqs
        .iter()
        .map(|&s| {
            let mut out = vec![0f32; q.len()];
            cache.attend(s, 0, &q, case.scale(), &mut out).unwrap();
            out
        })
        .collect();
    let cache = &cache;
    let parallel: Vec<Vec<f32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = seqs
            .iter()
            .map(|&s| {
                let q = &q;
                scope.spawn(move || {
                    let mut scratch = cache.new_scratch();
                    let mut out = vec![0f32; q.len()];
                    cache.attend_with(s, 0, q, case.scale(), &mut out, &mut scratch).unwrap();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(parallel, serial);
}

/// Attending KV heads in parts (as workers do for a prefill block) writes exactly what one call
/// over every head writes, bit for bit.
#[test]
fn attending_heads_in_parts_equals_one_call() {
    let case = Case {
        storage: KvStorage::F16,
        q_heads: 6,
        kv_heads: 3,
        d: 64,
        page_rows: 7,
        window: NonZeroUsize::new(9),
        sinks: true,
    };
    let mut cache = KvCache::new(case.config(1, 64)).unwrap();
    let s = cache.create_sequence();
    let mut rng = Rng(91);
    let tokens = 13;
    let (k, v) = (rng.values(case.kv_heads * tokens * case.d), rng.values(case.kv_heads * tokens * case.d));
    cache.append(s, 0, &k, &v).unwrap();
    let q = rng.values(case.q_heads * tokens * case.d);
    let mut whole = vec![0f32; q.len()];
    cache.attend(s, 0, &q, case.scoring(), &mut whole).unwrap();
    let mut parts = vec![0f32; q.len()];
    let per_head = q.len() / case.kv_heads;
    let mut scratch = cache.new_scratch();
    for heads in [0..1, 1..3] {
        let out = &mut parts[heads.start * per_head..heads.end * per_head];
        cache.attend_heads(s, 0, &q, case.scoring(), heads, out, &mut scratch).unwrap();
    }
    assert_eq!(whole, parts);
    let err = cache.attend_heads(s, 0, &q, case.scoring(), 1..3, &mut parts[..per_head], &mut scratch);
    assert!(matches!(err, Err(KvError::BadShape { tensor: "out", .. })), "{err:?}");
}

#[test]
fn block_queries_see_keys_up_to_their_own_position() {
    // One head, D = 1, pages of 2 rows; zero queries give uniform weights over what each sees.
    let config = KvCacheConfig::new(1, 1, 1, 1, 4).with_page_rows(2);
    let mut cache = KvCache::new(config).unwrap();
    let s = cache.create_sequence();
    cache.append(s, 0, &[1.0], &[0.0]).unwrap();
    cache.append(s, 0, &[1.0, 1.0, 1.0], &[3.0, 6.0, 9.0]).unwrap();
    let mut out = [0f32; 3];
    cache.attend(s, 0, &[0.0; 3], 1.0, &mut out).unwrap();
    assert_eq!(out, [1.5, 3.0, 4.5]);
}

/// Appends the same rows to `seq` in every layer: `rows` rows from `data` starting at row `from`.
fn append_rows(cache: &mut KvCache, seq: SeqId, case: Case, data: &[(Vec<f32>, Vec<f32>)], from: usize, rows: usize) {
    let width = case.kv_heads * case.d;
    for (layer, (k, v)) in data.iter().enumerate() {
        // `data` is [rows, kv_heads, d]; append wants [kv_heads, rows, d].
        let pick = |src: &[f32]| -> Vec<f32> {
            let mut out = Vec::with_capacity(rows * width);
            for h in 0..case.kv_heads {
                for r in from..from + rows {
                    out.extend_from_slice(&src[r * width + h * case.d..][..case.d]);
                }
            }
            out
        };
        cache.append(seq, layer, &pick(k), &pick(v)).unwrap();
    }
}

#[test]
fn truncated_rows_free_their_pages_copy_nothing_and_leave_what_a_cache_without_them_holds() {
    let case =
        Case { storage: KvStorage::Int8, q_heads: 4, kv_heads: 2, d: 64, page_rows: 7, window: None, sinks: false };
    let layers = 2;
    let mut rng = Rng(21);
    let data: Vec<(Vec<f32>, Vec<f32>)> = (0..layers)
        .map(|_| (rng.values(20 * case.kv_heads * case.d), rng.values(20 * case.kv_heads * case.d)))
        .collect();
    let mut cache = KvCache::new(case.config(layers, 64)).unwrap();
    // `a` verifies 6 drafted rows after 10 and accepts 2; `b` only ever sees the accepted 12.
    let (a, b) = (cache.create_sequence(), cache.create_sequence());
    append_rows(&mut cache, a, case, &data, 0, 10);
    let rejected = vec![(rng.values(6 * 2 * 64), rng.values(6 * 2 * 64)); layers];
    let drafts: Vec<(Vec<f32>, Vec<f32>)> = data
        .iter()
        .zip(&rejected)
        .map(|((k, v), (rk, rv))| {
            let w = case.kv_heads * case.d;
            let mix = |good: &[f32], bad: &[f32]| [&good[10 * w..12 * w], &bad[2 * w..6 * w]].concat();
            (mix(k, rk), mix(v, rv))
        })
        .collect();
    append_rows(&mut cache, a, case, &drafts, 0, 6);
    assert_eq!(cache.sequence_stats(a).unwrap().pages_in_use, layers * 3 * case.kv_heads);
    cache.truncate(a, 12).unwrap();
    append_rows(&mut cache, b, case, &data, 0, 12);

    // The rejected rows' block is released and nothing was copied; the counters say how much was
    // given up: 4 rows of K and V per KV head and layer.
    let stats = cache.sequence_stats(a).unwrap();
    assert_eq!(stats.pages_in_use, layers * 2 * case.kv_heads);
    assert_eq!(stats.traffic.copied_bytes, 0);
    let int8_row_bytes = (case.d + 4) as u64;
    assert_eq!(stats.traffic.truncated_bytes, layers as u64 * 4 * case.kv_heads as u64 * 2 * int8_row_bytes);
    assert_eq!(cache.pool_stats().pages_in_use, 2 * layers * 2 * case.kv_heads);

    // Both go on with the same rows and attend identically, bit for bit.
    append_rows(&mut cache, a, case, &data, 12, 8);
    append_rows(&mut cache, b, case, &data, 12, 8);
    assert_eq!(cache.rows(a, 1).unwrap(), 20);
    assert!(outputs(&mut cache, a, case, layers) == outputs(&mut cache, b, case, layers));

    // Truncating past what is held is refused and changes nothing.
    let error = cache.truncate(a, 21).unwrap_err();
    assert_eq!(error, KvError::TruncateBeyondHeld { seq: a, layer: 0, rows: 21, held_rows: 20 });
    assert_eq!(cache.rows(a, 0).unwrap(), 20);
}

/// Outputs of every attend of a run on the `isa` path: per layer, a block of 19 rows, one of 5,
/// then 30 single steps, with the same data whatever the path.
fn run_on(isa: Isa, case: Case) -> Vec<Vec<f32>> {
    let mut cache = KvCache::new(case.config(2, 1024).with_isa(isa)).unwrap();
    let seq = cache.create_sequence();
    let mut rng = Rng(0xA77E ^ (case.d * 13 + case.page_rows) as u64);
    let mut outs = Vec::new();
    for tokens in [19, 5].into_iter().chain([1; 30]) {
        for layer in 0..2 {
            let (k, v) = (rng.values(case.kv_heads * tokens * case.d), rng.values(case.kv_heads * tokens * case.d));
            let q = rng.values(case.q_heads * tokens * case.d);
            cache.append(seq, layer, &k, &v).unwrap();
            let mut out = vec![0f32; q.len()];
            cache.attend(seq, layer, &q, case.scoring(), &mut out).unwrap();
            outs.push(out);
        }
    }
    outs
}

/// Head dims with and without a vector tail, page sizes with partial pages, windows, GQA 3:1,
/// every storage type: each SIMD path within 2e-6 (relative to the row's largest output) of the
/// scalar path, which sums and exponentiates in another order.
#[test]
fn every_isa_path_attends_as_the_scalar_path_does() {
    let mut worst = 0f64;
    for storage in [KvStorage::F32, KvStorage::F16, KvStorage::Int8] {
        for (d, page_rows, window) in
            [(64, 16, None), (128, 7, None), (24, 16, Some(9)), (64, 5, Some(3)), (13, 16, None), (128, 64, Some(20))]
        {
            let window = window.and_then(NonZeroUsize::new);
            let case = Case { storage, q_heads: 6, kv_heads: 2, d, page_rows, window, sinks: d == 24 };
            let want = run_on(Isa::Scalar, case);
            for isa in Isa::ALL.into_iter().filter(|i| *i != Isa::Scalar && i.is_available()) {
                for (got, want) in run_on(isa, case).iter().zip(&want) {
                    let err = row_relative_error(got, want, d);
                    worst = worst.max(err);
                    assert!(err <= 2e-6, "{isa} {case:?}: {err:e} from the scalar path");
                }
            }
        }
    }
    eprintln!("SIMD attention within {worst:.2e} of the scalar path");
}

/// On every path and storage a query row's output does not depend on the other rows of its call:
/// a block of S rows gives each row the bits a single step at its position gives (int8 pages are
/// widened once for a block's many rows and read in place by a single step: the same bits).
#[test]
fn on_every_isa_path_a_block_row_equals_a_single_step_bit_for_bit() {
    let storages = [KvStorage::F32, KvStorage::F16, KvStorage::Int8];
    for (isa, storage) in Isa::ALL.into_iter().filter(|i| i.is_available()).flat_map(|i| storages.map(|s| (i, s))) {
        for (d, page_rows, window) in [(64, 16, None), (24, 7, Some(6))] {
            let window = window.and_then(NonZeroUsize::new);
            let case = Case { storage, q_heads: 6, kv_heads: 2, d, page_rows, window, sinks: d == 24 };
            let mut cache = KvCache::new(case.config(1, 256).with_isa(isa)).unwrap();
            let (block, single) = (cache.create_sequence(), cache.create_sequence());
            let mut rng = Rng(77);
            let (tokens, width) = (23, case.kv_heads * d);
            let (k, v) = (rng.values(tokens * width), rng.values(tokens * width));
            let q = rng.values(tokens * case.q_heads * d);
            let heads_major = |src: &[f32], heads: usize, from: usize, rows: usize| -> Vec<f32> {
                let per_row = heads * d;
                (0..heads)
                    .flat_map(|h| (from..from + rows).flat_map(move |r| (0..d).map(move |i| (r, h, i))))
                    .map(|(r, h, i)| src[r * per_row + h * d + i])
                    .collect()
            };
            cache.append(block, 0, &heads_major(&k, 2, 0, tokens), &heads_major(&v, 2, 0, tokens)).unwrap();
            let mut out = vec![0f32; q.len()];
            cache.attend(block, 0, &heads_major(&q, case.q_heads, 0, tokens), case.scoring(), &mut out).unwrap();
            for t in 0..tokens {
                cache.append(single, 0, &heads_major(&k, 2, t, 1), &heads_major(&v, 2, t, 1)).unwrap();
                let mut one = vec![0f32; case.q_heads * d];
                cache.attend(single, 0, &heads_major(&q, case.q_heads, t, 1), case.scoring(), &mut one).unwrap();
                for h in 0..case.q_heads {
                    let got = &out[(h * tokens + t) * d..][..d];
                    assert!(got == &one[h * d..(h + 1) * d], "{isa} {case:?}: row {t} of head {h} differs");
                }
            }
        }
    }
}
