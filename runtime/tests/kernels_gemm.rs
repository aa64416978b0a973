//! f32 GEMM/GEMV kernels, both weight layouts, against the reference evaluator's MatMul (+ Add)
//! on every path this CPU runs. Tolerance: `K·ε·Σₖ |a·w| + ε·|bias|` per output (the reference
//! accumulates in f64).

mod kernel_support;

use ir::Domain;
use kernel_support::*;
use proptest::prelude::*;
use runtime::kernels::gemm::{gemm_f32, pack_f32_panels, WeightLayout};
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
        WeightLayout::KN | WeightLayout::Panels => w.clone(),
        WeightLayout::NK => (0..k * n).map(|i| w[(i % n) * k + i / n]).collect(),
    };
    // The kernels read the panels packed from the same [K, N] weight.
    let w = if layout == WeightLayout::Panels { pack_f32_panels(&w, k, n) } else { w };
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
        for layout in [WeightLayout::KN, WeightLayout::NK, WeightLayout::Panels] {
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
        layout in 0usize..3,
        bias in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let layout = [WeightLayout::KN, WeightLayout::NK, WeightLayout::Panels][layout];
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

/// Packed panels give bit for bit what the `[K, N]` layout gives, decode rows and prefill rows
/// alike: the same fused multiply-adds in the same k order.
#[test]
fn panels_give_the_bits_of_the_kn_layout() {
    let isas = isas("gemm panels");
    let mut rng = kernel_support::Rng::new(91);
    for &(m, k, n) in &[(1, 576, 1536), (1, 1536, 576), (3, 64, 100), (9, 96, 33)] {
        let a = rng.f32s(m * k, -1.0, 1.0);
        let w = rng.f32s(k * n, -1.0, 1.0);
        let bias = rng.f32s(n, -1.0, 1.0);
        let panels = pack_f32_panels(&w, k, n);
        for &isa in &isas {
            for pool in pools() {
                let mut kn = vec![0.0; m * n];
                gemm_f32(isa, &pool, &a, m, k, &w, n, WeightLayout::KN, Some(&bias), &mut kn);
                let mut packed = vec![f32::NAN; m * n];
                gemm_f32(isa, &pool, &a, m, k, &panels, n, WeightLayout::Panels, Some(&bias), &mut packed);
                assert!(kn == packed, "{m}x{k}x{n} {isa} threads {}", pool.threads());
            }
        }
    }
}

#[test]
fn packing_puts_each_column_in_its_panel_row_after_row() {
    // W[k, n] = 100·k + n, K = 2, N = 35: two panels, the second holding columns 32..35.
    let (k, n) = (2, 35);
    let w: Vec<f32> = (0..k * n).map(|i| (100 * (i / n) + i % n) as f32).collect();
    let p = pack_f32_panels(&w, k, n);
    assert_eq!(p.len(), 2 * 32 * k);
    assert_eq!(p[32 + 5], 105.0, "panel 0, k = 1, column 5");
    assert_eq!(p[(k * 32) + 2], 34.0, "panel 1, k = 0, column 34");
    assert_eq!(p[(k + 1) * 32 + 2], 134.0, "panel 1, k = 1, column 34");
    assert_eq!(p[(k + 1) * 32 + 3], 0.0, "columns past N are zero");
}
