//! `QuantizeSwiGlu(g, u)` as core code: SwiGlu in integers (`ir::integer_gate`) and its
//! quantisation, in [`LANES`]-lane integer vectors with no floating point. `gq_gate` computes
//! each value `ĝ·σ̂·û` once from the `gu` element that brings the gate's and up's f32 rows
//! (`[2, rows, k]`: the gate's rows, then the up's) into `gv` of the same shape, as the exact
//! values the norm's
//! quantisation takes ([`super::norm_codes`]): `p·2^u`, `p = M_g·S·M_u` below 2³², the unit
//! `u = E_g + E_u − 284`: `gv`'s first plane holds `p`, its second `u + 512` with the value's
//! sign in bit 31; a NaN value is `p = 0` (code 0, no part of a maximum) and an
//! infinite one `p = 1` at the unit 400, past every scale (the row unscalable, the code ±127).
//! The maximum, scales, codes and residual codes are then the norm's functions reading `gv`.
//!
//! Every step of σ̂ is an unsigned one (the definition keeps every intermediate non-negative
//! and below 2³¹): shifts right are logical, minima and maxima compares and selects.

use super::norm_codes::{first_codes, running_max, second_codes, Exact, Source};
use super::softfloat::{ABS, INF};
use super::{lanes, Code, Shape, LANES};
use crate::kernels::{idx, lanes_of, memref, v, Function, Stmt};
use ir::integer_gate::{A, B, C, L, ONE};

/// The gate's values in place.
pub const GATE_VALUES: &str = "gq_gate";
/// Each row's running scale marker over one K part (pass 0).
pub const GATE_MAX: &str = "gq_max";
/// One K part's first-pass codes (and, with two passes, the residual's running marker).
pub const GATE_CODES: &str = "gq_codes";
/// One K part's second-pass codes.
pub const GATE_RESIDUAL: &str = "gq_residual";

/// The unit an infinite value takes: past every scale's exponent.
const INFINITE_UNIT: i64 = 400;
/// The bias that makes every unit (−282 to [`INFINITE_UNIT`]) positive in a plane word.
const UNIT_BIAS: i64 = 512;

/// One input rounded to 11 significant bits: its bits, the significand `M` (11 bits, the
/// implicit one set when normal), the exponent `E ≥ 1`, and whether it is NaN or ±∞.
struct Rounded11 {
    bits: String,
    m: String,
    e: String,
    nan: String,
    inf: String,
}

impl Code {
    /// `x`'s bits rounded to 11 significant bits, ties to even (`ir::integer_gate::round11`).
    fn round11(&mut self, x: &str, ty: &str) -> Rounded11 {
        let magnitude = self.with("andi", x, ABS, ty);
        let nan = self.test("ugt", &magnitude, INF, ty);
        let odd = self.with("shrui", x, 13, ty);
        let odd = self.with("andi", &odd, 1, ty);
        let t = self.with("addi", x, 0xfff, ty);
        let t = self.bin("addi", &t, &odd, ty);
        let bits = self.with("andi", &t, !0x1fff, ty);
        let (e, _, sig) = self.fields(&bits, ty);
        let m = self.with("shrui", &sig, 13, ty);
        let inf = self.test("eq", &e, 255, ty);
        Rounded11 { bits, m, e, nan, inf }
    }

    /// `(a·b) >> s`, unsigned, `s` a constant.
    fn mul_shift(&mut self, a: &str, b: &str, s: i64, ty: &str) -> String {
        let product = self.bin("muli", a, b, ty);
        self.with("shrui", &product, s, ty)
    }

    /// S of σ̂(ĝ) = S/1024 (`ir::integer_gate::sigma_code`).
    fn sigma_code(&mut self, g: &Rounded11, ty: &str) -> String {
        let shift = self.iconst(137, ty);
        let shift = self.bin("subi", &shift, &g.e, ty);
        // 7 to 31: a saturated or infinite ĝ (σ̂ chosen below) shifts by no amount past 31.
        let shift = self.clamp(&shift, (7, 31), ty);
        let l = self.iconst(i64::from(L), ty);
        let z = self.bin("muli", &g.m, &l, ty);
        let z = self.bin("shrui", &z, &shift, ty);
        let n = self.with("shrui", &z, 16, ty);
        let f = self.with("andi", &z, 0xffff, ty);
        let one = self.iconst(1 << 16, ty);
        let w = self.bin("subi", &one, &f, ty);
        let mut p = self.iconst(i64::from(C[3]), ty);
        for &c in C[..3].iter().rev() {
            let t = self.mul_shift(&p, &w, 16, ty);
            p = self.with("addi", &t, i64::from(c), ty);
        }
        let n1 = self.with("addi", &n, 1, ty);
        let e = self.bin("shrui", &p, &n1, ty);
        let d = self.with("addi", &e, 1 << 15, ty);
        let b = self.iconst(i64::from(B), ty);
        let guess = self.mul_shift(&d, &b, 15, ty);
        let a = self.iconst(i64::from(A), ty);
        let mut y = self.bin("subi", &a, &guess, ty);
        for _ in 0..2 {
            let dy = self.mul_shift(&d, &y, 15, ty);
            let two = self.bin("subi", &one, &dy, ty);
            y = self.mul_shift(&y, &two, 15, ty);
        }
        let s = self.with("addi", &y, 16, ty);
        let s = self.with("shrui", &s, 5, ty);
        self.signed_sigma(g, &s, ty)
    }

    /// S for ĝ's sign and saturation from `s` = S⁺ of |ĝ|.
    fn signed_sigma(&mut self, g: &Rounded11, s: &str, ty: &str) -> String {
        let full = self.iconst(i64::from(ONE), ty);
        let complement = self.bin("subi", &full, s, ty);
        let negative = self.test("slt", &g.bits, 0, ty);
        let s = self.select(&negative, &complement, s, ty);
        let magnitude = self.with("andi", &g.bits, ABS, ty);
        let saturated = self.test("uge", &magnitude, i64::from(16f32.to_bits()), ty);
        let c0 = self.iconst(0, ty);
        let limit = self.select(&negative, &c0, &full, ty);
        self.select(&saturated, &limit, &s, ty)
    }

    /// The gate's value of the bits `gb`, `ub` as the plane words `(p, sign | u + 512)`.
    fn gate_words(&mut self, gb: &str, ub: &str, ty: &str) -> (String, String) {
        let t1 = lanes_of(ty, "i1");
        let (g, u) = (self.round11(gb, ty), self.round11(ub, ty));
        let s = self.sigma_code(&g, ty);
        let p = self.bin("muli", &g.m, &s, ty);
        let p = self.bin("muli", &p, &u.m, ty);
        let unit = self.bin("addi", &g.e, &u.e, ty);
        let unit = self.with("subi", &unit, 284, ty);
        let infinite = self.bin("ori", &g.inf, &u.inf, &t1);
        let zero = self.test("eq", &p, 0, ty);
        let invalid = self.bin("andi", &infinite, &zero, &t1);
        let nan = self.bin("ori", &g.nan, &u.nan, &t1);
        let nan = self.bin("ori", &nan, &invalid, &t1);
        let (c0, c1) = (self.iconst(0, ty), self.iconst(1, ty));
        let p = self.select(&infinite, &c1, &p, ty);
        let p = self.select(&nan, &c0, &p, ty);
        let far = self.iconst(INFINITE_UNIT, ty);
        let unit = self.select(&infinite, &far, &unit, ty);
        let signs = self.bin("xori", gb, ub, ty);
        let sign = self.with("andi", &signs, i64::from(i32::MIN), ty);
        let word = self.with("addi", &unit, UNIT_BIAS, ty);
        (p, self.bin("ori", &word, &sign, ty))
    }

    /// Block `(%i, %l)` of plane `plane` of `mem` (a `[2, rows, k]` i32 element).
    fn plane(&mut self, (mem, mem_ty): (&str, &str), plane: usize, pad32: &str) -> String {
        let res = self.fresh("vec");
        let at = vec![idx(plane), "%i".to_string(), "%l".to_string()];
        let (mem, mem_ty, vty) = (v(mem), mem_ty.to_string(), lanes("i32"));
        self.push(Stmt::Read { res: res.clone(), mem, mem_ty, idx: at, pad: pad32.into(), vty, elem: "i32" });
        res
    }

    /// The exact values `gq_gate` left in `gv` at block `(%i, %l)`.
    pub(super) fn gate_exact(&mut self, gv_ty: &str, pad32: &str, ty: &str) -> Exact {
        let p = self.plane(("gv", gv_ty), 0, pad32);
        let word = self.plane(("gv", gv_ty), 1, pad32);
        let negative = self.test("slt", &word, 0, ty);
        let unit = self.with("andi", &word, ABS, ty);
        let unit = self.with("subi", &unit, UNIT_BIAS, ty);
        Exact { p, u: unit, negative, nan: None, inf: None }
    }
}

/// The `gu` element of a core of shape `sh`: the gate's `[rows, k]` f32 rows, then the up's,
/// as i32 words (the gate's values overwrite them in place).
pub fn gu_ty(sh: Shape) -> String {
    memref(&[2, sh.rows, sh.k], "i32")
}

/// `gq_gate(%gu, %gv)`: each value `ĝ·σ̂·û` of one K part of the gate's and up's rows `gu`,
/// as the planes of `gv` (which may be `gu` itself).
pub fn gate_values(sh: Shape) -> Function {
    let gu = gu_ty(sh);
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, sh.rows, sh.k, LANES]);
    let pad32 = c.iconst(0, "i32");
    c.each("i", sh.rows, |c| {
        c.each_by("l", (sh.k, LANES), |c| {
            let (g, u) = (c.plane(("gu", &gu), 0, &pad32), c.plane(("gu", &gu), 1, &pad32));
            let (p, word) = c.gate_words(&g, &u, &vi);
            for (plane, val) in [(0, p), (1, word)] {
                let at = vec![idx(plane), "%i".to_string(), "%l".to_string()];
                c.push(Stmt::Write { val, mem: v("gv"), mem_ty: gu.clone(), idx: at, vty: vi.clone() });
            }
        });
    });
    c.finish(GATE_VALUES, vec![(v("gu"), gu.clone()), (v("gv"), gu)])
}

/// `gq_max(%gv, %rs)`: each row's running scale marker of the gate's values over one K part.
pub fn gate_max(sh: Shape) -> Function {
    let gv = gu_ty(sh);
    running_max(sh, Source::Gate { gv_ty: &gv }, GATE_MAX)
}

/// `gq_codes(%gv, %rs, %c0)`: one K part's first-pass codes of the gate's values.
pub fn gate_codes(sh: Shape) -> Function {
    let gv = gu_ty(sh);
    first_codes(sh, Source::Gate { gv_ty: &gv }, GATE_CODES)
}

/// `gq_residual(%gv, %rs, %c1)`: one K part's second-pass codes of the gate's values.
pub fn gate_residual(sh: Shape) -> Function {
    let gv = gu_ty(sh);
    second_codes(sh, Source::Gate { gv_ty: &gv }, GATE_RESIDUAL)
}

/// Every function of `QuantizeSwiGlu(g, u)` a core of shape `sh` calls, in call order (the row
/// state's reset first; the scales are the norm's, read off the same markers).
pub fn gate_functions(sh: Shape) -> Vec<Function> {
    let mut f = vec![super::reset(sh), gate_values(sh), gate_max(sh), super::product_scale(sh, 0), gate_codes(sh)];
    if sh.passes > 1 {
        f.extend([super::product_scale(sh, 1), gate_residual(sh)]);
    }
    f
}
