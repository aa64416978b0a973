//! Decode-GEMV benchmark (M = 1) of the host kernels on SmolLM2-135M and Qwen3-0.6B shapes, with
//! 1 and 2 threads, next to a memory-bandwidth probe.
//!
//! `cargo bench -p runtime --bench kernels [-- --quick] [--isa scalar|avx2|avx512|avx512-vnni] [--filter TEXT]`
//!
//! Two regimes per shape: "hot" calls the same matrix again and again (it sits in L2/L3), and
//! "stream" cycles through enough copies of it to exceed the last-level cache several times, as
//! a decode step does with a model larger than the cache. GB/s counts the packed weight bytes
//! read (codes, scales, zero points); tok/s-eq is streaming calls per second. The per-model lines
//! sum the streaming time of every matrix of one token (all layers plus lm_head): bytes per token
//! over that time is the achieved decode bandwidth, to set against the probe.
//!
//! `--filter attention` (or a run without a filter) also times paged decode attention on the
//! Qwen3-4B shape (36 layers, 32/8 heads, head 128): one token's query against every layer's
//! cache at contexts 128, 1,024 and 4,096, f32 and int8 pages, one thread, with the KV bytes read
//! per second and the time per token against the 128-token context's.
//!
//! `--filter norm` (or no filter) times RmsNorm rows of the models' hidden sizes.
//!
//! `--filter gate` (or no filter) times the xdna program's gate on the host: `QuantizeSwiGlu`
//! (the integer gate and its exact two-pass quantisation) beside what it replaced, the f32
//! SwiGlu then a two-pass `QuantizeRows`, on rows of the models' intermediate sizes.

use runtime::kernels::gemm::{gemm_f32, WeightLayout};
use runtime::kernels::norm::rms_norm;
use runtime::kernels::qgemm::{pack_qgemm, qgemm, PackedQGemm, QActivations, QGemmScratch, QOutput, QWeightCodes};
use runtime::kernels::quantize::{quantize_gate_rows, quantize_rows, quantize_rows_residual};
use runtime::kernels::swiglu::swiglu;
use runtime::kernels::wgemm::{
    pack_wgemm, wgemm, MatMulNBits, NBitsZeroPoints, PackedWGemm, WGemmPrecision, WGemmScratch,
};
use runtime::kernels::{Isa, ThreadPool};
use runtime::kvcache::{KvCache, KvCacheConfig, KvStorage, DEFAULT_PAGE_ROWS};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Bytes the streaming regime cycles through (well above a 32 MiB L3).
const STREAM_BYTES: usize = 160 << 20;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

#[derive(Clone, Copy)]
enum Zp {
    Default,
    Packed,
    Float,
}

#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    k: usize,
    n: usize,
    bits: usize,
    zp: Zp,
    /// How many times one token uses this shape.
    per_token: usize,
}

fn pack(s: &Shape, seed: u64) -> PackedWGemm {
    let mut rng = Rng(seed | 1);
    let blocks = s.k.div_ceil(32);
    let b: Vec<u8> = (0..s.n * blocks * 32 * s.bits / 8).map(|_| rng.next() as u8).collect();
    let scales: Vec<f32> = (0..s.n * blocks).map(|_| 0.01 + 0.01 * rng.f32()).collect();
    let zp_u8: Vec<u8> = (0..s.n * (blocks * s.bits).div_ceil(8)).map(|_| rng.next() as u8).collect();
    let zp_f32: Vec<f32> = (0..s.n * blocks).map(|_| 8.0 + 4.0 * rng.f32()).collect();
    let zero_points = match s.zp {
        Zp::Default => NBitsZeroPoints::Default,
        Zp::Packed => NBitsZeroPoints::Packed(&zp_u8),
        Zp::Float => NBitsZeroPoints::Float(&zp_f32),
    };
    pack_wgemm(&MatMulNBits { k: s.k, n: s.n, bits: s.bits, block_size: 32, b: &b, scales: &scales, zero_points })
        .expect("pack")
}

/// Median seconds per call of `f` over `batches` batches lasting about `batch` each.
fn time_per_call(mut f: impl FnMut(), batch: Duration, batches: usize) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < batch / 4 {
        f();
        calls += 1;
    }
    let per_batch = ((calls as f64) * 4.0).max(3.0) as u64;
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed().as_secs_f64() / per_batch as f64
        })
        .collect();
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    samples[batches / 2]
}

fn bandwidth_probe(pools: &[ThreadPool], quick: bool) {
    let len = if quick { 128 << 20 } else { 512 << 20 };
    let src: Vec<u64> = (0..len / 8).map(|i| i as u64).collect();
    let mut dst = vec![0u64; len / 8];
    let batch = Duration::from_millis(if quick { 300 } else { 800 });
    println!("memory bandwidth probe ({} MiB buffers)", len >> 20);
    for pool in pools {
        let t = pool.threads();
        let chunks = t * 4;
        let read = time_per_call(
            || {
                let sums: Vec<std::sync::atomic::AtomicU64> = (0..chunks).map(|_| Default::default()).collect();
                pool.run(chunks, &|c| {
                    let part = &src[c * src.len() / chunks..(c + 1) * src.len() / chunks];
                    sums[c].store(read_sum(part), std::sync::atomic::Ordering::Relaxed);
                });
                black_box(&sums);
            },
            batch,
            5,
        );
        let dst_ptr = dst.as_mut_ptr() as usize;
        let copy = time_per_call(
            || {
                pool.run(chunks, &|c| {
                    let r = c * src.len() / chunks..(c + 1) * src.len() / chunks;
                    // SAFETY: chunks are disjoint ranges of dst.
                    let d = unsafe { std::slice::from_raw_parts_mut((dst_ptr as *mut u64).add(r.start), r.len()) };
                    d.copy_from_slice(&src[r]);
                });
                black_box(&dst);
            },
            batch,
            5,
        );
        println!(
            "  threads {t}: read {:6.1} GB/s   memcpy {:6.1} GB/s (read + write bytes)",
            len as f64 / read / 1e9,
            2.0 * len as f64 / copy / 1e9
        );
    }
}

fn read_sum(v: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = v.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().chain(rest).fold(0, |a, &b| a.wrapping_add(b))
}

/// Times `call(i)` on copy 0 ("hot") and cycling through all copies ("stream").
fn hot_and_stream(copies: usize, quick: bool, mut call: impl FnMut(usize)) -> (f64, f64) {
    let batch = Duration::from_millis(if quick { 60 } else { 250 });
    let hot = time_per_call(|| call(0), batch, 5);
    let mut next = 0;
    let stream = time_per_call(
        || {
            call(next);
            next = (next + 1) % copies;
        },
        batch,
        5,
    );
    (hot, stream)
}

fn copies_for(bytes: usize, quick: bool) -> usize {
    let c = (STREAM_BYTES / bytes).clamp(2, 512);
    if quick {
        c.min(48)
    } else {
        c
    }
}

fn line(name: &str, shape: String, bytes: usize, hot: f64, stream: f64) {
    println!(
        "  {name:<24} {shape:<22} {:>9.1} KiB | hot {:>8.1} us {:>6.1} GB/s | stream {:>8.1} us {:>6.1} GB/s {:>8.0} tok/s-eq",
        bytes as f64 / 1024.0,
        hot * 1e6,
        bytes as f64 / hot / 1e9,
        stream * 1e6,
        bytes as f64 / stream / 1e9,
        1.0 / stream
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let isa =
        value("--isa").and_then(|name| Isa::ALL.into_iter().find(|i| i.name() == name)).unwrap_or_else(Isa::detect);
    let filter = value("--filter");
    assert!(isa.is_available(), "{isa} is not available here");
    println!("kernel path: {isa} (best on this CPU: {}), {} mode", Isa::detect(), if quick { "quick" } else { "full" });
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    if filter.is_none() {
        bandwidth_probe(&pools, quick);
        parallelism_probe(&pools);
    }

    let runs = [
        (WGemmPrecision::Int8Activations, 0usize),
        (WGemmPrecision::Int8Activations, 1),
        (WGemmPrecision::Exact, 0),
        (WGemmPrecision::Exact, 1),
    ];
    for (model, shapes) in [("SmolLM2-135M", &smollm2_shapes()[..]), ("Qwen3-0.6B", &qwen3_shapes()[..])] {
        let shapes: Vec<&Shape> =
            shapes.iter().filter(|s| filter.as_ref().is_none_or(|f| s.name.contains(f.as_str()))).collect();
        if !shapes.is_empty() {
            decode_gemvs(isa, &pools, quick, model, &shapes, &runs);
        }
    }

    if filter.is_none() {
        other_kernels(isa, &pools, quick);
    }
    if filter.as_ref().is_none_or(|f| "attention".contains(f.as_str())) {
        decode_attention(isa, quick);
    }
    if filter.as_ref().is_none_or(|f| "norm".contains(f.as_str())) {
        norms(isa, quick);
    }
    if filter.as_ref().is_none_or(|f| "gate".contains(f.as_str())) {
        gates(isa, quick);
    }
}

/// The gate and its two-pass quantisation on rows of the models' intermediate sizes, one row
/// and 128, one thread: `QuantizeSwiGlu`'s kernel against SwiGlu then `QuantizeRows{passes=2}`.
fn gates(isa: Isa, quick: bool) {
    println!("\nGate and its quantisation (two passes), 1 thread");
    println!("{:<18} {:>6} {:>16} {:>16} {:>7}", "intermediate", "rows", "integer µs/call", "f32 µs/call", "ratio");
    let mut rng = Rng(13);
    let batch = Duration::from_millis(if quick { 50 } else { 200 });
    for (name, d) in [("SmolLM2", 1536usize), ("Qwen3-0.6B", 3072)] {
        for rows in [1usize, 128] {
            let g: Vec<f32> = (0..rows * d).map(|_| 4.0 * rng.f32()).collect();
            let u: Vec<f32> = (0..rows * d).map(|_| 2.0 * rng.f32()).collect();
            let (mut codes, mut scales, mut y) = (vec![0u8; 2 * g.len()], vec![0f32; 2 * rows], vec![0f32; g.len()]);
            let integer = time_per_call(
                || quantize_gate_rows(isa, (black_box(&g), &u), d, true, &mut codes, &mut scales),
                batch,
                7,
            );
            let float = time_per_call(
                || {
                    swiglu(isa, black_box(&g), &u, &mut y);
                    let (first, residual) = codes.split_at_mut(g.len());
                    let (s0, s1) = scales.split_at_mut(rows);
                    quantize_rows(&y, d, first, s0);
                    quantize_rows_residual(&y, d, (&*first, &*s0), residual, s1);
                },
                batch,
                7,
            );
            let (a, b) = (integer * 1e6, float * 1e6);
            println!("{:<18} {rows:>6} {a:>16.2} {b:>16.2} {:>7.2}", format!("{name} {d}"), a / b);
        }
    }
}

/// RmsNorm rows of the models' hidden sizes, one row (a decode step) and 128 (prefill), one
/// thread.
fn norms(isa: Isa, quick: bool) {
    println!("\nRmsNorm, 1 thread");
    println!("{:<16} {:>6} {:>12} {:>12}", "hidden", "rows", "µs/call", "ns/value");
    let mut rng = Rng(11);
    for (name, d) in [("SmolLM2", 576usize), ("Qwen3-0.6B", 1024), ("Qwen3-4B", 2560)] {
        for rows in [1usize, 128] {
            let x: Vec<f32> = (0..rows * d).map(|_| rng.f32()).collect();
            let gamma: Vec<f32> = (0..d).map(|_| rng.f32()).collect();
            let mut y = vec![0f32; x.len()];
            let t = time_per_call(
                || rms_norm(isa, black_box(&x), &gamma, 1e-5, &mut y),
                Duration::from_millis(if quick { 50 } else { 200 }),
                7,
            );
            println!("{:<16} {rows:>6} {:>12.3} {:>12.3}", format!("{name} {d}"), t * 1e6, t * 1e9 / x.len() as f64);
        }
    }
}

/// Decode attention of the Qwen3-4B shape over every layer's cache, per context and storage.
fn decode_attention(isa: Isa, quick: bool) {
    let (layers, q_heads, kv_heads, d) = (36, 32, 8, 128);
    println!("\nDecode attention, Qwen3-4B shape ({layers} layers, {q_heads}/{kv_heads} heads, head {d}), 1 thread");
    println!("{:<8} {:>8} {:>12} {:>9} {:>12}", "pages", "context", "µs/token", "GB/s", "vs ctx 128");
    let mut rng = Rng(7);
    for storage in [KvStorage::F32, KvStorage::Int8] {
        let mut base = None;
        for context in [128usize, 1024, 4096] {
            let pages = layers * kv_heads * context.div_ceil(DEFAULT_PAGE_ROWS);
            let config = KvCacheConfig::new(layers, q_heads, kv_heads, d, pages).with_storage(storage).with_isa(isa);
            let mut cache = KvCache::new(config).expect("cache");
            let seq = cache.create_sequence();
            let kv: Vec<f32> = (0..kv_heads * context * d).map(|_| rng.f32()).collect();
            for layer in 0..layers {
                cache.append(seq, layer, &kv, &kv).expect("append");
            }
            let q: Vec<f32> = (0..q_heads * d).map(|_| rng.f32()).collect();
            let (mut out, mut scratch) = (vec![0f32; q.len()], cache.new_scratch());
            let mut token = || {
                for layer in 0..layers {
                    cache.attend_with(seq, layer, &q, 0.088, &mut out, &mut scratch).expect("attend");
                }
                black_box(&out);
            };
            let t = time_per_call(&mut token, Duration::from_millis(if quick { 100 } else { 400 }), 5);
            let bytes = layers * kv_heads * context * 2 * storage.row_bytes(d);
            let base = *base.get_or_insert(t);
            let name = format!("{storage:?}");
            println!("{name:<8} {context:>8} {:>12.1} {:>9.1} {:>11.2}x", t * 1e6, bytes as f64 / t / 1e9, t / base);
        }
    }
}

/// How much a second thread speeds up pure arithmetic right now: on shared cores, other work
/// may hold the second core, and the 2-thread numbers below must be read with this in mind.
fn parallelism_probe(pools: &[ThreadPool]) {
    let work = |i: usize| {
        let mut x = i as u64 | 1;
        for _ in 0..200_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        }
        black_box(x);
    };
    let t: Vec<f64> =
        pools.iter().map(|p| time_per_call(|| p.run(64, &|i| work(i)), Duration::from_millis(300), 5)).collect();
    println!("parallelism probe: a compute-bound job runs {:.2}x faster on 2 threads than on 1", t[0] / t[1]);
}

/// QGemm and f32 GEMV on SmolLM2 shapes, for comparison.
fn other_kernels(isa: Isa, pools: &[ThreadPool], quick: bool) {
    let mut rng = Rng(99);
    println!("\nQGemm int8 decode GEMV (M = 1, u8 activations, per-column scales)");
    for (name, k, n) in [("smollm2 gate/up", 576usize, 1536usize), ("smollm2 down", 1536, 576)] {
        let w: Vec<i8> = (0..k * n).map(|_| rng.next() as i8).collect();
        let first = pack_qgemm(k, n, QWeightCodes::I8(&w), &vec![0.01; n], &vec![0; n]).unwrap();
        let copies: Vec<PackedQGemm> = (0..copies_for(first.bytes(), quick)).map(|_| first.clone()).collect();
        let a: Vec<u8> = (0..k).map(|_| rng.next() as u8).collect();
        let mut y = vec![0f32; n];
        let mut scratch = QGemmScratch::default();
        for pool in pools {
            let (hot, stream) = hot_and_stream(copies.len(), quick, |c| {
                qgemm(isa, pool, &copies[c], QActivations::U8(&a), 1, 0.02, 128, QOutput::F32(&mut y), &mut scratch)
            });
            line(&format!("{name} t{}", pool.threads()), format!("{k}x{n} int8"), first.bytes(), hot, stream);
        }
    }
    println!("\nWGemm prefill GEMM (M = 128), smollm2 gate/up 576x1536 4-bit");
    let shape = Shape { name: "prefill", k: 576, n: 1536, bits: 4, zp: Zp::Float, per_token: 0 };
    let w = pack(&shape, 5);
    let m = 128;
    let a: Vec<f32> = (0..m * shape.k).map(|_| rng.f32()).collect();
    let mut y = vec![0f32; m * shape.n];
    let mut scratch = WGemmScratch::default();
    for precision in [WGemmPrecision::Int8Activations, WGemmPrecision::Exact] {
        for pool in pools {
            let t = time_per_call(
                || wgemm(isa, pool, &w.weights(), &a, m, None, &mut y, precision, &mut scratch),
                Duration::from_millis(if quick { 100 } else { 300 }),
                5,
            );
            let macs = (m * shape.k * shape.n) as f64;
            println!(
                "  {precision:?} threads {}: {:.1} us, {:.1} GMAC/s, {:.0} tokens/s",
                pool.threads(),
                t * 1e6,
                macs / t / 1e9,
                m as f64 / t
            );
        }
    }

    println!("\nf32 decode GEMV (M = 1; float models)");
    for (name, k, n, layout) in [
        ("smollm2 gate/up [K,N]", 576usize, 1536usize, WeightLayout::KN),
        ("smollm2 lm_head [N,K]", 576, 49152, WeightLayout::NK),
    ] {
        let bytes = 4 * k * n;
        let copies: Vec<Vec<f32>> =
            (0..copies_for(bytes, quick).min(8)).map(|_| (0..k * n).map(|_| rng.f32()).collect()).collect();
        let a: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; n];
        for pool in pools {
            let (hot, stream) = hot_and_stream(copies.len(), quick, |c| {
                gemm_f32(isa, pool, &a, 1, k, &copies[c], n, layout, None, &mut y)
            });
            line(&format!("{name} t{}", pool.threads()), format!("{k}x{n} f32"), bytes, hot, stream);
        }
    }
}

/// SmolLM2-135M (30 layers) as the builder writes it in int4: symmetric blocks of 32, q|k|v
/// packed, a 4-bit lm_head.
fn smollm2_shapes() -> [Shape; 5] {
    [
        Shape { name: "smollm2 q|k|v", k: 576, n: 960, bits: 4, zp: Zp::Default, per_token: 30 },
        Shape { name: "smollm2 o", k: 576, n: 576, bits: 4, zp: Zp::Default, per_token: 30 },
        Shape { name: "smollm2 gate/up", k: 576, n: 1536, bits: 4, zp: Zp::Default, per_token: 60 },
        Shape { name: "smollm2 down", k: 1536, n: 576, bits: 4, zp: Zp::Default, per_token: 30 },
        Shape { name: "smollm2 lm_head", k: 576, n: 49152, bits: 4, zp: Zp::Default, per_token: 1 },
    ]
}

/// Qwen3-0.6B (28 layers; int4 with uint8 zero points; tied lm_head at 4 bits).
fn qwen3_shapes() -> [Shape; 6] {
    [
        Shape { name: "qwen3 q", k: 1024, n: 2048, bits: 4, zp: Zp::Packed, per_token: 28 },
        Shape { name: "qwen3 k/v", k: 1024, n: 1024, bits: 4, zp: Zp::Packed, per_token: 56 },
        Shape { name: "qwen3 o", k: 2048, n: 1024, bits: 4, zp: Zp::Packed, per_token: 28 },
        Shape { name: "qwen3 gate/up", k: 1024, n: 3072, bits: 4, zp: Zp::Packed, per_token: 56 },
        Shape { name: "qwen3 down", k: 3072, n: 1024, bits: 4, zp: Zp::Packed, per_token: 28 },
        Shape { name: "qwen3 lm_head q4", k: 1024, n: 151936, bits: 4, zp: Zp::Packed, per_token: 1 },
    ]
}

/// One model's decode GEMVs (M = 1) under every (precision, pool) of `runs`: each shape hot and
/// streamed from memory, and the per-token total.
fn decode_gemvs(
    isa: Isa,
    pools: &[ThreadPool; 2],
    quick: bool,
    model: &str,
    shapes: &[&Shape],
    runs: &[(WGemmPrecision, usize); 4],
) {
    // stream seconds and bytes per token, per run.
    let mut totals = [(0.0f64, 0usize); 4];
    let mut lines = vec![String::new(); 4];
    for s in shapes {
        let first = pack(s, 42);
        let bytes = first.weights().bytes();
        let mut mats = vec![first];
        for i in 1..copies_for(bytes, quick) {
            let mut m = mats[0].clone();
            m.codes[0] = i as u8;
            mats.push(m);
        }
        let weights: Vec<_> = mats.iter().map(|m| m.weights()).collect();
        let mut rng = Rng(7);
        let a: Vec<f32> = (0..s.k).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; s.n];
        let mut scratch = WGemmScratch::default();
        for (i, &(precision, pool)) in runs.iter().enumerate() {
            let pool = &pools[pool];
            let (hot, stream) = hot_and_stream(weights.len(), quick, |c| {
                wgemm(isa, pool, &weights[c], &a, 1, None, &mut y, precision, &mut scratch)
            });
            black_box(&y);
            totals[i].0 += stream * s.per_token as f64;
            totals[i].1 += bytes * s.per_token;
            lines[i].push_str(&format!(
                "  {:<20} {:>5}x{:<6} {}-bit {:>8.1} KiB | hot {:>7.1} us {:>5.1} GB/s | stream {:>7.1} us {:>5.1} GB/s {:>8.0} tok/s-eq\n",
                s.name,
                s.k,
                s.n,
                s.bits,
                bytes as f64 / 1024.0,
                hot * 1e6,
                bytes as f64 / hot / 1e9,
                stream * 1e6,
                bytes as f64 / stream / 1e9,
                1.0 / stream
            ));
        }
    }
    for (i, &(precision, pool)) in runs.iter().enumerate() {
        println!("\n{model} WGemm decode GEMV (M = 1), {precision:?}, threads {}", pools[pool].threads());
        print!("{}", lines[i]);
        let (secs, bytes) = totals[i];
        if shapes.len() > 1 {
            println!(
                "  => per token: {:.1} MB of weights, {:.2} ms in GEMVs, {:.1} GB/s, {:.0} tok/s (GEMVs only)",
                bytes as f64 / 1e6,
                secs * 1e3,
                bytes as f64 / secs / 1e9,
                1.0 / secs
            );
        }
    }
}
