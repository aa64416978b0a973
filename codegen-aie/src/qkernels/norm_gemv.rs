//! A norm-fed qgemv core's own norm: the projection of `RmsNorm(x)·γ` from the residual
//! stream's rows `x` and γ, nothing normalised on the host — the xdna program's form of it
//! (`array-norms`): `r = InverseRms(x)` with the aligned sum of squares, the codes and scales
//! `S₀` of the exact products (`QuantizeRows(x, γ)`, [`super::norm_codes`]), `S = S₀·r`, and
//! the `QGemm` epilogue with `S`. The row arrives K part by K part as often as its passes need,
//! and `r`'s steps ride on them: the row's largest magnitude beside the first pass's scale
//! markers, the squares beside the codes, the root once a row after them.
//!
//! The state beyond `QuantizeRows(x, γ)`'s: slots 4 and 5 of `rs` (the largest magnitude's
//! bits, then `r`), and `ss` of `[rows, 32]` int32, the squares' lanes (element `j` of the row
//! in lane `j mod 32`, so a K part is a whole number of 32-value blocks).
//!
//! Every vector here is [`LANES`] wide, as the row quantisation's: the 32 lanes are four
//! groups of 8 (group `b` summing the columns `32t + 8b ..`), folded by halves as groups
//! (`0 + 2`, `1 + 3`, then the two) and then lane by lane as scalars — the same additions in
//! the same order as `ir::pinned_norm`'s fold. mlir-aie lowers no wider integer vector
//! arithmetic (`Rule::VectorWidth`).

use super::{lanes, lanes_n, Code, NormShape, Shape, LANES, NORM_LANES};
use crate::kernels::{idx, memref, v, Function, Stmt};
use ir::pinned_norm::{ALIGNED_BITS, ALIGNED_MAX_D};

/// Zeroes the row state and the squares' lanes.
pub const NORM_RESET: &str = "nq_reset";
/// Each row's running largest magnitude over one K part.
pub const NORM_TOP: &str = "nq_top";
/// One K part's aligned squares added to the row's lanes.
pub const NORM_SQUARES: &str = "nq_squares";
/// `r` from the lanes, once a row.
pub const NORM_ROOT: &str = "nq_root";
/// `S = S₀·r` for each pass's scale.
pub const NORM_RESCALE: &str = "nq_rescale";

/// The squares' lanes, `[rows, 32]` int32.
pub fn squares_ty(sh: Shape) -> String {
    memref(&[sh.rows, NORM_LANES], "i32")
}

/// The lane groups of the squares: `[1, 8]` blocks at these columns of a row of `ss`.
const GROUPS: [usize; 4] = [0, LANES, 2 * LANES, 3 * LANES];

/// `nq_reset(%rs, %ss)`: the running maxima (slots 0, 2, 4) and the squares' lanes to 0.
pub fn norm_reset(sh: Shape) -> Function {
    let (rs_ty, ss_ty, vi) = (sh.rs_ty(), squares_ty(sh), lanes("i32"));
    let mut c = Code::new(&[0, 1, 2, 4, sh.rows, LANES, 2 * LANES, 3 * LANES]);
    let (zero, lanes_zero) = (c.fconst(0.0), c.iconst(0, &vi));
    c.each("i", sh.rows, |c| {
        for slot in [0, 2, 4] {
            c.store(&zero, "rs", &rs_ty, &[&idx(slot), "%i"], "f32");
        }
        for group in GROUPS {
            let at = vec!["%i".to_string(), idx(group)];
            c.push(Stmt::Write {
                val: lanes_zero.clone(),
                mem: v("ss"),
                mem_ty: ss_ty.clone(),
                idx: at,
                vty: vi.clone(),
            });
        }
    });
    c.finish(NORM_RESET, vec![(v("rs"), rs_ty), (v("ss"), ss_ty)])
}

/// `nq_top(%x, %rs)`: each row's running maximum of its values' bits without the sign (NaN's
/// above ∞'s, as `n_irms` takes them) over one K part, in slot 4.
pub fn norm_top(sh: Shape) -> Function {
    let (x_ty, rs_ty, vi) = (sh.x_ty(), sh.rs_ty(), lanes("i32"));
    let mut c = Code::new(&[0, 1, 4, sh.rows, sh.k, LANES]);
    let pad = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        let init = c.row_bits(&rs_ty, 4);
        let top = c.fold_by("l", (sh.k, LANES), (&init, &vi), |c, acc| {
            let xb = c.x_bits(&x_ty, &pad);
            let magnitude = c.with("andi", &xb, 0x7fff_ffff, &vi);
            c.bin("maxui", acc, &magnitude, &vi)
        });
        c.store_row_max(&top, &rs_ty, 4);
    });
    c.finish(NORM_TOP, vec![(v("x"), x_ty), (v("rs"), rs_ty)])
}

impl Code {
    /// Row `%i`'s largest exponent `E` (at least 1) and its largest magnitude's bits.
    fn row_exponent(&mut self, rs_ty: &str) -> (String, String) {
        let top = self.load("rs", rs_ty, &[&idx(4), "%i"], "f32");
        let top = self.cast("bitcast", &top, "f32", "i32");
        let e = self.with("shrui", &top, 23, "i32");
        (self.at_least_one(&e, "i32"), top)
    }

    /// Row `%i`'s squares' lane group at column `group` of `ss`.
    fn read_squares(&mut self, ss_ty: &str, group: usize) -> String {
        let res = self.fresh("vec");
        let (idx, pad) = (vec!["%i".to_string(), idx(group)], self.iconst(0, "i32"));
        self.push(Stmt::Read {
            res: res.clone(),
            mem: v("ss"),
            mem_ty: ss_ty.into(),
            idx,
            pad,
            vty: lanes("i32"),
            elem: "i32",
        });
        res
    }

    /// The 32 lanes' sum as `ir::pinned_norm::fold_lanes` takes it, from the four groups' f32
    /// bits: groups 0 + 2 and 1 + 3, their sum, then its 8 lanes as scalars, by halves.
    fn fold_groups(&mut self, groups: &[String]) -> String {
        let vi = lanes("i32");
        let low = self.add_f32(&groups[0], &groups[2], &vi);
        let high = self.add_f32(&groups[1], &groups[3], &vi);
        let eight = self.add_f32(&low, &high, &vi);
        let flat = format!("vector<{LANES}xi32>");
        let flat_v = self.vector("shape_cast", None, &eight, (&vi, &flat));
        let mut l: Vec<String> = (0..LANES).map(|k| self.extract(&flat_v, k, (&flat, "i32"))).collect();
        let mut n = LANES / 2;
        while n > 0 {
            l = (0..n).map(|k| self.add_f32(&l[k], &l[k + n], "i32")).collect();
            n /= 2;
        }
        l.remove(0)
    }
}

/// `nq_squares(%x, %rs, %ss)`: one K part's aligned squares (each value's significand on the
/// row's largest exponent, `ir::pinned_norm::aligned_sum_squares`) added to the row's lanes,
/// lane group by lane group.
pub fn norm_squares(sh: Shape) -> Function {
    let (x_ty, rs_ty, ss_ty) = (sh.x_ty(), sh.rs_ty(), squares_ty(sh));
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, 4, sh.rows, sh.k, NORM_LANES, LANES, 2 * LANES, 3 * LANES]);
    let pad = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        let (e_max, _) = c.row_exponent(&rs_ty);
        let top_shift = c.with("addi", &e_max, i64::from(24 - ALIGNED_BITS), "i32");
        let top_shift = c.vector("broadcast", None, &top_shift, ("i32", &vi));
        for group in GROUPS {
            let init = c.read_squares(&ss_ty, group);
            let lanes = c.fold_by("l", (sh.k, NORM_LANES), (&init, &vi), |c, acc| {
                let col = c.bin("addi", "%l", &idx(group), "index");
                let x = c.read_block(("x", &x_ty), "f32", ["%i", &col], (&pad, LANES));
                let xb = c.cast("bitcast", &x, &lanes("f32"), &vi);
                let square = c.aligned_square(&xb, &top_shift, &vi);
                c.bin("addi", acc, &square, &vi)
            });
            let at = vec!["%i".to_string(), idx(group)];
            c.push(Stmt::Write { val: lanes, mem: v("ss"), mem_ty: ss_ty.clone(), idx: at, vty: vi.clone() });
        }
    });
    c.finish(NORM_SQUARES, vec![(v("x"), x_ty), (v("rs"), rs_ty), (v("ss"), ss_ty)])
}

/// `nq_root(%rs, %ss)`: `r = 1/√(ss/d + ε)` of each row from its lanes (`n_irms`'s tail:
/// the lanes to f32 and folded, the exponent added, ∞ and NaN rows as f32 sums give them), in
/// slot 5.
pub fn norm_root(sh: Shape, norm: NormShape) -> Function {
    let (rs_ty, ss_ty) = (sh.rs_ty(), squares_ty(sh));
    let mut c = Code::new(&[0, 1, 4, 5, sh.rows, LANES, 2 * LANES, 3 * LANES]);
    c.each("i", sh.rows, |c| {
        let (e_max, top) = c.row_exponent(&rs_ty);
        let groups: Vec<String> = GROUPS
            .iter()
            .map(|&g| {
                let lanes = c.read_squares(&ss_ty, g);
                c.f32_of_i32(&lanes, &lanes_n("i32", LANES))
            })
            .collect();
        let t = c.fold_groups(&groups);
        let ss = c.scaled_fold(&t, &e_max);
        let ss = c.nonfinite_sum(&top, &ss);
        let r = c.inverse_root(&ss, norm);
        let r = c.cast("bitcast", &r, "i32", "f32");
        c.store(&r, "rs", &rs_ty, &[&idx(5), "%i"], "f32");
    });
    c.finish(NORM_ROOT, vec![(v("rs"), rs_ty), (v("ss"), ss_ty)])
}

/// `nq_rescale(%rs)`: each pass's row scale times `r` (the program's `Mul(S₀, r)`, an f32
/// product in integer operations).
pub fn norm_rescale(sh: Shape) -> Function {
    let rs_ty = sh.rs_ty();
    let mut c = Code::new(&[0, 1, 3, 5, sh.rows]);
    c.each("i", sh.rows, |c| {
        let r = c.load("rs", &rs_ty, &[&idx(5), "%i"], "f32");
        let r = c.cast("bitcast", &r, "f32", "i32");
        for slot in (0..sh.passes).map(|p| 2 * p + 1) {
            let s = c.load("rs", &rs_ty, &[&idx(slot), "%i"], "f32");
            let s = c.cast("bitcast", &s, "f32", "i32");
            let scaled = c.mul_f32(&s, &r, "i32");
            let scaled = c.cast("bitcast", &scaled, "i32", "f32");
            c.store(&scaled, "rs", &rs_ty, &[&idx(slot), "%i"], "f32");
        }
    });
    c.finish(NORM_RESCALE, vec![(v("rs"), rs_ty)])
}

/// Every function a norm-fed core of shape `sh` calls besides the GEMV kernels, for rows of
/// `d` values (the K parts' padding past `d` zero) and the norm's ε. Refuses K parts that are
/// not whole 32-value blocks and rows the aligned sum does not take.
pub fn norm_functions(sh: Shape, d: usize, epsilon: f32) -> Result<Vec<Function>, String> {
    if !sh.input.norm() || !sh.k.is_multiple_of(NORM_LANES) || d == 0 || d > ALIGNED_MAX_D {
        return Err(format!(
            "a norm-fed qgemv core takes γ in its X element, K parts of whole {NORM_LANES}-value blocks and rows of at most {ALIGNED_MAX_D}: parts of {} for rows of {d} are not",
            sh.k
        ));
    }
    let mut f = norm_quantise_functions(sh, NormShape { rows: sh.rows, d, epsilon });
    f.push(super::dequant(sh));
    Ok(f)
}

/// The norm and its row quantisation alone, in call order, for rows `norm`: what a core that
/// computes no outputs calls (a split design's prologue core). `sh`'s K parts are whole
/// 32-value blocks.
pub fn norm_quantise_functions(sh: Shape, norm: NormShape) -> Vec<Function> {
    let mut f = vec![norm_reset(sh), norm_top(sh), super::product_max(sh), super::product_scale(sh, 0)];
    f.extend([super::product_codes(sh), norm_squares(sh), norm_root(sh, norm)]);
    if sh.passes > 1 {
        f.extend([super::product_scale(sh, 1), super::product_residual(sh)]);
    }
    f.push(norm_rescale(sh));
    f
}
