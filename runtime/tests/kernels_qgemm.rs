//! QGemm kernels against the reference evaluator on every path this CPU runs: outputs must be
//! exactly equal (f32 bit for bit, requantised codes identical).

mod kernel_support;

use ir::{DType, Domain, Tensor};
use kernel_support::*;
use proptest::prelude::*;
use runtime::kernels::qgemm::{
    pack_qgemm, qgemm, qgemm_scaled, AScale, FirstRows, QActivations, QGemmScratch, QOutput, QWeightCodes, PANEL,
};
use runtime::kernels::{Isa, ThreadPool};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Out {
    F32,
    U8,
    I8,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    a_signed: bool,
    w_signed: bool,
    per_column: bool,
    out: Out,
    seed: u64,
}

struct Data {
    a: Vec<u8>,
    a_zero: i32,
    a_scale: f32,
    w: Vec<u8>,
    w_zero: Vec<i32>,
    w_scale: Vec<f32>,
    y_scale: f32,
    y_zero: i32,
}

/// A byte as a code of the given signedness.
fn code(b: u8, signed: bool) -> i64 {
    if signed {
        b as i8 as i64
    } else {
        b as i64
    }
}

impl Case {
    fn data(&self) -> Data {
        let mut rng = kernel_support::Rng::new(self.seed);
        let params = if self.per_column { self.n } else { 1 };
        let zero = |rng: &mut kernel_support::Rng, signed: bool| code(rng.next_u64() as u8, signed) as i32;
        Data {
            a: rng.bytes(self.m * self.k),
            a_zero: zero(&mut rng, self.a_signed),
            a_scale: rng.f32(0.001, 0.1),
            w: rng.bytes(self.k * self.n),
            w_zero: (0..params).map(|_| zero(&mut rng, self.w_signed)).collect(),
            w_scale: (0..params).map(|_| rng.f32(0.0001, 0.01)).collect(),
            y_scale: rng.f32(0.5, 20.0),
            y_zero: zero(&mut rng, self.out == Out::I8),
        }
    }

    fn reference(&self, d: &Data) -> Tensor {
        let (adt, wdt) =
            (if self.a_signed { DType::I8 } else { DType::U8 }, if self.w_signed { DType::I8 } else { DType::U8 });
        let a = Tensor::from_i64(adt, vec![self.m, self.k], d.a.iter().map(|&b| code(b, self.a_signed)).collect());
        let za = Tensor::from_i64(adt, vec![], vec![d.a_zero as i64]);
        let sa = Tensor::scalar_f32(d.a_scale);
        let w = Tensor::from_i64(wdt, vec![self.k, self.n], d.w.iter().map(|&b| code(b, self.w_signed)).collect());
        let pshape = if self.per_column { vec![self.n] } else { vec![] };
        let sw = Tensor::from_f32(DType::F32, pshape.clone(), d.w_scale.clone());
        let zw = Tensor::from_i64(wdt, pshape, d.w_zero.iter().map(|&z| z as i64).collect());
        let sy = Tensor::scalar_f32(d.y_scale);
        let zy = match self.out {
            Out::F32 => None,
            Out::U8 => Some(Tensor::from_i64(DType::U8, vec![], vec![d.y_zero as i64])),
            Out::I8 => Some(Tensor::from_i64(DType::I8, vec![], vec![d.y_zero as i64])),
        };
        let mut inputs = vec![Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)];
        if let Some(z) = &zy {
            inputs.push(Some(&sy));
            inputs.push(Some(z));
        }
        reference(Domain::Npuc, "QGemm", &Default::default(), &inputs, 1).remove(0)
    }
}

fn check(case: Case, pools: &[ThreadPool], isas: &[Isa]) {
    let d = case.data();
    let signed_w: Vec<i8> = d.w.iter().map(|&b| b as i8).collect();
    let codes = if case.w_signed { QWeightCodes::I8(&signed_w) } else { QWeightCodes::U8(&d.w) };
    let packed = pack_qgemm(case.k, case.n, codes, &d.w_scale, &d.w_zero).expect("pack");
    let want = case.reference(&d);
    let signed_a: Vec<i8> = d.a.iter().map(|&b| b as i8).collect();
    let a = if case.a_signed { QActivations::I8(&signed_a) } else { QActivations::U8(&d.a) };
    let mut scratch = QGemmScratch::default();
    for &isa in isas {
        for pool in pools {
            let what = format!("{case:?} {isa} threads {}", pool.threads());
            let len = case.m * case.n;
            match case.out {
                Out::F32 => {
                    let mut y = vec![f32::NAN; len];
                    qgemm(isa, pool, &packed, a, case.m, d.a_scale, d.a_zero, QOutput::F32(&mut y), &mut scratch);
                    assert_bits(&what, &y, want.as_f32().unwrap());
                }
                Out::U8 => {
                    let mut y = vec![0u8; len];
                    let out = QOutput::U8 { y: &mut y, scale: d.y_scale, zero_point: d.y_zero };
                    qgemm(isa, pool, &packed, a, case.m, d.a_scale, d.a_zero, out, &mut scratch);
                    let got: Vec<i64> = y.iter().map(|&v| v as i64).collect();
                    assert_eq!(got, want.as_i64().unwrap(), "{what}");
                }
                Out::I8 => {
                    let mut y = vec![0i8; len];
                    let out = QOutput::I8 { y: &mut y, scale: d.y_scale, zero_point: d.y_zero };
                    qgemm(isa, pool, &packed, a, case.m, d.a_scale, d.a_zero, out, &mut scratch);
                    let got: Vec<i64> = y.iter().map(|&v| v as i64).collect();
                    assert_eq!(got, want.as_i64().unwrap(), "{what}");
                }
            }
        }
    }
}

/// Activations quantised per row (`npuc::QuantizeRows` → `QGemm` with a scale per row, what an
/// `xdna` program runs): bit for bit the reference evaluator's QGemm with sₐ of shape [M, 1].
#[test]
fn per_row_activation_scales_are_exact_on_every_path() {
    let isas = isas("qgemm per-row scales");
    let pools = pools();
    for (seed, &(m, k, n)) in [(1, 80, 17), (3, 200, 33), (17, 130, 20), (9, 576, 48)].iter().enumerate() {
        let case =
            Case { m, k, n, a_signed: true, w_signed: true, per_column: true, out: Out::F32, seed: 900 + seed as u64 };
        let d = case.data();
        let mut rng = kernel_support::Rng::new(7 + seed as u64);
        let rows: Vec<f32> = (0..m).map(|_| rng.f32(0.001, 0.1)).collect();
        let signed_w: Vec<i8> = d.w.iter().map(|&b| b as i8).collect();
        let packed = pack_qgemm(k, n, QWeightCodes::I8(&signed_w), &d.w_scale, &d.w_zero).expect("pack");
        let a = Tensor::from_i64(DType::I8, vec![m, k], d.a.iter().map(|&b| b as i8 as i64).collect());
        let sa = Tensor::from_f32(DType::F32, vec![m, 1], rows.clone());
        let za = Tensor::from_i64(DType::I8, vec![], vec![0]);
        let w = Tensor::from_i64(DType::I8, vec![k, n], signed_w.iter().map(|&v| v as i64).collect());
        let sw = Tensor::from_f32(DType::F32, vec![n], d.w_scale.clone());
        let zw = Tensor::from_i64(DType::I8, vec![n], d.w_zero.iter().map(|&z| z as i64).collect());
        let inputs = [Some(&a), Some(&sa), Some(&za), Some(&w), Some(&sw), Some(&zw)];
        let want = reference(Domain::Npuc, "QGemm", &Default::default(), &inputs, 1).remove(0);
        let signed_a: Vec<i8> = d.a.iter().map(|&b| b as i8).collect();
        let mut scratch = QGemmScratch::default();
        for &isa in &isas {
            for pool in &pools {
                let mut y = vec![f32::NAN; m * n];
                let (acts, out) = (QActivations::I8(&signed_a), QOutput::F32(&mut y));
                qgemm_scaled(isa, pool, &packed, acts, m, AScale::Rows(&rows), 0, out, None, &mut scratch);
                assert_bits(&format!("{m}×{k}×{n} {isa} threads {}", pool.threads()), &y, want.as_f32().unwrap());
            }
        }
    }
}

/// Columns of a weight's residual pass need the first rows only: those rows, and every row of
/// the columns before it, are the full call's bit for bit; the rest of those columns is left
/// untouched.
#[test]
fn first_rows_compute_the_first_rows_of_the_columns_they_name() {
    let (m, k, n, from, rows) = (6, 96, 3 * PANEL + 5, 2 * PANEL, 3);
    let case = Case { m, k, n, a_signed: true, w_signed: true, per_column: true, out: Out::F32, seed: 77 };
    let d = case.data();
    let signed_w: Vec<i8> = d.w.iter().map(|&b| b as i8).collect();
    let packed = pack_qgemm(k, n, QWeightCodes::I8(&signed_w), &d.w_scale, &d.w_zero).expect("pack");
    let signed_a: Vec<i8> = d.a.iter().map(|&b| b as i8).collect();
    let scales: Vec<f32> = (0..m).map(|r| 0.01 * (r + 1) as f32).collect();
    let mut scratch = QGemmScratch::default();
    for &isa in &isas("qgemm first rows") {
        for pool in &pools() {
            let mut run = |first_rows| {
                let mut y = vec![f32::NAN; m * n];
                let (acts, out) = (QActivations::I8(&signed_a), QOutput::F32(&mut y));
                qgemm_scaled(isa, pool, &packed, acts, m, AScale::Rows(&scales), 0, out, first_rows, &mut scratch);
                y
            };
            let (full, part) = (run(None), run(Some(FirstRows { from, rows })));
            for (i, (f, p)) in full.iter().zip(&part).enumerate() {
                let (r, c) = (i / n, i % n);
                if r < rows || c < from {
                    assert_eq!(f.to_bits(), p.to_bits(), "{isa}: row {r} column {c}");
                } else {
                    assert!(p.is_nan(), "{isa}: row {r} column {c} was computed");
                }
            }
        }
    }
}

#[test]
fn awkward_shapes_are_exact_on_every_path() {
    let isas = isas("qgemm awkward shapes");
    let pools = pools();
    let mut seed = 100;
    for &(m, k, n) in &[(1, 1, 1), (1, 80, 17), (3, 200, 33), (17, 5, 31), (1, 577, 48), (17, 130, 20)] {
        for (a_signed, w_signed) in [(false, true), (true, true), (false, false), (true, false)] {
            for per_column in [false, true] {
                for out in [Out::F32, Out::U8, Out::I8] {
                    seed += 1;
                    check(Case { m, k, n, a_signed, w_signed, per_column, out, seed }, &pools, &isas);
                }
            }
        }
    }
}

#[test]
fn extreme_codes_and_zero_points_stay_exact() {
    // Every activation 255 (zero point 0) against weights −128 (zero point 127): the largest
    // magnitudes the int32 accumulators meet, at K = 4096.
    let (m, k, n) = (2, 4096, 20);
    let a = vec![255u8; m * k];
    let w = vec![-128i8; k * n];
    let packed = pack_qgemm(k, n, QWeightCodes::I8(&w), &[1.0], &[127]).unwrap();
    let want = -(255.0 * 255.0 * k as f64) as f32;
    for isa in isas("qgemm extreme codes") {
        let mut y = vec![0f32; m * n];
        qgemm(
            isa,
            &ThreadPool::new(2),
            &packed,
            QActivations::U8(&a),
            m,
            1.0,
            0,
            QOutput::F32(&mut y),
            &mut QGemmScratch::default(),
        );
        assert!(y.iter().all(|&v| v == want), "{isa}: {:?} != {want}", &y[..4]);
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (1usize..20, 1usize..300, 1usize..60, any::<bool>(), any::<bool>(), any::<bool>(), 0u8..3, any::<u64>()).prop_map(
        |(m, k, n, a_signed, w_signed, per_column, out, seed)| Case {
            m,
            k,
            n,
            a_signed,
            w_signed,
            per_column,
            out: [Out::F32, Out::U8, Out::I8][out as usize],
            seed,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_are_exact_on_every_path(case in case_strategy()) {
        let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
        check(case, &[ThreadPool::new(1), ThreadPool::new(2)], &isas);
    }
}
