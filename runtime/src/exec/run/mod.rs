//! One step's interpreters: [`Executor::prepare`] evaluates every value's shape for the step and
//! grows the buffers to fit; [`Executor::run_op`] runs one op of the plan — an integer op into its
//! i64 buffer (`integer`), a quantised op into its code or f32 buffers (`quantised`), or an op with
//! f32 outputs, whose buffers are taken out of the list while it runs (`float`, and the 4-bit
//! weight-only ops of `quantised`).

/// A [`View`] of an executor's buffers, borrowing only the fields it reads, so the others
/// (code buffers, scratch, a buffer taken out for writing) stay free to change.
macro_rules! view {
    ($e:expr) => {
        View {
            plan: &$e.plan,
            bufs: &$e.bufs,
            shapes: &$e.shapes,
            ids: &$e.ids,
            positions: &$e.positions,
            ibufs: &$e.ibufs,
        }
    };
}

mod delta_chunk;
mod float;
mod integer;
mod moe;
#[cfg(feature = "openvino")]
pub(crate) use moe::{activate as expert_activate, route as route_experts};
pub(crate) use recurrent::DeltaScratch;
#[cfg(feature = "openvino")]
pub(crate) use recurrent::{conv_channel, delta_rule_rows, l2_normalize_rows, LinearInputs};
mod quantised;
mod recurrent;
mod router;

pub(super) use moe::MoeScratch;

use super::error::ExecError;
use super::plan::{Loc, Op, Plan};
use super::program::StepDims;
use super::Executor;

/// Read access to the values of the current step.
/// Read access to the values of the current step.
struct View<'a, 'b> {
    plan: &'a Plan<'b>,
    bufs: &'a [Vec<f32>],
    shapes: &'a [Vec<usize>],
    ids: &'a [i64],
    positions: &'a [i64],
    ibufs: &'a [Vec<i64>],
}

impl<'a> View<'a, '_> {
    fn f32(&self, v: usize) -> &'a [f32] {
        let n = numel(&self.shapes[v]);
        match self.plan.locs[v] {
            Loc::Buf(b) => &self.bufs[b][..n],
            Loc::Weight(i) => self.plan.weights[i],
            Loc::ConstF32(i) => &self.plan.consts_f32[i],
            other => unreachable!("value {v} at {other:?} is not f32 (checked at load)"),
        }
    }

    fn i64(&self, v: usize) -> &'a [i64] {
        match self.plan.locs[v] {
            Loc::Ids => self.ids,
            Loc::Positions => self.positions,
            Loc::ConstI64(i) => &self.plan.consts_i64[i],
            Loc::I64Buf(i) => &self.ibufs[i],
            other => unreachable!("value {v} at {other:?} is not i64 (checked at load)"),
        }
    }
}

impl Executor<'_> {
    /// The current step's f32 value `v` (a buffer, weight or constant).
    pub(super) fn f32_value(&self, v: usize) -> &[f32] {
        view!(self).f32(v)
    }

    /// Evaluates every value's shape for the step and grows the buffers to fit.
    pub(super) fn prepare(&mut self, dims: StepDims) {
        for (v, info) in self.plan.program.values.iter().enumerate() {
            let shape = &mut self.shapes[v];
            shape.clear();
            shape.extend(info.shape.iter().map(|d| d.eval(dims)));
        }
        for (_, op) in &self.plan.ops {
            let (outputs, rows_one): (&[usize], bool) = match op {
                Op::MatMul { out, last_row_only, .. } | Op::WGemm { out, last_row_only, .. } => {
                    (std::slice::from_ref(out), *last_row_only && !self.every_row_logits)
                }
                Op::Int { .. } | Op::TopK { .. } => continue,
                Op::QuantizeRows { x, k, codes, scales, stacked, .. } => {
                    let n = numel(&self.shapes[*x]) * if *stacked { 2 } else { 1 };
                    let Loc::QBuf(b) = self.plan.locs[*codes] else { unreachable!("codes live in code buffers") };
                    if self.qbufs[b].len() < n {
                        self.qbufs[b].resize(n, 0);
                    }
                    grow(&mut self.bufs, self.plan.locs[*scales], n / k);
                    continue;
                }
                Op::Quantize { out, .. } | Op::QGemm { out, requant: Some(_), .. } => {
                    let Loc::QBuf(b) = self.plan.locs[*out] else { unreachable!("codes live in code buffers") };
                    let n = numel(&self.shapes[*out]);
                    if self.qbufs[b].len() < n {
                        self.qbufs[b].resize(n, 0);
                    }
                    continue;
                }
                Op::Dequantize { out, .. } | Op::QGemm { out, requant: None, .. } => (std::slice::from_ref(out), false),
                Op::GatherNBits { out, .. } | Op::Slice { out, .. } | Op::Concat { out, .. } => {
                    (std::slice::from_ref(out), false)
                }
                Op::SkipRmsNorm { x, y, sum, .. } => {
                    grow(&mut self.bufs, self.plan.locs[*y], numel(&self.shapes[*y]));
                    match sum {
                        Some(s) => grow(&mut self.bufs, self.plan.locs[*s], numel(&self.shapes[*s])),
                        None => {
                            let n = numel(&self.shapes[*x]);
                            if self.sum_scratch.len() < n {
                                self.sum_scratch.resize(n, 0.0);
                            }
                        }
                    }
                    continue;
                }
                op => match op.float_output() {
                    Some(out) => (std::slice::from_ref(out), false),
                    None => unreachable!("every op has a sizing rule"),
                },
            };
            for &o in outputs {
                let n = if rows_one { self.shapes[o].last().copied().unwrap_or(1) } else { numel(&self.shapes[o]) };
                grow(&mut self.bufs, self.plan.locs[o], n);
            }
        }
    }

    pub(super) fn run_op(&mut self, index: usize) -> Result<(), ExecError> {
        let (first, second) = match &self.plan.ops[index].1 {
            Op::Int { out, .. } => {
                let Loc::I64Buf(b) = self.plan.locs[*out] else { unreachable!("integer ops write i64 buffers") };
                let mut y = std::mem::take(&mut self.ibufs[b]);
                let result = self.compute_int(index, &mut y);
                self.ibufs[b] = y;
                return result;
            }
            Op::Quantize { .. } | Op::QuantizeRows { .. } | Op::Dequantize { .. } | Op::QGemm { .. } => {
                return self.run_quantised(index)
            }
            Op::TopK { .. } => return self.run_top_k(index),
            Op::WGemm { out, .. } | Op::GatherNBits { out, .. } | Op::Slice { out, .. } | Op::Concat { out, .. } => {
                (*out, None)
            }
            Op::MatMul { out, .. } => (*out, None),
            Op::SkipRmsNorm { y, sum, .. } => (*y, Some(*sum)),
            op => match op.float_output() {
                Some(out) => (*out, None),
                None => unreachable!("every op has a run rule"),
            },
        };
        // Outputs are taken out of the buffer list while the op runs; no input shares their
        // buffers (see `assign_buffers`).
        let mut y = take(&mut self.bufs, self.plan.locs[first]);
        let mut y2 = match second {
            Some(Some(s)) => take(&mut self.bufs, self.plan.locs[s]),
            Some(None) => std::mem::take(&mut self.sum_scratch),
            None => Vec::new(),
        };
        let result = self.compute(index, &mut y, &mut y2);
        put(&mut self.bufs, self.plan.locs[first], y);
        match second {
            Some(Some(s)) => put(&mut self.bufs, self.plan.locs[s], y2),
            Some(None) => self.sum_scratch = y2,
            None => {}
        }
        result
    }

    /// Runs an op with f32 outputs into `y` (and `y2`, SkipRmsNorm's sum).
    fn compute(&mut self, index: usize, y: &mut [f32], y2: &mut [f32]) -> Result<(), ExecError> {
        match &self.plan.ops[index].1 {
            Op::Gather { .. } => self.run_gather(index, y),
            Op::GatherColumns { .. } => self.run_gather_columns(index, y),
            Op::MatMul { .. } => self.run_matmul(index, y),
            Op::Transpose { .. } => self.run_transpose(index, y),
            Op::Slice { .. } => self.run_slice(index, y),
            Op::Concat { .. } => self.run_concat(index, y),
            Op::RmsNorm { .. } => self.run_rms_norm(index, y),
            Op::InverseRms { .. } => self.run_inverse_rms(index, y),
            Op::SkipRmsNorm { .. } => self.run_skip_rms_norm(index, y, y2),
            Op::Rope { .. } => self.run_rope(index, y),
            Op::Gate { .. } => self.run_gate(index, y),
            Op::BinaryF32 { .. } => self.run_binary(index, y),
            Op::Attention { .. } => self.run_attention(index, y),
            Op::WGemm { .. } => self.run_wgemm(index, y),
            Op::GatherNBits { .. } => self.run_gather_nbits(index, y),
            Op::CausalConv { .. } => self.run_causal_conv(index, y),
            Op::LinearAttention { .. } => self.run_linear_attention(index, y),
            Op::GatedRmsNorm { .. } => self.run_gated_rms_norm(index, y),
            Op::MRope { .. } => self.run_m_rope(index, y),
            Op::Moe { .. } => self.run_moe(index, y),
            Op::Unary { .. }
            | Op::Div { .. }
            | Op::RowScale { .. }
            | Op::ReduceLast { .. }
            | Op::Elements { .. }
            | Op::Fill { .. } => self.run_router(index, y),
            Op::TopK { .. } => unreachable!("run by run_top_k"),
            Op::DecayGate { .. } | Op::Sigmoid { .. } | Op::GatedAdd { .. } | Op::L2Norm { .. } => {
                self.run_gates(index, y)
            }
            Op::Int { .. } => unreachable!("run by compute_int"),
            Op::Quantize { .. } | Op::QuantizeRows { .. } | Op::Dequantize { .. } | Op::QGemm { .. } => {
                unreachable!("run by run_quantised")
            }
        }
    }
}

/// `ids` as table rows of `rows` (negative ids count from the end), into `out`.
fn row_ids(ids: &[i64], rows: usize, out: &mut Vec<u32>) -> Result<(), String> {
    out.clear();
    for &i in ids {
        let row = if i < 0 { i + rows as i64 } else { i };
        out.push(u32::try_from(row).map_err(|_| format!("index {i} is outside {rows} rows"))?);
    }
    Ok(())
}

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn grow(bufs: &mut [Vec<f32>], loc: Loc, n: usize) {
    if let Loc::Buf(b) = loc {
        if bufs[b].len() < n {
            bufs[b].resize(n, 0.0);
        }
    }
}

fn take(bufs: &mut [Vec<f32>], loc: Loc) -> Vec<f32> {
    let Loc::Buf(b) = loc else { unreachable!("outputs live in buffers") };
    std::mem::take(&mut bufs[b])
}

fn put(bufs: &mut [Vec<f32>], loc: Loc, buf: Vec<f32>) {
    let Loc::Buf(b) = loc else { unreachable!("outputs live in buffers") };
    bufs[b] = buf;
}

fn check_rows(fail: &impl Fn(String) -> ExecError, len: usize, width: usize, what: &str) -> Result<(), ExecError> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(fail(format!("{what} of {width} values does not match rows of the input ({len} values)")));
    }
    Ok(())
}

/// The rows of `k` values a product reads from activation `x` — only the last when
/// `last_row_only` — and how many there are.
fn product_rows<'x>(
    fail: &impl Fn(String) -> ExecError,
    x: &'x [f32],
    k: usize,
    last_row_only: bool,
) -> Result<(&'x [f32], usize), ExecError> {
    if !x.len().is_multiple_of(k) {
        return Err(fail(format!("the activation holds {} values, not rows of {k}", x.len())));
    }
    let m = x.len() / k;
    Ok(if last_row_only && m > 1 { (&x[(m - 1) * k..], 1) } else { (x, m) })
}

fn as_i8(bytes: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
}

fn as_i8_mut(bytes: &mut [u8]) -> &mut [i8] {
    // SAFETY: as in `as_i8`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<i8>(), bytes.len()) }
}
