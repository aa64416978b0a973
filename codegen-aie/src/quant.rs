//! The A8W8 epilogue on the array's int32 readback, as `QGemm` defines it (`ir::fused`): the
//! array computes `P = Σₖ a·w` on the int8 codes; with the weight zero points z_w (per column) and
//! the activation zero point zₐ (per tensor), `acc = P − z_w·Σₖa − zₐ·Σₖw + K·zₐ·z_w` exactly, and
//! `y = acc · (sₐ · s_w)` in f32, sₐ per tensor or per row (what `QuantizeRows` gives), s_w per
//! tensor or per column. It is the reference `QGemm`'s arithmetic step for step, so a design's
//! output can differ from the host's only if its accumulator does.

/// Quantisation parameters of one `QGemm` call.
#[derive(Clone, Debug)]
pub struct QParams<'a> {
    /// Per tensor (one value) or per row.
    pub a_scales: &'a [f32],
    pub a_zero: i64,
    /// Per tensor (one value) or per column.
    pub w_scales: &'a [f32],
    /// Per tensor (one value) or per column.
    pub w_zeros: &'a [i64],
}

/// `y [m, n]` from the array's `p [m, n]` (row-major), the activation codes' row sums and the
/// weight codes' column sums.
pub fn epilogue(
    p: &[i32],
    m: usize,
    k: usize,
    n: usize,
    a_row_sums: &[i64],
    w_col_sums: &[i64],
    q: &QParams,
) -> Vec<f32> {
    let pick = |v: &[f32], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    let zw = |j: usize| if q.w_zeros.len() == 1 { q.w_zeros[0] } else { q.w_zeros[j] };
    let mut y = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let acc =
                p[i * n + j] as i64 - zw(j) * a_row_sums[i] - q.a_zero * w_col_sums[j] + k as i64 * q.a_zero * zw(j);
            y.push(acc as f32 * (pick(q.a_scales, i) * pick(q.w_scales, j)));
        }
    }
    y
}

/// Row sums of `[m, k]` codes and column sums of `[k, n]` codes.
pub fn code_sums(a: &[i8], m: usize, k: usize, w: &[i8], n: usize) -> (Vec<i64>, Vec<i64>) {
    let rows = (0..m).map(|i| a[i * k..(i + 1) * k].iter().map(|&x| x as i64).sum()).collect();
    let mut cols = vec![0i64; n];
    for row in w.chunks_exact(n) {
        for (c, &x) in cols.iter_mut().zip(row) {
            *c += x as i64;
        }
    }
    (rows, cols)
}
