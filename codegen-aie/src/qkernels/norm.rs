//! RmsNorm as core code: `n_rms(%x, %g, %y)` normalises each f32 row of `x` into `y` by
//! `ir::pinned_norm`'s definition, step for step — the squares summed into 32 lanes, the lanes
//! folded by halves, `r = 1/√(ss/d + ε)`, `y = (x·r)·γ` — every f32 operation IEEE single
//! precision spelled in integer operations ([`super::softfloat`]), so a core's norm equals the
//! host kernels' bit for bit. The lanes are one `vector<1x32xi32>` of f32 bits; a fold takes
//! the vector's two halves (`vector.shape_cast` to two rows, `vector.extract` of each) and adds
//! them.

use super::{lanes_n, Code, LANES};
use crate::kernels::{idx, memref, v, Function, Stmt};

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
    fn extract(&mut self, src: &str, at: usize, (from, to): (&str, &str)) -> String {
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
