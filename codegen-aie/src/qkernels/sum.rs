//! A residual stream's sum as core code: before a norm-fed core normalises its rows it adds the
//! residual stream's rows and the projection's output rows that the program's residual `Add`
//! adds (`h = x + o`), so the array takes the two values the host program holds and gives back
//! the sum besides the projection ([`super::Input::SumNorm`]).
//!
//! The sum is IEEE single precision in integer operations ([`super::softfloat`]), rounded to
//! nearest even as the host's `Add` rounds it, so the sum — and every code and output the norm
//! computes from it — equals the program's bit for bit.

use super::{lanes, Code, Shape, LANES};
use crate::kernels::{idx, memref, v, Function, Stmt};

pub const SUM: &str = "qn_sum";

/// The type of a core's share of the sum: `[rows, k]` f32.
pub fn sum_ty(sh: Shape) -> String {
    memref(&[sh.rows, sh.k], "f32")
}

/// `qn_sum(%x, %h)`: row `i` of one K part of the residual stream (`x`'s row `i`) plus the
/// projection's (`x`'s row `rows + 1 + i`, after γ's), written over `x`'s row `i`, where the
/// norm's functions read their input, and into `h`'s row `i`.
pub fn sum(sh: Shape) -> Function {
    let (x_ty, h_ty) = (sh.x_ty(), sum_ty(sh));
    let (vi, vf) = (lanes("i32"), lanes("f32"));
    let mut c = Code::new(&[0, 1, sh.rows, sh.rows + 1, sh.k, LANES]);
    let pad = c.fconst(0.0);
    c.each("i", sh.rows, |c| {
        let o_row = c.bin("addi", "%i", &idx(sh.rows + 1), "index");
        c.each_by("l", (sh.k, LANES), |c| {
            let x = c.x_bits(&x_ty, &pad);
            let o = c.read_block(("x", &x_ty), "f32", [&o_row, "%l"], (&pad, LANES));
            let o = c.cast("bitcast", &o, &vf, &vi);
            let s = c.add_f32(&x, &o, &vi);
            let s = c.cast("bitcast", &s, &vi, &vf);
            for (mem, ty) in [("x", &x_ty), ("h", &h_ty)] {
                let at = vec!["%i".to_string(), "%l".to_string()];
                c.push(Stmt::Write { val: s.clone(), mem: v(mem), mem_ty: ty.clone(), idx: at, vty: vf.clone() });
            }
        });
    });
    c.finish(SUM, vec![(v("x"), x_ty), (v("h"), h_ty)])
}
