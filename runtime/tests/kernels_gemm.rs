//! f32 GEMM/GEMV kernels, both weight layouts, against the reference evaluator's MatMul (+ Add)
//! on every path this CPU runs. Tolerance: `K·ε·Σₖ |a·w| + ε·|bias|` per output (the reference
//! accumulates in f64).

mod kernel_support;

use ir::Domain;
use kernel_support::*;
use proptest::prelude::*;
use runtime::kernels::gemm::{gemm_f32, WeightLayout};
use runtime::kernels::{Isa, ThreadPool};

#[allow(clippy::too_many_arguments)]
fn check(
    m: usize,
    k: usize,
    n: usize,
    layout: WeightLayout,
    with_bias: bool,
    seed: u64,
    pools: &[ThreadPool],
    isas: &[Isa],
) {
    let mut rng = kernel_support::Rng::new(seed);
    let a = rng.f32s(m * k, -1.0, 1.0);
    let w = rng.f32s(k * n, -1.0, 1.0);
    let bias = rng.f32s(n, -1.0, 1.0);
    // The reference multiplies by W as [K, N].
    let w_kn: Vec<f32> = match layout {
        WeightLayout::KN => w.clone(),
        WeightLayout::NK => (0..k * n).map(|i| w[(i % n) * k + i / n]).collect(),
    };
    let y = reference(
        Domain::Onnx,
        "MatMul",
        &Default::default(),
        &[Some(&f32t(&[m, k], &a)), Some(&f32t(&[k, n], &w_kn))],
        1,
    );
    let mut want = f32s(&y[0]);
    let mut tol = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let mag: f64 = (0..k).map(|kk| (a[r * k + kk] * w_kn[kk * n + c]).abs() as f64).sum();
            let i = r * n + c;
            if with_bias {
                want[i] += bias[c];
            }
            tol[i] = ((k as f64 + 2.0) * f32::EPSILON as f64 * (mag + bias[c].abs() as f64)) as f32 + 1e-30;
        }
    }
    let b = with_bias.then_some(&bias[..]);
    for &isa in isas {
        for pool in pools {
            let mut got = vec![f32::NAN; m * n];
            gemm_f32(isa, pool, &a, m, k, &w, n, layout, b, &mut got);
            assert_within(
                &format!("{m}x{k}x{n} {layout:?} bias {with_bias} {isa} threads {}", pool.threads()),
                &got,
                &want,
                |i| tol[i],
            );
        }
    }
}

#[test]
fn awkward_shapes_match_the_reference_on_every_path() {
    let isas = isas("gemm awkward shapes");
    let pools = pools();
    let mut seed = 500;
    for &(m, k, n) in
        &[(1, 1, 1), (1, 80, 17), (3, 200, 33), (17, 35, 70), (1, 576, 129), (5, 17, 200), (1, 96, 900), (1, 64, 2100)]
    {
        for layout in [WeightLayout::KN, WeightLayout::NK] {
            for bias in [false, true] {
                seed += 1;
                check(m, k, n, layout, bias, seed, &pools, &isas);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_match_the_reference_on_every_path(
        m in 1usize..20,
        k in 1usize..300,
        n in 1usize..150,
        nk in any::<bool>(),
        bias in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = if nk { WeightLayout::NK } else { WeightLayout::KN };
        let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
        check(m, k, n, layout, bias, seed, &[ThreadPool::new(1), ThreadPool::new(2)], &isas);
    }
}

/// A single row (the decode path) gives bit for bit the first row of the same product computed
/// with two rows: every path accumulates each output over k in one order.
#[test]
fn one_row_equals_the_first_row_of_two() {
    let isas = isas("gemm one row");
    let (k, n) = (96, 1000);
    let mut rng = kernel_support::Rng::new(77);
    let a = rng.f32s(2 * k, -1.0, 1.0);
    let w = rng.f32s(k * n, -1.0, 1.0);
    let bias = rng.f32s(n, -1.0, 1.0);
    for &isa in &isas {
        for pool in pools() {
            let mut two = vec![0.0; 2 * n];
            gemm_f32(isa, &pool, &a, 2, k, &w, n, WeightLayout::KN, Some(&bias), &mut two);
            let mut one = vec![0.0; n];
            gemm_f32(isa, &pool, &a[..k], 1, k, &w, n, WeightLayout::KN, Some(&bias), &mut one);
            assert!(one == two[..n], "{isa} threads {}", pool.threads());
        }
    }
}
