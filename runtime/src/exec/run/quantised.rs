//! The quantised ops of a step: the weight-only 4-bit ops (WGemm, GatherBlockQuantized), whose
//! f32 output [`Executor::run_op`] has taken out of the buffer list, and the A8W8 ops
//! (QuantizeLinear, QuantizeRows, DequantizeLinear, QGemm), which read and write code buffers
//! themselves. A QGemm's products come from the [`GemmOffload`](crate::exec::GemmOffload) when it
//! takes the call, and the kernels' own epilogue applies to them.

use super::{as_i8, as_i8_mut, numel, product_rows, row_ids, View};
use crate::exec::error::{node_fail, ExecError};
use crate::exec::plan::{Loc, NBitsTable, Op, RowValues, StackedPasses};
use crate::exec::Executor;
use crate::kernels::qgemm::{self, AScale, QActivations, QOutput};
use crate::kernels::wgemm::{self, WGemmPrecision};
use crate::kernels::{embed, quantize};

/// The code buffer of value `v`.
fn qbuf(locs: &[Loc], v: usize) -> usize {
    match locs[v] {
        Loc::QBuf(b) => b,
        other => unreachable!("codes at {other:?} (checked at load)"),
    }
}

/// Codes as the QGemm kernels take them.
fn activations(codes: &[u8], signed: bool) -> QActivations<'_> {
    if signed {
        QActivations::I8(as_i8(codes))
    } else {
        QActivations::U8(codes)
    }
}

impl Executor<'_> {
    pub(super) fn run_wgemm(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::WGemm { a, packed, bias, k, n, last_row_only, int8_activations, .. } = op else {
            unreachable!("a WGemm")
        };
        let fail = node_fail(node);
        let view = view!(self);
        let weights = self.plan.packed[*packed].weights();
        let (x, m) = product_rows(&fail, view.f32(*a), *k, *last_row_only && !self.every_row_logits)?;
        let b = bias.map(|b| view.f32(b));
        if b.is_some_and(|b| b.len() != *n) {
            return Err(fail(format!("the bias is not {n} values")));
        }
        let precision = if *int8_activations { WGemmPrecision::Int8Activations } else { self.wgemm_precision };
        wgemm::wgemm(self.isa, &self.pool, &weights, x, m, b, &mut y[..m * n], precision, &mut self.wgemm_scratch);
        Ok(())
    }

    pub(super) fn run_gather_nbits(&mut self, index: usize, y: &mut [f32]) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::GatherNBits { table, ids, out } = op else { unreachable!("a GatherNBits") };
        let fail = node_fail(node);
        let view = view!(self);
        let table = &self.plan.nbits_tables[*table];
        let (rows, width) = (table.rows(), table.width());
        row_ids(view.i64(*ids), rows, &mut self.gather_ids).map_err(&fail)?;
        let n = numel(&self.shapes[*out]);
        if n != self.gather_ids.len() * width {
            return Err(fail(format!("{} ids of {width} values do not fill {n}", self.gather_ids.len())));
        }
        match table {
            NBitsTable::Source(t) => embed::embed_nbits(t, &self.gather_ids, &mut y[..n])?,
            NBitsTable::Packed(w) => embed::embed_packed(w, &self.gather_ids, &mut y[..n])?,
        }
        Ok(())
    }

    /// Runs QuantizeLinear, QuantizeRows, DequantizeLinear and QGemm: codes in
    /// [`Executor::qbufs`].
    pub(super) fn run_quantised(&mut self, index: usize) -> Result<(), ExecError> {
        match &self.plan.ops[index].1 {
            Op::Quantize { .. } => self.run_quantize(index),
            Op::QuantizeRows { .. } => self.run_quantize_rows(index),
            Op::Dequantize { .. } => self.run_dequantize(index),
            Op::QGemm { .. } => self.run_qgemm(index),
            _ => unreachable!("quantised ops only"),
        }
    }

    fn run_quantize(&mut self, index: usize) -> Result<(), ExecError> {
        let Op::Quantize { x, scale, zero_point, signed, out } = self.plan.node_op(index).1 else {
            unreachable!("a Quantize")
        };
        let b = qbuf(&self.plan.locs, *out);
        let mut y = std::mem::take(&mut self.qbufs[b]);
        let input = view!(self).f32(*x);
        quantize::quantize_linear(input, *scale, *zero_point, *signed, &mut y[..input.len()]);
        self.qbufs[b] = y;
        Ok(())
    }

    fn run_quantize_rows(&mut self, index: usize) -> Result<(), ExecError> {
        let Op::QuantizeRows { x, k, codes, scales, stacked, values } = self.plan.node_op(index).1 else {
            unreachable!("a QuantizeRows")
        };
        let b = qbuf(&self.plan.locs, *codes);
        let mut y = std::mem::take(&mut self.qbufs[b]);
        let Loc::Buf(sb) = self.plan.locs[*scales] else { unreachable!("scales live in buffers") };
        let mut row_scales = std::mem::take(&mut self.bufs[sb]);
        let input = view!(self).f32(*x);
        let (n, rows) = (input.len(), input.len() / *k);
        if let RowValues::TimesGamma(g) = values {
            quantize::quantize_product_rows(input, view!(self).f32(*g), *stacked, &mut y, &mut row_scales);
        } else if let RowValues::IntegerGate(u) = values {
            quantize::quantize_gate_rows(self.isa, (input, view!(self).f32(*u)), *k, *stacked, &mut y, &mut row_scales);
        } else {
            let (first, residual) = y.split_at_mut(n);
            let (first_scales, residual_scales) = row_scales.split_at_mut(rows);
            quantize::quantize_rows(input, *k, first, first_scales);
            if *stacked {
                let first = (&*first, &*first_scales);
                quantize::quantize_rows_residual(input, *k, first, &mut residual[..n], &mut residual_scales[..rows]);
            }
        }
        self.bufs[sb] = row_scales;
        self.qbufs[b] = y;
        Ok(())
    }

    fn run_dequantize(&mut self, index: usize) -> Result<(), ExecError> {
        let Op::Dequantize { x, scale, zero_point, signed, out } = self.plan.node_op(index).1 else {
            unreachable!("a Dequantize")
        };
        let codes = &self.qbufs[qbuf(&self.plan.locs, *x)][..numel(&self.shapes[*x])];
        let Loc::Buf(b) = self.plan.locs[*out] else { unreachable!("outputs live in buffers") };
        quantize::dequantize_linear(codes, *scale, *zero_point, *signed, &mut self.bufs[b][..codes.len()]);
        Ok(())
    }

    /// QGemm: the products from the offload when it takes the call, else the kernel; the
    /// output requantised into codes or f32. A QGemm of stacked passes is one call of every
    /// pass's rows, each output row then the sum of its passes' products (in pass order).
    fn run_qgemm(&mut self, index: usize) -> Result<(), ExecError> {
        let (node, op) = self.plan.node_op(index);
        let Op::QGemm { a, passes, a_signed, a_row_scales, a_scale, a_zero_point, packed, k, n, requant, out } = op
        else {
            unreachable!("a QGemm")
        };
        let fail = node_fail(node);
        let locs = &self.plan.locs;
        let (k, n) = (*k, *n);
        let (pass_rows, m) = call_rows(numel(&self.shapes[*a]), k, *passes).map_err(&fail)?;
        let codes_len = m * k;
        let weights = self.plan.qpacked[*packed].weights();
        // Per-row scales are read from their buffer, taken out while the output is written.
        let rows = a_row_scales.map(|v| {
            let Loc::Buf(b) = locs[v] else { unreachable!("scales live in buffers") };
            (b, std::mem::take(&mut self.bufs[b]))
        });
        let a_sc = match &rows {
            Some((_, r)) => AScale::Rows(&r[..m]),
            None => AScale::Tensor(*a_scale),
        };
        let a_codes = qbuf(locs, *a);
        let products = match self.offload.as_mut() {
            Some(off) => {
                let acts = activations(&self.qbufs[a_codes][..codes_len], *a_signed);
                off.products(&node.name, acts, m, weights)
                    .map_err(|source| ExecError::Offload { node: node.name.clone(), source })?
            }
            None => None,
        };
        self.offloaded_calls += u64::from(products.is_some());
        // A residual pass's columns need the first pass's rows only.
        let first_rows = passes
            .filter(|p| p.first_pass_columns > 0)
            .map(|p| qgemm::FirstRows { from: n - p.first_pass_columns, rows: pass_rows });
        // The kernel, or its epilogue on the offload's products.
        let (isa, pool, scratch) = (self.isa, &self.pool, &mut self.qgemm_scratch);
        let a_zero = *a_zero_point;
        let mut gemm = |acts: QActivations, dst: QOutput| match &products {
            Some(p) => qgemm::qgemm_from_products(weights, acts, m, a_sc, a_zero, p, dst),
            None => {
                qgemm::qgemm_scaled(isa, pool, weights, acts, m, a_sc, a_zero, dst, first_rows, scratch);
                Ok(())
            }
        };
        let result = match requant {
            Some((scale, zero_point, signed)) => {
                let b = qbuf(locs, *out);
                let mut y = std::mem::take(&mut self.qbufs[b]);
                let (scale, zero_point) = (*scale, *zero_point);
                let acts = activations(&self.qbufs[a_codes][..codes_len], *a_signed);
                let dst = if *signed {
                    QOutput::I8 { y: as_i8_mut(&mut y[..m * n]), scale, zero_point }
                } else {
                    QOutput::U8 { y: &mut y[..m * n], scale, zero_point }
                };
                let r = gemm(acts, dst);
                self.qbufs[b] = y;
                r
            }
            None => {
                let Loc::Buf(b) = locs[*out] else { unreachable!("outputs live in buffers") };
                let y = &mut self.bufs[b][..pass_rows * n];
                let acts = activations(&self.qbufs[a_codes][..codes_len], *a_signed);
                if m == pass_rows {
                    gemm(acts, QOutput::F32(y))
                } else {
                    let pass_products = &mut self.pass_products;
                    pass_products.resize(m * n, 0.0);
                    let r = gemm(acts, QOutput::F32(pass_products));
                    sum_passes(pass_products, y, n, n - passes.map_or(0, |p| p.first_pass_columns));
                    r
                }
            }
        };
        if let Some((b, r)) = rows {
            self.bufs[b] = r;
        }
        result.map_err(|e| fail(e.to_string()))?;
        Ok(())
    }
}

/// Rows of one activation pass of a QGemm whose activation holds `all_codes`, and the rows of
/// the call: every pass it reads.
fn call_rows(all_codes: usize, k: usize, passes: Option<StackedPasses>) -> Result<(usize, usize), String> {
    let stacked = passes.map_or(1, |p| p.stacked);
    if !all_codes.is_multiple_of(k * stacked) {
        return Err(format!("the activation holds {all_codes} codes, not {stacked} passes of rows of {k}"));
    }
    let pass_rows = all_codes / k / stacked;
    Ok((pass_rows, pass_rows * passes.map_or(1, |p| p.read)))
}

/// `y` = the sum of the passes stacked in `products` (each `y.len()` values, rows of `n`), in
/// pass order; of each row, only the first `summed` columns add the later passes.
fn sum_passes(products: &[f32], y: &mut [f32], n: usize, summed: usize) {
    let (first, rest) = products.split_at(y.len());
    y.copy_from_slice(first);
    for pass in rest.chunks_exact(y.len()) {
        for (s, p) in y.chunks_mut(n).zip(pass.chunks(n)) {
            s[..summed].iter_mut().zip(&p[..summed]).for_each(|(s, &p)| *s += p);
        }
    }
}
