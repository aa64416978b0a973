//! RmsNorm as core code: `n_rms(%x, %g, %y)` normalises each f32 row of `x` into `y` by
//! `ir::pinned_norm`'s definition, step for step — the squares summed into 32 lanes, the lanes
//! folded by halves, `r = 1/√(ss/d + ε)`, `y = (x·r)·γ` — every f32 operation IEEE single
//! precision spelled in integer operations ([`super::softfloat`]), so a core's norm equals the
//! host kernels' bit for bit. The lanes are one `vector<1x32xi32>` of f32 bits; a fold takes
//! the vector's two halves (`vector.shape_cast` to two rows, `vector.extract` of each) and adds
//! them.

use super::{lanes_n, Code, LANES};
use crate::kernels::{idx, memref, v, Function, Stmt};
use ir::pinned_norm::{ALIGNED_BITS, ALIGNED_MAX_D};

/// The function's name.
pub const NORM: &str = "n_rms";

/// The sum of squares' lanes, as `ir::pinned_norm::LANES`.
pub const NORM_LANES: usize = 4 * LANES;

/// A norm kernel's rows, row length and ε.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormShape {
    pub rows: usize,
    pub d: usize,
    pub epsilon: f32,
}

impl NormShape {
    pub fn x_ty(&self) -> String {
        memref(&[self.rows, self.d], "f32")
    }
    pub fn gamma_ty(&self) -> String {
        memref(&[1, self.d], "f32")
    }
}

fn vector_of(n: usize, elem: &str) -> String {
    format!("vector<{n}x{elem}>")
}

impl Code {
    /// The `[1, NORM_LANES]` block of row `row` of `mem` at column `%l`, as i32 bits.
    fn bits_at(&mut self, (mem, mem_ty): (&str, &str), row: &str, pad: &str) -> String {
        let x = self.read_block((mem, mem_ty), "f32", [row, "%l"], (pad, NORM_LANES));
        self.cast("bitcast", &x, &lanes_n("f32", NORM_LANES), &lanes_n("i32", NORM_LANES))
    }

    /// The f32 sum of the lanes of `acc` (`n` lanes of bits in a `[1, n]` vector), folded by
    /// halves: lane `k` plus lane `k + n/2`, down to one.
    fn fold_halves(&mut self, acc: &str, n: usize) -> String {
        let (mut acc, mut ty, mut n) = (acc.to_string(), lanes_n("i32", n), n);
        while n > 1 {
            let half = n / 2;
            let two = format!("vector<2x{half}xi32>");
            let rows = self.vector("shape_cast", None, &acc, (&ty, &two));
            let low = self.extract(&rows, 0, (&two, &vector_of(half, "i32")));
            let high = self.extract(&rows, 1, (&two, &vector_of(half, "i32")));
            (acc, ty, n) = (self.add_f32(&low, &high, &vector_of(half, "i32")), vector_of(half, "i32"), half);
        }
        self.extract(&acc, 0, (&ty, "i32"))
    }

    /// `vector.extract` of position `at` of `src`'s leading dimension.
    pub(super) fn extract(&mut self, src: &str, at: usize, (from, to): (&str, &str)) -> String {
        let res = self.fresh("ext");
        self.push(Stmt::Extract { res: res.clone(), src: src.into(), at, from: from.into(), to: to.into() });
        res
    }
}

/// `n_rms(%x, %g, %y)`: `y = RmsNorm(x)·γ` row by row (`x`, `y` `[rows, d]`, `γ` `[1, d]`).
/// Refuses rows that are not whole blocks of [`NORM_LANES`] values (every hidden size of the
/// models of interest is).
pub fn rms_norm(sh: NormShape) -> Result<Function, String> {
    if sh.d == 0 || !sh.d.is_multiple_of(NORM_LANES) || sh.rows == 0 {
        return Err(format!(
            "an RmsNorm core takes rows of whole {NORM_LANES}-value blocks: {} rows of {} values are not",
            sh.rows, sh.d
        ));
    }
    let (x_ty, g_ty) = (sh.x_ty(), sh.gamma_ty());
    let (vi, vf) = (lanes_n("i32", NORM_LANES), lanes_n("f32", NORM_LANES));
    let mut c = Code::new(&[0, 1, sh.rows, sh.d, NORM_LANES]);
    let pad = c.fconst(0.0);
    let zero = c.iconst(0, &vi);
    let (d, eps, one) = (
        c.iconst(i64::from((sh.d as f32).to_bits()), "i32"),
        c.iconst(i64::from(sh.epsilon.to_bits()), "i32"),
        c.iconst(i64::from(1f32.to_bits()), "i32"),
    );
    c.each("i", sh.rows, |c| {
        let lanes = c.fold_by("l", (sh.d, NORM_LANES), (&zero, &vi), |c, acc| {
            let xb = c.bits_at(("x", &x_ty), "%i", &pad);
            let square = c.mul_f32(&xb, &xb, &vi);
            c.add_f32(acc, &square, &vi)
        });
        let ss = c.fold_halves(&lanes, NORM_LANES);
        let mean = c.div_f32(&ss, &d, "i32");
        let t = c.add_f32(&mean, &eps, "i32");
        let root = c.sqrt_f32(&t, "i32");
        let r = c.div_f32(&one, &root, "i32");
        let r = c.vector("broadcast", None, &r, ("i32", &vi));
        c.each_by("l", (sh.d, NORM_LANES), |c| {
            let xb = c.bits_at(("x", &x_ty), "%i", &pad);
            let gb = c.bits_at(("g", &g_ty), &idx(0), &pad);
            // r is normal, 0, ∞ or NaN: never subnormal.
            let xr = c.mul_f32_by_normal(&r, &xb, &vi);
            let y = c.mul_f32(&xr, &gb, &vi);
            let y = c.cast("bitcast", &y, &vi, &vf);
            let idx = vec!["%i".to_string(), "%l".to_string()];
            c.push(Stmt::Write { val: y, mem: v("y"), mem_ty: x_ty.clone(), idx, vty: vf.clone() });
        });
    });
    Ok(c.finish(NORM, vec![(v("x"), x_ty.clone()), (v("g"), g_ty), (v("y"), x_ty)]))
}

/// The aligned inverse rms's function name.
pub const INVERSE_RMS: &str = "n_irms";

/// `n_irms(%x, %r)`: `r = 1/√(ss/d + ε)` of each f32 row of `x` (`[rows, d]`) into `r`
/// (`[rows, 1]`), with ss the xdna program's aligned sum of squares
/// (`ir::pinned_norm::aligned_sum_squares`, `InverseRms{squares="aligned"}`): a pass for the
/// row's largest magnitude, then per value a significand shifted onto the largest exponent,
/// squared and summed in 32 integer lanes — integer operations where [`rms_norm`]'s squares are
/// software floating point. Once a row: the lanes to f32 and folded by halves, the exponent
/// added, the root. Refuses rows that are not whole [`NORM_LANES`]-value blocks or are longer
/// than the definition takes.
pub fn inverse_rms(sh: NormShape) -> Result<Function, String> {
    if sh.d == 0 || !sh.d.is_multiple_of(NORM_LANES) || sh.rows == 0 || sh.d > ALIGNED_MAX_D {
        return Err(format!(
            "an aligned inverse-rms core takes rows of whole {NORM_LANES}-value blocks, at most {ALIGNED_MAX_D}: {} rows of {} values are not",
            sh.rows, sh.d
        ));
    }
    let (x_ty, r_ty, vi) = (sh.x_ty(), memref(&[sh.rows, 1], "f32"), lanes_n("i32", NORM_LANES));
    let mut c = Code::new(&[0, 1, sh.rows, sh.d, NORM_LANES]);
    let pad = c.fconst(0.0);
    let zero = c.iconst(0, &vi);
    c.each("i", sh.rows, |c| {
        let top = c.fold_by("l", (sh.d, NORM_LANES), (&zero, &vi), |c, acc| {
            let xb = c.bits_at(("x", &x_ty), "%i", &pad);
            let magnitude = c.with("andi", &xb, 0x7fff_ffff, &vi);
            c.bin("maxui", acc, &magnitude, &vi)
        });
        let flat = format!("vector<{NORM_LANES}xi32>");
        let top = c.vector("shape_cast", None, &top, (&vi, &flat));
        let top = c.vector("reduction", Some("maxui"), &top, (&flat, "i32"));
        let e_max = c.with("shrui", &top, 23, "i32");
        let e_max = c.at_least_one(&e_max, "i32");
        let lanes = aligned_squares(c, (&x_ty, sh.d), &pad, (&zero, &e_max));
        let ss = c.scaled_sum(&lanes, &e_max);
        let ss = c.nonfinite_sum(&top, &ss);
        let r = c.inverse_root(&ss, sh);
        let r = c.cast("bitcast", &r, "i32", "f32");
        c.store(&r, "r", &r_ty, &["%i", &idx(0)], "f32");
    });
    Ok(c.finish(INVERSE_RMS, vec![(v("x"), x_ty), (v("r"), r_ty)]))
}

/// Row `%i`'s squares over `d` values added to the 32 integer lanes `init` (32-lane blocks).
fn aligned_squares(c: &mut Code, (x_ty, d): (&str, usize), pad: &str, (init, e_max): (&str, &str)) -> String {
    let vi = lanes_n("i32", NORM_LANES);
    let top_shift = c.with("addi", e_max, i64::from(24 - ALIGNED_BITS), "i32");
    let top_shift = c.vector("broadcast", None, &top_shift, ("i32", &vi));
    c.fold_by("l", (d, NORM_LANES), (init, &vi), |c, acc| {
        let xb = c.bits_at(("x", x_ty), "%i", pad);
        let square = c.aligned_square(&xb, &top_shift, &vi);
        c.bin("addi", acc, &square, &vi)
    })
}

impl Code {
    /// The aligned squares of the f32 bits `xb` (lanes of `ty`): each value's significand
    /// (hidden bit included) over `2^(top_shift − e)` (`top_shift = E + 13` broadcast), rounded
    /// half up, squared.
    pub(super) fn aligned_square(&mut self, xb: &str, top_shift: &str, ty: &str) -> String {
        let e = self.with("shrui", xb, 23, ty);
        let e = self.with("andi", &e, 0xff, ty);
        let fraction = self.with("andi", xb, 0x007f_ffff, ty);
        let e1 = self.at_least_one(&e, ty);
        // The hidden bit, 1 << 23 when e ≥ 1: (e1 − e) is 1 for a subnormal, 0 otherwise.
        let subnormal = self.bin("subi", &e1, &e, ty);
        let hidden = self.with("xori", &subnormal, 1, ty);
        let hidden = self.with("shli", &hidden, 23, ty);
        let m = self.bin("ori", &fraction, &hidden, ty);
        let shift = self.bin("subi", top_shift, &e1, ty);
        let shift = self.at_most(&shift, 31, ty);
        let half = self.with("subi", &shift, 1, ty);
        let one = self.iconst(1, ty);
        let half = self.bin("shli", &one, &half, ty);
        let m = self.bin("addi", &m, &half, ty);
        let a = self.bin("shrui", &m, &shift, ty);
        self.bin("muli", &a, &a, ty)
    }

    /// `max(x, 1)` lane by lane, for `x ≥ 0`.
    pub(super) fn at_least_one(&mut self, x: &str, ty: &str) -> String {
        let one = self.iconst(1, ty);
        let zero = self.test("eq", x, 0, ty);
        self.select(&zero, &one, x, ty)
    }

    /// `min(x, limit)` lane by lane, unsigned.
    pub(super) fn at_most(&mut self, x: &str, limit: i64, ty: &str) -> String {
        let limit = self.iconst(limit, ty);
        let over = self.cmp(false, "ugt", x, &limit, ty);
        self.select(&over, &limit, x, ty)
    }

    /// The lanes (integer sums below 2³¹) to f32, folded by halves, times `2^(2E − 274)`
    /// ([`Code::scaled_fold`]).
    fn scaled_sum(&mut self, lanes: &str, e_max: &str) -> String {
        let vi = lanes_n("i32", NORM_LANES);
        let floats = self.f32_of_i32(lanes, &vi);
        let t = self.fold_halves(&floats, NORM_LANES);
        self.scaled_fold(&t, e_max)
    }

    /// The folded lanes' f32 `t` times `2^(2E − 274)` on the exponent field: +0 when the result
    /// is 0 or would be subnormal, +∞ when it would overflow.
    pub(super) fn scaled_fold(&mut self, t: &str, e_max: &str) -> String {
        let k = self.with("shli", e_max, 1, "i32");
        let e = self.with("shrui", t, 23, "i32");
        let e = self.bin("addi", &e, &k, "i32");
        let e = self.with("subi", &e, 274, "i32");
        let fraction = self.with("andi", t, 0x007f_ffff, "i32");
        let field = self.with("shli", &e, 23, "i32");
        let bits = self.bin("ori", &field, &fraction, "i32");
        let (c0, inf) = (self.iconst(0, "i32"), self.iconst(0x7f80_0000, "i32"));
        let over = self.test("sge", &e, 255, "i32");
        let bits = self.select(&over, &inf, &bits, "i32");
        let under = self.test("sle", &e, 0, "i32");
        let bits = self.select(&under, &c0, &bits, "i32");
        let empty = self.test("eq", t, 0, "i32");
        self.select(&empty, &c0, &bits, "i32")
    }

    /// The sum of a row holding ∞ or NaN (its largest magnitude's bits `top`): +∞, or NaN.
    pub(super) fn nonfinite_sum(&mut self, top: &str, ss: &str) -> String {
        let (inf, nan) = (self.iconst(0x7f80_0000, "i32"), self.iconst(0x7fc0_0000, "i32"));
        let infinite = self.test("eq", top, 0x7f80_0000, "i32");
        let ss = self.select(&infinite, &inf, ss, "i32");
        let not_a_number = self.test("ugt", top, 0x7f80_0000, "i32");
        self.select(&not_a_number, &nan, &ss, "i32")
    }

    /// `1/√(ss/d + ε)` on f32 bits, as `ir::pinned_norm::inverse_root`.
    pub(super) fn inverse_root(&mut self, ss: &str, sh: NormShape) -> String {
        let d = self.iconst(i64::from((sh.d as f32).to_bits()), "i32");
        let eps = self.iconst(i64::from(sh.epsilon.to_bits()), "i32");
        let one = self.iconst(i64::from(1f32.to_bits()), "i32");
        let mean = self.div_f32(ss, &d, "i32");
        let t = self.add_f32(&mean, &eps, "i32");
        let root = self.sqrt_f32(&t, "i32");
        self.div_f32(&one, &root, "i32")
    }
}
