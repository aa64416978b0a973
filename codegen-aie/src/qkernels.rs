//! The A8W8 prologue and epilogue as core code: the functions a [`crate::qgemv`] core calls to
//! quantise its f32 activation rows to int8 itself and to turn its int32 accumulators back into
//! f32 outputs, so the array takes and returns what the host program holds between projections.
//!
//! Each function computes, operation for operation, what the program's ops define
//! (`ir::fused`): [`QuantizeRows`](ir::fused::quantize_rows) (`s` the smallest power of two at
//! least `max|row| / 127`, read off the quotient's bits, 1 for a row of zeros or a non-finite
//! maximum; `codes = round_half_even(x / s)` within ±127, NaN to 0),
//! its residual pass (`r = x − code·s`, quantised the same way) and the `QGemm` epilogue
//! (`acc·(sₐ·s_w)` in f32, the passes' products added in pass order, a column the weight marks
//! first-pass-only keeping the first). Every f32 step is the program's own IEEE-754 operation,
//! rounded to nearest even, in the program's order (a product and a sum, never fused), and every
//! integer step gives exactly the value the program's f32 operation gives, so the core's results
//! equal the host's bit for bit, and the interpreter checks that they do.
//!
//! The state a core keeps per activation row is one buffer `rs` of `[4, rows]` f32: the first
//! pass's running maximum and scale, then the residual pass's. The codes are the core's own
//! `[kernel_rows, k]` int8 buffers, one per pass and K part, which the GEMV kernel reads as it
//! reads a resident activation. A tile's weight element carries, after its `n` rows of weights, the
//! epilogue's data ([`meta_rows`]): each column's f32 scale as four little-endian bytes, then
//! with two passes one byte per column, 1 when the column takes the first pass's product only.
//!
//! An AIE2 core has no floating-point scalar unit (its vector unit emulates f32 products with
//! bfloat16 parts, not to IEEE's rounding, and flushes subnormals), so f32 operations lower to
//! software floating point: exact, and tens of cycles each. The quantisation therefore takes no
//! floating point per element, and runs in vectors of [`LANES`] integers: a row's maximum is the
//! unsigned maximum of the bits without their sign (NaN's bits taken as 0); with the
//! power-of-two scale `x / s` is `x`'s significand shifted right by the exponents' difference, the
//! code the shifted integer rounded half to even from the bits shifted out — the program's
//! `round_half_even(x / s)` exactly; and the residual `x − code·s` (representable, so the
//! program's f32 subtraction is exact) is the remainder that shift leaves, normalised back into
//! f32 bits. The tests compare them on ties, subnormals, infinities and NaN. The epilogue is
//! integer vector code too, [`LANES`] columns at a time: the accumulator's conversion, the two
//! products and the passes' sum are IEEE single precision spelled in integer operations
//! ([`softfloat`]), and so is a row's scale, whose `max / 127` is the same
//! integer spelling of the division. No floating-point operation is left in a core's code: its
//! f32 values are loaded, stored and bitcast, and every operation on them is an integer one.

use crate::kernels::{idx, index_consts, lanes_of, memref, v, Carried, Function, Stmt};

mod exchange;
mod gate;
mod gate_codes;
mod norm;
mod norm_codes;
mod norm_gemv;
mod softfloat;
mod sum;

pub use exchange::{
    combine, maxima as exchange_maxima, pack as pack_slot, prologue_functions, share, unpack, Exchange, COMBINE, PACK,
    SHARE, UNPACK,
};
pub use gate::{swiglu, GateShape, GATE};
pub use gate_codes::{
    gate_codes, gate_functions, gate_max, gate_residual, gate_values, gu_ty, GATE_CODES, GATE_MAX, GATE_RESIDUAL,
    GATE_VALUES,
};
pub use norm::{inverse_rms, rms_norm, NormShape, INVERSE_RMS, NORM, NORM_LANES};
pub use norm_codes::{
    product_codes, product_functions, product_max, product_residual, product_scale, PRODUCT_CODES, PRODUCT_MAX,
    PRODUCT_RESIDUAL, PRODUCT_SCALE,
};
pub use norm_gemv::{
    norm_functions, norm_quantise_functions, norm_rescale, norm_reset, norm_root, norm_squares, norm_top, squares_ty,
    NORM_RESCALE, NORM_RESET, NORM_ROOT, NORM_SQUARES, NORM_TOP,
};
pub use sum::{sum, sum_ty, SUM};

pub const RESET: &str = "q_reset";
pub const ABSMAX: &str = "q_absmax";
pub const SCALE: [&str; 2] = ["q_scale0", "q_scale1"];
pub const CODES: &str = "q_codes";
pub const RESIDUAL_MAX: &str = "q_resmax";
pub const RESIDUAL: &str = "q_residual";
pub const DEQUANT: &str = "q_dequant";

/// Lanes of the prologue's vectors: a K part is a multiple of the micro-tile's 8, and 8 × 32
/// bits is a 256-bit vector register.
pub const LANES: usize = 8;

/// `vector<1xLANESxelem>`.
fn lanes(elem: &str) -> String {
    lanes_n(elem, LANES)
}

/// `vector<1xWIDTHxelem>`.
fn lanes_n(elem: &str, width: usize) -> String {
    format!("vector<1x{width}x{elem}>")
}

/// The shortest K part a qgemv core takes: one row of its weight element holds at least
/// [`LANES`] column scales.
pub const MIN_K: usize = 4 * LANES;

/// Column scales one row of `k` bytes of the epilogue data holds: whole blocks of [`LANES`].
pub fn scales_per_row(k: usize) -> usize {
    k / MIN_K * LANES
}

/// Rows of weight element a tile's epilogue data takes after its `n` weight rows of `k` bytes
/// (`bundle::xdna::QgemvLayout::meta`): the `n` f32 scales, and with two passes `n` flag bytes.
pub fn meta_rows(passes: usize, k: usize, n: usize) -> usize {
    n.div_ceil(scales_per_row(k)) + if passes > 1 { n.div_ceil(k) } else { 0 }
}

/// A core's shapes: `rows` activation rows, K parts of `k`, output tiles of `n` columns, the
/// activation's `passes` (1 or 2), and the rows of the codes and accumulators the GEMV kernel
/// multiplies, `kernel_rows` ≥ `rows`: a whole number of the device's micro-tile rows lets it
/// take its vector form (the rows past `rows` are never written, and their products never read).
/// `input` says what each `X` element carries. With `pairs` each of the `n` outputs is the sum of
/// two weight columns, as `array-int8` adds a weight's two passes: its first pass (every
/// activation pass) plus its residual pass (the first activation pass only), so a tile's
/// weight element and accumulators hold `2n` columns ([`dequant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    pub passes: usize,
    pub kernel_rows: usize,
    pub input: Input,
    pub pairs: bool,
    /// With two passes, both passes' codes as rows of one buffer (pass `p`'s row `i` at row
    /// `p·rows + i` of `kernel_rows ≥ 2·rows`), which one GEMV call a K part multiplies into one
    /// accumulator: half the codes' memory and calls of decode's one row.
    pub stacked: bool,
}

/// What a qgemv core's `X` elements carry, and so what its prologue computes from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// f32 activation rows: `QuantizeRows(x)` ([`functions`]).
    Rows,
    /// A norm's input rows with γ's part as one more row: `InverseRms` and
    /// `QuantizeRows(x, γ)` ([`norm_functions`]).
    Norm,
    /// The gate's f32 rows, then the up's, as `[2, rows, k]` words: `QuantizeSwiGlu(g, u)`
    /// ([`gate_functions`]).
    Gate,
    /// A norm's input as the residual stream's rows and a projection's output rows, which the
    /// core adds first (the program's residual `Add`, [`sum()`]), then `Norm`'s: the residual
    /// stream's rows, γ's part, then the projection's rows.
    SumNorm,
}

impl Input {
    /// Whether the core computes a norm of its rows.
    pub fn norm(self) -> bool {
        matches!(self, Input::Norm | Input::SumNorm)
    }
}

impl Shape {
    /// Rows of an `X` element: the activation rows, γ's with a norm, the gate's and the up's.
    pub fn x_rows(&self) -> usize {
        match self.input {
            Input::Rows => self.rows,
            Input::Norm => self.rows + 1,
            Input::SumNorm => 2 * self.rows + 1,
            Input::Gate => 2 * self.rows,
        }
    }
    pub fn x_ty(&self) -> String {
        match self.input {
            Input::Gate => gu_ty(*self),
            _ => memref(&[self.x_rows(), self.k], "f32"),
        }
    }
    /// The row state: the passes' maxima and scales, and with a norm the row's largest
    /// magnitude and `1/rms` (slots 4 and 5).
    pub fn rs_ty(&self) -> String {
        memref(&[if self.input.norm() { 6 } else { 4 }, self.rows], "f32")
    }
    /// Passes with codes buffers and accumulators of their own: one when [`Shape::stacked`].
    pub fn buffered_passes(&self) -> usize {
        if self.stacked {
            1
        } else {
            self.passes
        }
    }
    pub fn codes_ty(&self) -> String {
        memref(&[self.kernel_rows, self.k], "i8")
    }
    /// The weight columns a tile multiplies: `n`, or `2n` with pairs.
    pub fn w_cols(&self) -> usize {
        if self.pairs {
            2 * self.n
        } else {
            self.n
        }
    }
    pub fn acc_ty(&self) -> String {
        memref(&[self.kernel_rows, self.w_cols()], "i32")
    }
    /// Rows of a weight element: the tile's weight columns, then their epilogue data (with pairs
    /// no first-pass-only flags: a pair's second column always is).
    pub fn w_rows(&self) -> usize {
        let cols = self.w_cols();
        if self.pairs {
            cols + cols.div_ceil(scales_per_row(self.k))
        } else {
            cols + meta_rows(self.passes, self.k, cols)
        }
    }
    pub fn w_ty(&self) -> String {
        memref(&[self.w_rows(), self.k], "i8")
    }
    pub fn y_ty(&self) -> String {
        memref(&[self.rows, self.n], "f32")
    }
}

/// The parts of a quotient `x / s` (see [`Code::quotient`]): `x`'s biased exponent `e` (1 for a
/// subnormal), its mantissa field `m`, its significand `sig` (the implicit bit set when normal),
/// and the right shift `t` = s's exponent + 23 − `e`, clamped to 1..=31.
struct Quotient {
    e: String,
    m: String,
    sig: String,
    t: String,
}

/// A function body under construction: statements and fresh SSA names.
struct Code {
    stmts: Vec<Stmt>,
    next: usize,
}

impl Code {
    fn new(index_values: &[usize]) -> Code {
        Code { stmts: index_consts(index_values), next: 0 }
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("%{hint}{}", self.next)
    }

    fn push(&mut self, s: Stmt) {
        self.stmts.push(s);
    }

    fn fconst(&mut self, x: f32) -> String {
        let res = self.fresh("f");
        self.push(Stmt::FConst { res: res.clone(), bits: x.to_bits() });
        res
    }

    fn iconst(&mut self, value: i64, ty: &str) -> String {
        let res = self.fresh("k");
        self.push(Stmt::Const { res: res.clone(), value, ty: ty.into() });
        res
    }

    fn load(&mut self, mem: &str, mem_ty: &str, at: &[&str], ty: &str) -> String {
        let res = self.fresh("ld");
        let idx = at.iter().map(|s| s.to_string()).collect();
        self.push(Stmt::Load { res: res.clone(), mem: v(mem), mem_ty: mem_ty.into(), idx, ty: ty.into() });
        res
    }

    fn store(&mut self, val: &str, mem: &str, mem_ty: &str, at: &[&str], ty: &str) {
        let idx = at.iter().map(|s| s.to_string()).collect();
        self.push(Stmt::Store { val: val.into(), mem: v(mem), mem_ty: mem_ty.into(), idx, ty: ty.into() });
    }

    fn bin(&mut self, op: &'static str, a: &str, b: &str, ty: &str) -> String {
        let res = self.fresh(op);
        self.push(Stmt::Bin { res: res.clone(), op, a: a.into(), b: b.into(), ty: ty.into() });
        res
    }

    fn cast(&mut self, op: &'static str, src: &str, from: &str, to: &str) -> String {
        let res = self.fresh(op);
        self.push(Stmt::Cast { res: res.clone(), op, src: src.into(), from: from.into(), to: to.into() });
        res
    }

    fn cmp(&mut self, float: bool, pred: &'static str, a: &str, b: &str, ty: &str) -> String {
        let res = self.fresh("cmp");
        self.push(Stmt::Cmp { res: res.clone(), float, pred, a: a.into(), b: b.into(), ty: ty.into() });
        res
    }

    fn select(&mut self, cond: &str, a: &str, b: &str, ty: &str) -> String {
        let res = self.fresh("sel");
        self.push(Stmt::Select { res: res.clone(), cond: cond.into(), a: a.into(), b: b.into(), ty: ty.into() });
        res
    }

    /// `for iv in 0..ub { body }`, the body built by `f` in a fresh statement list.
    fn each(&mut self, iv: &str, ub: usize, f: impl FnOnce(&mut Code)) {
        self.each_by(iv, (ub, 1), f);
    }

    /// `res = for iv in 0..ub step step carrying a value of type `ty` from init { body }`: `f`
    /// builds the body from the carried value's name and returns the value it yields.
    fn fold_by(
        &mut self,
        iv: &str,
        (ub, step): (usize, usize),
        (init, ty): (&str, &str),
        f: impl FnOnce(&mut Code, &str) -> String,
    ) -> String {
        let (arg, res) = (self.fresh("carry"), self.fresh("folded"));
        let mut inner = Code { stmts: vec![], next: self.next };
        let yielded = f(&mut inner, &arg);
        self.next = inner.next;
        let carried = Carried { arg, init: init.into(), yielded, res: res.clone(), ty: ty.into() };
        self.push(Stmt::For {
            iv: v(iv),
            lb: idx(0),
            ub: idx(ub),
            step: idx(step),
            carried: Some(carried),
            body: inner.stmts,
        });
        res
    }

    /// `for iv in 0..ub step step { body }`.
    fn each_by(&mut self, iv: &str, (ub, step): (usize, usize), f: impl FnOnce(&mut Code)) {
        let body = self.nested(f);
        self.push(Stmt::For { iv: v(iv), lb: idx(0), ub: idx(ub), step: idx(step), carried: None, body });
    }

    /// The `[1, LANES]` block of a row-major `[rows, k]` memref at `(%i, %l)`, of element `elem`.
    fn read_lanes(&mut self, mem: &str, mem_ty: &str, elem: &'static str, pad: &str) -> String {
        self.read_block((mem, mem_ty), elem, ["%i", "%l"], (pad, LANES))
    }

    /// The `[1, width]` block of a row-major memref at `at`, of element `elem`.
    fn read_block(
        &mut self,
        (mem, mem_ty): (&str, &str),
        elem: &'static str,
        at: [&str; 2],
        (pad, width): (&str, usize),
    ) -> String {
        let res = self.fresh("vec");
        let vty = lanes_n(elem, width);
        let idx = at.iter().map(|s| s.to_string()).collect();
        self.push(Stmt::Read { res: res.clone(), mem: v(mem), mem_ty: mem_ty.into(), idx, pad: pad.into(), vty, elem });
        res
    }

    /// `x`'s `[1, LANES]` block at `(%i, %l)` as i32 bits (`x` the f32 activation part).
    fn x_bits(&mut self, x_ty: &str, pad: &str) -> String {
        let x = self.read_lanes("x", x_ty, "f32", pad);
        self.cast("bitcast", &x, &lanes("f32"), &lanes("i32"))
    }

    /// The first-pass codes' `[1, LANES]` block at `(%i, %l)`, widened to i32.
    fn first_codes(&mut self, c_ty: &str, pad8: &str) -> String {
        let q = self.read_lanes("c0", c_ty, "i8", pad8);
        self.extend(&q, (&lanes("i8"), &lanes("i32")))
    }

    /// `val` (`[1, LANES]` int8 codes) into `mem` at `(%i, %l)`.
    fn write_codes(&mut self, val: String, mem: &str, mem_ty: &str) {
        let idx = vec!["%i".to_string(), "%l".to_string()];
        self.push(Stmt::Write { val, mem: v(mem), mem_ty: mem_ty.into(), idx, vty: lanes("i8") });
    }

    /// Row `%i`'s f32 state `rs[slot]` as its bits in every lane.
    fn row_bits(&mut self, rs_ty: &str, slot: usize) -> String {
        let value = self.load("rs", rs_ty, &[&idx(slot), "%i"], "f32");
        let bits = self.cast("bitcast", &value, "f32", "i32");
        self.vector("broadcast", None, &bits, ("i32", &lanes("i32")))
    }

    /// The lanes' unsigned maximum of `acc` (the bits of non-negative floats, so the largest
    /// value), stored as row `%i`'s f32 state `rs[slot]`.
    fn store_row_max(&mut self, acc: &str, rs_ty: &str, slot: usize) {
        let flat_ty = format!("vector<{LANES}xi32>");
        let flat = self.vector("shape_cast", None, acc, (&lanes("i32"), &flat_ty));
        let max = self.vector("reduction", Some("maxui"), &flat, (&flat_ty, "i32"));
        let max = self.cast("bitcast", &max, "i32", "f32");
        self.store(&max, "rs", rs_ty, &[&idx(slot), "%i"], "f32");
    }

    fn vector(&mut self, op: &'static str, kind: Option<&'static str>, src: &str, (from, to): (&str, &str)) -> String {
        let res = self.fresh("v");
        self.push(Stmt::Vector { res: res.clone(), op, kind, src: src.into(), from: from.into(), to: to.into() });
        res
    }

    fn nested(&mut self, f: impl FnOnce(&mut Code)) -> Vec<Stmt> {
        let mut inner = Code { stmts: vec![], next: self.next };
        f(&mut inner);
        self.next = inner.next;
        inner.stmts
    }

    /// `QuantizeRows`' code of `x` at the power-of-two scale `s`: `round_half_even(x / s)` within
    /// ±127, NaN to 0, as int8 — in integer operations on the bits, no floating point: `x / s` is
    /// `x`'s significand `M` shifted right by `t` = (s's exponent + 23 − x's exponent), so its
    /// integer part is `M >> t` and the bits shifted out decide the rounding (up past half, and
    /// at exactly half when the integer part is odd).
    ///
    /// `xb` and `sb` are the bits of `x` and `s` as `ty` (i32, or a vector of them, lane by lane);
    /// the codes come back as its int8 form.
    fn quantise_bits(&mut self, xb: &str, sb: &str, ty: &str) -> String {
        let q = self.quotient(xb, sb, ty);
        self.round_code(&q, xb, ty)
    }

    /// The parts of `x / s` that its code and residual read, from the bits `xb` and `sb` (see
    /// [`Code::quantise_bits`]).
    fn quotient(&mut self, xb: &str, sb: &str, ty: &str) -> Quotient {
        let (e, m, sig) = self.fields(xb, ty);
        let c23 = self.iconst(23, ty);
        let es = self.bin("shrui", sb, &c23, ty);
        let t = self.bin("addi", &es, &c23, ty);
        let t = self.bin("subi", &t, &e, ty);
        // Shifts of 1 to 31: a finite |x| ≤ 127·s shifts by 17 or more, and 31 leaves nothing.
        let t = self.clamp(&t, (1, 31), ty);
        Quotient { e, m, sig, t }
    }

    /// The int8 code of a [`Code::quotient`]: the shifted significand rounded half to even,
    /// within ±127, ±∞ to ±127 and NaN to 0, with `x`'s sign.
    fn round_code(&mut self, quotient: &Quotient, xb: &str, ty: &str) -> String {
        let (t1, t8) = (lanes_of(ty, "i1"), lanes_of(ty, "i8"));
        let (t1, t8) = (t1.as_str(), t8.as_str());
        let Quotient { e, m, sig, t } = quotient;
        let k = |c: &mut Code, v: i64| c.iconst(v, ty);
        let (c0, c1, c255) = (k(self, 0), k(self, 1), k(self, 0xff));
        let q = self.bin("shrui", sig, t, ty);
        let mask = self.bin("shli", &c1, t, ty);
        let mask = self.bin("subi", &mask, &c1, ty);
        let rem = self.bin("andi", sig, &mask, ty);
        let half = self.bin("subi", t, &c1, ty);
        let half = self.bin("shli", &c1, &half, ty);
        let above = self.cmp(false, "ugt", &rem, &half, ty);
        let tie = self.cmp(false, "eq", &rem, &half, ty);
        let odd = self.bin("andi", &q, &c1, ty);
        let odd = self.cmp(false, "ne", &odd, &c0, ty);
        let tie_up = self.bin("andi", &tie, &odd, t1);
        let up = self.bin("ori", &above, &tie_up, t1);
        let up = self.cast("extui", &up, t1, ty);
        let mag = self.bin("addi", &q, &up, ty);
        let c127 = k(self, 127);
        let over = self.cmp(false, "sgt", &mag, &c127, ty);
        let mag = self.select(&over, &c127, &mag, ty);
        // ±∞ takes ±127, NaN 0 (the exponent field all ones).
        let special = self.cmp(false, "eq", e, &c255, ty);
        let nan = self.cmp(false, "ne", m, &c0, ty);
        let nan = self.bin("andi", &special, &nan, t1);
        let mag = self.select(&special, &c127, &mag, ty);
        let mag = self.select(&nan, &c0, &mag, ty);
        let neg = self.cmp(false, "slt", xb, &c0, ty);
        let minus = self.bin("subi", &c0, &mag, ty);
        let code = self.select(&neg, &minus, &mag, ty);
        self.cast("trunci", &code, ty, t8)
    }

    /// The residual `r = x − code·s` of a first-pass `code` (as `ty`'s i32 lanes), exactly, in
    /// integer operations: with `u` the unit of `x`'s last place, `x = ±sig·u` and
    /// `code·s = ±|code|·2ᵗ·u`, so `r = ±R·u` with `R = sig − (|code| << t)` — fewer than 24 bits,
    /// normalised by its leading zeros into an f32 (a subnormal one when its exponent runs out).
    /// Returns the bits of `|r|` (for a row's maximum; NaN's as 0) and of `r` (±∞ and NaN as `x`,
    /// whose f32 residual they are).
    fn residual_bits(&mut self, (xb, sb): (&str, &str), code: &str, ty: &str) -> (String, String) {
        let Quotient { e, sig, t, .. } = self.quotient(xb, sb, ty);
        let k = |c: &mut Code, v: i64| c.iconst(v, ty);
        let (c0, c1, c8, c23, c31) = (k(self, 0), k(self, 1), k(self, 8), k(self, 23), k(self, 31));
        let negative = self.cmp(false, "slt", code, &c0, ty);
        let minus = self.bin("subi", &c0, code, ty);
        let mag = self.select(&negative, &minus, code, ty);
        let shifted = self.bin("shli", &mag, &t, ty);
        let r = self.bin("subi", &sig, &shifted, ty);
        let r_negative = self.cmp(false, "slt", &r, &c0, ty);
        let minus = self.bin("subi", &c0, &r, ty);
        let a = self.select(&r_negative, &minus, &r, ty);
        let key = self.f32_bits_of(&a, &e, (&c0, &c1, &c8, &c23, &c31), ty);
        let (abs_mask, inf, sign) = (k(self, 0x7fff_ffff), k(self, 0x7f80_0000), k(self, i64::from(i32::MIN)));
        let c255 = k(self, 0xff);
        let special = self.cmp(false, "eq", &e, &c255, ty);
        let x_abs = self.bin("andi", xb, &abs_mask, ty);
        let nan = self.cmp(false, "ugt", &x_abs, &inf, ty);
        let x_key = self.select(&nan, &c0, &x_abs, ty);
        let key = self.select(&special, &x_key, &key, ty);
        let x_negative = self.cmp(false, "slt", xb, &c0, ty);
        let r_sign = self.bin("xori", &x_negative, &r_negative, &lanes_of(ty, "i1"));
        let sign_bit = self.select(&r_sign, &sign, &c0, ty);
        let rb = self.bin("ori", &key, &sign_bit, ty);
        let rb = self.select(&special, xb, &rb, ty);
        (key, rb)
    }

    /// The f32 bits of `a·2^(e−150)` for `0 ≤ a < 2²⁴` and a biased exponent `e` ≥ 1: `a`'s
    /// leading one moved to bit 23 and the exponent lowered to match, or the subnormal `a << (e−1)`
    /// when it would fall to 0 or below; 0 for `a = 0`.
    fn f32_bits_of(&mut self, a: &str, e: &str, consts: (&str, &str, &str, &str, &str), ty: &str) -> String {
        let (c0, c1, c8, c23, c31) = consts;
        let lz = self.leading_zeros(a, ty);
        let sh = self.bin("subi", &lz, c8, ty);
        let normalised = self.bin("shli", a, &sh, ty);
        let exponent = self.bin("subi", e, &sh, ty);
        let normal = self.cmp(false, "sgt", &exponent, c0, ty);
        let mask = self.iconst(0x007f_ffff, ty);
        let fraction = self.bin("andi", &normalised, &mask, ty);
        let field = self.bin("shli", &exponent, c23, ty);
        let normal_bits = self.bin("ori", &field, &fraction, ty);
        let e1 = self.bin("subi", e, c1, ty);
        let far = self.cmp(false, "sgt", &e1, c31, ty);
        let e1 = self.select(&far, c31, &e1, ty);
        let subnormal_bits = self.bin("shli", a, &e1, ty);
        let bits = self.select(&normal, &normal_bits, &subnormal_bits, ty);
        let zero = self.cmp(false, "eq", a, c0, ty);
        self.select(&zero, c0, &bits, ty)
    }

    /// `arith.extsi` of `src` from `from` to `to`.
    fn extend(&mut self, src: &str, (from, to): (&str, &str)) -> String {
        let res = self.fresh("ext");
        self.push(Stmt::ExtSI { res: res.clone(), src: src.into(), from: from.into(), to: to.into() });
        res
    }

    /// The leading zeros of a nonzero 32-bit `a` (31 for 0), by halving the field: five
    /// compares and shifts rather than `math.ctlz`, which aiecc's lowering of 2-D vectors to
    /// LLVM does not take.
    fn leading_zeros(&mut self, a: &str, ty: &str) -> String {
        let mut x = a.to_string();
        let mut n = self.iconst(0, ty);
        let steps = [(16, 0x0000_ffff), (8, 0x00ff_ffff), (4, 0x0fff_ffff), (2, 0x3fff_ffff), (1, 0x7fff_ffff)];
        for (i, (bits, limit)) in steps.into_iter().enumerate() {
            let (limit, bits) = (self.iconst(limit, ty), self.iconst(bits, ty));
            let small = self.cmp(false, "ule", &x, &limit, ty);
            let more = self.bin("addi", &n, &bits, ty);
            n = self.select(&small, &more, &n, ty);
            if i + 1 < steps.len() {
                let shifted = self.bin("shli", &x, &bits, ty);
                x = self.select(&small, &shifted, &x, ty);
            }
        }
        n
    }

    fn finish(self, name: &str, params: Vec<(String, String)>) -> Function {
        Function { name: name.into(), params, body: Some(self.stmts) }
    }
}

/// `q_reset(%rs)`: both passes' running maxima to 0.
pub fn reset(sh: Shape) -> Function {
    let rs_ty = sh.rs_ty();
    let mut c = Code::new(&[0, 1, 2, sh.rows]);
    let zero = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        c.store(&zero, "rs", &rs_ty, &[&idx(0), "%i"], "f32");
        c.store(&zero, "rs", &rs_ty, &[&idx(2), "%i"], "f32");
    });
    c.finish(RESET, vec![(v("rs"), rs_ty)])
}

/// `q_absmax(%x, %rs)`: each row's running maximum of `|x|` over one K part, in vectors of
/// [`LANES`] on the bits: `|x|` is `x` without its sign bit, and for floats that are not NaN the
/// larger bits are the larger value, so an unsigned maximum of the bits (NaN's bits, above
/// infinity's, taken as 0) is `maxnumf`'s.
pub fn absmax(sh: Shape) -> Function {
    let (x_ty, rs_ty) = (sh.x_ty(), sh.rs_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, sh.rows, sh.k, LANES]);
    let pad = c.fconst(0.0);
    let (magnitude, nan_above, zero) = (c.iconst(0x7fff_ffff, &vi), c.iconst(0x7f80_0000, &vi), c.iconst(0, &vi));
    c.each("i", sh.rows, |c| {
        let init = c.row_bits(&rs_ty, 0);
        let mx = c.fold_by("l", (sh.k, LANES), (&init, &vi), |c, acc| {
            let xb = c.x_bits(&x_ty, &pad);
            let a = c.bin("andi", &xb, &magnitude, &vi);
            let nan = c.cmp(false, "ugt", &a, &nan_above, &vi);
            let a = c.select(&nan, &zero, &a, &vi);
            c.bin("maxui", acc, &a, &vi)
        });
        c.store_row_max(&mx, &rs_ty, 0);
    });
    c.finish(ABSMAX, vec![(v("x"), x_ty), (v("rs"), rs_ty)])
}

/// The power of two `ir::fused::quantize_rows_scale` makes of the positive f32 `q = max / 127`,
/// from its bits: its exponent when its mantissa is zero, else the next exponent up, and 2⁻¹²⁶
/// when `q` is subnormal or zero.
fn power_of_two_above(c: &mut Code, bits: &str) -> String {
    let (exp_mask, mant_mask) = (c.iconst(0x7f80_0000, "i32"), c.iconst(0x007f_ffff, "i32"));
    let (zero, one_up) = (c.iconst(0, "i32"), c.iconst(0x0080_0000, "i32"));
    let exponent = c.bin("andi", bits, &exp_mask, "i32");
    let mantissa = c.bin("andi", bits, &mant_mask, "i32");
    let up = c.bin("addi", &exponent, &one_up, "i32");
    let exact = c.cmp(false, "eq", &mantissa, &zero, "i32");
    let pow = c.select(&exact, &exponent, &up, "i32");
    let tiny = c.cmp(false, "eq", &exponent, &zero, "i32");
    c.select(&tiny, &one_up, &pow, "i32")
}

/// `q_scale<p>(%rs)`: pass `p`'s scale from its maximum, the smallest power of two at least
/// `max / 127` (and 2⁻¹²⁶), or 1 when the maximum is 0 or infinite — on the bits, the quotient
/// the program's f32 division spelled in integers ([`softfloat`]). The maximum is the bits of a
/// magnitude (a NaN counted as 0), so it is positive and finite when its bits lie strictly
/// between 0 and +∞'s.
pub fn scale(sh: Shape, pass: usize) -> Function {
    let rs_ty = sh.rs_ty();
    let (max_at, scale_at) = (idx(2 * pass), idx(2 * pass + 1));
    let mut c = Code::new(&[0, 1, 2 * pass, 2 * pass + 1, sh.rows]);
    let inf = c.iconst(0x7f80_0000, "i32");
    let (zero, one, c127) = (c.iconst(0, "i32"), c.iconst(0x3f80_0000, "i32"), c.iconst(0x42fe_0000, "i32"));
    c.each("i", sh.rows, |c| {
        let mx = c.load("rs", &rs_ty, &[&max_at, "%i"], "f32");
        let mb = c.cast("bitcast", &mx, "f32", "i32");
        let above_zero = c.cmp(false, "ugt", &mb, &zero, "i32");
        let finite = c.cmp(false, "ult", &mb, &inf, "i32");
        let positive = c.bin("andi", &above_zero, &finite, "i1");
        let q = c.div_f32(&mb, &c127, "i32");
        let p = power_of_two_above(c, &q);
        let s = c.select(&positive, &p, &one, "i32");
        let s = c.cast("bitcast", &s, "i32", "f32");
        c.store(&s, "rs", &rs_ty, &[&scale_at, "%i"], "f32");
    });
    c.finish(SCALE[pass], vec![(v("rs"), rs_ty)])
}

/// `q_codes(%x, %rs, %c0)`: one K part's first-pass codes, in vectors of [`LANES`]
/// (`Code::quantise_bits` lane by lane).
pub fn codes(sh: Shape) -> Function {
    let (x_ty, rs_ty, c_ty) = (sh.x_ty(), sh.rs_ty(), sh.codes_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, sh.rows, sh.k, LANES]);
    let pad = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        let s = c.row_bits(&rs_ty, 1);
        c.each_by("l", (sh.k, LANES), |c| {
            let xb = c.x_bits(&x_ty, &pad);
            let q = c.quantise_bits(&xb, &s, &vi);
            c.write_codes(q, "c0", &c_ty);
        });
    });
    c.finish(CODES, vec![(v("x"), x_ty), (v("rs"), rs_ty), (v("c0"), c_ty)])
}

/// `q_resmax(%x, %rs, %c0)`: with two passes, each row's running maximum of the residual
/// `|x − code·s|` over one K part (its first-pass codes made), in vectors of [`LANES`] integers
/// (`Code::residual_bits`; the maximum of the bits is the maximum of the values).
pub fn residual_max(sh: Shape) -> Function {
    let (x_ty, rs_ty, c_ty) = (sh.x_ty(), sh.rs_ty(), sh.codes_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, 2, sh.rows, sh.k, LANES]);
    let (pad, pad8) = (c.fconst(0.0), c.iconst(0, "i8"));
    c.each("i", sh.rows, |c| {
        let s = c.row_bits(&rs_ty, 1);
        let init = c.row_bits(&rs_ty, 2);
        let mx = c.fold_by("l", (sh.k, LANES), (&init, &vi), |c, acc| {
            let xb = c.x_bits(&x_ty, &pad);
            let code = c.first_codes(&c_ty, &pad8);
            let (key, _) = c.residual_bits((&xb, &s), &code, &vi);
            c.bin("maxui", acc, &key, &vi)
        });
        c.store_row_max(&mx, &rs_ty, 2);
    });
    c.finish(RESIDUAL_MAX, vec![(v("x"), x_ty), (v("rs"), rs_ty), (v("c0"), c_ty)])
}

/// `q_residual(%x, %rs, %c0, %c1)`: one K part's second-pass codes, of the first pass's
/// residual, in vectors of [`LANES`] integers (`Code::residual_bits`, then the codes of those
/// bits at the residual's scale).
pub fn residual(sh: Shape) -> Function {
    let (x_ty, rs_ty, c_ty) = (sh.x_ty(), sh.rs_ty(), sh.codes_ty());
    let vi = lanes("i32");
    let mut c = Code::new(&[0, 1, 3, sh.rows, sh.k, LANES]);
    let (pad, pad8) = (c.fconst(0.0), c.iconst(0, "i8"));
    c.each("i", sh.rows, |c| {
        let (s0, s1) = (c.row_bits(&rs_ty, 1), c.row_bits(&rs_ty, 3));
        c.each_by("l", (sh.k, LANES), |c| {
            let xb = c.x_bits(&x_ty, &pad);
            let code = c.first_codes(&c_ty, &pad8);
            let (_, rb) = c.residual_bits((&xb, &s0), &code, &vi);
            let q1 = c.quantise_bits(&rb, &s1, &vi);
            c.write_codes(q1, "c1", &c_ty);
        });
    });
    let params = vec![(v("x"), x_ty), (v("rs"), rs_ty), (v("c0"), c_ty.clone()), (v("c1"), c_ty)];
    c.finish(RESIDUAL, params)
}

/// Column block `j`'s weight scales (`j` an index value: `%j`, or a pair's second column),
/// [`LANES`] columns' f32 bits as i32 lanes: one 32-byte read of the epilogue data ([`meta`])
/// taken as little-endian words.
fn column_scales(c: &mut Code, (sh, j): (Shape, &str), w_ty: &str, pad8: &str) -> String {
    let per_row = idx(scales_per_row(sh.k));
    let row = c.bin("divui", j, &per_row, "index");
    let row = c.bin("addi", &row, &idx(sh.w_cols()), "index");
    let col = c.bin("remui", j, &per_row, "index");
    let col = c.bin("muli", &col, &idx(4), "index");
    let bytes = c.read_block(("w", w_ty), "i8", [&row, &col], (pad8, 4 * LANES));
    c.vector("bitcast", None, &bytes, (&lanes_n("i8", 4 * LANES), &lanes("i32")))
}

/// Column block `%j`'s first-pass-only flags (two passes) as i1 lanes.
fn first_only_flags(c: &mut Code, sh: Shape, w_ty: &str, pad8: &str) -> String {
    let row = c.bin("divui", "%j", &idx(sh.k), "index");
    let row = c.bin("addi", &row, &idx(sh.n + sh.n.div_ceil(scales_per_row(sh.k))), "index");
    let col = c.bin("remui", "%j", &idx(sh.k), "index");
    let flags = c.read_block(("w", w_ty), "i8", [&row, &col], (pad8, LANES));
    let one = c.iconst(1, &lanes("i8"));
    c.cmp(false, "eq", &flags, &one, &lanes("i8"))
}

/// `acc·(sₐ·s_w)` of accumulator block `(%i, j)`, pass `p`'s scale in `rs`, the column scales'
/// bits `sw`: the program's two f32 products, in integer operations ([`softfloat`]). A row
/// scale is a power of two, or with a norm any f32 (`S₀·r`).
fn product(c: &mut Code, (sh, j): (Shape, &str), (acc, pass): (&str, usize), sw: &str, pad32: &str) -> String {
    let vi = lanes("i32");
    // Stacked, every pass's products are rows of the one accumulator.
    let (acc, row) = match sh.stacked {
        true => ("acc0", c.bin("addi", "%i", &idx(pass * sh.rows), "index")),
        false => (acc, "%i".to_string()),
    };
    let a = c.read_block((acc, &sh.acc_ty()), "i32", [&row, j], (pad32, LANES));
    let af = c.f32_of_i32(&a, &vi);
    let sa = c.row_bits(&sh.rs_ty(), 2 * pass + 1);
    let m = if sh.input.norm() { c.mul_f32(&sa, sw, &vi) } else { c.mul_f32_by_power_of_two(&sa, sw, &vi) };
    c.mul_f32_by_normal(&af, &m, &vi)
}

/// `q_dequant(%acc0, [%acc1,] %rs, %w, %y)`: the f32 output tile from the passes' int32
/// accumulators, [`LANES`] columns at a time, their scales and (two passes) first-pass-only
/// flags read from the weight element's epilogue data. With pairs, output `j` is column `j`
/// (every pass) plus column `n + j` (the first pass), added in that order as the program's
/// `Add` of its first-pass and residual columns.
pub fn dequant(sh: Shape) -> Function {
    let (acc_ty, rs_ty, w_ty, y_ty) = (sh.acc_ty(), sh.rs_ty(), sh.w_ty(), sh.y_ty());
    let (vi, vf) = (lanes("i32"), lanes("f32"));
    let scale_rows = sh.w_cols().div_ceil(scales_per_row(sh.k));
    let index_values =
        [0, 1, 2, 3, 4, sh.rows, sh.k, sh.n, sh.w_cols(), LANES, scales_per_row(sh.k), sh.n + scale_rows];
    let index_values = [&index_values[..], &[sh.rows * sh.passes]].concat();
    let mut c = Code::new(&index_values);
    let (pad8, pad32) = (c.iconst(0, "i8"), c.iconst(0, "i32"));
    c.each_by("j", (sh.n, LANES), |c| {
        let sw = column_scales(c, (sh, "%j"), &w_ty, &pad8);
        let first_only = (sh.passes > 1 && !sh.pairs).then(|| first_only_flags(c, sh, &w_ty, &pad8));
        let second = sh.pairs.then(|| {
            let j = c.bin("addi", "%j", &idx(sh.n), "index");
            let sw = column_scales(c, (sh, &j), &w_ty, &pad8);
            (j, sw)
        });
        c.each("i", sh.rows, |c| {
            let p0 = product(c, (sh, "%j"), ("acc0", 0), &sw, &pad32);
            let mut y = match (&first_only, sh.passes > 1) {
                (Some(first), _) => {
                    let p1 = product(c, (sh, "%j"), ("acc1", 1), &sw, &pad32);
                    let sum = c.add_f32(&p0, &p1, &vi);
                    c.select(first, &p0, &sum, &vi)
                }
                (None, true) => {
                    let p1 = product(c, (sh, "%j"), ("acc1", 1), &sw, &pad32);
                    c.add_f32(&p0, &p1, &vi)
                }
                (None, false) => p0,
            };
            if let Some((j, sw)) = &second {
                let r = product(c, (sh, j), ("acc0", 0), sw, &pad32);
                y = c.add_f32(&y, &r, &vi);
            }
            let y = c.cast("bitcast", &y, &vi, &vf);
            let idx = vec!["%i".to_string(), "%j".to_string()];
            c.push(Stmt::Write { val: y, mem: v("y"), mem_ty: y_ty.clone(), idx, vty: vf.clone() });
        });
    });
    let mut params = vec![(v("acc0"), acc_ty.clone())];
    if sh.passes > 1 && !sh.stacked {
        params.push((v("acc1"), acc_ty));
    }
    params.extend([(v("rs"), rs_ty), (v("w"), w_ty), (v("y"), y_ty)]);
    c.finish(DEQUANT, params)
}

/// Every function a core of shape `sh` calls besides the GEMV kernels.
pub fn functions(sh: Shape) -> Vec<Function> {
    let mut f = quantise_functions(sh);
    f.push(dequant(sh));
    f
}

/// `QuantizeRows(x)`'s functions alone, in call order: what a core that quantises but computes
/// no outputs calls (a split design's prologue core, [`crate::qgemv::split`]).
pub fn quantise_functions(sh: Shape) -> Vec<Function> {
    let mut f = vec![reset(sh), absmax(sh), scale(sh, 0), codes(sh)];
    if sh.passes > 1 {
        f.extend([residual_max(sh), scale(sh, 1), residual(sh)]);
    }
    f
}
