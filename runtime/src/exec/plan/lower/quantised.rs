//! Lowerings of the quantised ops. Weight-only 4-bit: WGemm (MatMulNBits semantics; weights read
//! in place when the bundle holds them packed, else packed here) and GatherBlockQuantized (a
//! table read in place, or a tied lm_head's packed weights). A8W8: QuantizeLinear of activations
//! into code buffers (of a weight: folded here), QuantizeRows, DequantizeLinear, and QGemm, whose
//! weight codes are read in place when packed at compile time and packed here otherwise.

use std::borrow::Cow;

use super::{input, output, Builder};
use crate::bundle::Dtype;
use crate::exec::error::{node_err, node_fail, value_err, ExecError};
use crate::exec::packed::{mapped_qgemm, qgemm_names, QGemmLayout, WGemmLayout};
use crate::exec::plan::weights::{f32_weight_input, load_packed, u8_weight, weight_name, weight_root};
use crate::exec::plan::{code_signedness, Loc, NBitsTable, Op, QGemmStore, RowValues, StackedPasses, WGemmStore};
use crate::exec::program::{ElemType, NodeInfo, Program};
use crate::kernels::qgemm::{pack_qgemm_codes, qgemm_columns, QWeightCodes};
use crate::kernels::quantize::quantize;
use crate::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints};

/// WGemm: `K`, `N`, `bits` and `block_size` from the attributes, the weights packed or packed
/// here, an optional bias; int8 activations when the node asks for them (`accuracy_level` 4).
pub(super) fn wgemm(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let a = b.f32_input(node, 0)?;
    let attr = |name: &str| -> Result<usize, ExecError> {
        node.attr_i64(name)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| fail(format!("attribute {name} is missing or negative")))
    };
    let (k, n_cols, bits, block_size) = (attr("K")?, attr("N")?, attr("bits")?, attr("block_size")?);
    if node.input(4).is_some() {
        return Err(fail("g_idx (act-order block indices) is not supported".to_string()));
    }
    let bias = match node.input(5) {
        Some(_) => Some(b.f32_input(node, 5)?),
        None => None,
    };
    let packed = wgemm_store(b, node, (k, n_cols, bits, block_size))?;
    let o = output(node, 0)?;
    b.fresh(o);
    let last_row_only = b.last_row_only(o);
    // accuracy_level 4 asks for int8 activations per block (onnxruntime's int8 kernel, 4-bit
    // codes without float zero points); the kernels compute it so.
    let float_zero_points = node.input(3).is_some_and(|v| b.values[v].dtype != "u8");
    let int8_activations = node.attr_i64("accuracy_level") == Some(4) && bits == 4 && !float_zero_points;
    b.push(n, Op::WGemm { a, packed, bias, k, n: n_cols, out: o, last_row_only, int8_activations });
    Ok(())
}

/// The [`Builder::packed`] index of a WGemm node's weights: read in place when the bundle holds
/// them packed (once per packed weight, however many nodes read it), else packed here from the
/// node's MatMulNBits inputs.
fn wgemm_store(
    b: &mut Builder<'_, '_>,
    node: &NodeInfo,
    sizes: (usize, usize, usize, usize),
) -> Result<usize, ExecError> {
    let fail = node_fail(node);
    let (program, layouts) = (b.cx.program, b.cx.layouts);
    if let Some(layout) = weight_name(program, node, 1).and_then(|s| layouts.wgemm.get(s)) {
        check_packed_layout(program, node, layout, sizes).map_err(&fail)?;
        return b.mapped_wgemm(layout);
    }
    let (k, n, bits, block_size) = sizes;
    let codes = u8_weight(node, &b.locs, &b.views, b.values, 1)?;
    let scales = f32_weight_input(node, &b.locs, &b.weights, b.values, 2)?;
    let zero_points = match node.input(3) {
        None => NBitsZeroPoints::Default,
        Some(v) if b.values[v].dtype == "u8" => {
            NBitsZeroPoints::Packed(u8_weight(node, &b.locs, &b.views, b.values, 3)?)
        }
        Some(_) => NBitsZeroPoints::Float(f32_weight_input(node, &b.locs, &b.weights, b.values, 3)?),
    };
    let src = MatMulNBits { k, n, bits, block_size, b: codes, scales, zero_points };
    b.packed.push(WGemmStore::PackedAtLoad(pack_wgemm(&src).map_err(|e| fail(e.to_string()))?));
    Ok(b.packed.len() - 1)
}

/// Checks a WGemm node against the layout description of the packed weights it reads: the same
/// K, N, bits and block size, packed from the node's own scale and zero-point weights.
fn check_packed_layout(
    program: &Program,
    node: &NodeInfo,
    layout: &WGemmLayout,
    (k, n, bits, block_size): (usize, usize, usize, usize),
) -> Result<(), String> {
    if (layout.k, layout.n, layout.bits, layout.block_size) != (k, n, bits, block_size) {
        return Err(format!(
            "packed weights of `{}` are K={} N={} {}-bit in blocks of {}, the node says K={k} N={n} {bits}-bit in blocks of {block_size}",
            layout.source, layout.k, layout.n, layout.bits, layout.block_size
        ));
    }
    if weight_name(program, node, 2) != Some(layout.scales.as_str())
        || weight_name(program, node, 3) != layout.zero_points.as_deref()
    {
        return Err(format!(
            "packed weights of `{}` were packed with scales `{}` and zero points {:?}, not the node's",
            layout.source, layout.scales, layout.zero_points
        ));
    }
    Ok(())
}

/// GatherBlockQuantized along axis 0 of a table quantised along its last axis, by token ids or
/// integer indices.
pub(super) fn gather_block_quantized(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let gather_axis = node.attr_i64("gather_axis").unwrap_or(0);
    let quantize_axis = node.attr_i64("quantize_axis").unwrap_or(1);
    let bits = node.attr_i64("bits").unwrap_or(4) as usize;
    let block_size = node.attr_i64("block_size").unwrap_or(128) as usize;
    let data = input(node, 0)?;
    let (rows, row_bytes) = match b.dims(data)[..] {
        [Some(r), Some(bytes)] => (r, bytes),
        _ => return Err(fail(format!("data `{}` is not 2-D with fixed sizes", b.values[data].name))),
    };
    if gather_axis != 0 || !(quantize_axis == 1 || quantize_axis == -1) {
        return Err(fail(format!(
            "gather_axis {gather_axis} and quantize_axis {quantize_axis}; the executor gathers rows quantised along them"
        )));
    }
    if !(bits == 4 || bits == 8) {
        return Err(fail(format!("{bits}-bit codes (4 and 8 are supported)")));
    }
    let k = row_bytes * 8 / bits;
    if block_size == 0 || !k.is_multiple_of(block_size) {
        return Err(fail(format!("rows of {k} are not whole blocks of {block_size}")));
    }
    let table = nbits_table(b, node, data, (rows, k, bits, block_size))?;
    let ids = input(node, 1)?;
    if !matches!(b.locs[ids], Loc::Ids | Loc::Positions | Loc::ConstI64(_) | Loc::I64Buf(_)) {
        return Err(fail(format!("indices `{}` are not token ids or an integer tensor", b.values[ids].name)));
    }
    b.nbits_tables.push(table);
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::GatherNBits { table: b.nbits_tables.len() - 1, ids, out: o });
    Ok(())
}

/// The table of a GatherBlockQuantized node: the packed weights of a tied lm_head when the table
/// is stored only in that form, else its own inputs in the MatMulNBits layout.
fn nbits_table<'b>(
    b: &Builder<'_, 'b>,
    node: &NodeInfo,
    data: usize,
    (rows, k, bits, block_size): (usize, usize, usize, usize),
) -> Result<NBitsTable<'b>, ExecError> {
    let fail = node_fail(node);
    let program = b.cx.program;
    let root = weight_root(program, &b.cx.uses.producer, data);
    let tied = root.and_then(|r| b.cx.layouts.wgemm.get(r)).filter(|_| b.locs[data] == Loc::Unused);
    if let Some(layout) = tied {
        // A tied table stored only packed for the lm_head: the same codes, scales and zero
        // points, so its rows are the packed weights' columns.
        let same_inputs = weight_name(program, node, 2) == Some(layout.scales.as_str())
            && weight_name(program, node, 3) == layout.zero_points.as_deref();
        if !same_inputs || (layout.n, layout.k, layout.bits, layout.block_size) != (rows, k, bits, block_size) {
            return Err(fail(format!(
                "data `{}` is stored only packed for WGemm, and this table is not the one packed (scales, zero points, or {rows}×{k} {bits}-bit in blocks of {block_size} differ)",
                layout.source
            )));
        }
        return Ok(NBitsTable::Packed(load_packed(b.cx.weight, layout)?));
    }
    let codes = u8_weight(node, &b.locs, &b.views, b.values, 0)?;
    let scales = f32_weight_input(node, &b.locs, &b.weights, b.values, 2)?;
    let zero_points = match node.input(3) {
        None => NBitsZeroPoints::Default,
        Some(_) => NBitsZeroPoints::Packed(u8_weight(node, &b.locs, &b.views, b.values, 3)?),
    };
    let table = MatMulNBits { k, n: rows, bits, block_size, b: codes, scales, zero_points };
    // Checks the buffers against the table's size (no ids: nothing is gathered).
    crate::kernels::embed::embed_nbits(&table, &[], &mut []).map_err(|e| fail(e.to_string()))?;
    Ok(NBitsTable::Source(table))
}

/// QuantizeLinear: of activations (one scale and zero point) into a code buffer; of a 2-D weight
/// (a tied lm_head quantised by the program), folded here into codes only QGemm packing reads.
pub(super) fn quantize_linear(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let o = output(node, 0)?;
    let signed = code_signedness(&b.values[o].dtype)
        .ok_or_else(|| fail(format!("quantises to {}; the executor holds u8 and i8 codes", b.values[o].dtype)))?;
    let x = input(node, 0)?;
    let scale = b.f32s(node, 1)?;
    let zero_point = match node.input(2) {
        Some(_) => b.ints(node, 2)?,
        None => vec![0; scale.len()],
    };
    if zero_point.len() != scale.len() {
        return Err(fail("the zero point and the scale differ in size".to_string()));
    }
    if let Loc::Weight(_) | Loc::WeightT(_) = b.locs[x] {
        let codes = fold_quantized_weight(b, node, x, (&scale, &zero_point), signed)?;
        b.folded.push((codes, signed));
        b.locs[o] = Loc::ConstQ(b.folded.len() - 1);
        return Ok(());
    }
    let x = b.f32_input(node, 0)?;
    let [scale] = scale[..] else {
        return Err(fail("quantises activations with several scales; the executor takes one per tensor".to_string()));
    };
    b.fresh_q(o);
    b.push(n, Op::Quantize { x, scale, zero_point: zero_point[0], signed, out: o });
    Ok(())
}

/// The codes of weight `x` (`[rows, cols]`, stored or transposed) quantised per tensor, per
/// column (axis 1) or per row (axis 0), row-major.
fn fold_quantized_weight(
    b: &Builder<'_, '_>,
    node: &NodeInfo,
    x: usize,
    (scale, zero_point): (&[f32], &[i32]),
    signed: bool,
) -> Result<Vec<u8>, ExecError> {
    let fail = node_fail(node);
    let [Some(rows), Some(cols)] = b.dims(x)[..] else {
        return Err(fail(format!("quantises `{}`, not a 2-D weight", b.values[x].name)));
    };
    let axis = node.attr_i64("axis").unwrap_or(1);
    let per_column = match (scale.len(), axis) {
        (1, _) => None,
        (len, 1 | -1) if len == cols => Some(true),
        (len, 0 | -2) if len == rows => Some(false),
        (len, _) => return Err(fail(format!("{len} scales along axis {axis} of a [{rows}, {cols}] weight"))),
    };
    let (Loc::Weight(i) | Loc::WeightT(i)) = b.locs[x] else { unreachable!("checked by the caller") };
    let data = b.weights[i];
    let transposed = matches!(b.locs[x], Loc::WeightT(_));
    let mut codes = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let v = if transposed { data[c * rows + r] } else { data[r * cols + c] };
            let p = match per_column {
                None => 0,
                Some(true) => c,
                Some(false) => r,
            };
            codes.push(quantize(v, scale[p], zero_point[p], signed));
        }
    }
    Ok(codes)
}

/// QuantizeRows: f32 rows (of a fixed last axis) into i8 codes and one f32 scale per row; with
/// γ, of the exact products `x·γ`. QuantizeSwiGlu: the same of the integer gate of its gate and
/// up rows.
pub(super) fn quantize_rows(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let op = if node.op == "npuc::QuantizeSwiGlu" { "QuantizeSwiGlu" } else { "QuantizeRows" };
    let x = b.f32_input(node, 0)?;
    let k = b.values[x]
        .shape
        .last()
        .and_then(|d| d.as_const())
        .filter(|&k| k > 0)
        .ok_or_else(|| fail(format!("`{}` has no fixed last axis to quantise along", b.values[x].name)))?;
    let (codes, scales) = (output(node, 0)?, output(node, 1)?);
    let stacked = match node.attr_i64("passes") {
        None | Some(1) => false,
        Some(2) => true,
        Some(p) => return Err(fail(format!("{op} takes 1 or 2 passes, got {p}"))),
    };
    if b.values[codes].dtype != "i8" || b.values[scales].elem != Some(ElemType::F32) {
        return Err(fail(format!("{op} gives i8 codes and f32 scales")));
    }
    let values = match node.input(1) {
        Some(_) => {
            let v = b.f32_input(node, 1)?;
            let shape = &b.values[v].shape;
            if op == "QuantizeSwiGlu" {
                if *shape != b.values[x].shape {
                    return Err(fail(format!("up `{}` is not shaped as the gate", b.values[v].name)));
                }
                RowValues::IntegerGate(v)
            } else if shape.len() == 1 && shape[0].as_const() == Some(k) {
                RowValues::TimesGamma(v)
            } else {
                return Err(fail(format!("γ `{}` is not {k} values", b.values[v].name)));
            }
        }
        None if op == "QuantizeSwiGlu" => return Err(fail("QuantizeSwiGlu has no up rows".to_string())),
        None => RowValues::X,
    };
    b.fresh_q(codes);
    b.fresh(scales);
    b.push(n, Op::QuantizeRows { x, k, codes, scales, stacked, values });
    Ok(())
}

/// DequantizeLinear of codes the executor computes, with one scale and zero point, into f32.
pub(super) fn dequantize_linear(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let x = input(node, 0)?;
    if !matches!(b.locs[x], Loc::QBuf(_)) {
        return Err(fail(format!("`{}` is not quantised activations the executor computes", b.values[x].name)));
    }
    let signed = code_signedness(&b.values[x].dtype).expect("QBuf values are u8 or i8");
    let (scale, zero_point) = b.per_tensor(node, 1, 2)?;
    if b.values[output(node, 0)?].elem != Some(ElemType::F32) {
        return Err(fail("dequantises to a type other than f32".to_string()));
    }
    let o = output(node, 0)?;
    b.fresh(o);
    b.push(n, Op::Dequantize { x, scale, zero_point, signed, out: o });
    Ok(())
}

/// QGemm over activation codes the executor computes: the activations' scale per tensor or per
/// row (QuantizeRows), the weights packed or packed here with their per-column scales and zero
/// points, the output f32 or requantised codes.
pub(super) fn qgemm(b: &mut Builder<'_, '_>, n: usize, node: &NodeInfo) -> Result<(), ExecError> {
    let fail = node_fail(node);
    let a = input(node, 0)?;
    if !matches!(b.locs[a], Loc::QBuf(_)) {
        return Err(fail(format!("the activation `{}` is not codes the executor computes", b.values[a].name)));
    }
    let a_signed = code_signedness(&b.values[a].dtype).expect("QBuf values are u8 or i8");
    let (a_scale, a_zero_point, a_row_scales) = activation_scale(b, node)?;
    let w = input(node, 3)?;
    let [Some(k), Some(n_cols)] = b.dims(w)[..] else {
        return Err(fail(format!("the weight `{}` is not 2-D with fixed sizes", b.values[w].name)));
    };
    let columns = (b.f32s(node, 4)?, b.ints(node, 5)?);
    let store = match weight_name(b.cx.program, node, 3).and_then(|s| b.cx.layouts.qgemm.get(s)) {
        Some(layout) => qgemm_mapped(b, node, layout, w, (k, n_cols), columns)?,
        None => qgemm_packed_at_load(b, node, w, (k, n_cols), columns)?,
    };
    b.qpacked.push(store);
    let o = output(node, 0)?;
    let requant = match node.input(6) {
        Some(_) => {
            let (s_y, z_y) = b.per_tensor(node, 6, 7)?;
            let signed = code_signedness(&b.values[o].dtype).ok_or_else(|| {
                fail(format!("requantises to {}; the executor holds u8 and i8 codes", b.values[o].dtype))
            })?;
            Some((s_y, z_y, signed))
        }
        None => None,
    };
    if requant.is_some() {
        b.fresh_q(o);
    } else {
        b.fresh(o);
    }
    let packed = b.qpacked.len() - 1;
    let passes = stacked_passes(b, node, a, n_cols, requant.is_none() && a_row_scales.is_some())?;
    let op =
        Op::QGemm { a, passes, a_signed, a_row_scales, a_scale, a_zero_point, packed, k, n: n_cols, requant, out: o };
    b.push(n, op);
    Ok(())
}

/// A QGemm's `passes` with the number of passes its activation stacks (its fixed leading axis),
/// or `None` for a plain activation; `summable` says the call has row scales and an f32 output.
fn stacked_passes(
    b: &Builder<'_, '_>,
    node: &NodeInfo,
    a: usize,
    n: usize,
    summable: bool,
) -> Result<Option<StackedPasses>, ExecError> {
    let fail = node_fail(node);
    let Some(passes) = node.attr_i64("passes") else { return Ok(None) };
    let stacked = b.values[a].shape.first().and_then(|d| d.as_const());
    let first_pass_columns = match node.attr_i64("first_pass_columns").unwrap_or(0) {
        c if c == 0 || (passes >= 2 && c > 0 && c as usize <= n) => c as usize,
        c => return Err(fail(format!("first_pass_columns {c} wants 2 or more passes and at most the {n} columns"))),
    };
    match stacked {
        Some(stacked) if passes >= 1 && passes as usize <= stacked && summable => {
            Ok(Some(StackedPasses { read: passes as usize, stacked, first_pass_columns }))
        }
        _ => Err(fail(format!(
            "{passes} passes of `{}` need a fixed leading axis of at least {passes} passes, row scales, and an f32 output",
            b.values[a].name
        ))),
    }
}

/// A QGemm's activation scale and zero point: computed per row by the program (QuantizeRows; the
/// scale value is returned, the per-tensor scale unused), or constants per tensor.
fn activation_scale(b: &Builder<'_, '_>, node: &NodeInfo) -> Result<(f32, i32, Option<usize>), ExecError> {
    Ok(match b.locs[input(node, 1)?] {
        Loc::Buf(_) => match b.ints(node, 2)?[..] {
            [z] => (1.0, z, Some(input(node, 1)?)),
            _ => return Err(node_fail(node)("per-row activation scales need one zero point".to_string())),
        },
        _ => {
            let (s, z) = b.per_tensor(node, 1, 2)?;
            (s, z, None)
        }
    })
}

/// A QGemm's weights as the bundle holds them packed, read in place, checked against the node.
fn qgemm_mapped<'b>(
    b: &Builder<'_, 'b>,
    node: &NodeInfo,
    layout: &QGemmLayout,
    w: usize,
    (k, n): (usize, usize),
    (w_scale, w_zero_point): (Vec<f32>, Vec<i32>),
) -> Result<QGemmStore<'b>, ExecError> {
    let fail = node_fail(node);
    let values = b.values;
    let unsigned = match values[w].dtype.as_str() {
        "u8" => true,
        "i8" => false,
        other => return Err(fail(format!("the weight `{}` is {other}, not u8 or i8 codes", values[w].name))),
    };
    if (layout.k, layout.n, layout.unsigned) != (k, n, unsigned) {
        return Err(fail(format!(
            "packed weights of `{}` are K={} N={} {} codes, the node reads K={k} N={n} {}",
            layout.source,
            layout.k,
            layout.n,
            if layout.unsigned { "u8" } else { "i8" },
            values[w].dtype
        )));
    }
    let (codes_name, sums_name) = qgemm_names(&layout.source);
    let get = |name: &str| {
        (b.cx.weight)(name)
            .ok_or_else(|| value_err(&layout.source, format!("packed tensor `{name}` is not in the bundle")))
    };
    let (codes, sums) =
        mapped_qgemm(get(&codes_name)?, get(&sums_name)?).map_err(|e| value_err(&layout.source, e.to_string()))?;
    let columns = qgemm_columns(n, unsigned, &w_scale, &w_zero_point).map_err(|e| fail(e.to_string()))?;
    QGemmStore::new(k, n, Cow::Borrowed(codes), Cow::Borrowed(sums), columns).map_err(fail)
}

/// A QGemm's weights packed here from `[K, N]` codes: a weight's, or codes folded at load.
fn qgemm_packed_at_load<'b>(
    b: &Builder<'_, 'b>,
    node: &NodeInfo,
    w: usize,
    (k, n): (usize, usize),
    (w_scale, w_zero_point): (Vec<f32>, Vec<i32>),
) -> Result<QGemmStore<'b>, ExecError> {
    let fail = node_fail(node);
    let (views, values) = (&b.views, b.values);
    let codes = match b.locs[w] {
        Loc::ConstQ(i) => {
            let (bytes, signed) = &b.folded[i];
            if *signed {
                QWeightCodes::I8(as_i8(bytes))
            } else {
                QWeightCodes::U8(bytes)
            }
        }
        Loc::Weight(i) if views[i].dtype == Dtype::I8 && values[w].dtype == "i8" => {
            QWeightCodes::I8(as_i8(views[i].bytes))
        }
        Loc::Weight(i) if views[i].dtype == Dtype::U8 && values[w].dtype == "u8" => QWeightCodes::U8(views[i].bytes),
        _ => return Err(fail(format!("the weight `{}` is not u8 or i8 codes", values[w].name))),
    };
    let unsigned = matches!(codes, QWeightCodes::U8(_));
    let (packed_codes, sums) = pack_qgemm_codes(k, n, codes).map_err(|e| fail(e.to_string()))?;
    let columns = qgemm_columns(n, unsigned, &w_scale, &w_zero_point).map_err(|e| fail(e.to_string()))?;
    QGemmStore::new(k, n, Cow::Owned(packed_codes), Cow::Owned(sums), columns).map_err(fail)
}

fn as_i8(bytes: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
}

/// Scales and zero points of the quantisation ops: weights or constants.
impl Builder<'_, '_> {
    fn f32s(&self, node: &NodeInfo, slot: usize) -> Result<Vec<f32>, ExecError> {
        let v = input(node, slot)?;
        match self.locs[v] {
            Loc::Weight(i) if self.values[v].elem == Some(ElemType::F32) => Ok(self.weights[i].to_vec()),
            Loc::ConstF32(i) => Ok(self.consts_f32[i].clone()),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!("input {slot} (`{}`) is not an f32 weight or constant", self.values[v].name),
            )),
        }
    }

    fn ints(&self, node: &NodeInfo, slot: usize) -> Result<Vec<i32>, ExecError> {
        let v = input(node, slot)?;
        let info = &self.values[v];
        match (self.locs[v], code_signedness(&info.dtype)) {
            (Loc::Weight(i), Some(signed)) => Ok(self.views[i]
                .bytes
                .iter()
                .map(|&b| if signed { i32::from(b as i8) } else { i32::from(b) })
                .collect()),
            (Loc::ConstI64(i), Some(_)) => Ok(self.consts_i64[i].iter().map(|&x| x as i32).collect()),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!("input {slot} (`{}`, {}) is not a u8 or i8 weight or constant", info.name, info.dtype),
            )),
        }
    }

    /// One scale and one zero point (0 when the zero point is absent).
    fn per_tensor(&self, node: &NodeInfo, scale_slot: usize, zero_slot: usize) -> Result<(f32, i32), ExecError> {
        let scale = self.f32s(node, scale_slot)?;
        let zero = match node.input(zero_slot) {
            Some(_) => self.ints(node, zero_slot)?,
            None => vec![0],
        };
        match (&scale[..], &zero[..]) {
            ([s], [z]) => Ok((*s, *z)),
            _ => Err(node_err(
                &node.name,
                &node.op,
                format!(
                    "{} scales and {} zero points; the executor takes one per tensor here",
                    scale.len(),
                    zero.len()
                ),
            )),
        }
    }
}
