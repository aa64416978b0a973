//! Quantisation: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear (either domain), and
//! onnxruntime's weight-only formats MatMulNBits and GatherBlockQuantized.

use super::elementwise::cast_tensor;
use super::layout::{checked_numel, strides};
use super::linalg::dot;
use super::{dtype_from_code, float_tensor, int_values, norm_axis, require_float, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{numel, Data, Tensor};

/// Which scale (and zero point) each element of a quantised tensor uses.
enum Granularity {
    PerTensor,
    /// One parameter per index along `axis`; `inner` is the product of the dims after it.
    PerAxis {
        dim: usize,
        inner: usize,
    },
    /// `block` consecutive indices along `axis` share a parameter; the parameter tensor has the
    /// data's shape with that axis shrunk to `blocks`.
    Blocked {
        dim: usize,
        inner: usize,
        block: usize,
        blocks: usize,
    },
}

impl Granularity {
    /// Reads the granularity from the scale's shape, the `axis` attribute and `block_size`.
    fn of(x_shape: &[usize], scale_shape: &[usize], axis: i64, block_size: i64) -> Res<Granularity> {
        let rank = x_shape.len();
        if block_size < 0 {
            bail!("block_size {block_size} is negative");
        }
        if block_size == 0 && scale_shape.iter().product::<usize>() == 1 && scale_shape.len() <= 1 {
            return Ok(Granularity::PerTensor);
        }
        let axis = norm_axis(axis, rank, "axis")?;
        let dim = x_shape[axis];
        let inner = x_shape[axis + 1..].iter().product();
        if block_size == 0 {
            if scale_shape != [dim] {
                bail!("per-axis scale must have shape [{dim}] for axis {axis} of {x_shape:?}, got {scale_shape:?}");
            }
            return Ok(Granularity::PerAxis { dim, inner });
        }
        let block = block_size as usize;
        let blocks = dim.div_ceil(block);
        let fits = scale_shape.len() == rank
            && scale_shape
                .iter()
                .zip(x_shape)
                .enumerate()
                .all(|(d, (&s, &n))| if d == axis { s == blocks } else { s == n });
        if !fits {
            bail!("blocked scale of shape {scale_shape:?} does not fit {x_shape:?} with block_size {block} on axis {axis}");
        }
        Ok(Granularity::Blocked { dim, inner, block, blocks })
    }

    /// The parameter index of element `i` (row-major) of the data.
    #[inline]
    fn param(&self, i: usize) -> usize {
        match *self {
            Granularity::PerTensor => 0,
            Granularity::PerAxis { dim, inner } => (i / inner) % dim,
            Granularity::Blocked { dim, inner, block, blocks } => {
                let (outer, rest) = (i / (dim * inner), i % (dim * inner));
                let (along, within) = (rest / inner, rest % inner);
                (outer * blocks + along / block) * inner + within
            }
        }
    }
}

/// The zero point's shape must equal the scale's; a one-element zero point beside a
/// one-element scale is per-tensor either way (`[1]` against `[]`, as ONNX's own tests write).
fn check_zero_point(zp: Option<&Tensor>, scale: &Tensor) -> Res<()> {
    if let Some(z) = zp {
        if z.shape != scale.shape && !(z.numel() == 1 && scale.numel() == 1) {
            bail!("zero point shape {:?} differs from scale shape {:?}", z.shape, scale.shape);
        }
    }
    Ok(())
}

/// Before opset 13 the ai.onnx ops quantize per tensor only: the scale is one value.
fn check_per_tensor_before_13(cx: &Ctx, scale: &Tensor) -> Res<()> {
    if cx.op.domain == crate::op::Domain::Onnx && cx.opset() < 13 && scale.numel() != 1 {
        bail!("the scale has shape {:?}; before opset 13 it is one value (per-tensor)", scale.shape);
    }
    Ok(())
}

fn is_small_float(d: DType) -> bool {
    d.is_float() && !matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// QuantizeLinear: `saturate(round_half_even(x / scale) + zero_point)` for integer outputs, and
/// `cast(x / scale + zero_point)` (honouring `saturate`) for float8/float4 outputs. The output
/// dtype comes from `output_dtype`, else the zero point, else uint8. The division is done in
/// f32 (f64 for double inputs), as onnxruntime does for every scale type.
pub(super) fn quantize_linear(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, scale, zp) = (cx.input(0, "x")?, cx.input(1, "y_scale")?, cx.opt(2));
    require_float(scale, "y_scale")?;
    check_zero_point(zp, scale)?;
    check_per_tensor_before_13(cx, scale)?;
    let requested = cx.attrs().int_or("output_dtype", 0)?;
    let out_dtype = match (requested, zp) {
        (0, Some(z)) => z.dtype,
        (0, None) => DType::U8,
        (code, z) => {
            let d = dtype_from_code(code, "output_dtype")?;
            if z.is_some_and(|z| z.dtype != d) {
                bail!("output_dtype {d} differs from the zero point's dtype");
            }
            d
        }
    };
    let int_output = out_dtype.is_int();
    if !int_output && !is_small_float(out_dtype) {
        bail!("cannot quantize to {out_dtype}");
    }
    let saturate = cx.attrs().int_or("saturate", 1)? != 0;
    let g =
        Granularity::of(&x.shape, &scale.shape, cx.attrs().int_or("axis", 1)?, cx.attrs().int_or("block_size", 0)?)?;
    let s = scale.to_f64_vec();
    let xv = match x.dtype {
        DType::I32 => x.to_f64_vec(),
        d if d.is_float() => x.to_f64_vec(),
        d => bail!("x must be float or int32, got {d}"),
    };
    let zv: Vec<f64> = zp.map(Tensor::to_f64_vec).unwrap_or_default();
    let zero_point = |i: usize| if zv.is_empty() { 0.0 } else { zv[g.param(i)] };
    let quotients = xv.iter().enumerate().map(|(i, &v)| {
        if x.dtype == DType::F64 {
            v / s[g.param(i)]
        } else {
            (v as f32 / s[g.param(i)] as f32) as f64
        }
    });
    if let (true, Some((lo, hi))) = (int_output, out_dtype.int_range()) {
        let q = quotients
            .enumerate()
            .map(|(i, v)| {
                let r = if v.is_nan() { 0.0 } else { v.round_ties_even() };
                (r + zero_point(i)).clamp(lo as f64, hi as f64) as i64
            })
            .collect();
        return Ok(vec![Tensor::from_i64(out_dtype, x.shape.clone(), q)]);
    }
    let shifted = quotients.enumerate().map(|(i, v)| (v as f32 + zero_point(i) as f32) as f64).collect();
    let as_f64 = Tensor::from_f64(x.shape.clone(), shifted);
    Ok(vec![cast_tensor(&as_f64, out_dtype, saturate)?])
}

/// DequantizeLinear: `(x - zero_point) * scale`, computed in f32 and rounded to the output dtype
/// (`output_dtype`, else the scale's dtype). int32 inputs take no (or a zero) zero point.
pub(super) fn dequantize_linear(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, scale, zp) = (cx.input(0, "x")?, cx.input(1, "x_scale")?, cx.opt(2));
    require_float(scale, "x_scale")?;
    check_zero_point(zp, scale)?;
    check_per_tensor_before_13(cx, scale)?;
    if zp.is_some_and(|z| z.dtype != x.dtype) {
        bail!("zero point dtype differs from x's {}", x.dtype);
    }
    if !(x.dtype.is_int() || is_small_float(x.dtype)) {
        bail!("x must be an integer or 8/4-bit float tensor, got {}", x.dtype);
    }
    let out_dtype = match cx.attrs().int_or("output_dtype", 0)? {
        0 => scale.dtype,
        code => dtype_from_code(code, "output_dtype")?,
    };
    if !out_dtype.is_float() {
        bail!("output_dtype must be a float type, got {out_dtype}");
    }
    let g =
        Granularity::of(&x.shape, &scale.shape, cx.attrs().int_or("axis", 1)?, cx.attrs().int_or("block_size", 0)?)?;
    let s = scale.to_f32_vec();
    let values: Vec<f64> = match (&x.data, zp.map(|z| &z.data)) {
        (Data::I64(v), z) => {
            let z = match z {
                Some(Data::I64(z)) => Some(z),
                _ => None,
            };
            v.iter()
                .enumerate()
                .map(|(i, &q)| {
                    let shifted = q.wrapping_sub(z.map_or(0, |z| z[g.param(i)]));
                    (shifted as f32 * s[g.param(i)]) as f64
                })
                .collect()
        }
        (Data::F32(v), z) => {
            let z = match z {
                Some(Data::F32(z)) => Some(z),
                _ => None,
            };
            v.iter()
                .enumerate()
                .map(|(i, &q)| ((q - z.map_or(0.0, |z| z[g.param(i)])) * s[g.param(i)]) as f64)
                .collect()
        }
        _ => bail!("x has unsupported storage"),
    };
    Ok(vec![float_tensor(out_dtype, x.shape.clone(), values)])
}

/// DynamicQuantizeLinear to uint8: the range is widened to include 0, `scale = range / 255`
/// (1 when the range is empty, as onnxruntime does), `zero_point = round(clamp(-min / scale))`,
/// `y = clamp(round(x / scale) + zero_point)`, all in f32 with ties to even.
pub(super) fn dynamic_quantize_linear(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "x")?;
    let Data::F32(v) = &x.data else {
        bail!("x must be a float tensor, got {}", x.dtype);
    };
    if x.dtype != DType::F32 {
        bail!("x must be float32, got {}", x.dtype);
    }
    let lo = v.iter().copied().fold(0.0f32, f32::min);
    let hi = v.iter().copied().fold(0.0f32, f32::max);
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    let zero_point = (-lo / scale).clamp(0.0, 255.0).round_ties_even();
    let y = v.iter().map(|&p| ((p / scale).round_ties_even() + zero_point).clamp(0.0, 255.0) as i64).collect();
    Ok(vec![
        Tensor::from_i64(DType::U8, x.shape.clone(), y),
        Tensor::scalar_f32(scale),
        Tensor::from_i64(DType::U8, vec![], vec![zero_point as i64]),
    ])
}

/// Reads `bits`-wide unsigned element `index` from packed bytes, low bits first.
#[inline]
fn unpack(bytes: &[i64], bits: usize, index: usize) -> i64 {
    let bit = index * bits;
    (bytes[bit / 8] >> (bit % 8)) & ((1 << bits) - 1)
}

/// MatMulNBits: `Y = A · Wᵀ (+ bias)` where W is `[N, K]`, stored in B as `bits`-wide codes
/// packed along K in blocks of `block_size` (element 2k of a 4-bit block in the low nibble), and
/// dequantised per block as `(q - zero_point) * scale`. Zero points are either packed uint8
/// (each row padded to whole bytes) or floats of the scales' type; by default 2^(bits-1). W is
/// dequantised in f32 and rounded to A's dtype; the products accumulate in f64.
///
/// `accuracy_level` 4 is semantics, as onnxruntime's CPU provider runs it: when its int8 kernel
/// applies (4-bit codes, f32 A, no g_idx, no float zero points, block_size 16 to 256, a power of
/// two), each block of each row of A is first quantised to int8 — `s = max|a| / 127`,
/// `q = round_half_even(a · (127 / max|a|))` in f32 — and the product reads `q · s`. Other levels,
/// and level 4 where that kernel does not apply, compute with A as it is.
pub(super) fn matmul_nbits(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (a, b, scales) = (cx.input(0, "A")?, cx.input(1, "B")?, cx.input(2, "scales")?);
    let (zp, g_idx, bias) = (cx.opt(3), cx.opt(4), cx.opt(5));
    let layout = NBitsLayout::of(cx, a, b, scales)?;
    let NBitsLayout { k, n, block, bits, blocks, blob } = layout;
    let zero_points = NBitsZeroPoints::of(zp, &layout)?;
    let groups = block_groups(g_idx, k, blocks)?;
    if let Some(bias) = bias {
        require_float(bias, "bias")?;
        if bias.numel() != n {
            bail!("bias must hold N={n} values, got shape {:?}", bias.shape);
        }
    }
    let mut out_shape = a.shape.clone();
    out_shape[a.rank() - 1] = n;
    checked_numel(&out_shape)?;
    let codes = int_values(b, "B")?;
    let s = scales.to_f32_vec();
    let bias_v = bias.map(Tensor::to_f64_vec);
    let int8 = cx.attrs().int_or("accuracy_level", 0)? == 4
        && bits == 4
        && g_idx.is_none()
        && !matches!(zero_points, NBitsZeroPoints::Float(_))
        && a.dtype == DType::F32
        && [16, 32, 64, 128, 256].contains(&block);
    let av = if int8 { int8_blocks(&a.to_f32_vec(), k, block) } else { a.to_f64_vec() };
    let rows = av.len() / k;
    let mut y = vec![0.0; rows * n];
    let mut w = vec![0.0f64; k];
    for col in 0..n {
        for (kk, wk) in w.iter_mut().enumerate() {
            let (blk_of_code, within) = (kk / block, kk % block);
            let q = unpack(&codes[(col * blocks + blk_of_code) * blob..][..blob], bits, within) as f32;
            let blk = groups.as_ref().map_or(blk_of_code, |g| g[kk]);
            let z = zero_points.at(col, blk, &layout);
            *wk = super::round_f64(a.dtype, ((q - z) * s[col * blocks + blk]) as f64) as f64;
        }
        let shift = bias_v.as_ref().map_or(0.0, |b| b[col]);
        for r in 0..rows {
            y[r * n + col] = dot(&av[r * k..(r + 1) * k], &w) + shift;
        }
    }
    Ok(vec![float_tensor(a.dtype, out_shape, y)])
}

/// A MatMulNBits node's sizes, checked against its A, B and scales.
#[derive(Clone, Copy)]
struct NBitsLayout {
    k: usize,
    n: usize,
    block: usize,
    bits: usize,
    /// Blocks per column: ⌈K / block⌉.
    blocks: usize,
    /// Bytes per block of codes.
    blob: usize,
}

impl NBitsLayout {
    fn of(cx: &Ctx, a: &Tensor, b: &Tensor, scales: &Tensor) -> Res<NBitsLayout> {
        let attr = |name: &str| -> Res<usize> {
            match cx.attrs().int(name)? {
                Some(v) if v > 0 => Ok(v as usize),
                Some(v) => bail!("attribute {name} must be positive, got {v}"),
                None => bail!("attribute {name} is required"),
            }
        };
        let (k, n, block) = (attr("K")?, attr("N")?, attr("block_size")?);
        let bits = cx.attrs().int_or("bits", 4)?;
        if ![2, 4, 8].contains(&bits) {
            bail!("bits must be 2, 4 or 8, got {bits}");
        }
        let bits = bits as usize;
        require_float(a, "A")?;
        require_float(scales, "scales")?;
        if a.rank() == 0 || a.shape[a.rank() - 1] != k {
            bail!("A of shape {:?} does not end in K={k}", a.shape);
        }
        let block_bits = block.checked_mul(bits).filter(|b| b.is_multiple_of(8));
        let Some(block_bits) = block_bits else {
            bail!("block_size {block} does not pack into whole bytes at {bits} bits");
        };
        let blocks = k.div_ceil(block);
        let blob = block_bits / 8;
        if b.dtype != DType::U8 || Some(b.numel()) != numel(&[n, blocks, blob]) {
            bail!("B must be uint8 [N={n}, {blocks}, {blob}], got {} {:?}", b.dtype, b.shape);
        }
        if Some(scales.numel()) != numel(&[n, blocks]) {
            bail!("scales must hold N*blocks = {} values, got shape {:?}", n * blocks, scales.shape);
        }
        Ok(NBitsLayout { k, n, block, bits, blocks, blob })
    }
}

/// MatMulNBits' zero points: by default 2^(bits-1), packed uint8 rows, or floats.
enum NBitsZeroPoints<'t> {
    Default,
    Packed { bytes: &'t [i64], row_bytes: usize },
    Float(Vec<f32>),
}

impl<'t> NBitsZeroPoints<'t> {
    fn of(zp: Option<&'t Tensor>, l: &NBitsLayout) -> Res<NBitsZeroPoints<'t>> {
        Ok(match zp {
            None => NBitsZeroPoints::Default,
            Some(z) if z.dtype == DType::U8 => {
                let row_bytes = (l.blocks * l.bits).div_ceil(8);
                if z.numel() != l.n * row_bytes {
                    bail!("packed zero_points must hold N*{row_bytes} bytes, got shape {:?}", z.shape);
                }
                NBitsZeroPoints::Packed { bytes: int_values(z, "zero_points")?, row_bytes }
            }
            Some(z) if z.dtype.is_float() && z.numel() == l.n * l.blocks => NBitsZeroPoints::Float(z.to_f32_vec()),
            Some(z) => bail!("zero_points must be uint8 packed or float [N*blocks], got {} {:?}", z.dtype, z.shape),
        })
    }

    /// The zero point of block `blk` of column `col`.
    fn at(&self, col: usize, blk: usize, l: &NBitsLayout) -> f32 {
        match self {
            NBitsZeroPoints::Default => (1i64 << (l.bits - 1)) as f32,
            NBitsZeroPoints::Packed { bytes, row_bytes } => {
                unpack(&bytes[col * row_bytes..][..*row_bytes], l.bits, blk) as f32
            }
            NBitsZeroPoints::Float(v) => v[col * l.blocks + blk],
        }
    }
}

/// MatMulNBits' `g_idx`: the block each of the K rows reads its scale and zero point from.
fn block_groups(g_idx: Option<&Tensor>, k: usize, blocks: usize) -> Res<Option<Vec<usize>>> {
    let Some(g) = g_idx else { return Ok(None) };
    let v = int_values(g, "g_idx")?;
    if v.len() != k || v.iter().any(|&x| x < 0 || x as usize >= blocks) {
        bail!("g_idx must hold {k} block indices below {blocks}");
    }
    Ok(Some(v.iter().map(|&x| x as usize).collect()))
}

/// GatherBlockQuantized: Gather over a block-quantised table, dequantising what it gathers as
/// `(q - zero_point) * scale` (computed in f32, output in the scales' dtype). `data` is uint8
/// with `bits`-wide codes packed along the last dimension, or int4/uint4, or an 8/4-bit float
/// type (no zero point). Default zero points, as in onnxruntime: 2^(bits-1) for uint8 data, 0
/// for int4/uint4. Scales have the data's shape with `quantize_axis` shrunk to blocks (other
/// scale dimensions of 1 broadcast). Unlike Gather, an out-of-range index yields zeros.
pub(super) fn gather_block_quantized(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (data, idx, scales, zp) = (cx.input(0, "data")?, cx.input(1, "indices")?, cx.input(2, "scales")?, cx.opt(3));
    let indices = int_values(idx, "indices")?;
    require_float(scales, "scales")?;
    let q = BlockQuantized::of(cx, data, scales, zp)?;
    let (logical, gather_axis) = (&q.logical, q.gather_axis);
    let mut out_shape: Vec<usize> = logical[..gather_axis].to_vec();
    out_shape.extend(&idx.shape);
    out_shape.extend(&logical[gather_axis + 1..]);
    let total = checked_numel(&out_shape)?;
    let dim = logical[gather_axis];
    let outer: usize = logical[..gather_axis].iter().product();
    let inner: usize = logical[gather_axis + 1..].iter().product();
    let s = scales.to_f32_vec();
    let scale_strides = strides(&scales.shape);
    let logical_strides = strides(logical);
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for &i in indices {
            let d = dim as i64;
            let row = if i < 0 { i + d } else { i };
            if row < 0 || row >= d {
                out.extend(std::iter::repeat_n(0.0, inner));
                continue;
            }
            let base = (o * dim + row as usize) * inner;
            out.extend((0..inner).map(|e| {
                let li = base + e;
                let si = q.scale_index(li, &logical_strides, &scale_strides);
                ((q.code_at(li) - q.zero_point_at(si)) * s[si]) as f64
            }));
        }
    }
    Ok(vec![float_tensor(scales.dtype, out_shape, out)])
}

/// A GatherBlockQuantized table: its codes, scales and zero points with the layout they were
/// checked to have.
struct BlockQuantized<'t> {
    data: &'t Tensor,
    scales: &'t Tensor,
    zero_points: Option<&'t Tensor>,
    /// Codes packed into uint8 (`8 / bits` per byte along the last axis).
    packed: bool,
    bits: i64,
    per_byte: usize,
    /// The shape of the codes once unpacked.
    logical: Vec<usize>,
    gather_axis: usize,
    quantize_axis: usize,
    block: usize,
}

impl<'t> BlockQuantized<'t> {
    fn of(cx: &Ctx, data: &'t Tensor, scales: &'t Tensor, zp: Option<&'t Tensor>) -> Res<BlockQuantized<'t>> {
        let bits = cx.attrs().int_or("bits", 4)?;
        let block = cx.attrs().int_or("block_size", 128)?;
        let packed = data.dtype == DType::U8;
        if packed && ![2, 4, 8].contains(&bits) {
            bail!("bits must be 2, 4 or 8 for uint8 data, got {bits}");
        }
        if !(packed || matches!(data.dtype, DType::I4 | DType::U4) || is_small_float(data.dtype)) {
            bail!("data must be uint8, int4, uint4 or an 8/4-bit float type, got {}", data.dtype);
        }
        if data.rank() == 0 {
            bail!("data must have rank at least 1");
        }
        let per_byte = if packed { 8 / bits as usize } else { 1 };
        let mut logical = data.shape.clone();
        let last = data.rank() - 1;
        logical[last] *= per_byte;
        let rank = logical.len();
        let gather_axis = norm_axis(cx.attrs().int_or("gather_axis", 0)?, rank, "gather_axis")?;
        let quantize_axis = norm_axis(cx.attrs().int_or("quantize_axis", 1)?, rank, "quantize_axis")?;
        let block = match block {
            0 if is_small_float(data.dtype) => logical[quantize_axis].max(1),
            b if b > 0 => b as usize,
            b => bail!("block_size must be positive, got {b}"),
        };
        let q = BlockQuantized {
            data,
            scales,
            zero_points: zp,
            packed,
            bits,
            per_byte,
            logical,
            gather_axis,
            quantize_axis,
            block,
        };
        q.check_scales()?;
        q.check_zero_points()?;
        Ok(q)
    }

    fn check_scales(&self) -> Res<()> {
        let (logical, scales, quantize_axis, block) = (&self.logical, self.scales, self.quantize_axis, self.block);
        let rank = logical.len();
        let blocks = logical[quantize_axis].div_ceil(block);
        let scale_fits = scales.rank() == rank
            && (0..rank).all(|d| {
                let s = scales.shape[d];
                if d == quantize_axis {
                    s == blocks
                } else {
                    s == logical[d] || s == 1
                }
            });
        if !scale_fits {
            bail!(
                "scales of shape {:?} do not fit data {:?} quantised in blocks of {block} on axis {quantize_axis}",
                scales.shape,
                logical
            );
        }
        Ok(())
    }

    fn check_zero_points(&self) -> Res<()> {
        let Some(z) = self.zero_points else { return Ok(()) };
        let data = self.data;
        if is_small_float(data.dtype) || z.dtype != data.dtype {
            bail!("zero_points of {} do not fit {} data", z.dtype, data.dtype);
        }
        let last = data.rank() - 1;
        let mut stored = self.scales.shape.clone();
        stored[last] = stored[last].div_ceil(self.per_byte);
        if z.shape != stored {
            bail!("zero_points must have shape {stored:?}, got {:?}", z.shape);
        }
        Ok(())
    }

    /// The code at logical (unpacked) flat index `li`.
    fn code_at(&self, li: usize) -> f32 {
        let data = self.data;
        let last = data.rank() - 1;
        match &data.data {
            Data::I64(v) if self.packed => {
                let (row, j) = (li / self.logical[last], li % self.logical[last]);
                unpack(&v[row * data.shape[last]..][..data.shape[last]], self.bits as usize, j) as f32
            }
            Data::I64(v) => v[li] as f32,
            Data::F32(v) => v[li],
            _ => f32::NAN,
        }
    }

    /// The zero point at flat scale index `si`.
    fn zero_point_at(&self, si: usize) -> f32 {
        let zp_last = self.scales.shape[self.data.rank() - 1];
        match self.zero_points.map(|z| &z.data) {
            Some(Data::I64(v)) if self.packed => {
                let (row, j) = (si / zp_last, si % zp_last);
                let row_bytes = zp_last.div_ceil(self.per_byte);
                unpack(&v[row * row_bytes..][..row_bytes], self.bits as usize, j) as f32
            }
            Some(Data::I64(v)) => v[si] as f32,
            _ if self.packed => (1i64 << (self.bits - 1)) as f32,
            _ => 0.0,
        }
    }

    /// The flat scale index of logical flat index `li`.
    fn scale_index(&self, li: usize, logical_strides: &[usize], scale_strides: &[usize]) -> usize {
        let mut si = 0;
        for d in 0..self.logical.len() {
            let c = (li / logical_strides[d]) % self.logical[d];
            let c = if d == self.quantize_axis {
                c / self.block
            } else if self.scales.shape[d] == 1 {
                0
            } else {
                c
            };
            si += c * scale_strides[d];
        }
        si
    }
}

/// A's rows with each `block`-long run along K replaced by its int8 quantisation `q · s`
/// (`s = max|a| / 127`, `q = round_half_even(a · (127 / max|a|))`, f32 arithmetic): what
/// onnxruntime's `accuracy_level` 4 kernel multiplies the weights with.
pub(super) fn int8_blocks(a: &[f32], k: usize, block: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(a.len());
    for row in a.chunks(k) {
        for blk in row.chunks(block) {
            let amax = blk.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
            let scale = amax / 127.0;
            let inv = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            out.extend(
                blk.iter().map(|&x| f64::from((x * inv).round_ties_even().clamp(-128.0, 127.0)) * f64::from(scale)),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    fn code(d: DType) -> Attr {
        Attr::Int(d.onnx_code() as i64)
    }

    #[test]
    fn quantize_linear_rounds_half_to_even_then_saturates() {
        let x = f32t(&[8], &[0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 3.499_999_8]);
        let one = f32t(&[], &[1.0]);
        // onnxruntime 1.32's outputs for these two cases.
        let y = run("QuantizeLinear", &[], &[Some(&x), Some(&one)], 1).unwrap();
        assert_eq!((y[0].dtype, ints(&y[0])), (DType::U8, vec![0, 2, 2, 0, 0, 255, 0, 3]));
        let y = run1("QuantizeLinear", &[], &[&x, &one, &typed(DType::I8, &[], &[3])]);
        assert_eq!(ints(&y), vec![3, 5, 5, 3, 1, 127, -128, 6]);
        // 0.3f / 0.1f is exactly 3 and 0.35f / 0.1f exactly 3.5 in f32 (onnxruntime agrees).
        let y = run1("QuantizeLinear", &[], &[&f32t(&[3], &[0.3, 0.25, 0.35]), &f32t(&[], &[0.1])]);
        assert_eq!(ints(&y), vec![3, 2, 4]);
        let y = run(
            "QuantizeLinear",
            &[("output_dtype", code(DType::I4))],
            &[Some(&f32t(&[3], &[7.5, -9.0, 3.49])), Some(&one)],
            1,
        )
        .unwrap();
        assert_eq!((y[0].dtype, ints(&y[0])), (DType::I4, vec![7, -8, 3]));
        let y = run(
            "QuantizeLinear",
            &[("output_dtype", code(DType::F8E4M3FN))],
            &[Some(&f32t(&[2], &[1.0, 1000.0])), Some(&one)],
            1,
        )
        .unwrap();
        assert_eq!((y[0].dtype, f32s(&y[0])), (DType::F8E4M3FN, vec![1.0, 448.0]));
    }

    #[test]
    fn quantize_linear_per_axis_and_blocked() {
        let x = f32t(&[2, 6], &(0..12).map(|i| i as f32 - 5.0).collect::<Vec<_>>());
        // onnxruntime 1.32's outputs for both cases.
        let blocked = run1(
            "QuantizeLinear",
            &[("axis", Attr::Int(1)), ("block_size", Attr::Int(3))],
            &[&x, &f32t(&[2, 2], &[1.0, 2.0, 0.5, 4.0]), &typed(DType::I8, &[2, 2], &[0; 4])],
        );
        assert_eq!(ints(&blocked), vec![-5, -4, -3, -1, 0, 0, 2, 4, 6, 1, 1, 2]);
        let per_axis = run1(
            "QuantizeLinear",
            &[("axis", Attr::Int(0))],
            &[&x, &f32t(&[2], &[1.0, 3.0]), &typed(DType::U8, &[2], &[1, 2])],
        );
        assert_eq!(ints(&per_axis), vec![0, 0, 0, 0, 0, 1, 2, 3, 3, 3, 4, 4]);
        let e = err_msg(run("QuantizeLinear", &[("axis", Attr::Int(0))], &[Some(&x), Some(&f32t(&[3], &[1.0; 3]))], 1));
        assert!(e.contains("per-axis scale"), "{e}");
    }

    #[test]
    fn dequantize_linear_subtracts_the_zero_point_and_scales() {
        let x = typed(DType::I8, &[3], &[-128, 0, 127]);
        let y = run1("DequantizeLinear", &[], &[&x, &f32t(&[], &[0.5]), &typed(DType::I8, &[], &[-1])]);
        assert_eq!(f32s(&y), vec![-63.5, 0.5, 64.0]);
        let xu = typed(DType::U8, &[2, 2], &[1, 2, 3, 4]);
        let y = run1("DequantizeLinear", &[], &[&xu, &f32t(&[2], &[1.0, 10.0]), &typed(DType::U8, &[2], &[0, 1])]);
        assert_eq!(f32s(&y), vec![1.0, 10.0, 3.0, 30.0]);
        let x4 = typed(DType::I4, &[1, 4], &[1, 2, 3, 4]);
        let y = run1(
            "DequantizeLinear",
            &[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))],
            &[&x4, &f32t(&[1, 2], &[1.0, 0.5])],
        );
        assert_eq!(f32s(&y), vec![1.0, 2.0, 1.5, 2.0]);
        let half = Tensor::from_f32(DType::F16, vec![], vec![0.1]);
        let y = run1("DequantizeLinear", &[], &[&typed(DType::I32, &[1], &[3]), &half]);
        // 0.1 is 0.0999755859375 in f16; times 3 is 0.2999267578125, exactly halfway between the
        // f16 neighbours 1228 * 2^-12 = 0.2998046875 and 1229 * 2^-12: the tie goes to even.
        assert_eq!((y.dtype, f32s(&y)), (DType::F16, vec![0.299_804_7]));
        let f8 = Tensor::from_f32(DType::F8E4M3FN, vec![2], vec![448.0, 0.3125]);
        assert_eq!(f32s(&run1("DequantizeLinear", &[], &[&f8, &f32t(&[], &[2.0])])), vec![896.0, 0.625]);
        let ms =
            run_ms("DequantizeLinear", &[("axis", Attr::Int(1))], &[Some(&xu), Some(&f32t(&[2], &[1.0, 10.0]))], 1)
                .unwrap();
        assert_eq!(f32s(&ms[0]), vec![1.0, 20.0, 3.0, 40.0]);
    }

    #[test]
    fn dynamic_quantize_linear_matches_onnxruntime() {
        // onnxruntime 1.32's outputs (y, scale, zero point) for each input.
        let cases: [(&[f32], &[i64], f32, i64); 5] = [
            (&[0.0, 0.0, 0.0], &[0, 0, 0], 1.0, 0),
            (&[1.0, 2.0, 3.0], &[85, 170, 255], 0.011_764_706, 0),
            (&[-1.0, -2.0], &[128, 0], 0.007_843_138, 255),
            (&[-1.0, 0.5, 2.55], &[0, 108, 255], 0.013_921_568, 72),
            (&[0.0, 2.0, -3.0, -2.5, 1.34, 0.5], &[153, 255, 0, 26, 221, 179], 0.019_607_844, 153),
        ];
        for (x, y, scale, zp) in cases {
            let out = run("DynamicQuantizeLinear", &[], &[Some(&f32t(&[x.len()], x))], 3).unwrap();
            assert_eq!(ints(&out[0]), y, "input {x:?}");
            assert_eq!(f32s(&out[1]), vec![scale], "input {x:?}");
            assert_eq!((out[2].dtype, ints(&out[2])), (DType::U8, vec![zp]), "input {x:?}");
        }
    }

    /// MatMulNBits over K=20 (two blocks of 16, the second padded), N=2, A = pattern(40, 1) as
    /// [1, 2, 20], scales [0.5, 0.25, 1, 2].
    fn nbits(bits: usize, b: Vec<i64>, extra: &[Option<&Tensor>]) -> Vec<f32> {
        let a = f32t(&[1, 2, 20], &pattern(40, 1));
        let blob = 16 * bits / 8;
        let b = Tensor::from_i64(DType::U8, vec![2, 2, blob], b);
        let scales = f32t(&[4], &[0.5, 0.25, 1.0, 2.0]);
        let mut inputs = vec![Some(&a), Some(&b), Some(&scales)];
        inputs.extend_from_slice(extra);
        let attrs = [
            ("K", Attr::Int(20)),
            ("N", Attr::Int(2)),
            ("bits", Attr::Int(bits as i64)),
            ("block_size", Attr::Int(16)),
        ];
        let y = run_ms("MatMulNBits", &attrs, &inputs, 1).unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 2]);
        f32s(&y[0])
    }

    #[test]
    fn matmul_nbits_unpacks_low_nibble_first_with_default_zero_point() {
        // onnxruntime 1.32's outputs for these inputs.
        const MNB4_DEFAULT: [f32; 4] = [-1.859375, -8.4375, -4.234375, -18.0];
        const MNB8_DEFAULT: [f32; 4] = [10.25, 49.6875, 18.75, 171.0625];
        const MNB2_DEFAULT: [f32; 4] = [0.703125, 4.0625, 0.703125, 1.375];
        assert_close(&nbits(4, byte_pattern(32, 2), &[]), &MNB4_DEFAULT, 1e-5);
        assert_close(&nbits(8, byte_pattern(64, 3), &[]), &MNB8_DEFAULT, 1e-4);
        assert_close(&nbits(2, byte_pattern(16, 4), &[]), &MNB2_DEFAULT, 1e-5);
    }

    #[test]
    fn matmul_nbits_takes_packed_or_float_zero_points_and_bias() {
        // onnxruntime 1.32's outputs for these inputs.
        const MNB4_PACKED_ZP: [f32; 4] = [-3.6875, -16.8125, -6.0, -25.625];
        const MNB4_FLOAT_ZP: [f32; 4] = [-3.3125, 10.96875, -5.203125, -1.34375];
        const MNB4_BIAS: [f32; 4] = [98.140625, -108.4375, 95.765625, -118.0];
        // Row 0 uses zero points 0xa (block 0) and 0x3 (block 1); row 1 uses 0xc and 0x5.
        let packed = typed(DType::U8, &[2], &[0x3a, 0x5c]);
        assert_close(&nbits(4, byte_pattern(32, 2), &[Some(&packed)]), &MNB4_PACKED_ZP, 1e-5);
        let float_zp = f32t(&[4], &[8.5, 3.0, 0.0, 15.25]);
        assert_close(&nbits(4, byte_pattern(32, 2), &[Some(&float_zp)]), &MNB4_FLOAT_ZP, 1e-5);
        let bias = f32t(&[2], &[100.0, -100.0]);
        assert_close(&nbits(4, byte_pattern(32, 2), &[None, None, Some(&bias)]), &MNB4_BIAS, 1e-4);
        let short = f32t(&[3], &[0.0; 3]);
        let a = f32t(&[1, 20], &pattern(20, 1));
        let b = Tensor::from_i64(DType::U8, vec![2, 2, 8], byte_pattern(32, 2));
        let attrs = [("K", Attr::Int(20)), ("N", Attr::Int(2)), ("block_size", Attr::Int(16))];
        let e = err_msg(run_ms("MatMulNBits", &attrs, &[Some(&a), Some(&b), Some(&short)], 1));
        assert!(e.contains("scales must hold"), "{e}");
    }

    #[test]
    fn matmul_nbits_dequantises_by_hand() {
        // K=16, N=1, one block: codes 0..15 (two per byte, low nibble first), scale 0.5,
        // default zero point 8, A all ones: Σ (q - 8) * 0.5 = (120 - 128) * 0.5 = -4.
        let a = f32t(&[1, 16], &[1.0; 16]);
        let b = Tensor::from_i64(DType::U8, vec![1, 1, 8], (0..8).map(|i| (2 * i) | ((2 * i + 1) << 4)).collect());
        let attrs = [("K", Attr::Int(16)), ("N", Attr::Int(1)), ("block_size", Attr::Int(16))];
        let y = run_ms("MatMulNBits", &attrs, &[Some(&a), Some(&b), Some(&f32t(&[1], &[0.5]))], 1).unwrap();
        assert_eq!(f32s(&y[0]), vec![-4.0]);
        // A picks out element 1 (code 1): (1 - 8) * 0.5.
        let mut unit = vec![0.0; 16];
        unit[1] = 1.0;
        let y = run_ms("MatMulNBits", &attrs, &[Some(&f32t(&[1, 16], &unit)), Some(&b), Some(&f32t(&[1], &[0.5]))], 1)
            .unwrap();
        assert_eq!(f32s(&y[0]), vec![-3.5]);
    }

    #[test]
    fn gather_block_quantized_dequantises_gathered_rows() {
        // onnxruntime 1.32's outputs; data is byte_pattern(48, 5) as uint8 [3, 16] holding 4-bit
        // codes [3, 32], scales [3, 2] (blocks of 16), indices [2, -3, 7]: 7 is out of range and
        // gives zeros.
        const GBQ_U8_DEFAULT: [f32; 96] = [
            1.0, -5.0, -4.0, -7.0, 7.0, 6.0, 2.0, 4.0, -3.0, 2.0, 8.0, -1.0, 3.0, -3.0, -2.0, -5.0, 28.0, 28.0, -16.0,
            -24.0, 4.0, -16.0, 24.0, -8.0, -20.0, 4.0, 0.0, 12.0, 20.0, 20.0, -24.0, -32.0, -1.0, -5.0, 4.0, -3.0,
            -7.0, 0.0, -2.0, 2.0, 3.0, 4.0, -8.0, 7.0, -3.0, -7.0, 2.0, -5.0, 3.5, -1.5, -2.0, 0.0, 0.5, 1.0, 3.0, 2.0,
            -2.5, 3.5, 0.0, -3.5, 2.5, -2.5, -3.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        const GBQ_U8_ZP: [f32; 64] = [
            6.0, 2.0, 11.0, 4.0, 0.0, 7.0, 5.0, 9.0, 10.0, 11.0, -1.0, 14.0, 4.0, 0.0, 9.0, 2.0, 6.0, 1.0, 0.5, 2.5,
            3.0, 3.5, 5.5, 4.5, 0.0, 6.0, 2.5, -1.0, 5.0, 0.0, -0.5, 1.5, -7.0, -13.0, -12.0, -15.0, -1.0, -2.0, -6.0,
            -4.0, -11.0, -6.0, -0.0, -9.0, -5.0, -11.0, -10.0, -13.0, 0.0, 0.0, -44.0, -52.0, -24.0, -44.0, -4.0,
            -36.0, -48.0, -24.0, -28.0, -16.0, -8.0, -8.0, -52.0, -60.0,
        ];
        const GBQ_I4_ZP: [f32; 64] = [
            -10.0, 0.0, 10.0, -12.0, -2.0, 8.0, -14.0, -4.0, 6.0, -16.0, -6.0, 4.0, 14.0, -8.0, 2.0, 12.0, -2.0, -0.75,
            0.5, -2.25, -1.0, 0.25, -2.5, -1.25, 0.0, -2.75, -1.5, -0.25, 1.0, -1.75, -0.5, 0.75, -3.0, -8.0, -13.0,
            -2.0, -7.0, -12.0, -1.0, -6.0, -11.0, -0.0, -5.0, -10.0, -15.0, -4.0, -9.0, -14.0, -48.0, -28.0, -8.0,
            -52.0, -32.0, -12.0, -56.0, -36.0, -16.0, -60.0, -40.0, -20.0, 0.0, -44.0, -24.0, -4.0,
        ];
        let data = typed(DType::U8, &[3, 16], &byte_pattern(48, 5));
        let scales = f32t(&[3, 2], &[1.0, 0.5, 2.0, 0.25, -1.0, 4.0]);
        let attrs = [
            ("block_size", Attr::Int(16)),
            ("quantize_axis", Attr::Int(1)),
            ("gather_axis", Attr::Int(0)),
            ("bits", Attr::Int(4)),
        ];
        let y =
            run_ms("GatherBlockQuantized", &attrs, &[Some(&data), Some(&i64t(&[3], &[2, -3, 7])), Some(&scales)], 1)
                .unwrap();
        assert_eq!(y[0].shape, vec![3, 32]);
        assert_eq!(f32s(&y[0]), GBQ_U8_DEFAULT);
        let zp = typed(DType::U8, &[3, 1], &[0x31, 0x02, 0xf0]);
        let y = run_ms(
            "GatherBlockQuantized",
            &attrs,
            &[Some(&data), Some(&i64t(&[2], &[0, 2])), Some(&scales), Some(&zp)],
            1,
        )
        .unwrap();
        assert_eq!(f32s(&y[0]), GBQ_U8_ZP);
        // int4 data: the default zero point is 0 and typed zero points apply directly.
        let d4 = typed(DType::I4, &[3, 32], &(0..96).map(|i| ((i * 5 + 3) % 16) - 8).collect::<Vec<_>>());
        let z4 = typed(DType::I4, &[3, 2], &[1, -2, 0, 3, -8, 7]);
        let attrs4 = [("block_size", Attr::Int(16)), ("quantize_axis", Attr::Int(1)), ("gather_axis", Attr::Int(0))];
        let y = run_ms(
            "GatherBlockQuantized",
            &attrs4,
            &[Some(&d4), Some(&i64t(&[2], &[1, 2])), Some(&scales), Some(&z4)],
            1,
        )
        .unwrap();
        assert_eq!(f32s(&y[0]), GBQ_I4_ZP);
        let y =
            run_ms("GatherBlockQuantized", &attrs4, &[Some(&d4), Some(&i64t(&[1], &[0])), Some(&scales)], 1).unwrap();
        assert_eq!(f32s(&y[0])[0], -5.0);
        let e = err_msg(run_ms(
            "GatherBlockQuantized",
            &attrs,
            &[Some(&data), Some(&i64t(&[1], &[0])), Some(&f32t(&[3, 3], &[1.0; 9]))],
            1,
        ));
        assert!(e.contains("do not fit"), "{e}");
    }
}
