//! What the frontend's case checks share (the `contrib_ops_vs_ort` test and the `check_cases`
//! example, which includes this file by path).

/// The largest error of `got` against `want`, relative to the largest |want|.
pub fn relative_error(got: &ir::Tensor, want: &ir::Tensor) -> Result<f64, String> {
    if got.shape != want.shape || got.dtype != want.dtype {
        return Err(format!("{}{:?}, expected {}{:?}", got.dtype, got.shape, want.dtype, want.shape));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let worst =
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f64, |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) });
    Ok(worst / scale)
}
