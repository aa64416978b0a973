//! `QuantizeRows(x, γ)` as core code: the codes of the exact products `x·γ` of a norm's input
//! and its weight (`ir::norm_codes`), for γ whose values are bfloat16 (8 significant bits, as
//! every norm weight of SmolLM2 is; the compile checks). Then a product's significand, x's 24
//! bits times γ's 8, is exact in 32 unsigned bits, and every step of both passes is a shift, a
//! compare or a select of it — integer vector code, no software floating point:
//!
//! - a value is `p·2^u`: `p` the significands' product (below 2³²), `u` the exponent of its
//!   unit;
//! - its scale's exponent is `u − lz + 25` with `lz` the leading zeros of `p`, plus 1 when `p`
//!   shifted up by them exceeds `127·2²⁵` (the smallest `k` with `127·2^k ≥ p·2^u`); a row's
//!   scale is the largest, at least 2⁻¹²⁶, and 1 for a row of zeros or one no f32 power of two
//!   holds (an exponent past 127, or ±∞);
//! - the code at scale `2^k` is `p` shifted right by `k − u`, rounded half to even from the
//!   bits shifted out, within ±127 (or shifted left, exactly, when `k < u`, which only tiny
//!   products reach); the remainder those bits leave is the residual's significand at the same
//!   unit, exact, and the second pass quantises it the same way. Only a marker needs the leading
//!   zeros, the one step that is not a handful of operations.
//!
//! A function's `x` is an `X` element with γ's part as its last row (`Shape::norm`). The row
//! state is `rs` of f32 rows, as for `QuantizeRows(x)` ([`super::Shape`]), but
//! the running maxima are markers: the f32 bits of `2^k` for the largest scale so far, 0 for
//! none, +∞ (`INF`'s bits) for an unscalable row — so an unsigned maximum of the bits keeps
//! the largest.

use super::softfloat::INF;
use super::{lanes, Code, Shape, LANES};
use crate::kernels::{idx, lanes_of, v, Function};

/// Each row's running scale marker over one K part (pass 0).
pub const PRODUCT_MAX: &str = "qn_max";
/// A pass's scale from its marker.
pub const PRODUCT_SCALE: [&str; 2] = ["qn_scale0", "qn_scale1"];
/// One K part's first-pass codes (and, with two passes, the residual's running marker).
pub const PRODUCT_CODES: &str = "qn_codes";
/// One K part's second-pass codes.
pub const PRODUCT_RESIDUAL: &str = "qn_residual";

/// An exact value, lane by lane: `p·2^u` with `p` below 2³², its sign, and (for the products
/// `x·γ`) whether it is NaN (x NaN, or ∞·0: code 0, no part of a maximum) or ±∞. A source that
/// encodes those in `p` and `u` itself (the gate: NaN as `p` = 0, ±∞ as `p` = 1 at a unit past
/// every scale) has neither.
pub(super) struct Exact {
    pub(super) p: String,
    pub(super) u: String,
    pub(super) negative: String,
    pub(super) nan: Option<String>,
    pub(super) inf: Option<String>,
}

/// Where a function's exact values come from: the products `x·γ` of an `X` element (γ its last
/// row, after `rows` rows), or the gate's values `gq_gate` left in a `gv` buffer
/// ([`super::gate_codes`]).
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    Products { x_ty: &'a str, rows: usize },
    Gate { gv_ty: &'a str },
}

impl Source<'_> {
    /// The function parameter the values come from.
    fn param(&self) -> (String, String) {
        match *self {
            Source::Products { x_ty, .. } => (v("x"), x_ty.to_string()),
            Source::Gate { gv_ty } => (v("gv"), gv_ty.to_string()),
        }
    }
}

/// A value's code at a scale, before its sign: the magnitude, and the remainder the shift
/// leaves (`r`, at the value's unit) with whether rounding up flipped its sign.
struct Rounded {
    magnitude: String,
    r: String,
    flipped: String,
}

impl Code {
    /// `[1, LANES]` of `γ` at column `%l` (the `X` element's last row, `rows`), as i32 bits.
    fn gamma_bits(&mut self, (x_ty, rows): (&str, usize), pad: &str) -> String {
        let g = self.read_block(("x", x_ty), "f32", [&idx(rows), "%l"], (pad, LANES));
        self.cast("bitcast", &g, &lanes("f32"), &lanes("i32"))
    }

    /// The exact product of the bits `xb` and `gb` (γ a bfloat16 value).
    fn exact_product(&mut self, xb: &str, gb: &str, ty: &str) -> Exact {
        let t1 = lanes_of(ty, "i1");
        let (ex, mx, sx) = self.fields(xb, ty);
        let (eg, _, sg) = self.fields(gb, ty);
        let sg = self.with("shrui", &sg, 16, ty);
        let p = self.bin("muli", &sx, &sg, ty);
        let e = self.bin("addi", &ex, &eg, ty);
        let u = self.with("subi", &e, 284, ty);
        let special = self.test("eq", &ex, 255, ty);
        let fraction = self.test("ne", &mx, 0, ty);
        let zero_gamma = self.test("eq", &sg, 0, ty);
        let invalid = self.bin("ori", &fraction, &zero_gamma, &t1);
        let nan = self.bin("andi", &special, &invalid, &t1);
        let inf = self.bin("xori", &special, &nan, &t1);
        let signs = self.bin("xori", xb, gb, ty);
        let negative = self.test("slt", &signs, 0, ty);
        Exact { p, u, negative, nan: Some(nan), inf: Some(inf) }
    }

    /// Block `(%i, %l)`'s exact values from `src` (`pad` an f32 zero, `pad32` an i32 one).
    pub(super) fn exact(&mut self, src: Source<'_>, (pad, pad32): (&str, &str), ty: &str) -> Exact {
        match src {
            Source::Products { x_ty, rows } => {
                let xb = self.x_bits(x_ty, pad);
                let gb = self.gamma_bits((x_ty, rows), pad);
                self.exact_product(&xb, &gb, ty)
            }
            Source::Gate { gv_ty } => self.gate_exact(gv_ty, pad32, ty),
        }
    }

    /// The scale marker of `p·2^u`: with `p` normalised to `n·2^(u−lz)` (bit 31 set), the f32
    /// bits of `2^k`, `k = u − lz + 25` (+1 when `n > 127·2²⁵`), clamped to 2⁻¹²⁶ and to +∞
    /// past 2¹²⁷; 0 for a zero `p`.
    fn marker(&mut self, p: &str, u: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let lz = self.leading_zeros(p, ty);
        let n = self.bin("shli", p, &lz, ty);
        let above = self.test("ugt", &n, 0xfe00_0000, ty);
        let above = self.cast("extui", &above, &t1, ty);
        let k = self.bin("subi", u, &lz, ty);
        let k = self.with("addi", &k, 152, ty);
        let k = self.bin("addi", &k, &above, ty);
        let k = self.clamp(&k, (1, 255), ty);
        let bits = self.with("shli", &k, 23, ty);
        let zero = self.test("eq", p, 0, ty);
        let c0 = self.iconst(0, ty);
        self.select(&zero, &c0, &bits, ty)
    }

    /// A value's marker: NaN none, ±∞ unscalable.
    fn product_marker(&mut self, p: &Exact, ty: &str) -> String {
        let mut bits = self.marker(&p.p, &p.u, ty);
        let (c0, inf) = (self.iconst(0, ty), self.iconst(INF, ty));
        if let Some(i) = &p.inf {
            bits = self.select(i, &inf, &bits, ty);
        }
        match &p.nan {
            Some(n) => self.select(n, &c0, &bits, ty),
            None => bits,
        }
    }

    /// `p·2^u` (`p` < 2³²) at the scale `2^k` whose f32 bits are `sb`, by the shift
    /// `k − u`: from 1 to 32 a right shift rounded half to even from the bits shifted out (a
    /// remainder left), past 32 below half a step (code 0, the value its own remainder), and at
    /// 0 or below a left shift, exact (no remainder). Magnitudes within 127.
    fn at_scale(&mut self, (p, u): (&str, &str), sb: &str, ty: &str) -> Rounded {
        let t1 = lanes_of(ty, "i1");
        let t1 = t1.as_str();
        let k = self.with("shrui", sb, 23, ty);
        let k = self.with("subi", &k, 127, ty);
        let shift = self.bin("subi", &k, u, ty);
        let left = self.test("slt", &shift, 1, ty);
        let gone = self.test("sgt", &shift, 32, ty);
        let (magnitude, rem, mask, up) = self.shifted_right(p, &shift, ty);
        let c0 = self.iconst(0, ty);
        let magnitude = self.select(&gone, &c0, &magnitude, ty);
        let complement = self.bin("subi", &c0, &rem, ty);
        let complement = self.bin("andi", &complement, &mask, ty);
        let r = self.select(&up, &complement, &rem, ty);
        let r = self.select(&gone, p, &r, ty);
        let exact = self.shifted_left(p, &shift, ty);
        let magnitude = self.select(&left, &exact, &magnitude, ty);
        let r = self.select(&left, &c0, &r, ty);
        let right = self.with("xori", &left, 1, t1);
        let kept = self.with("xori", &gone, 1, t1);
        let kept = self.bin("andi", &kept, &right, t1);
        let flipped = self.bin("andi", &up, &kept, t1);
        Rounded { magnitude, r, flipped }
    }

    /// `p >> shift` rounded half to even, within 127 (unsigned), the shift clamped to 1..=32:
    /// the magnitude, the bits shifted out, their mask and whether it rounded up.
    fn shifted_right(&mut self, p: &str, shift: &str, ty: &str) -> (String, String, String, String) {
        let (magnitude, rem, mask, up) = self.round_shift_right(p, shift, ty);
        (self.at_most(&magnitude, 127, ty), rem, mask, up)
    }

    /// `p >> shift` (`p` < 2³², unsigned) rounded half to even from the bits shifted out, the
    /// shift clamped to 1..=32 (32 leaves nothing): the rounded quotient, the bits shifted out,
    /// their mask and whether it rounded up.
    pub(super) fn round_shift_right(&mut self, p: &str, shift: &str, ty: &str) -> (String, String, String, String) {
        let t1 = lanes_of(ty, "i1");
        let t1 = t1.as_str();
        let shift = self.clamp(shift, (1, 32), ty);
        let below = self.with("subi", &shift, 1, ty);
        let q = self.with("shrui", p, 1, ty);
        let q = self.bin("shrui", &q, &below, ty);
        let ones = self.iconst(0xffff_ffff, ty);
        let keep = self.iconst(32, ty);
        let keep = self.bin("subi", &keep, &shift, ty);
        let mask = self.bin("shrui", &ones, &keep, ty);
        let rem = self.bin("andi", p, &mask, ty);
        let one = self.iconst(1, ty);
        let half = self.bin("shli", &one, &below, ty);
        let above = self.cmp(false, "ugt", &rem, &half, ty);
        let tie = self.cmp(false, "eq", &rem, &half, ty);
        let odd = self.with("andi", &q, 1, ty);
        let odd = self.test("ne", &odd, 0, ty);
        let tie_up = self.bin("andi", &tie, &odd, t1);
        let up = self.bin("ori", &above, &tie_up, t1);
        let step = self.cast("extui", &up, t1, ty);
        (self.bin("addi", &q, &step, ty), rem, mask, up)
    }

    /// `p << −shift` for a shift of 0 or below, within 127 (`p` first capped at 128 and the
    /// shift at 7, so nothing overflows).
    fn shifted_left(&mut self, p: &str, shift: &str, ty: &str) -> String {
        let c0 = self.iconst(0, ty);
        let by = self.bin("subi", &c0, shift, ty);
        let by = self.clamp(&by, (0, 7), ty);
        let p = self.at_most(p, 128, ty);
        let shifted = self.bin("shli", &p, &by, ty);
        self.at_most(&shifted, 127, ty)
    }

    /// The int8 code of a magnitude with its sign; NaN lanes 0.
    fn signed_code(&mut self, magnitude: &str, (negative, nan): (&str, Option<&str>), ty: &str) -> String {
        let c0 = self.iconst(0, ty);
        let minus = self.bin("subi", &c0, magnitude, ty);
        let mut code = self.select(negative, &minus, magnitude, ty);
        if let Some(nan) = nan {
            code = self.select(nan, &c0, &code, ty);
        }
        self.cast("trunci", &code, ty, &lanes_of(ty, "i8"))
    }

    /// The residual of a first-pass rounding: `r·2^u` (at the product's unit) and its sign.
    fn residual_value(&mut self, p: &Exact, first: &Rounded, ty: &str) -> (String, String, String) {
        let negative = self.bin("xori", &p.negative, &first.flipped, &lanes_of(ty, "i1"));
        (first.r.clone(), p.u.clone(), negative)
    }

    /// The first pass of block `(%i, %l)`: the value, its rounding at the row's scale `s0`
    /// and the code's lanes (∞ at 127).
    fn first_pass(&mut self, (src, pads): (Source<'_>, (&str, &str)), s0: &str, ty: &str) -> (Exact, Rounded, String) {
        let p = self.exact(src, pads, ty);
        let first = self.at_scale((&p.p, &p.u), s0, ty);
        let c127 = self.iconst(127, ty);
        let magnitude = match &p.inf {
            Some(inf) => self.select(inf, &c127, &first.magnitude, ty),
            None => first.magnitude.clone(),
        };
        let code = self.signed_code(&magnitude, (&p.negative, p.nan.as_deref()), ty);
        (p, first, code)
    }

    /// The zero constant `src`'s reads pad with: f32 for an `X` element, i32 for a `gu` one
    /// (the other left empty).
    fn pads(&mut self, src: Source<'_>) -> (String, String) {
        match src {
            Source::Products { .. } => (self.fconst(0.0), String::new()),
            Source::Gate { .. } => (String::new(), self.iconst(0, "i32")),
        }
    }
}

/// `qn_max(%x, %rs)`: each row's running scale marker of `x·γ` over one K part.
pub fn product_max(sh: Shape) -> Function {
    let x_ty = sh.x_ty();
    running_max(sh, Source::Products { x_ty: &x_ty, rows: sh.rows }, PRODUCT_MAX)
}

/// `name(%src, %rs)`: each row's running scale marker of `src`'s values over one K part.
pub(super) fn running_max(sh: Shape, src: Source<'_>, name: &str) -> Function {
    let rs_ty = sh.rs_ty();
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, sh.rows, sh.k, LANES]);
    let pads = c.pads(src);
    c.each("i", sh.rows, |c| {
        let init = c.row_bits(&rs_ty, 0);
        let mx = c.fold_by("l", (sh.k, LANES), (&init, &vi), |c, acc| {
            let p = c.exact(src, (&pads.0, &pads.1), &vi);
            let m = c.product_marker(&p, &vi);
            c.bin("maxui", acc, &m, &vi)
        });
        c.store_row_max(&mx, &rs_ty, 0);
    });
    c.finish(name, vec![src.param(), (v("rs"), rs_ty)])
}

/// `qn_scale<p>(%rs)`: pass `p`'s scale from its marker: the marker's power of two, 1 for
/// none or an unscalable row (for the second pass, also when the first was unscalable).
pub fn product_scale(sh: Shape, pass: usize) -> Function {
    let rs_ty = sh.rs_ty();
    let mut c = Code::new(&[0, 1, 2 * pass, 2 * pass + 1, sh.rows]);
    let one = c.iconst(0x3f80_0000, "i32");
    c.each("i", sh.rows, |c| {
        let m = c.load("rs", &rs_ty, &[&idx(2 * pass), "%i"], "f32");
        let m = c.cast("bitcast", &m, "f32", "i32");
        let first = c.load("rs", &rs_ty, &[&idx(0), "%i"], "f32");
        let first = c.cast("bitcast", &first, "f32", "i32");
        let none = c.test("eq", &m, 0, "i32");
        let unscalable = c.test("eq", &m, INF, "i32");
        let first_unscalable = c.test("eq", &first, INF, "i32");
        let s = c.select(&none, &one, &m, "i32");
        let s = c.select(&unscalable, &one, &s, "i32");
        let s = c.select(&first_unscalable, &one, &s, "i32");
        let s = c.cast("bitcast", &s, "i32", "f32");
        c.store(&s, "rs", &rs_ty, &[&idx(2 * pass + 1), "%i"], "f32");
    });
    c.finish(PRODUCT_SCALE[pass], vec![(v("rs"), rs_ty)])
}

/// `qn_codes(%x, %rs, %c0)`: one K part's first-pass codes of `x·γ`; with two passes also
/// each row's running marker of the residuals (NaN lanes none).
pub fn product_codes(sh: Shape) -> Function {
    let x_ty = sh.x_ty();
    first_codes(sh, Source::Products { x_ty: &x_ty, rows: sh.rows }, PRODUCT_CODES)
}

/// `name(%src, %rs, %c0)`: [`product_codes`] of `src`'s values.
pub(super) fn first_codes(sh: Shape, src: Source<'_>, name: &str) -> Function {
    let (rs_ty, c_ty) = (sh.rs_ty(), sh.codes_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, 2, sh.rows, sh.k, LANES]);
    let (pad, pad32) = c.pads(src);
    let zero = c.iconst(0, &vi);
    let types = (src, (pad.as_str(), pad32.as_str()));
    c.each("i", sh.rows, |c| {
        let s0 = c.row_bits(&rs_ty, 1);
        if sh.passes == 1 {
            c.each_by("l", (sh.k, LANES), |c| {
                let (_, _, code) = c.first_pass(types, &s0, &vi);
                c.write_codes(code, "c0", &c_ty);
            });
            return;
        }
        let init = c.row_bits(&rs_ty, 2);
        let mx = c.fold_by("l", (sh.k, LANES), (&init, &vi), |c, acc| {
            let (p, first, code) = c.first_pass(types, &s0, &vi);
            c.write_codes(code, "c0", &c_ty);
            let (n, u, _) = c.residual_value(&p, &first, &vi);
            let mut m = c.marker(&n, &u, &vi);
            if let Some(nan) = &p.nan {
                m = c.select(nan, &zero, &m, &vi);
            }
            c.bin("maxui", acc, &m, &vi)
        });
        c.store_row_max(&mx, &rs_ty, 2);
    });
    c.finish(name, vec![src.param(), (v("rs"), rs_ty.clone()), (v("c0"), c_ty.clone())])
}

/// `qn_residual(%x, %rs, %c1)`: one K part's second-pass codes, of the first pass's exact
/// remainders at the row's second scale; 0 in an unscalable row.
pub fn product_residual(sh: Shape) -> Function {
    let x_ty = sh.x_ty();
    second_codes(sh, Source::Products { x_ty: &x_ty, rows: sh.rows }, PRODUCT_RESIDUAL)
}

/// `name(%src, %rs, %c1)`: [`product_residual`] of `src`'s values.
pub(super) fn second_codes(sh: Shape, src: Source<'_>, name: &str) -> Function {
    let (rs_ty, c_ty) = (sh.rs_ty(), sh.codes_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, 3, sh.rows, sh.k, LANES]);
    let (pad, pad32) = c.pads(src);
    let types = (src, (pad.as_str(), pad32.as_str()));
    c.each("i", sh.rows, |c| {
        let (s0, s1) = (c.row_bits(&rs_ty, 1), c.row_bits(&rs_ty, 3));
        let first_marker = c.row_bits(&rs_ty, 0);
        let unscalable = c.test("eq", &first_marker, INF, &vi);
        c.each_by("l", (sh.k, LANES), |c| {
            let (p, first, _) = c.first_pass(types, &s0, &vi);
            let (n, u, negative) = c.residual_value(&p, &first, &vi);
            let second = c.at_scale((&n, &u), &s1, &vi);
            let empty = match &p.nan {
                Some(nan) => c.bin("ori", nan, &unscalable, &lanes_of(&vi, "i1")),
                None => unscalable.clone(),
            };
            let code = c.signed_code(&second.magnitude, (&negative, Some(&empty)), &vi);
            c.write_codes(code, "c1", &c_ty);
        });
    });
    c.finish(name, vec![src.param(), (v("rs"), rs_ty), (v("c1"), c_ty)])
}

/// Every function of `QuantizeRows(x, γ)` a core of shape `sh` calls, in call order (the
/// row state's reset first).
pub fn product_functions(sh: Shape) -> Vec<Function> {
    let mut f = vec![super::reset(sh), product_max(sh), product_scale(sh, 0), product_codes(sh)];
    if sh.passes > 1 {
        f.extend([product_scale(sh, 1), product_residual(sh)]);
    }
    f
}
