//! SwiGlu as core code: `g_swiglu(%g, %u, %y)` computes `ir::pinned_gate`'s definition of
//! `(g·σ(g))·u` row by row in [`LANES`]-lane vectors, every f32 step IEEE single precision
//! spelled in integer operations ([`super::softfloat`]), so a core's gate equals the host
//! kernels' bit for bit. Its cost is what it is for: the measure of whether the gate belongs
//! on the array as f32 (the `qgemv_designs` example counts it).
//!
//! The core's `exp` takes only what σ gives it, `x = −|g|` (0 or below, or NaN): `x` clamped
//! at −104 by the bits' order, `n = round_half_even(x·log₂e)` by a rounded shift of the
//! product's significand (|n| ≤ 150), the range reduction, Horner's polynomial and the two
//! scalings as the definition has them, NaN kept. Then one division — `1/d` or `e/d` chosen
//! before it — and the two products.

use super::softfloat::{ABS, INF, SIGN};
use super::{lanes, Code, LANES};
use crate::kernels::{memref, v, Function, Stmt};
use ir::pinned_gate::{LN2_HI, LN2_LO, LOG2E, LOWEST, P};

/// The function's name.
pub const GATE: &str = "g_swiglu";

/// A gate kernel's rows and row length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateShape {
    pub rows: usize,
    pub d: usize,
}

/// An f32 constant's bits as an i32 constant of `ty`.
fn bits(c: &mut Code, x: f32, ty: &str) -> String {
    c.iconst(i64::from(x.to_bits() as i32), ty)
}

impl Code {
    /// `x − y` on f32 bits: `x + (−y)`.
    fn sub_f32(&mut self, x: &str, y: &str, ty: &str) -> String {
        let minus = self.with("xori", y, SIGN, ty);
        self.add_f32(x, &minus, ty)
    }

    /// The signed integer `round_half_even(v)` of an f32 `v ≤ 0` with |v| < 2²³ (bits `vb`): its
    /// significand shifted right by `150 − e`, rounded from the bits shifted out, negated.
    fn round_to_int(&mut self, vb: &str, ty: &str) -> String {
        let (e, _, sig) = self.fields(vb, ty);
        let shift = self.iconst(150, ty);
        let shift = self.bin("subi", &shift, &e, ty);
        let (magnitude, ..) = self.round_shift_right(&sig, &shift, ty);
        let zero = self.iconst(0, ty);
        self.bin("subi", &zero, &magnitude, ty)
    }

    /// The f32 bits of `2^k` for an integer `k` in the normal range.
    fn pow2_bits(&mut self, k: &str, ty: &str) -> String {
        let biased = self.with("addi", k, 127, ty);
        self.with("shli", &biased, 23, ty)
    }

    /// `ir::pinned_gate::exp` of `x ≤ 0` or NaN (bits `xb`).
    fn exp_nonpositive(&mut self, xb: &str, ty: &str) -> String {
        let lowest = bits(self, LOWEST, ty);
        let magnitude = self.with("andi", xb, ABS, ty);
        let nan = self.test("ugt", &magnitude, INF, ty);
        // For x ≤ 0 a larger magnitude is a lower value.
        let below = self.test("ugt", &magnitude, i64::from(LOWEST.to_bits()) & ABS, ty);
        let x = self.select(&below, &lowest, xb, ty);
        let log2e = bits(self, LOG2E, ty);
        let v = self.mul_f32(&x, &log2e, ty);
        let n = self.round_to_int(&v, ty);
        let nf = self.f32_of_i32(&n, ty);
        let (hi, lo) = (bits(self, LN2_HI, ty), bits(self, LN2_LO, ty));
        let t = self.mul_f32(&nf, &hi, ty);
        let r = self.sub_f32(&x, &t, ty);
        let t = self.mul_f32(&nf, &lo, ty);
        let r = self.sub_f32(&r, &t, ty);
        let mut p = bits(self, P[0], ty);
        for &coefficient in &P[1..] {
            let product = self.mul_f32(&p, &r, ty);
            let c = bits(self, coefficient, ty);
            p = self.add_f32(&product, &c, ty);
        }
        let r2 = self.mul_f32(&r, &r, ty);
        let t = self.mul_f32(&p, &r2, ty);
        let t = self.add_f32(&t, &r, ty);
        let one = bits(self, 1.0, ty);
        let y = self.add_f32(&t, &one, ty);
        let n1 = self.clamp(&n, (-125, 127), ty);
        let n2 = self.bin("subi", &n, &n1, ty);
        let (p1, p2) = (self.pow2_bits(&n1, ty), self.pow2_bits(&n2, ty));
        let e = self.mul_f32_by_power_of_two(&p1, &y, ty);
        let e = self.mul_f32_by_power_of_two(&p2, &e, ty);
        self.select(&nan, xb, &e, ty)
    }

    /// `(g·σ(g))·u` on the bits `gb`, `ub`.
    fn swiglu_bits(&mut self, gb: &str, ub: &str, ty: &str) -> String {
        let magnitude = self.with("andi", gb, ABS, ty);
        let x = self.with("ori", &magnitude, SIGN, ty);
        let e = self.exp_nonpositive(&x, ty);
        let one = bits(self, 1.0, ty);
        let d = self.add_f32(&one, &e, ty);
        // `g ≥ 0` by the sign bit alone: −0 takes e/d = 1/2 = 1/d, and a NaN gives NaN either way.
        let sign_clear = self.test("sge", gb, 0, ty);
        let numerator = self.select(&sign_clear, &one, &e, ty);
        let sigma = self.div_f32(&numerator, &d, ty);
        let silu = self.mul_f32(gb, &sigma, ty);
        self.mul_f32(&silu, ub, ty)
    }
}

/// `g_swiglu(%g, %u, %y)`: `y = (g·σ(g))·u` of `[rows, d]` f32 rows, [`LANES`] values at a
/// time. Refuses rows that are not whole blocks.
pub fn swiglu(sh: GateShape) -> Result<Function, String> {
    if sh.rows == 0 || sh.d == 0 || !sh.d.is_multiple_of(LANES) {
        return Err(format!(
            "a gate core takes rows of whole {LANES}-value blocks: {} rows of {} values are not",
            sh.rows, sh.d
        ));
    }
    let ty = memref(&[sh.rows, sh.d], "f32");
    let (vi, vf) = (lanes("i32"), lanes("f32"));
    let mut c = Code::new(&[0, 1, sh.rows, sh.d, LANES]);
    let pad = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        c.each_by("l", (sh.d, LANES), |c| {
            let g = c.read_lanes("g", &ty, "f32", &pad);
            let g = c.cast("bitcast", &g, &vf, &vi);
            let u = c.read_lanes("u", &ty, "f32", &pad);
            let u = c.cast("bitcast", &u, &vf, &vi);
            let y = c.swiglu_bits(&g, &u, &vi);
            let y = c.cast("bitcast", &y, &vi, &vf);
            let idx = vec!["%i".to_string(), "%l".to_string()];
            c.push(Stmt::Write { val: y, mem: v("y"), mem_ty: ty.clone(), idx, vty: vf.clone() });
        });
    });
    Ok(c.finish(GATE, vec![(v("g"), ty.clone()), (v("u"), ty.clone()), (v("y"), ty)]))
}
