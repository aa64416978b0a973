//! MatMul, Gemm and MatMulInteger, and the dot-product kernels they share with the quantised and
//! attention ops. Float products accumulate in f64 and round once to the output dtype; integer
//! products are exact with two's-complement wrapping.

use super::layout::{broadcast_index_map, broadcast_shapes, broadcasts_to, checked_numel, BroadcastMap};
use super::{float_tensor, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{numel, Data, Tensor};

/// Float element types that widen exactly to f64.
pub(crate) trait Widen: Copy {
    fn widen(self) -> f64;
}

impl Widen for f32 {
    #[inline]
    fn widen(self) -> f64 {
        self as f64
    }
}

impl Widen for f64 {
    #[inline]
    fn widen(self) -> f64 {
        self
    }
}

/// Where a matrix lives in a flat buffer: element (i, j) is at `offset + i*row_step + j*col_step`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatView {
    pub(crate) offset: usize,
    pub(crate) row_step: usize,
    pub(crate) col_step: usize,
}

impl MatView {
    /// A row-major `rows x cols` matrix starting at `offset`.
    pub(crate) fn row_major(offset: usize, cols: usize) -> MatView {
        MatView { offset, row_step: cols, col_step: 1 }
    }
}

/// `out[i*n + j] += Σ_k a(i,k) b(k,j)` in f64 for an `m x k` by `k x n` product. When B's rows
/// are contiguous the loop runs i-k-j so the innermost loop streams a row of B; otherwise (B
/// transposed in memory) it takes dot products along k.
pub(crate) fn gemm_f64<T: Widen>(
    a: &[T],
    av: MatView,
    b: &[T],
    bv: MatView,
    (m, k, n): (usize, usize, usize),
    out: &mut [f64],
) {
    if bv.col_step == 1 {
        for i in 0..m {
            let row = &mut out[i * n..(i + 1) * n];
            for kk in 0..k {
                let x = a[av.offset + i * av.row_step + kk * av.col_step].widen();
                let b_row = &b[bv.offset + kk * bv.row_step..][..n];
                for (o, &y) in row.iter_mut().zip(b_row) {
                    *o += x * y.widen();
                }
            }
        }
    } else {
        for i in 0..m {
            for j in 0..n {
                let a_at = |kk: usize| a[av.offset + i * av.row_step + kk * av.col_step].widen();
                let b_at = |kk: usize| b[bv.offset + kk * bv.row_step + j * bv.col_step].widen();
                out[i * n + j] += strided_dot(k, a_at, b_at);
            }
        }
    }
}

/// Σ a(k) b(k) over `len` terms in f64, with four partial sums so the additions pipeline.
#[inline]
pub(crate) fn strided_dot(len: usize, a: impl Fn(usize) -> f64, b: impl Fn(usize) -> f64) -> f64 {
    let mut acc = [0.0f64; 4];
    let body = len - len % 4;
    for kk in (0..body).step_by(4) {
        for (lane, s) in acc.iter_mut().enumerate() {
            *s += a(kk + lane) * b(kk + lane);
        }
    }
    let mut tail = 0.0;
    for kk in body..len {
        tail += a(kk) * b(kk);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Dot product of two f64 slices of equal length.
#[inline]
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    strided_dot(a.len().min(b.len()), |k| a[k], |k| b[k])
}

/// Integer `m x k` by `k x n` product of row-major blocks with per-row zero points for A and
/// per-column zero points for B, accumulated with wrapping: `out[i][j] += Σ (a-za_i)(b-zb_j)`.
#[allow(clippy::too_many_arguments)]
fn gemm_i64(
    a: &[i64],
    a_offset: usize,
    a_zp: &[i64],
    b: &[i64],
    b_offset: usize,
    b_zp: &[i64],
    (m, k, n): (usize, usize, usize),
    out: &mut [i64],
) {
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = a[a_offset + i * k + kk].wrapping_sub(a_zp[i]);
            let b_row = &b[b_offset + kk * n..][..n];
            for ((o, &y), &z) in row.iter_mut().zip(b_row).zip(b_zp) {
                *o = o.wrapping_add(x.wrapping_mul(y.wrapping_sub(z)));
            }
        }
    }
}

/// Shapes of a (batched, broadcast) matrix product: 1-D operands are promoted to matrices
/// (A to a row, B to a column) and the promoted dimension is dropped from the result.
struct MatmulShape {
    m: usize,
    k: usize,
    n: usize,
    batch: Vec<usize>,
    a_batch_map: Vec<usize>,
    b_batch_map: Vec<usize>,
    out_shape: Vec<usize>,
}

fn matmul_shape(a: &[usize], b: &[usize]) -> Res<MatmulShape> {
    if a.is_empty() || b.is_empty() {
        bail!("MatMul operands must have rank at least 1, got {a:?} and {b:?}");
    }
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        bail!("cannot multiply {a:?} by {b:?}: inner dimensions {k} and {k2} differ");
    }
    let (a_batch, b_batch) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = broadcast_shapes(&[a_batch, b_batch])?;
    let mut out_shape = batch.clone();
    if a.len() > 1 {
        out_shape.push(m);
    }
    if b.len() > 1 {
        out_shape.push(n);
    }
    checked_numel(&out_shape)?;
    Ok(MatmulShape {
        m,
        k,
        n,
        a_batch_map: broadcast_index_map(a_batch, &batch),
        b_batch_map: broadcast_index_map(b_batch, &batch),
        batch,
        out_shape,
    })
}

/// MatMul with numpy semantics: batch dimensions broadcast, 1-D operands promoted.
pub(super) fn matmul(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (a, b) = (cx.input(0, "A")?, cx.input(1, "B")?);
    if a.dtype != b.dtype {
        bail!("operands have different dtypes {} and {}", a.dtype, b.dtype);
    }
    let s = matmul_shape(&a.shape, &b.shape)?;
    let (m, k, n) = (s.m, s.k, s.n);
    let batches = numel(&s.batch).unwrap_or(0);
    let block = m * n;
    let out = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => float_tensor(a.dtype, s.out_shape.clone(), batched_f64(x, y, &s)),
        (Data::F64(x), Data::F64(y)) => float_tensor(a.dtype, s.out_shape.clone(), batched_f64(x, y, &s)),
        (Data::I64(x), Data::I64(y)) if a.dtype != DType::Bool => {
            let mut out = vec![0i64; batches * block];
            let (za, zb) = (vec![0; m], vec![0; n]);
            for bi in 0..batches {
                let (ao, bo) = (s.a_batch_map[bi] * m * k, s.b_batch_map[bi] * k * n);
                gemm_i64(x, ao, &za, y, bo, &zb, (m, k, n), &mut out[bi * block..(bi + 1) * block]);
            }
            Tensor::from_i64(a.dtype, s.out_shape, out)
        }
        _ => bail!("MatMul is not defined for {} tensors", a.dtype),
    };
    Ok(vec![out])
}

fn batched_f64<T: Widen>(x: &[T], y: &[T], s: &MatmulShape) -> Vec<f64> {
    let (m, k, n) = (s.m, s.k, s.n);
    let batches = numel(&s.batch).unwrap_or(0);
    let mut out = vec![0.0; batches * m * n];
    for bi in 0..batches {
        let av = MatView::row_major(s.a_batch_map[bi] * m * k, k);
        let bv = MatView::row_major(s.b_batch_map[bi] * k * n, n);
        gemm_f64(x, av, y, bv, (m, k, n), &mut out[bi * m * n..(bi + 1) * m * n]);
    }
    out
}

/// Gemm: `alpha * A' B' + beta * C` with optional transposes and C broadcast to `[M, N]`.
/// Integer Gemm is exact and needs integral alpha and beta.
pub(super) fn gemm(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (a, b, c) = (cx.input(0, "A")?, cx.input(1, "B")?, cx.opt(2));
    let trans_a = cx.attrs().int_or("transA", 0)? != 0;
    let trans_b = cx.attrs().int_or("transB", 0)? != 0;
    let alpha = cx.attrs().float_or("alpha", 1.0)? as f64;
    let beta = cx.attrs().float_or("beta", 1.0)? as f64;
    if a.rank() != 2 || b.rank() != 2 {
        bail!("Gemm needs 2-D operands, got {:?} and {:?}", a.shape, b.shape);
    }
    if a.dtype != b.dtype || c.is_some_and(|c| c.dtype != a.dtype) {
        bail!("operands must share one dtype");
    }
    let (m, k) = if trans_a { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let (k2, n) = if trans_b { (b.shape[1], b.shape[0]) } else { (b.shape[0], b.shape[1]) };
    if k != k2 {
        bail!("inner dimensions differ: A' is {m}x{k}, B' is {k2}x{n}");
    }
    let out_shape = vec![m, n];
    checked_numel(&out_shape)?;
    if let Some(c) = c {
        if !broadcasts_to(&c.shape, &out_shape) {
            bail!("C of shape {:?} does not broadcast to [{m}, {n}]", c.shape);
        }
    }
    let c_map = c.map(|c| BroadcastMap::new(&c.shape, &out_shape));
    let av = if trans_a {
        MatView { offset: 0, row_step: 1, col_step: a.shape[1] }
    } else {
        MatView::row_major(0, a.shape[1])
    };
    let bv = if trans_b {
        MatView { offset: 0, row_step: 1, col_step: b.shape[1] }
    } else {
        MatView::row_major(0, b.shape[1])
    };
    let out = match (&a.data, &b.data) {
        (Data::F32(_) | Data::F64(_), _) => {
            let mut acc = vec![0.0; m * n];
            match (&a.data, &b.data) {
                (Data::F32(x), Data::F32(y)) => gemm_f64(x, av, y, bv, (m, k, n), &mut acc),
                (Data::F64(x), Data::F64(y)) => gemm_f64(x, av, y, bv, (m, k, n), &mut acc),
                _ => bail!("operands have different storage"),
            }
            let c_values = c.map(|c| c.to_f64_vec());
            for (i, v) in acc.iter_mut().enumerate() {
                *v *= alpha;
                if let (Some(cv), Some(map)) = (&c_values, &c_map) {
                    *v += beta * cv[map.at(i)];
                }
            }
            float_tensor(a.dtype, out_shape, acc)
        }
        (Data::I64(x), Data::I64(y)) if a.dtype != DType::Bool => {
            if alpha.fract() != 0.0 || beta.fract() != 0.0 {
                bail!("integer Gemm needs integral alpha and beta, got {alpha} and {beta}");
            }
            let at = |v: &MatView, data: &[i64], i: usize, j: usize| data[v.offset + i * v.row_step + j * v.col_step];
            let a_rows: Vec<i64> = (0..m * k).map(|e| at(&av, x, e / k, e % k)).collect();
            let b_rows: Vec<i64> = (0..k * n).map(|e| at(&bv, y, e / n, e % n)).collect();
            let mut acc = vec![0i64; m * n];
            gemm_i64(&a_rows, 0, &vec![0; m], &b_rows, 0, &vec![0; n], (m, k, n), &mut acc);
            let c_values = c.and_then(|c| c.as_i64());
            for (i, v) in acc.iter_mut().enumerate() {
                *v = v.wrapping_mul(alpha as i64);
                if let (Some(cv), Some(map)) = (c_values, &c_map) {
                    *v = v.wrapping_add((beta as i64).wrapping_mul(cv[map.at(i)]));
                }
            }
            Tensor::from_i64(a.dtype, out_shape, acc)
        }
        _ => bail!("Gemm is not defined for {} tensors", a.dtype),
    };
    Ok(vec![out])
}

/// MatMulInteger: 8-bit operands minus their zero points (A's per tensor or per row, B's per
/// tensor or per column), multiplied exactly into int32.
pub(super) fn matmul_integer(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (a, b) = (cx.input(0, "A")?, cx.input(1, "B")?);
    for t in [a, b] {
        if !matches!(t.dtype, DType::U8 | DType::I8) {
            bail!("operands must be uint8 or int8, got {}", t.dtype);
        }
    }
    let s = matmul_shape(&a.shape, &b.shape)?;
    let (m, k, n) = (s.m, s.k, s.n);
    let zero_points = |index: usize, operand: &Tensor, len: usize, what: &str| -> Res<Vec<i64>> {
        let Some(z) = cx.opt(index) else { return Ok(vec![0; len]) };
        if z.dtype != operand.dtype {
            bail!("{what} has dtype {}, its operand {}", z.dtype, operand.dtype);
        }
        let v = super::int_values(z, what)?;
        match v.len() {
            1 => Ok(vec![v[0]; len]),
            l if l == len => Ok(v.to_vec()),
            l => bail!("{what} has {l} values, expected 1 or {len}"),
        }
    };
    let za = zero_points(2, a, m, "a_zero_point")?;
    let zb = zero_points(3, b, n, "b_zero_point")?;
    let (Data::I64(x), Data::I64(y)) = (&a.data, &b.data) else {
        bail!("operands must be integer tensors");
    };
    let batches = numel(&s.batch).unwrap_or(0);
    let block = m * n;
    let mut out = vec![0i64; batches * block];
    for bi in 0..batches {
        let (ao, bo) = (s.a_batch_map[bi] * m * k, s.b_batch_map[bi] * k * n);
        gemm_i64(x, ao, &za, y, bo, &zb, (m, k, n), &mut out[bi * block..(bi + 1) * block]);
    }
    Ok(vec![Tensor::from_i64(DType::I32, s.out_shape, out)])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;

    #[test]
    fn matmul_promotes_one_dimensional_operands() {
        let v = f32t(&[3], &[1.0, 2.0, 3.0]);
        let y = run1("MatMul", &[], &[&v, &f32t(&[3], &[4.0, 5.0, 6.0])]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![], vec![32.0]));
        let m = f32t(&[2, 3], &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        let y = run1("MatMul", &[], &[&m, &v]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2], vec![1.0, 5.0]));
        let y = run1("MatMul", &[], &[&f32t(&[2], &[1.0, 1.0]), &m]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![3], vec![1.0, 1.0, 1.0]));
    }

    #[test]
    fn matmul_broadcasts_batch_dimensions() {
        let a = f32t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let b = f32t(&[2, 1], &[1.0, 10.0]);
        let y = run1("MatMul", &[], &[&a, &b]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2, 1], vec![21.0, 43.0, 65.0, 87.0]));
        let b3 = f32t(&[3, 1, 2, 1], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let y = run1("MatMul", &[], &[&a, &b3]);
        assert_eq!(y.shape, vec![3, 2, 2, 1]);
        assert_eq!(&f32s(&y)[4..8], &[2.0, 4.0, 6.0, 8.0]);
        let ai = typed(DType::I32, &[1, 2], &[3, -4]);
        let bi = typed(DType::I32, &[2, 1], &[5, 6]);
        assert_eq!(ints(&run1("MatMul", &[], &[&ai, &bi])), vec![-9]);
        let e = err_msg(run("MatMul", &[], &[Some(&a), Some(&f32t(&[3, 1], &[0.0; 3]))], 1));
        assert!(e.contains("inner dimensions"), "{e}");
    }

    #[test]
    fn gemm_applies_transposes_alpha_beta_and_broadcast_c() {
        let a = f32t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = f32t(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        let c = f32t(&[2], &[1.0, -1.0]);
        let attrs = [("transB", Attr::Int(1)), ("alpha", Attr::Float(2.0)), ("beta", Attr::Float(0.5))];
        assert_eq!(f32s(&run1("Gemm", &attrs, &[&a, &b, &c])), vec![8.5, 3.5, 20.5, 9.5]);
        // The same product with A stored transposed.
        let at = f32t(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let attrs = [("transA", Attr::Int(1)), ("transB", Attr::Int(1))];
        assert_eq!(f32s(&run("Gemm", &attrs, &[Some(&at), Some(&b)], 1).unwrap()[0]), vec![4.0, 2.0, 10.0, 5.0]);
    }

    #[test]
    fn matmul_integer_subtracts_row_and_column_zero_points() {
        let a = typed(DType::U8, &[2, 2], &[10, 20, 30, 40]);
        let b = typed(DType::I8, &[2, 2], &[1, -2, 3, 4]);
        let (za, zb) = (typed(DType::U8, &[2], &[10, 20]), typed(DType::I8, &[2], &[1, 0]));
        let y = run1("MatMulInteger", &[], &[&a, &b, &za, &zb]);
        assert_eq!((y.dtype, ints(&y)), (DType::I32, vec![20, 40, 40, 60]));
        let y = run("MatMulInteger", &[], &[Some(&a), Some(&b)], 1).unwrap();
        assert_eq!(ints(&y[0]), vec![70, 60, 150, 100]);
    }
}
