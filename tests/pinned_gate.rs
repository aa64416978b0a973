//! The host's SwiGlu kernels, on every instruction set this CPU has, compute
//! `ir::pinned_gate`'s definition bit for bit — `exp`, the sigmoid and the products in one
//! order, no fused multiply-add — as the evaluator does, so an array core following the same
//! definition equals the host. Gates over many binades, where σ's `exp` underflows gradually
//! and to 0, ±0, ±∞ and NaN, in rows of every tail length the vector paths take.

mod common;

use common::values::Rng;
use runtime::kernels::swiglu::swiglu;
use runtime::kernels::Isa;

/// Gates: spread over binades up to ±128 (σ's exp from 1 down to 0), the gradual underflow
/// (−87.3 to −103.3), and the specials.
fn gates(rng: &mut Rng, len: usize) -> Vec<f32> {
    let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -88.0, -95.5, -103.9, -200.0, 88.8];
    (0..len)
        .map(|i| match i % 5 {
            0 => specials[(i / 5) % specials.len()],
            1 => -87.3 - 16.0 * (rng.next() >> 40) as f32 / (1u64 << 24) as f32,
            _ => rng.spread(7),
        })
        .collect()
}

#[test]
fn every_path_computes_the_pinned_gate() {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    for len in [1usize, 7, 8, 9, 15, 16, 17, 100, 1536] {
        let g = gates(&mut rng, len);
        let u: Vec<f32> = (0..len).map(|_| rng.spread(4)).collect();
        let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| ir::pinned_gate::swiglu(g, u)).collect();
        for &isa in &isas {
            let mut y = vec![0f32; len];
            swiglu(isa, &g, &u, &mut y);
            for (j, (a, b)) in y.iter().zip(&want).enumerate() {
                let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                assert!(same, "{isa}, row of {len}: gate {} gives {a:e}, the definition {b:e}", g[j]);
            }
            checked += 1;
        }
    }
    assert!(checked >= 9 * isas.len().max(1));
}

#[test]
fn the_evaluator_computes_the_pinned_gate() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let g = gates(&mut rng, 64);
    let u: Vec<f32> = (0..64).map(|_| rng.spread(4)).collect();
    let op = ir::OpRef { node: "gate", domain: ir::Domain::Npuc, op: "SwiGlu", opset: 1, attrs: &ir::Attrs::default() };
    let gt = ir::Tensor::from_f32(ir::DType::F32, vec![64], g.clone());
    let ut = ir::Tensor::from_f32(ir::DType::F32, vec![64], u.clone());
    let y = ir::fused::eval(&op, &[Some(&gt), Some(&ut)], 1).unwrap().remove(0).to_f32_vec();
    for (j, &v) in y.iter().enumerate() {
        let w = ir::pinned_gate::swiglu(g[j], u[j]);
        assert!(v.to_bits() == w.to_bits() || (v.is_nan() && w.is_nan()), "gate {}: {v:e} against {w:e}", g[j]);
    }
    // The definition reaches the underflow and the specials.
    assert!(y.iter().any(|v| v.is_nan()) && y.iter().any(|v| v.is_infinite()));
    assert!(g.iter().zip(&y).any(|(g, y)| *g < -87.3 && *y != 0.0 && y.abs() < 1e-35));
}
