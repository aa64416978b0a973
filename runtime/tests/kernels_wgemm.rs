//! WGemm (MatMulNBits) kernels against the reference evaluator, on every path this CPU runs.
//!
//! Tolerances: the exact path within `(K + 8)·ε·Σₖ |s|·(|q| + |z|)·|a|` (+ ε·|bias|) of the
//! reference (which dequantises each weight in f32 and accumulates in f64); the int8-activation
//! path within `Σ_blocks (max|a| / 254)·Σₖ |(q − z)·s|` plus twice that f32 term, and
//! bit-identical to its scalar path.

mod kernel_support;

use ir::{Attr, Domain};
use kernel_support::*;
use proptest::prelude::*;
use runtime::kernels::wgemm::{
    pack_wgemm, quantize_rows, wgemm, wgemm_quantized, MatMulNBits, NBitsZeroPoints, QuantizedRows, WGemmPrecision,
    WGemmScratch,
};
use runtime::kernels::{Isa, ThreadPool};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Zp {
    Default,
    Packed,
    Float,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    bits: usize,
    block: usize,
    zp: Zp,
    bias: bool,
    seed: u64,
}

struct Data {
    a: Vec<f32>,
    b: Vec<u8>,
    scales: Vec<f32>,
    zp_packed: Vec<u8>,
    zp_float: Vec<f32>,
    bias: Vec<f32>,
}

impl Case {
    fn blocks(&self) -> usize {
        self.k.div_ceil(self.block)
    }
    fn blob(&self) -> usize {
        self.block * self.bits / 8
    }
    fn zp_row_bytes(&self) -> usize {
        (self.blocks() * self.bits).div_ceil(8)
    }

    fn data(&self) -> Data {
        let mut rng = kernel_support::Rng::new(self.seed);
        let blocks = self.blocks();
        let scales = (0..self.n * blocks)
            .map(|_| if rng.below(8) == 0 { -rng.f32(0.001, 0.05) } else { rng.f32(0.001, 0.05) })
            .collect();
        Data {
            a: rng.f32s(self.m * self.k, -2.0, 2.0),
            b: rng.bytes(self.n * blocks * self.blob()),
            scales,
            zp_packed: rng.bytes(self.n * self.zp_row_bytes()),
            zp_float: rng.f32s(self.n * blocks, 0.0, (1 << self.bits) as f32 - 1.0),
            bias: rng.f32s(self.n, -1.0, 1.0),
        }
    }

    fn source<'a>(&self, d: &'a Data) -> MatMulNBits<'a> {
        MatMulNBits {
            k: self.k,
            n: self.n,
            bits: self.bits,
            block_size: self.block,
            b: &d.b,
            scales: &d.scales,
            zero_points: match self.zp {
                Zp::Default => NBitsZeroPoints::Default,
                Zp::Packed => NBitsZeroPoints::Packed(&d.zp_packed),
                Zp::Float => NBitsZeroPoints::Float(&d.zp_float),
            },
        }
    }

    fn code(&self, d: &Data, col: usize, k: usize) -> f32 {
        let (blk, within) = (k / self.block, k % self.block);
        let bit = within * self.bits;
        let byte = d.b[(col * self.blocks() + blk) * self.blob() + bit / 8];
        ((byte >> (bit % 8)) as u32 & ((1 << self.bits) - 1)) as f32
    }

    fn zero(&self, d: &Data, col: usize, blk: usize) -> f32 {
        match self.zp {
            Zp::Default => (1 << (self.bits - 1)) as f32,
            Zp::Packed => {
                let bit = blk * self.bits;
                let byte = d.zp_packed[col * self.zp_row_bytes() + bit / 8];
                ((byte >> (bit % 8)) as u32 & ((1 << self.bits) - 1)) as f32
            }
            Zp::Float => d.zp_float[col * self.blocks() + blk],
        }
    }

    fn reference(&self, d: &Data) -> Vec<f32> {
        let at = attrs(&[
            ("K", Attr::Int(self.k as i64)),
            ("N", Attr::Int(self.n as i64)),
            ("bits", Attr::Int(self.bits as i64)),
            ("block_size", Attr::Int(self.block as i64)),
        ]);
        let a = f32t(&[self.m, self.k], &d.a);
        let b = u8t(&[self.n, self.blocks(), self.blob()], &d.b);
        let s = f32t(&[self.n * self.blocks()], &d.scales);
        let zp = match self.zp {
            Zp::Default => None,
            Zp::Packed => Some(u8t(&[self.n * self.zp_row_bytes()], &d.zp_packed)),
            Zp::Float => Some(f32t(&[self.n * self.blocks()], &d.zp_float)),
        };
        let bias = self.bias.then(|| f32t(&[self.n], &d.bias));
        // MatMulNBits itself: WGemm's optional bias is MatMulNBits' input 5 (input 4 is g_idx).
        let y = reference(
            Domain::Microsoft,
            "MatMulNBits",
            &at,
            &[Some(&a), Some(&b), Some(&s), zp.as_ref(), None, bias.as_ref()],
            1,
        );
        f32s(&y[0])
    }

    /// Per-output tolerances of the exact and the int8-activation paths.
    fn tolerances(&self, d: &Data) -> (Vec<f32>, Vec<f32>) {
        let eps = f32::EPSILON as f64;
        let mut exact = vec![0f32; self.m * self.n];
        let mut int8 = vec![0f32; self.m * self.n];
        for r in 0..self.m {
            let row = &d.a[r * self.k..(r + 1) * self.k];
            for col in 0..self.n {
                let (mut mag, mut quant) = (0f64, 0f64);
                for blk in 0..self.blocks() {
                    let (lo, hi) = (blk * self.block, ((blk + 1) * self.block).min(self.k));
                    let s = d.scales[col * self.blocks() + blk] as f64;
                    let z = self.zero(d, col, blk) as f64;
                    let amax = row[lo..hi].iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
                    for (kk, &x) in row[lo..hi].iter().enumerate() {
                        let q = self.code(d, col, lo + kk) as f64;
                        mag += s.abs() * (q + z.abs()) * (x.abs() as f64);
                        quant += amax / 254.0 * ((q - z) * s).abs();
                    }
                }
                let bias = if self.bias { d.bias[col].abs() as f64 * eps } else { 0.0 };
                let e = (self.k as f64 + 8.0) * eps * mag + bias + 1e-30;
                exact[r * self.n + col] = e as f32;
                int8[r * self.n + col] = (quant * 1.0001 + 2.0 * e) as f32;
            }
        }
        (exact, int8)
    }
}

fn check(case: Case, pools: &[ThreadPool], isas: &[Isa]) {
    let d = case.data();
    let packed = pack_wgemm(&case.source(&d)).expect("pack");
    let w = packed.weights();
    let want = case.reference(&d);
    let (exact_tol, int8_tol) = case.tolerances(&d);
    let bias = case.bias.then_some(&d.bias[..]);
    let mut scratch = WGemmScratch::default();
    let mut scalar_int8 = vec![0f32; case.m * case.n];
    wgemm(
        Isa::Scalar,
        &pools[0],
        &w,
        &d.a,
        case.m,
        bias,
        &mut scalar_int8,
        WGemmPrecision::Int8Activations,
        &mut scratch,
    );
    for &isa in isas {
        for pool in pools {
            let what = |p: &str| format!("{case:?} {isa} {p} threads {}", pool.threads());
            let mut y = vec![f32::NAN; case.m * case.n];
            wgemm(isa, pool, &w, &d.a, case.m, bias, &mut y, WGemmPrecision::Exact, &mut scratch);
            assert_within(&what("exact"), &y, &want, |i| exact_tol[i]);
            let mut y = vec![f32::NAN; case.m * case.n];
            wgemm(isa, pool, &w, &d.a, case.m, bias, &mut y, WGemmPrecision::Int8Activations, &mut scratch);
            assert_within(&what("int8"), &y, &want, |i| int8_tol[i]);
            assert_bits(&what("int8 vs scalar"), &y, &scalar_int8);
        }
    }
}

#[test]
fn awkward_shapes_match_the_reference_on_every_path() {
    let isas = isas("wgemm awkward shapes");
    let pools = pools();
    let mut seed = 1;
    for &(m, k, n) in &[(1, 80, 17), (3, 200, 33), (17, 35, 1), (1, 576, 48), (3, 592, 31), (17, 96, 50)] {
        for (bits, block) in [(4, 32), (8, 32), (4, 16), (4, 64), (8, 16)] {
            for zp in [Zp::Default, Zp::Packed, Zp::Float] {
                seed += 1;
                let case = Case { m, k, n, bits, block, zp, bias: seed % 2 == 0, seed };
                check(case, &pools, &isas);
            }
        }
    }
}

#[test]
fn int8_activations_lose_well_under_one_percent_on_random_data() {
    let case = Case { m: 4, k: 576, n: 64, bits: 4, block: 32, zp: Zp::Float, bias: false, seed: 7 };
    let d = case.data();
    let w = pack_wgemm(&case.source(&d)).unwrap();
    let want = case.reference(&d);
    let mut y = vec![0f32; case.m * case.n];
    let pool = ThreadPool::new(1);
    wgemm(
        Isa::detect(),
        &pool,
        &w.weights(),
        &d.a,
        case.m,
        None,
        &mut y,
        WGemmPrecision::Int8Activations,
        &mut WGemmScratch::default(),
    );
    let err: f64 = y.iter().zip(&want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
    let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>().sqrt();
    println!("int8-activation relative RMS error on random data: {:.3}%", 100.0 * err / norm);
    assert!(err / norm < 0.01, "relative error {}", err / norm);
}

#[test]
fn prequantised_rows_serve_several_weights() {
    let pool = ThreadPool::new(2);
    let isa = Isa::detect();
    let c1 = Case { m: 2, k: 96, n: 40, bits: 4, block: 32, zp: Zp::Packed, bias: false, seed: 11 };
    let c2 = Case { n: 24, bits: 8, zp: Zp::Default, seed: 12, ..c1 };
    let d1 = c1.data();
    let mut d2 = c2.data();
    d2.a = d1.a.clone();
    let mut q = QuantizedRows::default();
    quantize_rows(&d1.a, 2, 96, 32, &mut q);
    for (c, d) in [(c1, &d1), (c2, &d2)] {
        let w = pack_wgemm(&c.source(d)).unwrap();
        let mut direct = vec![0f32; c.m * c.n];
        wgemm(
            isa,
            &pool,
            &w.weights(),
            &d.a,
            c.m,
            None,
            &mut direct,
            WGemmPrecision::Int8Activations,
            &mut WGemmScratch::default(),
        );
        let mut shared = vec![0f32; c.m * c.n];
        wgemm_quantized(isa, &pool, &w.weights(), &q, None, &mut shared);
        assert_bits("shared quantisation", &shared, &direct);
    }
}

#[test]
fn a_view_of_whole_panels_computes_those_columns_of_the_full_product() {
    // Four "experts" of 32 columns stacked along N, as QMoE stores them; the last view ends at
    // N = 136, inside a panel.
    let pool = ThreadPool::new(2);
    let isa = Isa::detect();
    for zp in [Zp::Default, Zp::Packed, Zp::Float] {
        let case = Case { m: 3, k: 96, n: 136, bits: 4, block: 32, zp, bias: false, seed: 21 };
        let d = case.data();
        let packed = pack_wgemm(&case.source(&d)).unwrap();
        let w = packed.weights();
        for precision in [WGemmPrecision::Exact, WGemmPrecision::Int8Activations] {
            let mut full = vec![0f32; case.m * case.n];
            wgemm(isa, &pool, &w, &d.a, case.m, None, &mut full, precision, &mut WGemmScratch::default());
            for cols in [0..32, 32..64, 96..136, 16..48] {
                let view = w.columns(cols.clone());
                assert_eq!(view.n(), cols.len());
                let mut part = vec![f32::NAN; case.m * cols.len()];
                wgemm(isa, &pool, &view, &d.a, case.m, None, &mut part, precision, &mut WGemmScratch::default());
                let want: Vec<f32> = (0..case.m).flat_map(|r| full[r * case.n..][cols.clone()].to_vec()).collect();
                assert_bits(&format!("{zp:?} {precision:?} columns {cols:?}"), &part, &want);
            }
        }
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        1usize..20,
        1usize..300,
        1usize..60,
        prop_oneof![Just(4usize), Just(8usize)],
        prop_oneof![Just(16usize), Just(32usize), Just(64usize)],
        0u8..3,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(m, k, n, bits, block, zp, bias, seed)| Case {
            m,
            k,
            n,
            bits,
            block,
            zp: [Zp::Default, Zp::Packed, Zp::Float][zp as usize],
            bias,
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_match_the_reference_on_every_path(case in case_strategy()) {
        let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
        check(case, &[ThreadPool::new(1), ThreadPool::new(2)], &isas);
    }
}

/// A block of rows gives every row the bits of a call on that row alone, on every path and in
/// both precisions (speculative verify blocks and single decode steps must agree bit for bit).
#[test]
fn each_row_of_a_block_has_the_bits_of_a_single_row_call() {
    let pool = ThreadPool::new(2);
    for isa in isas("wgemm row independence") {
        for bits in [4, 8] {
            let case = Case { m: 11, k: 160, n: 48, bits, block: 32, zp: Zp::Float, bias: true, seed: 31 };
            let d = case.data();
            let packed = pack_wgemm(&case.source(&d)).unwrap();
            for precision in [WGemmPrecision::Exact, WGemmPrecision::Int8Activations] {
                let mut block = vec![0f32; case.m * case.n];
                let mut scratch = WGemmScratch::default();
                wgemm(isa, &pool, &packed.weights(), &d.a, case.m, Some(&d.bias), &mut block, precision, &mut scratch);
                for r in 0..case.m {
                    let mut one = vec![0f32; case.n];
                    let a = &d.a[r * case.k..][..case.k];
                    wgemm(isa, &pool, &packed.weights(), a, 1, Some(&d.bias), &mut one, precision, &mut scratch);
                    assert_bits(
                        &format!("{isa} {bits}-bit {precision:?} row {r}"),
                        &one,
                        &block[r * case.n..][..case.n],
                    );
                }
            }
        }
    }
}
