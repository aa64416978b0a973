//! IEEE-754 single precision in integer operations on the bits: the conversion of an int32, the
//! product, the quotient and the sum, each rounded to nearest even with subnormals and overflow
//! to ±∞ as the standard defines them — what a row's scale and the epilogue need where a core
//! has no exact f32 unit (an AIE2 core has no scalar one, and its vector one rounds bfloat16
//! parts). Every function works on `ty`, an i32 or a vector of them, lane by lane, so the same
//! code is scalar or vector code.
//!
//! NaN results are the quiet NaN `0x7FC00000`: which NaN an operation returns is not part of
//! the exactness contract (the host's instruction set picks its own payloads), only that it is
//! one.
//!
//! The product splits each 24-bit significand into 12-bit halves, so the 48-bit product is four
//! int32 products and two words; the quotient is restoring division of the significands, one
//! bit a step, the remainder sticky; the sum aligns the smaller operand with six extra bits, the
//! bits it shifts out jammed into the lowest (a sticky bit), which rounds every case
//! exactly as the unbounded result would.

use super::Code;
use crate::kernels::lanes_of;

/// +∞'s bits, the magnitude mask and the sign bit of an f32, as i32 constants.
pub(super) const INF: i64 = 0x7f80_0000;
pub(super) const ABS: i64 = 0x7fff_ffff;
pub(super) const SIGN: i64 = i32::MIN as i64;
const QUIET_NAN: i64 = 0x7fc0_0000;
const IMPLICIT: i64 = 0x0080_0000;
const MANTISSA: i64 = 0x007f_ffff;
/// Extra low bits of the sum's aligned significands.
const SUM_EXTRA: i64 = 6;

/// A product's or quotient's sign bit and its operands' classes: (x, y) zero, (x, y) infinite,
/// either NaN.
struct Classes {
    sign: String,
    zero: (String, String),
    inf: (String, String),
    nan: String,
}

impl Code {
    /// `x op c` for a constant `c`.
    pub(super) fn with(&mut self, op: &'static str, x: &str, c: i64, ty: &str) -> String {
        let c = self.iconst(c, ty);
        self.bin(op, x, &c, ty)
    }

    /// `x pred c` (`arith.cmpi`) for a constant `c`.
    pub(super) fn test(&mut self, pred: &'static str, x: &str, c: i64, ty: &str) -> String {
        let c = self.iconst(c, ty);
        self.cmp(false, pred, x, &c, ty)
    }

    /// `lo ≤ x ≤ hi` by selects (signed).
    pub(super) fn clamp(&mut self, x: &str, (lo, hi): (i64, i64), ty: &str) -> String {
        let (lo_c, hi_c) = (self.iconst(lo, ty), self.iconst(hi, ty));
        let below = self.cmp(false, "slt", x, &lo_c, ty);
        let x = self.select(&below, &lo_c, x, ty);
        let above = self.cmp(false, "sgt", &x, &hi_c, ty);
        self.select(&above, &hi_c, &x, ty)
    }

    /// A finite or zero f32's biased exponent `E` ≥ 1 and significand (the implicit bit set for
    /// a normal number): the value is `sig·2^(E−150)`.
    fn unpack(&mut self, x: &str, ty: &str) -> (String, String) {
        let (e, _, sig) = self.fields(x, ty);
        (e, sig)
    }

    /// [`Code::unpack`]'s exponent and significand with the mantissa field between them.
    pub(super) fn fields(&mut self, x: &str, ty: &str) -> (String, String, String) {
        let field = self.with("shrui", x, 23, ty);
        let field = self.with("andi", &field, 0xff, ty);
        let m = self.with("andi", x, MANTISSA, ty);
        let normal = self.test("ne", &field, 0, ty);
        let implicit = self.with("ori", &m, IMPLICIT, ty);
        let sig = self.select(&normal, &implicit, &m, ty);
        let one = self.iconst(1, ty);
        (self.select(&normal, &field, &one, ty), m, sig)
    }

    /// [`Code::unpack`] with a subnormal's significand shifted up to bit 23 and its exponent
    /// lowered to match (to 0 or below); 0 stays 0.
    fn unpack_normalised(&mut self, x: &str, ty: &str) -> (String, String) {
        let (e, sig) = self.unpack(x, ty);
        let lz = self.leading_zeros(&sig, ty);
        let shift = self.with("subi", &lz, 8, ty);
        (self.bin("subi", &e, &shift, ty), self.bin("shli", &sig, &shift, ty))
    }

    /// The bits of `(sig + rounding)·2^(e−150)`, `e` ≥ 1 and `sig` < 2²⁴ (below 2²³ only with
    /// `e` = 1, a subnormal): rounded up when the guard bit `g` is set and the sticky bit `st` or
    /// `sig`'s lowest is (half to even); a carry out of the significand raises the exponent by
    /// the addition itself; ±∞ past the largest finite number. Sign not included.
    fn round_pack(&mut self, e: &str, sig: &str, (g, st): (&str, &str), ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let odd = self.with("andi", sig, 1, ty);
        let odd = self.test("ne", &odd, 0, ty);
        let tail = self.bin("ori", st, &odd, &t1);
        let up = self.bin("andi", g, &tail, &t1);
        let up = self.cast("extui", &up, &t1, ty);
        let rounded = self.bin("addi", sig, &up, ty);
        let field = self.with("subi", e, 1, ty);
        let field = self.with("shli", &field, 23, ty);
        let bits = self.bin("addi", &field, &rounded, ty);
        let inf = self.iconst(INF, ty);
        let over = self.cmp(false, "uge", &bits, &inf, ty);
        self.select(&over, &inf, &bits, ty)
    }

    /// The f32 bits of the int32 `a`, rounded to nearest even (`arith.sitofp`).
    pub(super) fn f32_of_i32(&mut self, a: &str, ty: &str) -> String {
        let zero = self.iconst(0, ty);
        let negative = self.cmp(false, "slt", a, &zero, ty);
        let minus = self.bin("subi", &zero, a, ty);
        // i32::MIN negates to itself, 2³¹ read unsigned.
        let mag = self.select(&negative, &minus, a, ty);
        let lz = self.leading_zeros(&mag, ty);
        let top = self.bin("shli", &mag, &lz, ty);
        let sig = self.with("shrui", &top, 8, ty);
        let g = self.with("andi", &top, 0x80, ty);
        let g = self.test("ne", &g, 0, ty);
        let st = self.with("andi", &top, 0x7f, ty);
        let st = self.test("ne", &st, 0, ty);
        let e = self.iconst(158, ty);
        let e = self.bin("subi", &e, &lz, ty);
        let bits = self.round_pack(&e, &sig, (&g, &st), ty);
        let sign = self.with("andi", a, SIGN, ty);
        let bits = self.bin("ori", &bits, &sign, ty);
        let is_zero = self.cmp(false, "eq", a, &zero, ty);
        self.select(&is_zero, &zero, &bits, ty)
    }

    /// The 48-bit product of two significands below 2²⁴ as `(hi, lo)`, `hi·2²⁴ + lo`, from
    /// their 12-bit halves (every partial product and sum below 2³¹).
    fn product48(&mut self, a: &str, b: &str, ty: &str) -> (String, String) {
        let (ah, al) = (self.with("shrui", a, 12, ty), self.with("andi", a, 0xfff, ty));
        let (bh, bl) = (self.with("shrui", b, 12, ty), self.with("andi", b, 0xfff, ty));
        let hh = self.bin("muli", &ah, &bh, ty);
        let hl = self.bin("muli", &ah, &bl, ty);
        let lh = self.bin("muli", &al, &bh, ty);
        let ll = self.bin("muli", &al, &bl, ty);
        let mid = self.bin("addi", &hl, &lh, ty);
        let mid_low = self.with("andi", &mid, 0xfff, ty);
        let mid_low = self.with("shli", &mid_low, 12, ty);
        let lo = self.bin("addi", &ll, &mid_low, ty);
        let mid_high = self.with("shrui", &mid, 12, ty);
        let carry = self.with("shrui", &lo, 24, ty);
        let hi = self.bin("addi", &hh, &mid_high, ty);
        let hi = self.bin("addi", &hi, &carry, ty);
        (hi, self.with("andi", &lo, 0x00ff_ffff, ty))
    }

    /// A product's exponent `e`, 24-bit significand `s` and 24 rounding bits `r` as
    /// [`Code::round_pack`] takes them: as they are for `e` ≥ 1, shifted right by `1 − e`
    /// (at most 25: all of it gone) into a subnormal otherwise, the bits shifted out becoming the
    /// guard and sticky bits. Returns (e, s, guard, sticky).
    fn denormalise(&mut self, e: &str, s: &str, r: &str, ty: &str) -> [String; 4] {
        let t1 = lanes_of(ty, "i1");
        let g = self.with("shrui", r, 23, ty);
        let g = self.test("ne", &g, 0, ty);
        let st = self.with("andi", r, MANTISSA, ty);
        let st = self.test("ne", &st, 0, ty);
        let subnormal = self.test("slt", e, 1, ty);
        let one = self.iconst(1, ty);
        let d = self.bin("subi", &one, e, ty);
        let d = self.clamp(&d, (1, 25), ty);
        let s_sub = self.bin("shrui", s, &d, ty);
        let d1 = self.bin("subi", &d, &one, ty);
        let g_sub = self.bin("shrui", s, &d1, ty);
        let g_sub = self.with("andi", &g_sub, 1, ty);
        let g_sub = self.test("ne", &g_sub, 0, ty);
        let mask = self.bin("shli", &one, &d1, ty);
        let mask = self.bin("subi", &mask, &one, ty);
        let lost = self.bin("andi", s, &mask, ty);
        let lost = self.test("ne", &lost, 0, ty);
        let r_set = self.test("ne", r, 0, ty);
        let st_sub = self.bin("ori", &lost, &r_set, &t1);
        [
            self.select(&subnormal, &one, e, ty),
            self.select(&subnormal, &s_sub, s, ty),
            self.select(&subnormal, &g_sub, &g, &t1),
            self.select(&subnormal, &st_sub, &st, &t1),
        ]
    }

    /// The f32 bits of `x·y` (`arith.mulf`).
    pub(super) fn mul_f32(&mut self, x: &str, y: &str, ty: &str) -> String {
        let (ex, sx) = self.unpack_normalised(x, ty);
        self.mul_f32_unpacked(x, (&ex, &sx), y, ty)
    }

    /// [`Code::mul_f32`] for an `x` that is a normal number, ±0, ±∞ or NaN — never a subnormal,
    /// as an int32's conversion and a power-of-two scale are not — so its significand needs no
    /// normalising.
    pub(super) fn mul_f32_by_normal(&mut self, x: &str, y: &str, ty: &str) -> String {
        let (ex, sx) = self.unpack(x, ty);
        self.mul_f32_unpacked(x, (&ex, &sx), y, ty)
    }

    /// [`Code::mul_f32`] for an `x` that is a normal power of two (its mantissa field 0), as a
    /// row's scale is: `y`'s significand, normalised, is the product's, so only the exponents add
    /// and a subnormal or overflowing result rounds.
    pub(super) fn mul_f32_by_power_of_two(&mut self, x: &str, y: &str, ty: &str) -> String {
        let (ey, sy) = self.unpack_normalised(y, ty);
        let ex = self.with("shrui", x, 23, ty);
        let ex = self.with("andi", &ex, 0xff, ty);
        let e = self.bin("addi", &ex, &ey, ty);
        let e = self.with("subi", &e, 127, ty);
        let zero = self.iconst(0, ty);
        let [e, s, g, st] = self.denormalise(&e, &sy, &zero, ty);
        let bits = self.round_pack(&e, &s, (&g, &st), ty);
        self.mul_specials((x, y), &bits, ty)
    }

    /// The f32 bits of `x / y` (`arith.divf`): the normalised significands' quotient by
    /// restoring division, one bit a step — its leading bit, 23 more and a guard bit — the
    /// remainder the sticky bit.
    pub(super) fn div_f32(&mut self, x: &str, y: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let (ex, sx) = self.unpack_normalised(x, ty);
        let (ey, sy) = self.unpack_normalised(y, ty);
        // Below y's significand x's takes one more bit, so the quotient's leading bit is 1.
        let short = self.cmp(false, "ult", &sx, &sy, ty);
        let doubled = self.with("shli", &sx, 1, ty);
        let mut rem = self.select(&short, &doubled, &sx, ty);
        let short = self.cast("extui", &short, &t1, ty);
        let e = self.bin("subi", &ex, &ey, ty);
        let e = self.with("addi", &e, 127, ty);
        let e = self.bin("subi", &e, &short, ty);
        let mut q = self.iconst(0, ty);
        for _ in 0..25 {
            let fits = self.cmp(false, "uge", &rem, &sy, ty);
            let less = self.bin("subi", &rem, &sy, ty);
            rem = self.select(&fits, &less, &rem, ty);
            rem = self.with("shli", &rem, 1, ty);
            let bit = self.cast("extui", &fits, &t1, ty);
            q = self.with("shli", &q, 1, ty);
            q = self.bin("ori", &q, &bit, ty);
        }
        let s = self.with("shrui", &q, 1, ty);
        let g = self.with("andi", &q, 1, ty);
        let g = self.with("shli", &g, 23, ty);
        let st = self.test("ne", &rem, 0, ty);
        let st = self.cast("extui", &st, &t1, ty);
        let r = self.bin("ori", &g, &st, ty);
        let [e, s, g, st] = self.denormalise(&e, &s, &r, ty);
        let bits = self.round_pack(&e, &s, (&g, &st), ty);
        self.div_specials((x, y), &bits, ty)
    }

    /// The f32 bits of `√x` (`math.sqrt`): restoring square root of the normalised significand,
    /// two radicand bits a step — 25 result bits, 24 and a guard bit — the remainder the sticky
    /// bit. An odd exponent lends one bit to the significand so that the exponent halves; a
    /// root neither overflows nor underflows, so no subnormal case arises.
    pub(super) fn sqrt_f32(&mut self, x: &str, ty: &str) -> String {
        let (e, sig) = self.unpack_normalised(x, ty);
        // x = (sig/2²³)·2^u, u = e − 127; with u odd, x = (2·sig/2²³)·2^(u−1).
        let u = self.with("subi", &e, 127, ty);
        let odd = self.with("andi", &u, 1, ty);
        // ⌊u/2⌋ + 127 = ⌊(e + 127)/2⌋, halved as a positive number (e ≥ −22).
        let e_root = self.with("addi", &e, 127, ty);
        let e_root = self.with("shrui", &e_root, 1, ty);
        // The radicand's 26 leading bits, sig·2 or sig·4, then 24 zero bits: its root is the
        // significand's times 2²⁴, in [2²⁴, 2²⁵).
        let shift = self.with("addi", &odd, 1, ty);
        let m = self.bin("shli", &sig, &shift, ty);
        let (q, rem) = self.root_bits(&m, ty);
        let s = self.with("shrui", &q, 1, ty);
        let g = self.with("andi", &q, 1, ty);
        let g = self.test("ne", &g, 0, ty);
        let st = self.test("ne", &rem, 0, ty);
        let bits = self.round_pack(&e_root, &s, (&g, &st), ty);
        self.sqrt_specials(x, &bits, ty)
    }

    /// `(q, rem)`: the integer square root of `m·2²⁴` (`m` < 2²⁶) and its remainder, one
    /// result bit for each pair of radicand bits from the top (the remainder stays below 2²⁸).
    fn root_bits(&mut self, m: &str, ty: &str) -> (String, String) {
        let t1 = lanes_of(ty, "i1");
        let (mut q, mut rem) = (self.iconst(0, ty), self.iconst(0, ty));
        for step in 0..25 {
            rem = self.with("shli", &rem, 2, ty);
            if step < 13 {
                let pair = self.with("shrui", m, 24 - 2 * step, ty);
                let pair = self.with("andi", &pair, 3, ty);
                rem = self.bin("ori", &rem, &pair, ty);
            }
            let trial = self.with("shli", &q, 2, ty);
            let trial = self.with("ori", &trial, 1, ty);
            let fits = self.cmp(false, "uge", &rem, &trial, ty);
            let less = self.bin("subi", &rem, &trial, ty);
            rem = self.select(&fits, &less, &rem, ty);
            let bit = self.cast("extui", &fits, &t1, ty);
            q = self.with("shli", &q, 1, ty);
            q = self.bin("ori", &q, &bit, ty);
        }
        (q, rem)
    }

    /// A root's cases that are not a positive finite root: ±0 and +∞ are their own roots; NaN
    /// and every other negative number give NaN.
    fn sqrt_specials(&mut self, x: &str, bits: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let magnitude = self.with("andi", x, ABS, ty);
        let zero = self.test("eq", &magnitude, 0, ty);
        let inf = self.test("eq", x, INF, ty);
        let itself = self.bin("ori", &zero, &inf, &t1);
        // Above +∞'s bits unsigned: a NaN, or the sign bit set.
        let invalid = self.test("ugt", x, INF, ty);
        let nan = self.iconst(QUIET_NAN, ty);
        let r = self.select(&invalid, &nan, bits, ty);
        self.select(&itself, x, &r, ty)
    }

    /// A quotient's sign on its finite magnitude `bits`, and the cases that are not a finite
    /// quotient: ±0 (a zero dividend or an infinite divisor), ±∞ (an infinite dividend or a zero
    /// divisor), NaN (a NaN, 0/0, ∞/∞).
    fn div_specials(&mut self, (x, y): (&str, &str), bits: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let c = self.classes(x, y, ty);
        let zero = self.bin("ori", &c.zero.0, &c.inf.1, &t1);
        let inf = self.bin("ori", &c.inf.0, &c.zero.1, &t1);
        let zeros = self.bin("andi", &c.zero.0, &c.zero.1, &t1);
        let infs = self.bin("andi", &c.inf.0, &c.inf.1, &t1);
        let invalid = self.bin("ori", &zeros, &infs, &t1);
        self.signed_result(&c, bits, (&zero, &inf, &invalid), ty)
    }

    /// `x·y` with `x`'s exponent and significand (leading one at bit 23) given.
    fn mul_f32_unpacked(&mut self, x: &str, (ex, sx): (&str, &str), y: &str, ty: &str) -> String {
        let (ey, sy) = self.unpack_normalised(y, ty);
        let (hi, lo) = self.product48(sx, &sy, ty);
        // The product's leading one is bit 47 or 46 of hi·2²⁴ + lo: a 24-bit significand from
        // its top and the 24 bits below it.
        let top = self.test("uge", &hi, IMPLICIT, ty);
        let hi2 = self.with("shli", &hi, 1, ty);
        let lo_top = self.with("shrui", &lo, 23, ty);
        let s_low = self.bin("ori", &hi2, &lo_top, ty);
        let s = self.select(&top, &hi, &s_low, ty);
        let lo2 = self.with("shli", &lo, 1, ty);
        let lo2 = self.with("andi", &lo2, 0x00ff_ffff, ty);
        let r = self.select(&top, &lo, &lo2, ty);
        let e = self.bin("addi", ex, &ey, ty);
        let e = self.with("subi", &e, 127, ty);
        let top = self.cast("extui", &top, &lanes_of(ty, "i1"), ty);
        let e = self.bin("addi", &e, &top, ty);
        let [e, s, g, st] = self.denormalise(&e, &s, &r, ty);
        let bits = self.round_pack(&e, &s, (&g, &st), ty);
        self.mul_specials((x, y), &bits, ty)
    }

    /// A product's sign on its finite magnitude `bits`, and the cases that are not a finite
    /// product: a zero factor (±0), an infinite one (±∞), NaN or ∞·0 (NaN).
    fn mul_specials(&mut self, (x, y): (&str, &str), bits: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let c = self.classes(x, y, ty);
        let zero = self.bin("ori", &c.zero.0, &c.zero.1, &t1);
        let inf = self.bin("ori", &c.inf.0, &c.inf.1, &t1);
        let inf_zero = self.bin("andi", &c.inf.0, &c.zero.1, &t1);
        let zero_inf = self.bin("andi", &c.zero.0, &c.inf.1, &t1);
        let invalid = self.bin("ori", &inf_zero, &zero_inf, &t1);
        self.signed_result(&c, bits, (&zero, &inf, &invalid), ty)
    }

    /// The classes of a product's or quotient's operands.
    fn classes(&mut self, x: &str, y: &str, ty: &str) -> Classes {
        let t1 = lanes_of(ty, "i1");
        let (ax, ay) = (self.with("andi", x, ABS, ty), self.with("andi", y, ABS, ty));
        let sign = self.bin("xori", x, y, ty);
        let sign = self.with("andi", &sign, SIGN, ty);
        let zero = (self.test("eq", &ax, 0, ty), self.test("eq", &ay, 0, ty));
        let inf = (self.test("eq", &ax, INF, ty), self.test("eq", &ay, INF, ty));
        let (x_nan, y_nan) = (self.test("ugt", &ax, INF, ty), self.test("ugt", &ay, INF, ty));
        let nan = self.bin("ori", &x_nan, &y_nan, &t1);
        Classes { sign, zero, inf, nan }
    }

    /// The sign on the finite magnitude `bits`, or ±0 where `zero`, ±∞ where `inf`, and NaN
    /// where an operand is NaN or the operation `invalid`.
    fn signed_result(&mut self, c: &Classes, bits: &str, (zero, inf, invalid): (&str, &str, &str), ty: &str) -> String {
        let finite = self.bin("ori", bits, &c.sign, ty);
        let r = self.select(zero, &c.sign, &finite, ty);
        let signed_inf = self.with("ori", &c.sign, INF, ty);
        let r = self.select(inf, &signed_inf, &r, ty);
        let nan = self.bin("ori", &c.nan, invalid, &lanes_of(ty, "i1"));
        let quiet = self.iconst(QUIET_NAN, ty);
        self.select(&nan, &quiet, &r, ty)
    }

    /// The f32 bits of `x + y` (`arith.addf`).
    pub(super) fn add_f32(&mut self, x: &str, y: &str, ty: &str) -> String {
        let (ax, ay) = (self.with("andi", x, ABS, ty), self.with("andi", y, ABS, ty));
        let swap = self.cmp(false, "ugt", &ay, &ax, ty);
        let a = self.select(&swap, y, x, ty);
        let b = self.select(&swap, x, y, ty);
        let (ea, sa) = self.unpack(&a, ty);
        let (eb, sb) = self.unpack(&b, ty);
        let big = self.with("shli", &sa, SUM_EXTRA, ty);
        let small = self.with("shli", &sb, SUM_EXTRA, ty);
        let d = self.bin("subi", &ea, &eb, ty);
        let d = self.clamp(&d, (0, 24 + SUM_EXTRA), ty);
        let small = self.shift_right_jam(&small, &d, ty);
        let mixed = self.bin("xori", &a, &b, ty);
        let same = self.test("sge", &mixed, 0, ty);
        let opposite = self.test("slt", &mixed, 0, ty);
        let (sum, e_sum) = self.aligned_sum(&big, &small, &ea, ty);
        let (diff, e_diff) = self.aligned_difference(&big, &small, &ea, ty);
        let v = self.select(&same, &sum, &diff, ty);
        let e = self.select(&same, &e_sum, &e_diff, ty);
        let s = self.with("shrui", &v, SUM_EXTRA, ty);
        let g = self.with("andi", &v, 1 << (SUM_EXTRA - 1), ty);
        let g = self.test("ne", &g, 0, ty);
        let st = self.with("andi", &v, (1 << (SUM_EXTRA - 1)) - 1, ty);
        let st = self.test("ne", &st, 0, ty);
        let bits = self.round_pack(&e, &s, (&g, &st), ty);
        let sign = self.with("andi", &a, SIGN, ty);
        let r = self.bin("ori", &bits, &sign, ty);
        self.add_specials((&a, &b), (&opposite, &diff), &r, ty)
    }

    /// `x >> d` with the bits shifted out ORed into the lowest bit (`d` < 32).
    fn shift_right_jam(&mut self, x: &str, d: &str, ty: &str) -> String {
        let one = self.iconst(1, ty);
        let shifted = self.bin("shrui", x, d, ty);
        let mask = self.bin("shli", &one, d, ty);
        let mask = self.bin("subi", &mask, &one, ty);
        let lost = self.bin("andi", x, &mask, ty);
        let lost = self.test("ne", &lost, 0, ty);
        let lost = self.cast("extui", &lost, &lanes_of(ty, "i1"), ty);
        self.bin("ori", &shifted, &lost, ty)
    }

    /// Same signs: the aligned significands' sum and its exponent, a carry shifted back (jammed)
    /// into place.
    fn aligned_sum(&mut self, big: &str, small: &str, ea: &str, ty: &str) -> (String, String) {
        let sum = self.bin("addi", big, small, ty);
        let carry = self.test("uge", &sum, 1 << (24 + SUM_EXTRA), ty);
        let half = self.with("shrui", &sum, 1, ty);
        let low = self.with("andi", &sum, 1, ty);
        let half = self.bin("ori", &half, &low, ty);
        let v = self.select(&carry, &half, &sum, ty);
        let carry = self.cast("extui", &carry, &lanes_of(ty, "i1"), ty);
        (v, self.bin("addi", ea, &carry, ty))
    }

    /// Opposite signs: the difference of the aligned significands (`big` the larger magnitude's)
    /// and its exponent, shifted up to the leading bit's place but not below exponent 1.
    fn aligned_difference(&mut self, big: &str, small: &str, ea: &str, ty: &str) -> (String, String) {
        let diff = self.bin("subi", big, small, ty);
        let lz = self.leading_zeros(&diff, ty);
        let up = self.with("subi", &lz, 31 - 23 - SUM_EXTRA, ty);
        let room = self.with("subi", ea, 1, ty);
        let short = self.cmp(false, "sgt", &up, &room, ty);
        let up = self.select(&short, &room, &up, ty);
        (self.bin("shli", &diff, &up, ty), self.bin("subi", ea, &up, ty))
    }

    /// A sum's cases that are not a rounded finite sum: an exact cancellation (+0), an infinite
    /// larger operand `a` (itself), NaN or ∞ − ∞ (NaN).
    fn add_specials(&mut self, (a, b): (&str, &str), (opposite, diff): (&str, &str), r: &str, ty: &str) -> String {
        let t1 = lanes_of(ty, "i1");
        let (aa, ab) = (self.with("andi", a, ABS, ty), self.with("andi", b, ABS, ty));
        let a_nan = self.test("ugt", &aa, INF, ty);
        let (a_inf, b_inf) = (self.test("eq", &aa, INF, ty), self.test("eq", &ab, INF, ty));
        let cancelled = self.test("eq", diff, 0, ty);
        let cancelled = self.bin("andi", &cancelled, opposite, &t1);
        let zero = self.iconst(0, ty);
        let r = self.select(&cancelled, &zero, r, ty);
        let r = self.select(&a_inf, a, &r, ty);
        let both_inf = self.bin("andi", &a_inf, &b_inf, &t1);
        let inf_minus_inf = self.bin("andi", &both_inf, opposite, &t1);
        let nan = self.bin("ori", &a_nan, &inf_minus_inf, &t1);
        let quiet = self.iconst(QUIET_NAN, ty);
        self.select(&nan, &quiet, &r, ty)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{lanes, Code, LANES};
    use crate::interp;
    use crate::kernels::{memref, v, Stmt};

    type Op = fn(&mut Code, &[String], &str) -> String;

    /// Runs `op` on rows of [`LANES`] i32 lanes through the design interpreter: the core code
    /// as MLIR text, compiled and executed, one output lane per input lane.
    fn run(op: Op, inputs: &[Vec<u32>]) -> Vec<u32> {
        let rows = inputs[0].len() / LANES;
        let (ty, vi) = (memref(&[rows, LANES], "i32"), lanes("i32"));
        let mut c = Code::new(&[0, 1, rows, LANES]);
        let pad = c.iconst(0, "i32");
        let names: Vec<String> = (0..inputs.len()).map(|a| format!("in{a}")).collect();
        c.each("i", rows, |c| {
            c.each_by("l", (LANES, LANES), |c| {
                let args: Vec<String> = names.iter().map(|n| c.read_lanes(n, &ty, "i32", &pad)).collect();
                let val = op(c, &args, &vi);
                let idx = vec!["%i".to_string(), "%l".to_string()];
                c.push(Stmt::Write { val, mem: v("out"), mem_ty: ty.clone(), idx, vty: vi.clone() });
            })
        });
        let mut params: Vec<(String, String)> = names.iter().map(|n| (v(n), ty.clone())).collect();
        params.push((v("out"), ty.clone()));
        let text = format!("\"builtin.module\"() ({{\n{}}}) : () -> ()\n", c.finish("f", params).generic(2));
        let funcs = interp::module_functions(&text, true).unwrap();
        let mut mems: Vec<Vec<i32>> = inputs.iter().map(|x| x.iter().map(|&b| b as i32).collect()).collect();
        mems.push(vec![0; rows * LANES]);
        funcs[0].call(&mut mems).unwrap();
        mems.pop().unwrap().into_iter().map(|b| b as u32).collect()
    }

    /// SplitMix64: reproducible bits without a dependency.
    struct Bits(u64);

    impl Bits {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u32
        }
    }

    /// Edge values: zeros, subnormals, the normal range's ends, infinities, NaNs, ties.
    fn specials() -> Vec<u32> {
        let zero_and_subnormals = [0u32, 1, 2, 3, 0x0040_0000, 0x007f_ffff];
        let least_normals = [0x0080_0000, 0x0080_0001, 0x00ff_ffff, 0x0100_0000];
        let near_one = [0x3f80_0000, 0x3f80_0001, 0x3fc0_0000, 0x3fff_ffff, 0x4000_0000, 0x3dcc_cccd];
        // 2⁻⁶⁴, 2⁻⁶³, 2⁻⁷⁵, 2⁶⁵, 2⁶⁴ and 2¹²⁷: products of two at the subnormal and overflow edges.
        let powers = [0x1f80_0000, 0x2000_0000, 0x1a00_0000, 0x6000_0000, 0x5f80_0000, 0x7f00_0000];
        let top = [0x7f7f_ffff, 0x7f80_0000, 0x7f80_0001, 0x7fc0_0000];
        let positive = [&zero_and_subnormals[..], &least_normals, &near_one, &powers, &top].concat();
        positive.iter().flat_map(|&b| [b, b | 0x8000_0000]).collect()
    }

    /// Operand pairs: every pair of [`specials`], uniform bits, and pairs steered to the hard
    /// cases (results near the subnormal boundary, near cancellation, near overflow).
    fn pairs(seed: u64, steer: fn(&mut Bits, u32) -> u32) -> (Vec<u32>, Vec<u32>) {
        let s = specials();
        let (mut x, mut y): (Vec<u32>, Vec<u32>) = s.iter().flat_map(|&a| s.iter().map(move |&b| (a, b))).unzip();
        let mut r = Bits(seed);
        for _ in 0..20_000 {
            let a = r.next();
            let b = r.next();
            x.push(a);
            y.push(b);
            x.push(a);
            y.push(steer(&mut r, a));
        }
        let pad = x.len().next_multiple_of(LANES);
        x.resize(pad, 0);
        y.resize(pad, 0);
        (x, y)
    }

    /// Same bits, or both NaN.
    fn check(name: &str, args: (&[u32], &[u32]), got: &[u32], want: impl Fn(f32, f32) -> f32) {
        for ((&a, &b), &g) in args.0.iter().zip(args.1).zip(got) {
            let w = want(f32::from_bits(a), f32::from_bits(b));
            let ok = if w.is_nan() { f32::from_bits(g).is_nan() } else { g == w.to_bits() };
            assert!(ok, "{name}({a:#010x}, {b:#010x}) = {g:#010x}, IEEE gives {:#010x}", w.to_bits());
        }
    }

    #[test]
    fn products_round_as_ieee_single_precision() {
        // A factor whose exponent puts the product anywhere from overflow to below the least
        // subnormal.
        let steer = |r: &mut Bits, a: u32| {
            // The product's biased exponent is about ea + eb − 127: within 30 of 0 (the
            // subnormals) or of 254 (the largest binade).
            let ea = i64::from((a >> 23) & 0xff);
            let edge = if r.next() & 1 == 0 { 0 } else { 254 };
            let product = edge + i64::from(r.next() % 60) - 30;
            let eb = (product + 127 - ea).clamp(0, 254) as u32;
            (r.next() & 0x807f_ffff) | (eb << 23)
        };
        let (x, y) = pairs(1, steer);
        let got = run(|c, a, ty| c.mul_f32(&a[0], &a[1], ty), &[x.clone(), y.clone()]);
        check("mul", (&x, &y), &got, |a, b| a * b);
        let count = |class: fn(f32) -> bool| got.iter().filter(|&&g| class(f32::from_bits(g))).count();
        assert!(count(f32::is_subnormal) > 2000 && count(f32::is_infinite) > 2000, "the steered pairs reach the edges");
        // The form for a factor that is never subnormal, on such factors.
        let (mut x, mut y): (Vec<u32>, Vec<u32>) =
            x.iter().zip(&y).filter(|(&a, _)| !f32::from_bits(a).is_subnormal()).unzip();
        x.resize(x.len().next_multiple_of(LANES), 0);
        y.resize(x.len(), 0);
        let got = run(|c, a, ty| c.mul_f32_by_normal(&a[0], &a[1], ty), &[x.clone(), y.clone()]);
        check("mul_by_normal", (&x, &y), &got, |a, b| a * b);
    }

    #[test]
    fn products_by_powers_of_two_round_as_ieee_single_precision() {
        let steer = |r: &mut Bits, _: u32| (r.next() & 0x8000_0000) | ((r.next() % 254 + 1) << 23);
        let (y, x) = pairs(4, steer);
        // Every power of two beside every special value, then the steered pairs.
        let (x, y): (Vec<u32>, Vec<u32>) = x
            .iter()
            .zip(&y)
            .filter(|(&p, _)| p & 0x007f_ffff == 0)
            .filter(|(&p, _)| {
                let e = (p >> 23) & 0xff;
                (1..255).contains(&e)
            })
            .unzip();
        let (mut x, mut y) = (x, y);
        x.resize(x.len().next_multiple_of(LANES), 0x3f80_0000);
        y.resize(x.len(), 0);
        let got = run(|c, a, ty| c.mul_f32_by_power_of_two(&a[0], &a[1], ty), &[x.clone(), y.clone()]);
        check("mul_by_power_of_two", (&x, &y), &got, |a, b| a * b);
        let count = |class: fn(f32) -> bool| got.iter().filter(|&&g| class(f32::from_bits(g))).count();
        assert!(count(f32::is_subnormal) > 500 && count(f32::is_infinite) > 500, "the pairs reach the edges");
    }

    #[test]
    fn quotients_round_as_ieee_single_precision() {
        // A divisor whose exponent puts the quotient near the subnormals or the largest binade.
        let steer = |r: &mut Bits, a: u32| {
            let ea = i64::from((a >> 23) & 0xff);
            let edge = if r.next() & 1 == 0 { 0 } else { 254 };
            let quotient = edge + i64::from(r.next() % 60) - 30;
            let eb = (ea - quotient + 127).clamp(0, 254) as u32;
            (r.next() & 0x807f_ffff) | (eb << 23)
        };
        let (x, y) = pairs(5, steer);
        let got = run(|c, a, ty| c.div_f32(&a[0], &a[1], ty), &[x.clone(), y.clone()]);
        check("div", (&x, &y), &got, |a, b| a / b);
        let count = |class: fn(f32) -> bool| got.iter().filter(|&&g| class(f32::from_bits(g))).count();
        assert!(count(f32::is_subnormal) > 2000 && count(f32::is_infinite) > 2000, "the steered pairs reach the edges");
    }

    #[test]
    fn sums_round_as_ieee_single_precision() {
        // The other operand near -a (cancellation), or a few binades away (alignment, ties).
        let steer = |r: &mut Bits, a: u32| {
            let near = (a ^ 0x8000_0000) ^ (r.next() & 0xff);
            let apart = (a & 0x807f_ffff) | (((a >> 23) & 0xff).saturating_sub(r.next() % 30) << 23);
            if r.next() & 1 == 0 {
                near
            } else {
                apart ^ (r.next() & 0x8000_0003)
            }
        };
        let (x, y) = pairs(2, steer);
        let got = run(|c, a, ty| c.add_f32(&a[0], &a[1], ty), &[x.clone(), y.clone()]);
        check("add", (&x, &y), &got, |a, b| a + b);
    }

    #[test]
    fn square_roots_round_as_ieee_single_precision() {
        // Every special value, uniform bits (half of them negative), every exponent's binade
        // with random mantissas, and the neighbours of exact squares (exact roots, and the
        // radicands whose root lies nearest a rounding boundary).
        let mut a = specials();
        let mut r = Bits(6);
        a.extend((0..20_000).map(|_| r.next()));
        a.extend((0..20_000).map(|i| (i % 256) << 23 | (r.next() & 0x007f_ffff)));
        for _ in 0..5_000 {
            let root = f32::from_bits(r.next() % 0x7f00_0000);
            let square = (root * root).to_bits();
            a.extend([square.wrapping_sub(1), square, square + 1].into_iter().filter(|&b| b < 0x7f80_0000));
        }
        a.resize(a.len().next_multiple_of(LANES), 0);
        let got = run(|c, a, ty| c.sqrt_f32(&a[0], ty), std::slice::from_ref(&a));
        check("sqrt", (&a, &a), &got, |x, _| x.sqrt());
        let subnormal = a.iter().filter(|&&b| f32::from_bits(b).is_subnormal()).count();
        assert!(subnormal > 100, "{subnormal} subnormal radicands");
    }

    #[test]
    fn int32_conversions_round_as_ieee_single_precision() {
        let mut a: Vec<u32> = vec![0, 1, u32::MAX, i32::MIN as u32, i32::MAX as u32, 1 << 24, (1 << 24) + 1];
        a.extend((0..64).flat_map(|t| [(1u32 << 25) + t, ((1u32 << 25) + t).wrapping_neg(), (1 << 31) - t]));
        let mut r = Bits(3);
        a.extend((0..20_000).map(|i| r.next() >> (i % 32)));
        a.resize(a.len().next_multiple_of(LANES), 0);
        let got = run(|c, a, ty| c.f32_of_i32(&a[0], ty), std::slice::from_ref(&a));
        check("sitofp", (&a, &a), &got, |x, _| x.to_bits() as i32 as f32);
    }
}
