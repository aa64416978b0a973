//! SwiGlu in integers (`ir::integer_gate`): the host kernel the executor runs for
//! `npuc::QuantizeSwiGlu` gives the evaluator's codes and scales bit for bit on every
//! instruction set this CPU has, so the xdna program computes the same gate on the host as an
//! array core's integer code would. Rows over
//! many binades, gates around the saturation at 16 and the rounding ties of 11 bits,
//! subnormals, zeros of both signs, NaN, ∞ and rows past every f32 power-of-two scale.

mod common;

use common::values::Rng;
use runtime::kernels::quantize::quantize_gate_rows;
use runtime::kernels::swiglu::integer_gate_row;
use runtime::kernels::Isa;

/// The evaluator's `QuantizeSwiGlu{passes}` of rows of `d` gate and up values.
fn evaluated(g: &[f32], u: &[f32], d: usize, passes: i64) -> (Vec<u8>, Vec<f32>) {
    let mut attrs = ir::Attrs::default();
    attrs.set("passes", ir::Attr::Int(passes));
    let op = ir::OpRef { node: "gate", domain: ir::Domain::Npuc, op: "QuantizeSwiGlu", opset: 1, attrs: &attrs };
    let shape = vec![g.len() / d, d];
    let gt = ir::Tensor::from_f32(ir::DType::F32, shape.clone(), g.to_vec());
    let ut = ir::Tensor::from_f32(ir::DType::F32, shape, u.to_vec());
    let out = ir::fused::eval(&op, &[Some(&gt), Some(&ut)], 2).unwrap();
    (out[0].as_i64().unwrap().iter().map(|&c| c as i8 as u8).collect(), out[1].to_f32_vec())
}

/// Gate rows of `d` values: over a few binades, over many, around ±16, on 11-bit ties, tiny and
/// subnormal, huge (past 127·2¹²⁷ once multiplied), with a NaN, ±∞ and signed zeros.
fn gate_rows(rng: &mut Rng, d: usize) -> Vec<Vec<f32>> {
    let mut rows: Vec<Vec<f32>> = [3, 12].iter().map(|&s| (0..d).map(|_| rng.spread(s)).collect()).collect();
    rows.push((0..d).map(|j| if j % 2 == 0 { 16.0 } else { -15.99 } * (1.0 + rng.spread(1) * 1e-3)).collect());
    rows.push((0..d).map(|_| f32::from_bits(0x3f80_1000 + ((rng.next() as u32 & 0xff) << 14))).collect());
    rows.push((0..d).map(|_| rng.spread(4) * 1e-39).collect());
    rows.push((0..d).map(|_| rng.spread(4) * 3e37).collect());
    let mut special: Vec<f32> = (0..d).map(|_| rng.spread(3)).collect();
    for (j, v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0].into_iter().enumerate() {
        if j < d {
            special[d - 1 - j] = v;
        }
    }
    rows.push(special);
    rows
}

#[test]
fn the_host_gate_quantises_as_the_evaluator_does() {
    let mut rng = Rng(0x510e_527f_ade6_82d1);
    for d in [1usize, 5, 64, 1536] {
        let rows = gate_rows(&mut rng, d);
        let g: Vec<f32> = rows.concat();
        let mut u: Vec<f32> = (0..g.len()).map(|_| rng.spread(6)).collect();
        u[0] = 0.0;
        let n = rows.len();
        u[(n - 2) * d] = 1e30;
        for passes in [1, 2] {
            let (want_codes, want_scales) = evaluated(&g, &u, d, passes);
            let p = passes as usize;
            for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
                let (mut codes, mut scales) = (vec![0u8; p * g.len()], vec![0f32; p * n]);
                quantize_gate_rows(isa, (&g, &u), d, passes == 2, &mut codes, &mut scales);
                assert_eq!(codes, want_codes, "{isa}: codes of rows of {d}, {passes} passes");
                let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scales), bits(&want_scales), "{isa}: scales of rows of {d}, {passes} passes");
            }
        }
    }
}

#[test]
fn every_small_gate_is_the_evaluators_on_every_path() {
    // Every 11-bit ĝ of magnitude 2⁻⁴⁰ to 16 and both signs (and subnormal, saturated and
    // special ones), each by a few up values, through the scalar value and every row path.
    let ups = [1.0f32, -3.25, 1e-20, 7e20];
    let mut gates: Vec<f32> = (87u32..=131)
        .flat_map(|e| (0u32..1024).map(move |m| f32::from_bits((e << 23) | (m << 13))))
        .flat_map(|g| [g, -g])
        .collect();
    gates.extend([1e-40, -3e-39, 0.0, -0.0, 16.0, -16.0, 300.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    for u in ups {
        let want: Vec<f64> = gates.iter().map(|&g| ir::integer_gate::value(g, u)).collect();
        let same = |got: f64, want: f64| got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
        for (&g, &w) in gates.iter().zip(&want) {
            assert!(same(runtime::kernels::swiglu::integer_gate(g, u), w), "ĝ {g:e}, û {u:e}");
        }
        let ups = vec![u; gates.len()];
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut got = vec![0f64; gates.len()];
            integer_gate_row(isa, &gates, &ups, &mut got);
            for ((&g, &y), &w) in gates.iter().zip(&got).zip(&want) {
                assert!(same(y, w), "{isa}: ĝ {g:e}, û {u:e}: {y:e} against {w:e}");
            }
        }
    }
}

/// Where the integer gate and the f32 one part, and by how much: within 2⁻¹⁰ of |ĝ·û| plus the
/// inputs' rounding to 11 bits, over a few binades.
#[test]
fn the_integer_gate_is_swiglu_to_ten_bits() {
    let mut rng = Rng(0x9b05_688c_2b3e_6c1f);
    let mut worst = 0f64;
    for _ in 0..100_000 {
        let (g, u) = (rng.spread(5), rng.spread(5));
        let want = f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u);
        let got = runtime::kernels::swiglu::integer_gate(g, u);
        worst = worst.max((got - want).abs() / (f64::from(g) * f64::from(u)).abs());
    }
    // σ̂ within 0.55·2⁻¹⁰; ĝ and û within 2⁻¹¹ relative each (σ's slope is at most 1/4).
    assert!(worst < 0.55 / 1024.0 + 2.0 * 2f64.powi(-11) + 2f64.powi(-22) && worst > 1e-4, "worst {worst:e}");
}
