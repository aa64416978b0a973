//! The array's numerics for float and int4 models: int8 weights per output channel and int8
//! activations per row, each symmetric with scale amax/127 (zero point 0, codes in [-127, 127],
//! rounded half to even), int32 accumulation on the array, and the float epilogue
//! `y[i][j] = acc[i][j] · s_a[i] · s_w[j]` on the readback. QDQ (A8W8) models keep their own codes,
//! scales and zero points, and their epilogue is the host `QGemm`'s.

/// Symmetric int8 codes of a `[k, n]` row-major weight, one scale per output column.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnCodes {
    pub k: usize,
    pub n: usize,
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
}

/// Symmetric int8 codes of `[m, k]` row-major activations, one scale per row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowCodes {
    pub m: usize,
    pub k: usize,
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
}

fn code(x: f32, scale: f32) -> i8 {
    if scale == 0.0 {
        0
    } else {
        (x / scale).round_ties_even().clamp(-127.0, 127.0) as i8
    }
}

/// int8 weights per output channel.
pub fn quantize_columns(w: &[f32], k: usize, n: usize) -> ColumnCodes {
    assert_eq!(w.len(), k * n, "weight holds {} values, not {k}×{n}", w.len());
    let mut amax = vec![0f32; n];
    for row in w.chunks_exact(n) {
        for (m, &x) in amax.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    let scales: Vec<f32> = amax.iter().map(|&a| a / 127.0).collect();
    let codes = w.iter().enumerate().map(|(i, &x)| code(x, scales[i % n])).collect();
    ColumnCodes { k, n, codes, scales }
}

/// int8 activations per row.
pub fn quantize_rows(a: &[f32], m: usize, k: usize) -> RowCodes {
    assert_eq!(a.len(), m * k, "activations hold {} values, not {m}×{k}", a.len());
    let mut codes = Vec::with_capacity(m * k);
    let mut scales = Vec::with_capacity(m);
    for row in a.chunks_exact(k) {
        let s = row.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        codes.extend(row.iter().map(|&x| code(x, s)));
        scales.push(s);
    }
    RowCodes { m, k, codes, scales }
}

/// The float epilogue on the int32 readback `acc` (`[m, n]` row-major).
pub fn epilogue(acc: &[i32], rows: &RowCodes, cols: &ColumnCodes) -> Vec<f32> {
    let n = cols.n;
    acc.iter().enumerate().map(|(i, &v)| v as f32 * rows.scales[i / n] * cols.scales[i % n]).collect()
}

/// `‖got − want‖ / ‖want‖` (Frobenius).
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Relative error of a weight's int8 per-channel form against the weight.
pub fn weight_error(w: &[f32], k: usize, n: usize) -> f64 {
    let q = quantize_columns(w, k, n);
    let back: Vec<f32> = q.codes.iter().enumerate().map(|(i, &c)| c as f32 * q.scales[i % n]).collect();
    relative_error(&back, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_symmetric_and_round_half_to_even() {
        let q = quantize_rows(&[127.0, -63.5, 0.5, 1.5], 1, 4);
        assert_eq!(q.scales, vec![1.0]);
        assert_eq!(q.codes, vec![127, -64, 0, 2]);
        let c = quantize_columns(&[1.0, -2.0, -0.5, 4.0], 2, 2);
        assert_eq!(c.scales, vec![1.0 / 127.0, 4.0 / 127.0]);
        assert_eq!(c.codes, vec![127, -64, -64, 127]);
        let zero = quantize_rows(&[0.0; 3], 1, 3);
        assert_eq!(zero.codes, vec![0; 3]);
    }

    #[test]
    fn the_epilogue_scales_rows_and_columns() {
        let rows = RowCodes { m: 2, k: 1, codes: vec![], scales: vec![2.0, 3.0] };
        let cols = ColumnCodes { k: 1, n: 2, codes: vec![], scales: vec![0.5, 0.25] };
        assert_eq!(epilogue(&[1, 4, 2, 8], &rows, &cols), vec![1.0, 2.0, 3.0, 6.0]);
    }
}
