//! Helpers shared by the design tests: operands, the plain reference GEMM, host padding.

use codegen_aie::design::{Design, Kind};
use codegen_aie::{gemv, interp};

/// A deterministic xorshift stream from `seed`.
pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// Deterministic int8 values in [-128, 127].
pub fn values(len: usize, seed: u64) -> Vec<i8> {
    xorshift(seed).take(len).map(|x| (x >> 24) as u8 as i8).collect()
}

pub fn reference(a: &[i8], b: &[i8], (m, k, n): (usize, usize, usize)) -> Vec<i32> {
    let mut c = vec![0i32; m * n];
    for i in 0..m {
        for kk in 0..k {
            let av = a[i * k + kk] as i32;
            for j in 0..n {
                c[i * n + j] += av * b[kk * n + j] as i32;
            }
        }
    }
    c
}

pub fn pad(src: &[i8], (rows, cols): (usize, usize), (prows, pcols): (usize, usize)) -> Vec<i8> {
    let mut out = vec![0i8; prows * pcols];
    for r in 0..rows {
        out[r * pcols..r * pcols + cols].copy_from_slice(&src[r * cols..r * cols + cols]);
    }
    out
}

/// `w` (`[k, n]` row-major) transposed into a zero-padded `[pn, pk]`: a GEMV design's B operand.
#[allow(dead_code)]
pub fn transpose_padded(w: &[i8], (k, n): (usize, usize), (pk, pn): (usize, usize)) -> Vec<i8> {
    let mut out = vec![0i8; pn * pk];
    for kk in 0..k {
        for j in 0..n {
            out[j * pk + kk] = w[kk * n + j];
        }
    }
    out
}

/// The B operand a design takes for the weight `w` (`[k, n]`): row-major for a GEMM, transposed
/// for a GEMV; both zero-padded to the host shape.
#[allow(dead_code)]
pub fn b_operand(d: &Design, w: &[i8]) -> Vec<i8> {
    let (s, p) = (d.tiling.shape, d.tiling.padded);
    match d.kind {
        Kind::Gemm => pad(w, (s.k, s.n), (p.k, p.n)),
        Kind::Gemv => transpose_padded(w, (s.k, s.n), (p.k, p.n)),
        Kind::QGemv { .. } => panic!("{}: a qgemv design's operand is qgemv::pack's", d.name),
    }
}

/// Output tiles, kernel calls per tile and cores of a design, as its tiling says.
#[allow(dead_code)]
fn expected_calls(d: &Design) -> (usize, usize, usize) {
    let t = &d.tiling;
    match d.kind {
        Kind::Gemm => (t.rows * t.cols * t.tiles_per_core(), t.k_steps(), t.rows * t.cols),
        Kind::Gemv => {
            let (parts, tiles) = gemv::parts_and_tiles(t);
            let cores = gemv::streams(t.device);
            (cores * tiles, parts, cores)
        }
        Kind::QGemv { .. } => panic!("{}: tests/qgemv.rs runs qgemv designs", d.name),
    }
}

#[allow(dead_code)]
/// Runs a design's generic text on random operands of its logical shape (zero-padded to its
/// host shape) and compares the uncropped result with the reference (zero in the padding), and
/// each function's calls with what the tiling says.
pub fn prove(d: &Design, seed: u64) {
    let t = &d.tiling;
    let (s, p) = (t.shape, t.padded);
    let a = values(s.m * s.k, seed);
    let b = values(s.k * s.n, seed + 1);
    let want = reference(&a, &b, (s.m, s.k, s.n));
    let (out, stats) = interp::run(&d.generic(), &[&pad(&a, (s.m, s.k), (p.m, p.k)), &b_operand(d, &b)])
        .unwrap_or_else(|e| panic!("{}: {e}", d.name));
    let (tiles, calls_per_tile, cores) = expected_calls(d);
    let (mul, zero) = match d.kind {
        Kind::Gemm => ("matmul_i8_i32", "zero_i32"),
        Kind::Gemv => ("gemv_i8_i32", "gemv_zero_i32"),
        Kind::QGemv { .. } => panic!("{}: tests/qgemv.rs runs qgemv designs", d.name),
    };
    assert_eq!(stats.cores, cores, "{}", d.name);
    assert_eq!(stats.calls[mul] as usize, tiles * calls_per_tile, "{}", d.name);
    assert_eq!(stats.calls[zero] as usize, tiles, "{}", d.name);
    assert_eq!(out.len(), p.m * p.n);
    for i in 0..p.m {
        for j in 0..p.n {
            let got = out[i * p.n + j];
            let expect = if i < s.m && j < s.n { want[i * s.n + j] } else { 0 };
            assert_eq!(got, expect, "{}: C[{i}][{j}]", d.name);
        }
    }
}

/// The design's result on operands of its logical shape, cropped, and the reference.
#[allow(dead_code)]
pub fn run_text(d: &Design, text: &str, seed: u64) -> Result<(Vec<i32>, Vec<i32>), interp::InterpError> {
    let t = &d.tiling;
    let (s, p) = (t.shape, t.padded);
    let a = values(s.m * s.k, seed);
    let b = values(s.k * s.n, seed + 1);
    let want = reference(&a, &b, (s.m, s.k, s.n));
    let (out, _) = interp::run(text, &[&pad(&a, (s.m, s.k), (p.m, p.k)), &b_operand(d, &b)])?;
    let mut got = vec![0; s.m * s.n];
    for i in 0..s.m {
        got[i * s.n..(i + 1) * s.n].copy_from_slice(&out[i * p.n..i * p.n + s.n]);
    }
    Ok((got, want))
}
