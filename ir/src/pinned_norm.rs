//! RmsNorm in f32 in one pinned order: the definition the host kernels follow on every
//! instruction set and an array core's code follows step for step, so that a norm computed on
//! the array equals the host's bit for bit (a program's exactness contract; see DESIGN.md, "XDNA:
//! toward one array program per layer").
//!
//! ```text
//! l[0..32] = +0;  for j in 0..d: l[j mod 32] = l[j mod 32] + x_j·x_j  (each product and sum rounded)
//! for n in 16, 8, 4, 2, 1: l[k] = l[k] + l[k + n] for k < n           (the lanes folded by halves)
//! ss = l[0]
//! r = 1 / √(ss/d + ε)
//! y_j = (x_j·r)·γ_j
//! ```
//!
//! Thirty-two lanes are four vectors of eight for an AIE2 core (eight f32 bit patterns to an
//! integer vector) and for AVX2, two for AVX-512: independent accumulators, so the host's sums
//! are not one chain of dependent additions; the folding by halves is how vector lanes reduce.
//! A row padded with zeros has the same sum (+0 added to a lane leaves it), so a vector loop
//! may read a tail with zeros. The products and sums are separate IEEE operations, never
//! fused, and every operation rounds to nearest even.

/// The sum of squares' lanes.
pub const LANES: usize = 32;

/// The sum of the squares of `row`, in the order of the module's definition.
pub fn sum_squares(row: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (j, &x) in row.iter().enumerate() {
        lanes[j % LANES] += x * x;
    }
    fold_lanes(lanes)
}

/// The lanes folded by halves: `l[k] + l[k + n]` for `k < n`, `n` from 16 down to 1.
pub fn fold_lanes(mut l: [f32; LANES]) -> f32 {
    let mut n = LANES / 2;
    while n > 0 {
        for k in 0..n {
            l[k] += l[k + n];
        }
        n /= 2;
    }
    l[0]
}

/// `r = 1/√(ss/d + ε)` for a row of `d` values whose squares sum to `ss`.
pub fn inverse_root(ss: f32, d: usize, epsilon: f32) -> f32 {
    1.0 / (ss / d as f32 + epsilon).sqrt()
}

/// One row's RmsNorm: `y_j = (x_j·r)·γ_j`. Panics unless `x`, `gamma` and `y` have one length.
pub fn rms_norm_row(x: &[f32], gamma: &[f32], epsilon: f32, y: &mut [f32]) {
    assert!(
        x.len() == gamma.len() && y.len() == x.len(),
        "rms_norm_row: x {}, γ {}, y {}",
        x.len(),
        gamma.len(),
        y.len()
    );
    let r = inverse_root(sum_squares(x), x.len(), epsilon);
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(gamma) {
        *o = (v * r) * g;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lanes_sum_in_the_defined_order() {
        // 2²⁴ + 1 + 1 depends on the order: left to right each 1 is lost to rounding (a tie,
        // to even), while the folding adds the ones in lanes 1 and 17 to each other first.
        let mut row = [0f32; 40];
        row[0] = 4096.0;
        row[1] = 1.0;
        row[17] = 1.0;
        // l[1] = 1 + 1 at the first halving, 2²⁴ + 2 exactly at the last.
        assert_eq!(sum_squares(&row), 16_777_218.0);
        let sequential: f32 = row.iter().map(|x| x * x).sum();
        assert_eq!(sequential, 16_777_216.0, "the order matters for this row");
        // Element 32 joins lane 0 after element 0, where the 1 is lost again.
        row[32] = 1.0;
        assert_eq!(sum_squares(&row), 16_777_218.0);
    }

    #[test]
    fn a_row_normalises_to_unit_mean_square() {
        let x: Vec<f32> = (0..40).map(|j| (j as f32 - 19.5) * 0.37).collect();
        let gamma = vec![1.0; 40];
        let mut y = vec![0.0; 40];
        rms_norm_row(&x, &gamma, 0.0, &mut y);
        let ms: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / 40.0;
        assert!((ms - 1.0).abs() < 1e-6, "mean square {ms}");
    }
}
