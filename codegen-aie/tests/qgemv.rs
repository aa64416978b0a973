//! qgemv designs: f32 activation rows in, the f32 outputs of `QuantizeRows{passes}` →
//! `QGemm{passes}` out, the quantisation and the epilogue in the cores' own code. Executed from
//! their text by the interpreter and compared bit for bit with the program's definition of the
//! two ops (`ir::fused::eval`), on rows that reach the definition's edges: ties, a row of zeros,
//! infinities, NaN, subnormals, values near f32's limit; and the qgemv designs of SmolLM2-135M's
//! and a Qwen3-0.6B-shaped model's decode projections passing the checker.

mod common;

use codegen_aie::design::{self, Kind};
use codegen_aie::gemm::GemmSite;
use codegen_aie::kernels::Stmt;
use codegen_aie::plan::{self, PlanOptions};
use codegen_aie::sequence::{self, ArrayProgram, Phase};
use codegen_aie::{interp, mlir, qgemv, qkernels, Device, GemmShape};
use common::{values, xorshift};
use ir::{Attr, Attrs, DType, Domain, OpRef, Tensor};
use std::collections::HashMap;

/// Heavy-tailed f32 activations: most small, a few outliers, as a norm's output has.
fn activations(len: usize, seed: u64) -> Vec<f32> {
    xorshift(seed)
        .take(len)
        .map(|x| {
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if x & 0xff < 3 {
                u * 400.0
            } else {
                u * 3.0
            }
        })
        .collect()
}

fn eval(op: &str, attrs: &Attrs, inputs: &[Option<&Tensor>], outputs: usize) -> Vec<Tensor> {
    let r = OpRef { node: "test", domain: Domain::Npuc, op, opset: 1, attrs };
    ir::fused::eval(&r, inputs, outputs).unwrap_or_else(|e| panic!("{op}: {e}"))
}

/// A projection's operands: rows `x` [rows, K], codes `w` [K, N], column scales, the passes and
/// the columns (at the end) that take the first pass only.
#[derive(Clone)]
struct Case {
    x: Vec<f32>,
    w: Vec<i8>,
    sw: Vec<f32>,
    dims: (usize, usize, usize),
    passes: usize,
    first_only: usize,
}

impl Case {
    fn new((rows, k, n): (usize, usize, usize), passes: usize, first_only: usize, seed: u64) -> Case {
        let sw = xorshift(seed + 7).take(n).map(|x| ((x >> 40) as f32 + 1.0) * 1e-9).collect();
        let (x, w) = (activations(rows * k, seed), values(k * n, seed + 1));
        Case { x, w, sw, dims: (rows, k, n), passes, first_only }
    }

    /// The program's own answer: `QuantizeRows{passes}` then `QGemm{passes, first_pass_columns}`.
    fn reference(&self) -> Vec<f32> {
        let (rows, k, _) = self.dims;
        // One pass is the plain ops (no pass axis), as the program writes them.
        let mut qa = Attrs::default();
        if self.passes > 1 {
            qa.set("passes", Attr::Int(self.passes as i64));
        }
        let xt = Tensor::from_f32(DType::F32, vec![rows, k], self.x.clone());
        let q = eval("QuantizeRows", &qa, &[Some(&xt)], 2);
        self.qgemm(&q[0], &q[1])
    }

    /// The program's answer for a norm-fed projection, as `array-norms` leaves it:
    /// `r = InverseRms{aligned}(x)`, `QuantizeRows(x, γ)`, `S = S₀·r`, `QGemm`.
    fn norm_reference(&self, gamma: &[f32], epsilon: f32) -> Vec<f32> {
        let (rows, k, _) = self.dims;
        let xt = Tensor::from_f32(DType::F32, vec![rows, k], self.x.clone());
        let mut ia = Attrs::default();
        ia.set("epsilon", Attr::Float(epsilon));
        ia.set("squares", Attr::Str("aligned".into()));
        let r = eval("InverseRms", &ia, &[Some(&xt)], 1).remove(0).to_f32_vec();
        let mut qa = Attrs::default();
        if self.passes > 1 {
            qa.set("passes", Attr::Int(self.passes as i64));
        }
        let gt = Tensor::from_f32(DType::F32, vec![k], gamma.to_vec());
        let q = eval("QuantizeRows", &qa, &[Some(&xt), Some(&gt)], 2);
        let scaled = q[1].to_f32_vec().iter().enumerate().map(|(j, s)| s * r[j % rows]).collect();
        self.qgemm(&q[0], &Tensor::from_f32(DType::F32, q[1].shape.clone(), scaled))
    }

    /// The program's answer for a gate-fed projection, as `array-gates` leaves it:
    /// `QuantizeSwiGlu(g, u)` (`g` the case's rows), `QGemm`.
    fn gate_reference(&self, u: &[f32]) -> Vec<f32> {
        let (rows, k, _) = self.dims;
        let mut qa = Attrs::default();
        if self.passes > 1 {
            qa.set("passes", Attr::Int(self.passes as i64));
        }
        let gt = Tensor::from_f32(DType::F32, vec![rows, k], self.x.clone());
        let ut = Tensor::from_f32(DType::F32, vec![rows, k], u.to_vec());
        let q = eval("QuantizeSwiGlu", &qa, &[Some(&gt), Some(&ut)], 2);
        self.qgemm(&q[0], &q[1])
    }

    /// A gate-fed design's answer, the case's rows the gate's and `u` the up's: `[rows, n]`.
    fn gate_on_array(&self, device: Device, design_rows: usize, u: &[f32]) -> Vec<f32> {
        let (rows, k, n) = self.dims;
        let q = qgemv::choose_gate(device, GemmShape { m: design_rows, k, n }, self.passes).unwrap();
        let d = qgemv::build(&q);
        let p = d.tiling.padded;
        let x = qgemv::gate_operand(&q, (&self.x, u), k);
        let first_only = |c: usize| c >= n - self.first_only;
        let w = qgemv::pack(&q, (&self.w, k, n), (0, n), &self.sw, &first_only);
        let (out, _) = interp::run_args(&d.generic(), &[interp::Arg::F32(&x), interp::Arg::I8(&w)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let y: Vec<f32> = out.iter().map(|&b| f32::from_bits(b as u32)).collect();
        (0..rows).flat_map(|i| y[i * p.n..i * p.n + n].to_vec()).collect()
    }

    /// A pairs design's answer ([`qkernels::Shape::pairs`]): the weight's `n` columns as `n/2`
    /// outputs, each its first-pass column plus its residual column; with `norm` (γ, ε) a
    /// norm-fed design's. The design's whole output buffer, `[padded rows, padded n/2]`.
    fn pairs_on_array(&self, device: Device, design_rows: usize, norm: Option<(&[f32], f32)>) -> (Vec<f32>, usize) {
        let (_, k, n) = self.dims;
        let feed = norm.map_or(qgemv::Feed::Rows, |(_, epsilon)| qgemv::Feed::Norm { epsilon, sum: false });
        let q = qgemv::choose_pairs(device, GemmShape { m: design_rows, k, n: n / 2 }, self.passes, feed).unwrap();
        let d = qgemv::build(&q);
        assert!(d.name.ends_with("_pairs"), "{}", d.name);
        let x = qgemv::rows_operand(&q, (&self.x, k), norm.map(|(g, _)| g));
        let w = qgemv::pack(&q, (&self.w, k, n), (0, n / 2), &self.sw, &|_| false);
        let (out, _) = interp::run_args(&d.generic(), &[interp::Arg::F32(&x), interp::Arg::I8(&w)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        (out.iter().map(|&b| f32::from_bits(b as u32)).collect(), d.tiling.padded.n)
    }

    /// `QGemm{passes, first_pass_columns}` of `codes` at row scales `scales`.
    fn qgemm(&self, codes: &Tensor, scales: &Tensor) -> Vec<f32> {
        let (_, k, n) = self.dims;
        let mut ga = Attrs::default();
        if self.passes > 1 {
            ga.set("passes", Attr::Int(self.passes as i64));
        }
        if self.first_only > 0 {
            ga.set("first_pass_columns", Attr::Int(self.first_only as i64));
        }
        let wt = Tensor::from_i64(DType::I8, vec![k, n], self.w.iter().map(|&v| i64::from(v)).collect());
        let swt = Tensor::from_f32(DType::F32, vec![n], self.sw.clone());
        let zw = Tensor::from_i64(DType::I8, vec![n], vec![0; n]);
        let za = Tensor::from_i64(DType::I8, vec![], vec![0]);
        let inputs = [Some(codes), Some(scales), Some(&za), Some(&wt), Some(&swt), Some(&zw)];
        eval("QGemm", &ga, &inputs, 1).remove(0).as_f32().unwrap().to_vec()
    }

    /// The design's answer for the block's rows (the rest of the design's rows zero).
    fn on_array(&self, device: Device, design_rows: usize) -> Vec<f32> {
        self.chunk_on_array(device, design_rows, (0, self.dims.2), None)
    }

    /// The design's answer for `cols` columns of the weight from `col_offset`, one call as a
    /// wide projection's chunk is: `[rows, cols]`; with `norm` (γ, ε) a norm-fed design's.
    fn chunk_on_array(
        &self,
        device: Device,
        design_rows: usize,
        (col_offset, cols): (usize, usize),
        norm: Option<(&[f32], f32)>,
    ) -> Vec<f32> {
        let (rows, k, n) = self.dims;
        let shape = GemmShape { m: design_rows, k, n: cols };
        let q = match norm {
            None => qgemv::choose(device, shape, self.passes),
            Some((_, eps)) => qgemv::choose_norm(device, shape, self.passes, eps),
        }
        .unwrap();
        let d = qgemv::build(&q);
        let p = d.tiling.padded;
        let x = qgemv::rows_operand(&q, (&self.x, k), norm.map(|(g, _)| g));
        let first_only = |c: usize| c >= n - self.first_only;
        let w = qgemv::pack(&q, (&self.w, k, n), (col_offset, cols), &self.sw, &first_only);
        let (out, _) = interp::run_args(&d.generic(), &[interp::Arg::F32(&x), interp::Arg::I8(&w)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let y: Vec<f32> = out.iter().map(|&b| f32::from_bits(b as u32)).collect();
        for (i, row) in y.chunks(p.n).enumerate() {
            // Past its columns a row's products are 0 — times a NaN row scale (a norm's NaN
            // row), NaN.
            let live = if i < rows { cols } else { 0 };
            let nan_row = norm.is_some() && row[..live].iter().any(|v| v.is_nan());
            let padding = |v: &f32| *v == 0.0 || (nan_row && v.is_nan());
            assert!(row[live..].iter().all(padding), "{}: row {i} has output past its columns", d.name);
        }
        (0..rows).flat_map(|i| y[i * p.n..i * p.n + cols].to_vec()).collect()
    }
}

/// What a split design's rows are, with what the rows operand carries besides them.
#[derive(Clone, Copy)]
enum Fed<'a> {
    Rows,
    Norm(&'a [f32], f32),
    Gate(&'a [f32]),
}

impl Case {
    /// A split design's answer ([`qgemv::split`]): the rows (`fed`) quantised by `cores`
    /// prologue cores; with two passes, both passes' codes stacked in one GEMV call when
    /// `cores` is even.
    fn split_on_array(&self, device: Device, design_rows: usize, (cores, fed): (usize, Fed)) -> Vec<f32> {
        let (rows, k, n) = self.dims;
        let feed = match fed {
            Fed::Rows => qgemv::Feed::Rows,
            Fed::Norm(_, epsilon) => qgemv::Feed::Norm { epsilon, sum: false },
            Fed::Gate(_) => qgemv::Feed::Gate { kept: true },
        };
        let stacked = self.passes > 1 && cores % 2 == 0;
        let shape = GemmShape { m: design_rows, k, n };
        let q = qgemv::choose_split(device, shape, (self.passes, feed), (cores, stacked)).unwrap();
        let d = qgemv::build(&q);
        assert!(d.name.contains(&format!("_split{cores}")), "{}", d.name);
        assert_eq!(stacked, d.name.contains("_stacked"), "{}", d.name);
        let x = match fed {
            Fed::Gate(u) => qgemv::gate_operand(&q, (&self.x, u), k),
            Fed::Norm(gamma, _) => qgemv::rows_operand(&q, (&self.x, k), Some(gamma)),
            Fed::Rows => qgemv::rows_operand(&q, (&self.x, k), None),
        };
        let first_only = |c: usize| c >= n - self.first_only;
        let w = qgemv::pack(&q, (&self.w, k, n), (0, n), &self.sw, &first_only);
        let (out, stats) = interp::run_args(&d.generic(), &[interp::Arg::F32(&x), interp::Arg::I8(&w)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let rounds = if matches!(fed, Fed::Norm(..)) { 2 } else { self.passes };
        assert_eq!(stats.calls[qkernels::SHARE], (rounds * cores) as u64, "{}: each round of maxima", d.name);
        let y: Vec<f32> = out.iter().map(|&b| f32::from_bits(b as u32)).collect();
        (0..rows).flat_map(|i| y[i * d.tiling.padded.n..i * d.tiling.padded.n + n].to_vec()).collect()
    }
}

impl Case {
    /// A sum-fed split design's answer ([`qkernels::Input::SumNorm`]): the case's rows the
    /// residual stream's, `o` the projection's, added by `cores` prologue cores before the norm
    /// (γ, ε 1e-5): the outputs `[rows, n]` and the sum `[rows, k]` the design wrote.
    fn sum_on_array(&self, device: Device, (cores, o, gamma): (usize, &[f32], &[f32])) -> (Vec<f32>, Vec<f32>) {
        let (rows, k, n) = self.dims;
        let feed = qgemv::Feed::Norm { epsilon: 1e-5, sum: true };
        let stacked = self.passes > 1 && cores % 2 == 0;
        let shape = GemmShape { m: rows, k, n };
        let q = qgemv::choose_split(device, shape, (self.passes, feed), (cores, stacked)).unwrap();
        let d = qgemv::build(&q);
        assert!(d.name.starts_with("snqgemv") && d.name.contains(&format!("_split{cores}")), "{}", d.name);
        let x = q.layout().rows_operand((&self.x, k), Some(gamma), Some(o)).unwrap();
        let first_only = |c: usize| c >= n - self.first_only;
        let w = qgemv::pack(&q, (&self.w, k, n), (0, n), &self.sw, &first_only);
        let (out, _) = interp::run_buffers(&d.generic(), &[interp::Arg::F32(&x), interp::Arg::I8(&w)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let f32s = |b: &[i32]| b.iter().map(|&w| f32::from_bits(w as u32)).collect::<Vec<f32>>();
        let p = d.tiling.padded;
        (columns(&f32s(&out[2]), (rows, n), p.n), columns(&f32s(&out[3]), (rows, k), p.k))
    }
}

/// Equal bits, or both NaN.
fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}: output {i}: {g} against {w}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The program's sum of a two-pass weight's outputs `y` (`[rows, n]`: the first-pass columns,
/// then the residual ones), as `array-int8` writes it: `Add(Slice(y, main), Slice(y, residual))`.
fn group(y: &[f32], (rows, n): (usize, usize)) -> Vec<f32> {
    (0..rows).flat_map(|i| (0..n / 2).map(move |j| y[i * n + j] + y[i * n + n / 2 + j])).collect()
}

/// The first `cols` columns of `rows` rows of a `[.., width]` buffer.
fn columns(y: &[f32], (rows, cols): (usize, usize), width: usize) -> Vec<f32> {
    (0..rows).flat_map(|i| y[i * width..i * width + cols].to_vec()).collect()
}

#[test]
fn one_and_two_passes_equal_the_programs_ops_bit_for_bit() {
    for device in [Device::Npu1, Device::Npu2] {
        for (passes, first_only) in [(1, 0), (2, 0), (2, 40)] {
            let case = Case::new((3, 576, 192), passes, first_only, 11 + passes as u64);
            let want = case.reference();
            assert_eq!(
                bits(&case.on_array(device, 8)),
                bits(&want),
                "{device}: {passes} passes, {first_only} first-pass"
            );
        }
    }
}

#[test]
fn k_in_several_parts_and_ragged_columns_equal_the_reference() {
    // K 1,536 (SmolLM2's down projection) takes several f32 parts for 8 rows; 100 columns are
    // no multiple of the cores.
    let mut spans = false;
    for device in [Device::Npu1, Device::Npu2] {
        let case = Case::new((8, 1536, 100), 2, 30, 5);
        let q = qgemv::choose(device, GemmShape { m: 8, k: 1536, n: 100 }, 2).unwrap();
        assert!(q.parts_and_tiles().0 > 1, "{device}: {:?}", q.tiling);
        assert_eq!(bits(&case.on_array(device, 8)), bits(&case.reference()), "{device}");
        // A K part of 40 bytes holds one block of 8 column scales a row: a tile's scales span
        // several rows of its epilogue data.
        let short = Case::new((2, 40, 72), 2, 5, 9);
        let q = qgemv::choose(device, GemmShape { m: 2, k: 40, n: 72 }, 2).unwrap();
        spans |= q.tiling.n > qkernels::scales_per_row(q.tiling.k);
        assert_eq!(bits(&short.on_array(device, 2)), bits(&short.reference()), "{device}: K 40");
    }
    assert!(spans, "a tile whose scales take several rows");
}

#[test]
fn a_wide_projection_in_column_chunks_equals_the_reference() {
    // 300 columns as three 100-column calls, the last 60 columns first-pass-only (all in the
    // third chunk): each call packs its own columns' weights, scales and flags.
    let case = Case::new((2, 256, 300), 2, 60, 17);
    let want = case.reference();
    let chunks: Vec<Vec<f32>> = (0..3).map(|c| case.chunk_on_array(Device::Npu1, 8, (c * 100, 100), None)).collect();
    let got: Vec<f32> =
        (0..2).flat_map(|r| chunks.iter().flat_map(move |ch| ch[r * 100..(r + 1) * 100].to_vec())).collect();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn rows_at_the_definitions_edges_equal_the_reference() {
    let (rows, k, n) = (8, 64, 48);
    let mut case = Case::new((rows, k, n), 2, 8, 3);
    let row = |r: usize| r * k..(r + 1) * k;
    case.x[row(0)].fill(0.0); // a row of zeros: scale 1, codes 0
                              // Ties: max 127 makes s = 1, so every x.5 is a tie, rounded to even (and their residuals
                              // ±0.5 ties again in the second pass).
    case.x[row(1)].iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 32.5);
    case.x[k] = 127.0;
    case.x[2 * k + 5] = f32::INFINITY; // a non-finite maximum: scale 1
    case.x[2 * k + 6] = f32::NEG_INFINITY;
    case.x[3 * k + 1] = f32::NAN; // NaN codes to 0 and is no maximum
    case.x[row(4)].iter_mut().enumerate().for_each(|(i, v)| *v = f32::from_bits(i as u32 + 1)); // subnormals
    case.x[row(5)].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 3.0e38 } else { -1.0e-3 });
    case.x[row(6)].fill(-0.0);
    // Weight scales whose products with the rows' scales fall to subnormals, to 0, or past the
    // largest f32: the epilogue's integer products round there as IEEE does.
    case.sw[..6].copy_from_slice(&[1e-40, f32::from_bits(1), f32::MIN_POSITIVE, 3e38, 1e30, 0.0]);
    let want = case.reference();
    let got = case.on_array(Device::Npu2, 8);
    // NaN outputs compare by being NaN: the reference's and the array's payloads are both f32 NaN.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "output {i}: {g} against {w}");
    }
    assert!(want.iter().any(|v| v.is_nan()) || want.iter().any(|v| v.is_infinite()), "the edges reach the output");
    assert!(want.iter().any(|v| v.is_subnormal()), "a subnormal output");
}

#[test]
fn a_prologue_split_across_cores_equals_the_programs_ops_bit_for_bit() {
    for device in [Device::Npu1, Device::Npu2] {
        for (passes, cores) in [(1, 2), (2, 3), (2, 4)] {
            let case = Case::new((2, 576, 192), passes, 20, 40 + cores as u64);
            let got = case.split_on_array(device, 2, (cores, Fed::Rows));
            assert_eq!(bits(&got), bits(&case.reference()), "{device}: {passes} passes on {cores} cores");
        }
    }
    // The edges in different slices: a row's maximum (or its infinity) in the last core's slice
    // only, a NaN in the first's, a row of zeros in every slice.
    let (rows, k, n) = (4, 96, 48);
    let mut case = Case::new((rows, k, n), 2, 8, 13);
    case.x[..k].fill(0.0);
    case.x[k + k - 3] = 900.0;
    case.x[2 * k + k - 1] = f32::INFINITY;
    case.x[3 * k] = f32::NAN;
    let want = case.reference();
    for cores in [2, 3, 4] {
        assert_same(&case.split_on_array(Device::Npu1, rows, (cores, Fed::Rows)), &want, &format!("{cores} cores"));
    }
}

#[test]
fn a_norms_and_a_gates_prologue_split_across_cores_equal_the_programs_ops_bit_for_bit() {
    // A norm's row: its largest magnitude, its products' maximum and its squares' lanes come
    // from every slice; a row of zeros, a NaN, an ∞ and an outlier in the last slice only.
    let (rows, k, n) = (5, 576, 64);
    let gamma = bfloat16_gamma(k, 5);
    for (passes, cores) in [(1, 2), (2, 3), (2, 4)] {
        let mut case = Case::new((rows, k, n), passes, 8, 50 + cores as u64);
        case.x[k..2 * k].fill(0.0);
        case.x[2 * k + k - 1] = 5000.0;
        case.x[3 * k + 7] = f32::NAN;
        case.x[4 * k + k - 2] = f32::INFINITY;
        let want = case.norm_reference(&gamma, 1e-5);
        let got = case.split_on_array(Device::Npu2, rows, (cores, Fed::Norm(&gamma, 1e-5)));
        assert_same(&got, &want, &format!("norm, {passes} passes on {cores} cores"));
    }
    // A gate's rows: ∞·u, NaN, a zero row, the largest value in the last slice.
    for (passes, cores) in [(1, 2), (2, 3), (2, 4)] {
        let mut case = Case::new((rows, k, n), passes, 8, 60 + cores as u64);
        let u = activations(rows * k, 61);
        case.x[k..2 * k].fill(0.0);
        case.x[2 * k + k - 1] = 40.0;
        (case.x[3 * k + 3], case.x[4 * k + 4]) = (f32::NAN, f32::INFINITY);
        let want = case.gate_reference(&u);
        let got = case.split_on_array(Device::Npu1, rows, (cores, Fed::Gate(&u)));
        assert_eq!(bits(&got), bits(&want), "gate, {passes} passes on {cores} cores");
    }
}

#[test]
fn a_sum_fed_design_adds_the_residual_stream_as_the_program_does_and_normalises_the_sum() {
    // The residual stream's rows and the attention's projection in; the program's `Add`, the
    // next norm's projection of the sum and the sum itself out. Sums that round, overflow to
    // ∞, cancel a whole row to zeros, and carry a NaN; the outlier in the last core's slice.
    let (rows, k, n) = (3, 576, 64);
    let gamma = bfloat16_gamma(k, 8);
    for (device, passes, cores) in [(Device::Npu1, 1, 2), (Device::Npu2, 2, 3), (Device::Npu1, 2, 4)] {
        let mut case = Case::new((rows, k, n), passes, 8, 70 + cores as u64);
        let mut o = activations(rows * k, 71);
        (case.x[5], o[5]) = (f32::MAX, f32::MAX);
        (case.x[6], o[6]) = (1.0, f32::EPSILON / 2.0);
        for (o, x) in o[k..2 * k].iter_mut().zip(&case.x[k..2 * k]) {
            *o = -x;
        }
        (case.x[2 * k + 3], o[2 * k + k - 1]) = (f32::NAN, 3000.0);
        let h: Vec<f32> = case.x.iter().zip(&o).map(|(a, b)| a + b).collect();
        assert!(h[5].is_infinite() && h[6] == 1.0 && h[k..2 * k].iter().all(|v| *v == 0.0));
        let want = Case { x: h.clone(), ..case.clone() }.norm_reference(&gamma, 1e-5);
        let (got, sum) = case.sum_on_array(device, (cores, &o, &gamma));
        let what = format!("{device}: {passes} passes on {cores} cores");
        assert_same(&sum, &h, &format!("{what}: the sum"));
        assert_same(&got, &want, &format!("{what}: the projection"));
    }
}

#[test]
fn the_sum_fed_projections_of_smollm2_and_qwen3_have_designs_the_checker_and_mlir_accept() {
    // Decode's norm-fed pairs projections (q/k/v, gate/up) taking the residual stream and the
    // previous projection's output: `choose_pairs` returns only designs the checker accepts;
    // each adds the sum's work and bytes to the norm-fed design's, and writes the sum as its
    // fourth argument, `[rows, padded K]`, through each prologue core's own channel.
    let (sum, norm) = (qgemv::Feed::Norm { epsilon: 1e-5, sum: true }, qgemv::Feed::Norm { epsilon: 1e-5, sum: false });
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in [(576, 960), (576, 3072), (1024, 4096), (1024, 6144)] {
            let shape = GemmShape { m: 1, k, n };
            let q = qgemv::choose_pairs(device, shape, 2, sum).unwrap_or_else(|e| panic!("{device} {k}x{n}: {e}"));
            let plain = qgemv::choose_pairs(device, shape, 2, norm).unwrap();
            assert!(q.split > 0 && q.tiling.total_cycles > plain.tiling.total_cycles, "{device} {k}x{n}: {q:?}");
            let d = qgemv::build(&q);
            let pk = q.tiling.padded.k;
            assert_eq!(d.args[0].0, 3 * pk, "{}: the residual stream, γ and the projection's row", d.name);
            assert_eq!(d.args[3].0, pk, "{}: the sum", d.name);
            let sums: Vec<_> = d.fifos.iter().filter(|f| f.name.starts_with("H_")).collect();
            assert_eq!(sums.len(), q.split, "{}", d.name);
            assert!(sums.iter().all(|f| f.consumers[0].1 == 0 && f.producer.1 >= 2), "{}", d.name);
        }
    }
    let q = qgemv::choose_pairs(Device::Npu1, GemmShape { m: 8, k: 576, n: 3072 }, 2, sum).unwrap();
    let d = qgemv::build(&q);
    mlir::verify_generic(&d.generic()).unwrap_or_else(|e| panic!("{}: {e}", d.name));
}

/// γ of bfloat16 values over a few binades, as a norm weight's.
fn bfloat16_gamma(d: usize, seed: u64) -> Vec<f32> {
    let spread = |x: u64| (1.0 + (x >> 40) as f32 / (1u64 << 24) as f32) * 2f32.powi((x % 6) as i32 - 3);
    xorshift(seed).take(d).map(|x| f32::from_bits(spread(x).to_bits() & 0xffff_0000)).collect()
}

#[test]
fn norm_fed_designs_equal_the_programs_norm_and_projection_bit_for_bit() {
    // The residual stream's rows and γ in, RmsNorm's projection out, as `array-norms` defines
    // it: a heavy-tailed row, a row of zeros (r = 1/√ε), tiny values, a NaN, an ∞.
    let (rows, k, n) = (6, 576, 96);
    let gamma = bfloat16_gamma(k, 3);
    for device in [Device::Npu1, Device::Npu2] {
        for (passes, first_only) in [(1, 0), (2, 16)] {
            let mut case = Case::new((rows, k, n), passes, first_only, 21);
            case.x[k..2 * k].fill(0.0);
            case.x[2 * k..3 * k].iter_mut().for_each(|v| *v *= 1e-30);
            case.x[3 * k + 7] = f32::NAN;
            case.x[4 * k + 9] = f32::INFINITY;
            let want = case.norm_reference(&gamma, 1e-5);
            let got = case.chunk_on_array(device, 8, (0, n), Some((&gamma, 1e-5)));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                assert!(same, "{device}, {passes} passes: output {i}: {g} against {w}");
            }
            assert!(want[..n].iter().all(|v| v.is_finite()) && want[3 * n..4 * n].iter().all(|v| v.is_nan()));
        }
        // Decode's design: one row, K in several parts (SmolLM2's down projection's K).
        let q = qgemv::choose_norm(device, GemmShape { m: 1, k: 1536, n: 64 }, 2, 1e-6).unwrap();
        assert!(q.parts_and_tiles().0 > 1, "{device}: {:?}", q.tiling);
        let case = Case::new((1, 1536, 64), 2, 8, 23);
        let gamma = bfloat16_gamma(1536, 4);
        let want = case.norm_reference(&gamma, 1e-6);
        assert_eq!(
            bits(&case.chunk_on_array(device, 1, (0, 64), Some((&gamma, 1e-6)))),
            bits(&want),
            "{device}: one row"
        );
    }
}

#[test]
fn the_norm_fed_projections_of_smollm2_and_qwen3_have_designs_the_checker_and_mlir_accept() {
    // The projections a norm feeds, decode's one row: q/k/v fused and gate/up fused, SmolLM2's
    // (hidden 576) and a Qwen3-0.6B-shaped model's (1,024). `choose_norm` returns only a design
    // the checker accepts.
    let shapes = [(576, 960), (576, 3072), (1024, 4096), (1024, 6144)];
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in shapes {
            for passes in [1, 2] {
                let q = qgemv::choose_norm(device, GemmShape { m: 1, k, n }, passes, 1e-5)
                    .unwrap_or_else(|e| panic!("{device} {k}x{n}, {passes} passes: {e}"));
                let plain = qgemv::choose(device, GemmShape { m: 1, k, n }, passes).unwrap();
                assert!(q.tiling.total_cycles > plain.tiling.total_cycles, "the norm costs cycles");
                assert!(q.tiling.k.is_multiple_of(qkernels::NORM_LANES), "{:?}", q.tiling);
            }
        }
    }
    let d = qgemv::build(&qgemv::choose_norm(Device::Npu2, GemmShape { m: 1, k: 576, n: 960 }, 2, 1e-5).unwrap());
    assert!(d.name.starts_with("nqgemv2_1x576x960_npu2"), "{}", d.name);
    mlir::verify_generic(&d.generic()).unwrap_or_else(|e| panic!("{}: {e}", d.name));
}

#[test]
fn gate_fed_designs_equal_the_programs_gate_and_projection_bit_for_bit() {
    // The gate's and up's f32 rows in, the down projection out, as `array-gates` defines it:
    // gates over a few binades (SwiGlu's range), a row past ±16, a row of zero gates, a NaN,
    // ∞·u and −∞ (σ̂ 0, ∞·0: code 0).
    let (rows, k, n) = (5, 576, 96);
    for device in [Device::Npu1, Device::Npu2] {
        for (passes, first_only) in [(1, 0), (2, 16)] {
            let mut case = Case::new((rows, k, n), passes, first_only, 31);
            let mut u = activations(rows * k, 32);
            case.x[k..2 * k].iter_mut().for_each(|v| *v *= 20.0);
            case.x[2 * k..3 * k].fill(0.0);
            (case.x[3 * k + 3], case.x[3 * k + 4], case.x[3 * k + 5]) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
            u[3 * k + 4] = 2.0;
            let want = case.gate_reference(&u);
            let got = case.gate_on_array(device, 8, &u);
            assert_eq!(bits(&got), bits(&want), "{device}, {passes} passes");
            assert!(want[2 * n..3 * n].iter().all(|&v| v == 0.0), "zero gates: zero outputs");
        }
        // Decode's design: one row, K in several parts (SmolLM2's down projection's K).
        let q = qgemv::choose_gate(device, GemmShape { m: 1, k: 1536, n: 64 }, 2).unwrap();
        assert!(q.parts_and_tiles().0 > 1, "{device}: {:?}", q.tiling);
        let case = Case::new((1, 1536, 64), 2, 8, 33);
        let u = activations(1536, 34);
        assert_eq!(bits(&case.gate_on_array(device, 1, &u)), bits(&case.gate_reference(&u)), "{device}: one row");
    }
}

#[test]
fn the_gate_fed_down_projections_of_smollm2_and_qwen3_have_designs_the_checker_and_mlir_accept() {
    // Decode's one row: SmolLM2's down projection (K 1,536) and a Qwen3-0.6B-shaped model's
    // (3,072). `choose_gate` returns only a design the checker accepts: unsplit, the gate's
    // values kept in the cores (the rows stream once) where they fit beside the vector kernel's
    // codes, else computed again a pass — Qwen3's two passes on npu2, whose 8-row codes of
    // K 3,072 fill most of a core; split, the prologue cores keep their slices' values.
    let unsplit = |device, shape, passes| {
        [true, false]
            .into_iter()
            .filter_map(|kept| qgemv::choose_gate_with_values(device, shape, passes, kept).ok())
            .min_by_key(|q| q.tiling.total_cycles)
            .unwrap()
    };
    let mut kept = vec![];
    for device in [Device::Npu1, Device::Npu2] {
        for (k, n) in [(1536, 576), (3072, 1024)] {
            for passes in [1, 2] {
                let shape = GemmShape { m: 1, k, n };
                let q = qgemv::choose_gate(device, shape, passes)
                    .unwrap_or_else(|e| panic!("{device} {k}x{n}, {passes} passes: {e}"));
                let d = qgemv::build(&q);
                assert!(matches!(d.kind, Kind::QGemv { input: qkernels::Input::Gate, .. }), "{}", d.name);
                // Kept or not, the design's cores run the vector kernel.
                assert_eq!(q.kernel_rows, device.micro_tile().0, "{}", d.name);
                assert!(q.split > 0 || q.feed.kept(), "{}: values kept where the rows are quantised", d.name);
                kept.push(unsplit(device, shape, passes).feed.kept());
            }
        }
    }
    assert!(kept.contains(&true) && kept.contains(&false), "{kept:?}");
    for k in [1536, 3072] {
        let d = qgemv::build(&qgemv::choose_gate(Device::Npu2, GemmShape { m: 1, k, n: 576 }, 2).unwrap());
        assert!(d.name.starts_with(&format!("gqgemv2_1x{k}x576_npu2")), "{}", d.name);
        mlir::verify_generic(&d.generic()).unwrap_or_else(|e| panic!("{}: {e}", d.name));
    }
}

#[test]
fn the_cost_models_pairs_epilogue_cycles_are_the_generated_codes_vector_operations() {
    for (norm, input) in [(0, qkernels::Input::Rows), (1, qkernels::Input::Norm)] {
        for passes in [1, 2] {
            let sh =
                qkernels::Shape { rows: 1, k: 64, n: 16, passes, kernel_rows: 8, input, pairs: true, stacked: false };
            let ops = innermost_ops(qkernels::dequant(sh).body.as_ref().unwrap()) as u64;
            let per_output = ops.div_ceil(qkernels::LANES as u64);
            assert_eq!(qgemv::PAIRS_EPILOGUE_CYCLES_PER_ELEMENT[norm][passes - 1], per_output, "{input:?} {passes}");
        }
    }
}

#[test]
fn the_cost_models_gate_fed_cycles_are_the_generated_codes_vector_operations() {
    for passes in [1, 2] {
        let sh = cost_shape(passes, qkernels::Input::Gate, false);
        let ops: HashMap<String, u64> = qkernels::gate_functions(sh)
            .into_iter()
            .map(|f| (f.name, innermost_ops(f.body.as_ref().unwrap()) as u64))
            .collect();
        let mut prologue =
            [qkernels::GATE_VALUES, qkernels::GATE_MAX, qkernels::GATE_CODES].iter().map(|f| ops[*f]).sum::<u64>();
        if passes == 2 {
            prologue += ops[qkernels::GATE_RESIDUAL];
        }
        let lanes = qkernels::LANES as u64;
        assert_eq!(qgemv::GATE_CYCLES_PER_ELEMENT[passes - 1], prologue.div_ceil(lanes), "{passes}: {ops:?}");
        // Without room to keep them, the values again each time the rows stream.
        let again = prologue + passes as u64 * ops[qkernels::GATE_VALUES];
        assert_eq!(qgemv::GATE_RESTREAMED_CYCLES_PER_ELEMENT[passes - 1], again.div_ceil(lanes), "{passes}");
    }
}

#[test]
fn pairs_designs_sum_a_weights_two_passes_as_the_program_does() {
    // The weight's first-pass columns then its residual columns (`first_pass_columns` = half),
    // summed in the epilogue: plain rows and a norm's, one and two activation passes.
    let (rows, k, n) = (3, 576, 192);
    let gamma = bfloat16_gamma(k, 5);
    for device in [Device::Npu1, Device::Npu2] {
        for passes in [1, 2] {
            let case = Case::new((rows, k, n), passes, n / 2, 41);
            let (y, width) = case.pairs_on_array(device, 8, None);
            assert_eq!(bits(&columns(&y, (rows, n / 2), width)), bits(&group(&case.reference(), (rows, n))));
            let (y, width) = case.pairs_on_array(device, 8, Some((&gamma, 1e-5)));
            let want = group(&case.norm_reference(&gamma, 1e-5), (rows, n));
            assert_eq!(bits(&columns(&y, (rows, n / 2), width)), bits(&want), "{device}, {passes} passes, norm");
        }
    }
}

#[test]
fn the_mlp_runs_as_two_calls_with_the_hidden_state_between_them_untouched() {
    // Decode's MLP: the residual stream's row and γ into the norm-fed gate/up design, whose
    // output buffer — the gate's row, then the up's — is, unread and unchanged, the gate-fed
    // down design's rows operand. Bit for bit with the program's ops: InverseRms,
    // QuantizeRows(x, γ), Mul, QGemm, the passes' Add, QuantizeSwiGlu, QGemm.
    let (hidden, inter, out) = (576, 256, 64);
    let gamma = bfloat16_gamma(hidden, 7);
    for device in [Device::Npu1, Device::Npu2] {
        let gate_up = Case::new((1, hidden, 4 * inter), 2, 2 * inter, 51);
        let (y, _) = gate_up.pairs_on_array(device, 1, Some((&gamma, 1e-5)));
        let q = qgemv::choose_gate(device, GemmShape { m: 1, k: inter, n: out }, 2).unwrap();
        assert_eq!((q.tiling.padded.m, q.tiling.padded.k), (1, inter), "{device}: the operand is the buffer");
        let d = qgemv::build(&q);
        let w = values(inter * out, 52);
        let sw: Vec<f32> = xorshift(53).take(out).map(|x| ((x >> 40) as f32 + 1.0) * 1e-7).collect();
        let packed = qgemv::pack(&q, (&w, inter, out), (0, out), &sw, &|_| false);
        let (got, _) = interp::run_args(&d.generic(), &[interp::Arg::F32(&y[..2 * inter]), interp::Arg::I8(&packed)])
            .unwrap_or_else(|e| panic!("{}: {e}", d.name));
        let got: Vec<f32> = got[..out].iter().map(|&b| f32::from_bits(b as u32)).collect();
        let gu = group(&gate_up.norm_reference(&gamma, 1e-5), (1, 4 * inter));
        let mut down = Case::new((1, inter, out), 2, 0, 54);
        (down.x, down.w, down.sw) = (gu[..inter].to_vec(), w, sw);
        let want = down.gate_reference(&gu[inter..]);
        assert_eq!(bits(&got), bits(&want), "{device}");
        assert!(want.iter().all(|v| v.is_finite() && *v != 0.0), "{want:?}");
    }
}

/// An array program, its f32 operands (rows, the buffer between the phases), its weights, and
/// the program's answer.
struct ProgramCase {
    program: ArrayProgram,
    rows: [Vec<f32>; 2],
    weights: [Vec<i8>; 2],
    want: Vec<f32>,
}

/// Decode's MLP as one array program (`codegen_aie::sequence`): the norm-fed gate/up pairs
/// design, then the gate-fed down pairs design on the buffer the first wrote, in one runtime
/// sequence that configures each in turn.
fn mlp_program(device: Device, (hidden, inter, out): (usize, usize, usize)) -> ProgramCase {
    let gamma = bfloat16_gamma(hidden, 7);
    let gate_up = Case::new((1, hidden, 4 * inter), 2, 2 * inter, 61);
    let norm = qgemv::Feed::Norm { epsilon: 1e-5, sum: false };
    let q1 = qgemv::choose_pairs(device, GemmShape { m: 1, k: hidden, n: 2 * inter }, 2, norm).unwrap();
    let gate = qgemv::Feed::Gate { kept: true };
    let q2 = qgemv::choose_pairs(device, GemmShape { m: 1, k: inter, n: out }, 2, gate).unwrap();
    assert_eq!((q2.tiling.padded.m, q2.tiling.padded.k), (1, inter), "{device}: the gate's rows are the buffer's");
    let gu = group(&gate_up.norm_reference(&gamma, 1e-5), (1, 4 * inter));
    let mut down = Case::new((1, inter, 2 * out), 2, out, 62);
    down.x = gu[..inter].to_vec();
    let want = group(&down.gate_reference(&gu[inter..]), (1, 2 * out));
    let x = qgemv::rows_operand(&q1, (&gate_up.x, hidden), Some(&gamma));
    let w1 = qgemv::pack(&q1, (&gate_up.w, hidden, 4 * inter), (0, 2 * inter), &gate_up.sw, &|_| false);
    let w2 = qgemv::pack(&q2, (&down.w, inter, 2 * out), (0, out), &down.sw, &|_| false);
    let program = sequence::mlp(&q1, &q2).unwrap();
    let between = vec![f32::NAN; program.buffers[2].0];
    ProgramCase { program, rows: [x, between], weights: [w1, w2], want }
}

#[test]
fn the_mlp_is_one_array_program_its_hidden_state_staying_on_the_array_between_the_phases() {
    for device in [Device::Npu1, Device::Npu2] {
        let ProgramCase { program, rows: [x, between], weights: [w1, w2], want } = mlp_program(device, (576, 256, 64));
        let text = program.generic();
        let args = [interp::Arg::F32(&x), interp::Arg::I8(&w1), interp::Arg::F32(&between), interp::Arg::I8(&w2)];
        let (y, stats) = interp::run_args(&text, &args).unwrap_or_else(|e| panic!("{device}: {e}"));
        let got: Vec<f32> = y[..want.len()].iter().map(|&b| f32::from_bits(b as u32)).collect();
        assert_eq!(bits(&got), bits(&want), "{device}");
        assert!(want.iter().all(|v| v.is_finite() && *v != 0.0), "{want:?}");
        // The buffer between the phases came in as NaN: the down phase read what gate/up wrote.
        let ran = |f: &str| stats.calls.get(f).copied().unwrap_or(0);
        assert!(ran(qkernels::NORM_SQUARES) > 0 && ran(qkernels::GATE_VALUES) > 0, "{:?}", stats.calls);
        if let Ok(version) = mlir::version() {
            mlir::verify_generic(&text).unwrap_or_else(|e| panic!("{device}: MLIR {version}: {e}"));
        }
    }
}

#[test]
fn the_layer_after_attention_is_one_array_program_with_the_residual_sum_on_the_array() {
    // o (rows-fed pairs) writes its row into the sum-fed gate/up design's rows operand, whose
    // cores add the residual stream's row, normalise and project; down follows on the row
    // gate/up wrote. The program's output and the sum against the program's ops.
    let (hidden, attn, inter, out) = (576, 576, 256, 64);
    for device in [Device::Npu1, Device::Npu2] {
        let gamma = bfloat16_gamma(hidden, 9);
        let o = Case::new((1, attn, 2 * hidden), 2, hidden, 81);
        let x = activations(hidden, 82);
        let h: Vec<f32> = x.iter().zip(group(&o.reference(), (1, 2 * hidden))).map(|(a, b)| a + b).collect();
        let mut gate_up = Case::new((1, hidden, 4 * inter), 2, 2 * inter, 83);
        gate_up.x = h.clone();
        let gu = group(&gate_up.norm_reference(&gamma, 1e-5), (1, 4 * inter));
        let mut down = Case::new((1, inter, 2 * out), 2, out, 84);
        down.x = gu[..inter].to_vec();
        let want = group(&down.gate_reference(&gu[inter..]), (1, 2 * out));
        let rows = qgemv::Feed::Rows;
        let q0 = qgemv::choose_pairs(device, GemmShape { m: 1, k: attn, n: hidden }, 2, rows).unwrap();
        let sum = qgemv::Feed::Norm { epsilon: 1e-5, sum: true };
        let q1 = qgemv::choose_pairs(device, GemmShape { m: 1, k: hidden, n: 2 * inter }, 2, sum).unwrap();
        let gate = qgemv::Feed::Gate { kept: true };
        let q2 = qgemv::choose_pairs(device, GemmShape { m: 1, k: inter, n: out }, 2, gate).unwrap();
        let program = sequence::layer(&q0, &q1, &q2).unwrap();
        let a = qgemv::rows_operand(&q0, (&o.x, attn), None);
        let mut residual = q1.layout().rows_operand((&x, hidden), Some(&gamma), Some(&vec![0.0; hidden])).unwrap();
        residual.resize(program.buffers[2].0, 0.0);
        let between = vec![f32::NAN; program.buffers[4].0];
        let w0 = qgemv::pack(&q0, (&o.w, attn, 2 * hidden), (0, hidden), &o.sw, &|_| false);
        let w1 = qgemv::pack(&q1, (&gate_up.w, hidden, 4 * inter), (0, 2 * inter), &gate_up.sw, &|_| false);
        let w2 = qgemv::pack(&q2, (&down.w, inter, 2 * out), (0, out), &down.sw, &|_| false);
        let args = [&a[..], &residual, &between].map(interp::Arg::F32);
        let args = [args[0], interp::Arg::I8(&w0), args[1], interp::Arg::I8(&w1), args[2], interp::Arg::I8(&w2)];
        let (after, stats) = interp::run_buffers(&program.generic(), &args).unwrap_or_else(|e| panic!("{device}: {e}"));
        let f32s = |b: &[i32], n: usize| b[..n].iter().map(|&w| f32::from_bits(w as u32)).collect::<Vec<f32>>();
        assert_eq!(bits(&f32s(&after[6], out)), bits(&want), "{device}: the MLP's output");
        assert_eq!(bits(&f32s(&after[7], hidden)), bits(&h), "{device}: the residual stream's sum");
        assert_eq!(stats.calls[qkernels::SUM], q1.split as u64, "{device}: each prologue core adds its slice");
        if let Ok(version) = mlir::version() {
            mlir::verify_generic(&program.generic()).unwrap_or_else(|e| panic!("{device}: MLIR {version}: {e}"));
        }
    }
}

#[test]
fn a_program_whose_buffers_do_not_fit_its_designs_is_refused_by_name() {
    let program = mlp_program(Device::Npu1, (576, 256, 64)).program;
    let mut buffers = program.buffers.clone();
    buffers[2].0 = 16;
    let phases: Vec<Phase> = program.phases.into_iter().collect();
    let err = ArrayProgram::new("mlp", buffers, phases).err().unwrap().to_string();
    assert!(err.contains("program mlp: design ") && err.contains("argument 2") && err.contains("buffer 2"), "{err}");
    // A down design whose rows are not the gate/up design's halves.
    let gate = qgemv::Feed::Gate { kept: true };
    let norm = qgemv::Feed::Norm { epsilon: 1e-5, sum: false };
    let gate_up = qgemv::choose_pairs(Device::Npu1, GemmShape { m: 1, k: 576, n: 512 }, 2, norm).unwrap();
    let down = qgemv::choose_pairs(Device::Npu1, GemmShape { m: 1, k: 128, n: 64 }, 2, gate).unwrap();
    let err = sequence::mlp(&gate_up, &down).err().unwrap().to_string();
    assert!(err.contains("reads rows of 128 values") && err.contains("the gate's 256 then the up's"), "{err}");
}

/// A decode layer's projections as chained designs take them, and the lm_head's chunks: (K, N
/// outputs, what feeds the rows, whether the weight's two passes are summed on the cores).
fn chained_projections(
    hidden: usize,
    qkv: usize,
    attn: usize,
    inter: usize,
    head_chunk: usize,
) -> Vec<(usize, usize, &'static str, bool)> {
    vec![
        (hidden, qkv, "norm", true),
        (attn, hidden, "rows", true),
        (hidden, 2 * inter, "norm", true),
        (inter, hidden, "gate", true),
        (hidden, head_chunk, "norm", false),
    ]
}

#[test]
fn every_decode_projection_of_smollm2_and_qwen3_has_a_chained_design_the_checker_accepts() {
    // Decode's one row, two activation passes: q/k/v and gate/up fed by their norms, o by the
    // attention's rows, down by the gate, each summing its weight's two passes; the lm_head (one
    // weight pass) fed by the final norm, in the plan's GEMV column chunks (SmolLM2's 49,152 as
    // three, Qwen3's 151,936 as ten).
    let smollm2 = chained_projections(576, 960, 576, 1536, 16384);
    let qwen3 = chained_projections(1024, 4096, 2048, 3072, 15194);
    let mut names = vec![];
    for device in [Device::Npu1, Device::Npu2] {
        for &(k, n, feed, pairs) in smollm2.iter().chain(&qwen3) {
            let shape = GemmShape { m: 1, k, n };
            let q = match (feed, pairs) {
                ("norm", true) => {
                    qgemv::choose_pairs(device, shape, 2, qgemv::Feed::Norm { epsilon: 1e-6, sum: false })
                }
                ("norm", false) => qgemv::choose_norm(device, shape, 2, 1e-6),
                ("gate", _) => qgemv::choose_pairs(device, shape, 2, qgemv::Feed::Gate { kept: true }),
                _ => qgemv::choose_pairs(device, shape, 2, qgemv::Feed::Rows),
            }
            .unwrap_or_else(|e| panic!("{device} {k}x{n} {feed}: {e}"));
            let d = qgemv::build(&q);
            design::check(&d).unwrap_or_else(|e| panic!("{}: {e}", d.name));
            assert_eq!(q.kernel_rows, device.micro_tile().0, "{}: the vector kernel", d.name);
            names.push(d.name);
        }
    }
    assert_eq!(names.len(), 20);
    assert!(names.iter().filter(|n| n.ends_with("_pairs")).count() == 16, "{names:?}");
}

#[test]
fn a_norm_fed_design_refuses_rows_the_aligned_sum_cannot_take() {
    let long = ir::pinned_norm::ALIGNED_MAX_D + 32;
    let err = qgemv::choose_norm(Device::Npu2, GemmShape { m: 1, k: long, n: 64 }, 2, 1e-5).unwrap_err().to_string();
    assert!(err.contains(&format!("1x{long}x64")) && err.contains("at most 16352"), "{err}");
}

fn sites(shapes: &[(usize, usize)]) -> Vec<GemmSite> {
    shapes.iter().enumerate().map(|(i, &(k, n))| GemmSite::of_shape(&format!("p{i}"), k, n)).collect()
}

#[test]
fn the_plans_gemv_chunks_of_smollm2_and_qwen3_have_qgemv_designs_the_checker_accepts() {
    // Each model's projections (K, N) as its plan chunks them for decode, the lm_head included.
    let smollm2 = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)];
    let qwen3 = [(1024, 2048), (1024, 1024), (2048, 1024), (1024, 3072), (3072, 1024), (1024, 151936)];
    let mut checked = 0;
    for device in [Device::Npu1, Device::Npu2] {
        // A decode step's one row everywhere; 8-row blocks where their codes fit a core beside
        // the weights (SmolLM2's K ≤ 1,536: Qwen3's K 3,072 in two passes is 48 KiB of codes).
        for (shapes, block) in [(&smollm2[..], &[1, 8][..]), (&qwen3[..], &[1][..])] {
            let p = plan::plan_sites(sites(shapes), PlanOptions::new(device)).unwrap();
            for c in p.gemms.iter().flat_map(|g| g.gemv_chunks.iter().map(move |c| (g.site.k, c.cols))) {
                for &rows in block {
                    let q = qgemv::choose(device, GemmShape { m: rows, k: c.0, n: c.1 }, 2)
                        .unwrap_or_else(|e| panic!("{device} {rows}x{}x{}: {e}", c.0, c.1));
                    let d = qgemv::build(&q);
                    assert!(matches!(d.kind, Kind::QGemv { passes: 2, .. }), "{}", d.name);
                    // Every one of these fits the GEMV kernel's vector form: its rows a whole
                    // number of micro-tile rows, the one activation row padded.
                    let rows = if q.stacked { 2 * rows } else { rows };
                    assert_eq!(q.kernel_rows, rows.next_multiple_of(device.micro_tile().0), "{}", d.name);
                    assert!(d.generic().contains("\"vector.contract\""), "{}", d.name);
                    design::check(&d).unwrap_or_else(|e| panic!("{}: {e}", d.name));
                    assert!(
                        d.pretty().contains(" = aie.buffer("),
                        "{}: the codes live in the cores' own buffers",
                        d.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 2 * (2 * 5 + 6), "{checked} designs");
}

#[test]
fn mlir_verifies_the_core_code_of_qgemv_designs() {
    // MLIR 22 verifies the f32, cast, compare and select operations of the cores' functions as
    // the real `arith`, `math`, `scf` and `memref` operations.
    for device in [Device::Npu1, Device::Npu2] {
        for (passes, (k, n)) in [(1, (576, 960)), (2, (1536, 1152))] {
            let d = qgemv::build(&qgemv::choose(device, GemmShape { m: 1, k, n }, passes).unwrap());
            mlir::verify_generic(&d.generic()).unwrap_or_else(|e| panic!("{}: {e}", d.name));
        }
    }
}

#[test]
fn a_shift_past_the_width_is_poison_and_an_error() {
    // The codes' right shift is clamped to 31 (in every lane); with the clamp at 40 a value 2⁻³⁰
    // of its row's scale shifts an i32 by more than its width, which MLIR makes poison.
    let sh = qkernels::Shape {
        rows: 1,
        k: 8,
        n: 8,
        passes: 1,
        kernel_rows: 1,
        input: qkernels::Input::Rows,
        pairs: false,
        stacked: false,
    };
    let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", qkernels::codes(sh).generic(2));
    let clamp = "{value = dense<31> : vector<1x8xi32>}";
    assert_eq!(text.matches(clamp).count(), 1, "one shift clamp");
    let run = |text: &str| {
        let funcs = interp::module_functions(text, true).unwrap();
        let x: Vec<i32> =
            [1.0f32, 1.0e-9, 0.5, 0.0, -1.0, 0.25, 0.75, 1.0].iter().map(|v| v.to_bits() as i32).collect();
        let rs = [1.0f32, 2f32.powi(-6), 0.0, 0.0].iter().map(|v| v.to_bits() as i32).collect();
        let mut mems = vec![x, rs, vec![0; 8]];
        funcs[0].call(&mut mems).map(|()| mems.pop().unwrap())
    };
    assert_eq!(run(&text).unwrap(), vec![64, 0, 32, 0, -64, 16, 48, 64]);
    let err = run(&text.replace(clamp, "{value = dense<40> : vector<1x8xi32>}")).unwrap_err().to_string();
    assert!(err.contains("shift by 40 of an i32 is poison") && err.contains("@q_codes"), "{err}");
}

/// The core shape the cost tests count operations in: one row, K 64, 16 columns.
fn cost_shape(passes: usize, input: qkernels::Input, pairs: bool) -> qkernels::Shape {
    qkernels::Shape { rows: 1, k: 64, n: 16, passes, kernel_rows: 8, input, pairs, stacked: false }
}

/// Operations a statement list runs once per iteration of its innermost loop, constants aside
/// (a compiler hoists them): the loop's own body.
fn innermost_ops(body: &[Stmt]) -> usize {
    match body.iter().rev().find_map(|s| if let Stmt::For { body, .. } = s { Some(body) } else { None }) {
        Some(inner) => innermost_ops(inner),
        None => body.iter().filter(|s| !matches!(s, Stmt::Const { .. } | Stmt::FConst { .. })).count(),
    }
}

#[test]
fn the_cost_models_prologue_and_epilogue_cycles_are_the_generated_codes_vector_operations() {
    let lanes = qkernels::LANES as u64;
    for passes in [1, 2] {
        let sh = cost_shape(passes, qkernels::Input::Rows, false);
        let ops: HashMap<String, u64> = qkernels::functions(sh)
            .into_iter()
            .map(|f| (f.name, innermost_ops(f.body.as_ref().unwrap()) as u64))
            .collect();
        let per_output = ops[qkernels::DEQUANT].div_ceil(lanes);
        assert_eq!(qgemv::EPILOGUE_CYCLES_PER_ELEMENT[passes - 1], per_output, "{passes} passes: {ops:?}");
        let first = (ops[qkernels::ABSMAX] + ops[qkernels::CODES]).div_ceil(lanes);
        assert_eq!(qgemv::FIRST_PASS_CYCLES_PER_ELEMENT, first, "{ops:?}");
        if passes == 2 {
            let residual = (ops[qkernels::RESIDUAL_MAX] + ops[qkernels::RESIDUAL]).div_ceil(lanes);
            assert_eq!(qgemv::RESIDUAL_PASS_CYCLES_PER_ELEMENT, residual, "{ops:?}");
        }
    }
}

#[test]
fn the_cost_models_exchange_cycles_are_the_generated_codes_operations() {
    let ex = qkernels::Exchange { cores: 4, slice: 64, rows: 1, passes: 2, input: qkernels::Input::Rows };
    let ops = |f: codegen_aie::kernels::Function| innermost_ops(f.body.as_ref().unwrap()) as u64;
    assert_eq!(qgemv::COMBINE_CYCLES_PER_SLOT, ops(qkernels::combine(ex, 1)));
    assert_eq!(qgemv::SHARE_CYCLES_PER_ROW, ops(qkernels::share(ex)));
    let sh = cost_shape(2, qkernels::Input::Rows, false);
    assert_eq!(qgemv::UNPACK_CYCLES_PER_BLOCK, ops(qkernels::unpack(ex, sh, 4)));
}

#[test]
fn the_cost_models_norm_fed_cycles_are_the_generated_codes_vector_operations() {
    // A 32-lane operation (the squares') is four 8-lane cycles for 32 values: per value, every
    // function's operations over 8. The root and the row scales' products are once a row (their
    // functions have no loop inside the rows').
    for passes in [1, 2] {
        let sh = cost_shape(passes, qkernels::Input::Norm, false);
        let ops: HashMap<String, u64> = qkernels::norm_functions(sh, 64, 1e-5)
            .unwrap()
            .into_iter()
            .map(|f| (f.name, innermost_ops(f.body.as_ref().unwrap()) as u64))
            .collect();
        let mut prologue = [qkernels::NORM_TOP, qkernels::PRODUCT_MAX, qkernels::PRODUCT_CODES, qkernels::NORM_SQUARES]
            .iter()
            .map(|f| ops[*f])
            .sum::<u64>();
        if passes == 2 {
            prologue += ops[qkernels::PRODUCT_RESIDUAL];
        }
        let lanes = qkernels::LANES as u64;
        assert_eq!(qgemv::NORM_CYCLES_PER_ELEMENT[passes - 1], prologue.div_ceil(lanes), "{passes}: {ops:?}");
        let epilogue = ops[qkernels::DEQUANT].div_ceil(lanes);
        assert_eq!(qgemv::NORM_EPILOGUE_CYCLES_PER_ELEMENT[passes - 1], epilogue, "{passes}: {ops:?}");
        let once = ops[qkernels::NORM_ROOT] + ops[qkernels::NORM_RESCALE];
        assert_eq!(qgemv::NORM_ROW_CYCLES[passes - 1], once, "{passes}: {ops:?}");
    }
    let sum = qkernels::sum(cost_shape(1, qkernels::Input::SumNorm, false));
    let per_element = (innermost_ops(sum.body.as_ref().unwrap()) as u64).div_ceil(qkernels::LANES as u64);
    assert_eq!(qgemv::SUM_CYCLES_PER_ELEMENT, per_element);
}

#[test]
fn a_k_too_short_for_the_epilogues_scale_reads_is_refused_by_name() {
    let err = qgemv::choose(Device::Npu1, GemmShape { m: 1, k: 24, n: 64 }, 1).unwrap_err().to_string();
    assert!(err.contains("1x24x64") && err.contains("K must be at least 32"), "{err}");
    assert!(qgemv::choose(Device::Npu1, GemmShape { m: 1, k: 32, n: 64 }, 1).is_ok());
}
