//! The compute cores' code, carried by every design as MLIR function bodies that mlir-aie lowers
//! itself (`aie-standard-lowering`, then MLIR's own lowering to LLVM), so a design needs no object
//! file: `zero_i32` clears a core's C tile and `matmul_i8_i32` accumulates `A · B` into it, in
//! int32, on the micro-block layouts the mem-tile DMAs write (the device's r×s×t, see
//! [`crate::device::Device::micro_tile`]):
//!
//! - A `m × k` as `[m/r][k/s][r][s]`, B `k × n` as `[k/s][n/t][s][t]`, C `m × n` as
//!   `[m/r][n/t][r][t]` — each a 4-d memref, so every load is a plain index.
//! - The three innermost loops walk one native block (`r`, then `t`, then the `s`-long reduction
//!   carried in a register), the shape a vectorizer maps onto the array's matrix multiply.
//!
//! A function is a small structured program ([`Stmt`]) printed in the generic form the
//! interpreter executes ([`Function::generic`]) and in the custom form `aie-opt` takes
//! ([`Function::pretty`]); one structure, so the two texts cannot disagree.

use crate::device::Device;
use std::fmt::Write;

pub const MATMUL: &str = "matmul_i8_i32";
pub const ZERO: &str = "zero_i32";
pub const GEMV: &str = "gemv_i8_i32";
pub const GEMV_ZERO: &str = "gemv_zero_i32";

/// One operation of a function body. Values are SSA names (`%x`); types are MLIR's spelling.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `res = arith.constant value : ty`.
    Const { res: String, value: i64, ty: String },
    /// `res = memref.load mem[idx] : mem_ty`, an element of type `ty`.
    Load { res: String, mem: String, mem_ty: String, idx: Vec<String>, ty: String },
    /// `memref.store val, mem[idx] : mem_ty`.
    Store { val: String, mem: String, mem_ty: String, idx: Vec<String>, ty: String },
    /// `res = arith.extsi src : from to to` (integers, or vectors of them).
    ExtSI { res: String, src: String, from: String, to: String },
    /// `res = vector.transfer_read mem[idx], pad` of a 2-D vector `vty` over the memref's two
    /// innermost dimensions (in bounds, the minor identity map), `elem` the element type.
    Read { res: String, mem: String, mem_ty: String, idx: Vec<String>, pad: String, vty: String, elem: &'static str },
    /// `vector.transfer_write val, mem[idx]`, the inverse of [`Stmt::Read`].
    Write { val: String, mem: String, mem_ty: String, idx: Vec<String>, vty: String },
    /// `res = vector.contract a, b, acc`: `acc + a · b` for 2-D vectors `a` [m, k], `b` [k, n]
    /// (the matmul indexing maps), or `acc + a · bᵀ` for `b` [n, k] when `b_transposed`; the
    /// operands' and the accumulator's types.
    Contract { res: String, a: String, b: String, acc: String, tys: [String; 3], b_transposed: bool },
    /// `res = arith.<op> a, b : ty` (`addi`, `muli`).
    Bin { res: String, op: &'static str, a: String, b: String, ty: String },
    /// `scf.for iv = lb to ub step step`, with at most one value carried across iterations.
    For { iv: String, lb: String, ub: String, step: String, carried: Option<Carried>, body: Vec<Stmt> },
    /// `res = arith.constant <bits> : f32`, the value spelled by its bits so it is exact.
    FConst { res: String, bits: u32 },
    /// `res = <op> a : ty` of one operand: `math.absf`, `math.roundeven`.
    Un { res: String, op: &'static str, a: String, ty: String },
    /// `res = arith.<op> src : from to to`: `sitofp`, `fptosi`, `extui`, `bitcast`.
    Cast { res: String, op: &'static str, src: String, from: String, to: String },
    /// `res = arith.cmpf pred, a, b` (`float`) or `arith.cmpi`, an `i1`.
    Cmp { res: String, float: bool, pred: &'static str, a: String, b: String, ty: String },
    /// `res = arith.select cond, a, b : ty`.
    Select { res: String, cond: String, a: String, b: String, ty: String },
    /// `res = vector.<op> src : from to to` of one vector operand: `broadcast` (a scalar to every
    /// lane), `shape_cast`, `bitcast` (to wider lanes), `reduction <kind>` (`kind` set: the lanes
    /// combined into a scalar).
    Vector { res: String, op: &'static str, kind: Option<&'static str>, src: String, from: String, to: String },
    /// `res = vector.extract src[at] : to from from`: position `at` of the vector's leading
    /// dimension (a row of a 2-D vector, a lane of a 1-D one).
    Extract { res: String, src: String, at: usize, from: String, to: String },
}

/// An `arith.constant`'s value: the integer, or a splat `dense<..>` of it for a vector type.
fn constant(value: i64, ty: &str) -> String {
    if ty.starts_with("vector<") {
        format!("dense<{value}>")
    } else {
        value.to_string()
    }
}

/// The type with `ty`'s shape and `elem` elements: `elem` for a scalar, `vector<..xelem>` for a
/// vector.
pub fn lanes_of(ty: &str, elem: &str) -> String {
    match ty.strip_prefix("vector<").and_then(|t| t.rsplit_once('x')) {
        Some((shape, _)) => format!("vector<{shape}x{elem}>"),
        None => elem.to_string(),
    }
}

/// `arith.cmpf`'s predicates in the order of their enum values.
pub const CMPF_PREDICATES: [&str; 16] =
    ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une", "uno", "true"];

/// `arith.cmpi`'s predicates in the order of their enum values.
pub const CMPI_PREDICATES: [&str; 10] = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"];

fn predicate_value(float: bool, pred: &str) -> usize {
    let list: &[&str] = if float { &CMPF_PREDICATES } else { &CMPI_PREDICATES };
    list.iter().position(|p| *p == pred).expect("a predicate of the list")
}

/// A value an `scf.for` carries: `arg` starts as `init`, each iteration yields `yielded` into it,
/// and the loop's result `res` is its last value.
#[derive(Clone, Debug, PartialEq)]
pub struct Carried {
    pub arg: String,
    pub init: String,
    pub yielded: String,
    pub res: String,
    pub ty: String,
}

/// A function a design defines for its cores: parameters (name, memref type) and a body, or no
/// body — a declaration whose code would come from an object file, which the design checker
/// refuses ([`crate::rules::Rule::CoreCalls`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: Vec<(String, String)>,
    pub body: Option<Vec<Stmt>>,
}

pub(crate) fn memref(shape: &[usize], elem: &str) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("memref<{}x{elem}>", dims.join("x"))
}

/// The blocked memref shapes of a core's `m × k`, `k × n` and `m × n` tiles on `device`.
pub fn blocked_shapes(device: Device, (m, k, n): (usize, usize, usize)) -> [Vec<usize>; 3] {
    let (r, s, t) = device.micro_tile();
    [vec![m / r, k / s, r, s], vec![k / s, n / t, s, t], vec![m / r, n / t, r, t]]
}

/// The memref types of A (i8), B (i8) and C (i32) of a core's tile.
pub fn tile_types(device: Device, mkn: (usize, usize, usize)) -> [String; 3] {
    let [a, b, c] = blocked_shapes(device, mkn);
    [memref(&a, "i8"), memref(&b, "i8"), memref(&c, "i32")]
}

pub(crate) fn v(name: &str) -> String {
    format!("%{name}")
}

/// An index constant's name; [`index_consts`] defines one per value.
pub(crate) fn idx(value: usize) -> String {
    format!("%idx{value}")
}

/// One `arith.constant` per distinct index value, named by [`idx`].
pub(crate) fn index_consts(values: &[usize]) -> Vec<Stmt> {
    let mut seen: Vec<usize> = values.to_vec();
    seen.sort_unstable();
    seen.dedup();
    seen.into_iter().map(|x| Stmt::Const { res: idx(x), value: x as i64, ty: "index".into() }).collect()
}

/// `for iv in 0..ub { body }`.
fn count(iv: &str, ub: usize, body: Vec<Stmt>) -> Stmt {
    Stmt::For { iv: v(iv), lb: idx(0), ub: idx(ub), step: idx(1), carried: None, body }
}

/// Nested loops `for ivs[0] in 0..ubs[0] { for ivs[1] ... { body } }`.
fn nest(loops: &[(&str, usize)], body: Vec<Stmt>) -> Vec<Stmt> {
    loops.iter().rev().fold(body, |inner, &(iv, ub)| vec![count(iv, ub, inner)])
}

/// `zero_i32(%c)`: every element of a core's C tile set to 0.
pub fn zero_i32(device: Device, mkn: (usize, usize, usize)) -> Function {
    let [_, _, shape] = blocked_shapes(device, mkn);
    let [_, _, c_ty] = tile_types(device, mkn);
    let mut body = index_consts(&[0, 1, shape[0], shape[1], shape[2], shape[3]]);
    body.push(Stmt::Const { res: v("zero"), value: 0, ty: "i32".into() });
    let store = Stmt::Store {
        val: v("zero"),
        mem: v("c"),
        mem_ty: c_ty.clone(),
        idx: ["mb", "nb", "i", "j"].map(v).to_vec(),
        ty: "i32".into(),
    };
    let loops = [("mb", shape[0]), ("nb", shape[1]), ("i", shape[2]), ("j", shape[3])];
    body.extend(nest(&loops, vec![store]));
    Function { name: ZERO.into(), params: vec![(v("c"), c_ty)], body: Some(body) }
}

/// One element of C updated in place: `c[c_ix] += Σₗ x[x_ix] · y[y_ix]` for `l` in `0..len`, the
/// int8 operands widened to int32 (`xv` → `xw`) and the sum carried in a register.
fn accumulate_dot(
    len: usize,
    (c_ty, c_ix): (&String, &[&str]),
    x: (&str, &String, &[&str]),
    y: (&str, &String, &[&str]),
) -> Vec<Stmt> {
    let load = |res: String, mem: &str, ty: &String, ix: &[&str], elem: &str| Stmt::Load {
        res,
        mem: v(mem),
        mem_ty: ty.clone(),
        idx: ix.iter().map(|i| v(i)).collect(),
        ty: String::from(elem),
    };
    let widened = |(name, ty, ix): (&str, &String, &[&str])| {
        let (code, wide) = (v(&format!("{name}v")), v(&format!("{name}w")));
        [
            load(code.clone(), name, ty, ix, "i8"),
            Stmt::ExtSI { res: wide, src: code, from: "i8".into(), to: "i32".into() },
        ]
    };
    let [x_load, x_wide] = widened(x);
    let [y_load, y_wide] = widened(y);
    let product = Stmt::Bin {
        res: v("prod"),
        op: "muli",
        a: v(&format!("{}w", x.0)),
        b: v(&format!("{}w", y.0)),
        ty: "i32".into(),
    };
    let reduce = Stmt::For {
        iv: v("l"),
        lb: idx(0),
        ub: idx(len),
        step: idx(1),
        carried: Some(Carried { arg: v("acc"), init: v("c_in"), yielded: v("sum"), res: v("c_out"), ty: "i32".into() }),
        body: vec![
            x_load,
            y_load,
            x_wide,
            y_wide,
            product,
            Stmt::Bin { res: v("sum"), op: "addi", a: v("acc"), b: v("prod"), ty: "i32".into() },
        ],
    };
    let store = Stmt::Store {
        val: v("c_out"),
        mem: v("c"),
        mem_ty: c_ty.clone(),
        idx: c_ix.iter().map(|i| v(i)).collect(),
        ty: "i32".into(),
    };
    vec![load(v("c_in"), "c", c_ty, c_ix, "i32"), reduce, store]
}

/// `matmul_i8_i32(%a, %b, %c)`: `C += A · B` on the blocked layouts, products and sums in int32,
/// one native block at a time in vector form — the `r × t` block of C read once, then for each
/// `s`-long slice of the reduction the `r × s` block of A and the `s × t` block of B read as
/// vectors, widened, and contracted into it (`vector.contract`, which mlir-aie's
/// `convert-vector-to-aievec` maps onto the array's int8 matrix multiply: `aievec.matmul` on
/// AIE2, `aievec.matmul_aie2p` on AIE2P), then written back.
pub fn matmul_i8_i32(device: Device, mkn: (usize, usize, usize)) -> Function {
    let (r, s, t) = device.micro_tile();
    let [a_shape, b_shape, _] = blocked_shapes(device, mkn);
    let [a_ty, b_ty, c_ty] = tile_types(device, mkn);
    let (mbs, kbs, nbs) = (a_shape[0], a_shape[1], b_shape[1]);
    let mut body = index_consts(&[0, 1, mbs, kbs, nbs]);
    body.extend(vector_pads());
    let at = |i: &str, j: &str| vec![v(i), v(j), idx(0), idx(0)];
    let block = contract_block(
        Block { mem: "c", ty: &c_ty, at: at("mb", "nb"), shape: (r, t) },
        Block { mem: "a", ty: &a_ty, at: at("mb", "kb"), shape: (r, s) },
        Block { mem: "b", ty: &b_ty, at: at("kb", "nb"), shape: (s, t) },
        ("kb", kbs, 1),
        false,
    );
    body.extend(nest(&[("mb", mbs), ("nb", nbs)], block));
    let params = vec![(v("a"), a_ty), (v("b"), b_ty), (v("c"), c_ty)];
    Function { name: MATMUL.into(), params, body: Some(body) }
}

/// The padding values vector reads name (never read: every transfer is in bounds).
fn vector_pads() -> [Stmt; 2] {
    [
        Stmt::Const { res: v("pad8"), value: 0, ty: "i8".into() },
        Stmt::Const { res: v("pad32"), value: 0, ty: "i32".into() },
    ]
}

/// A 2-D block of a memref: its name, type, indices (of its first element) and shape.
struct Block<'a> {
    mem: &'a str,
    ty: &'a String,
    at: Vec<String>,
    shape: (usize, usize),
}

impl Block<'_> {
    fn vector_type(&self, elem: &str) -> String {
        format!("vector<{}x{}x{elem}>", self.shape.0, self.shape.1)
    }

    fn read(&self, res: &str, elem: &'static str) -> Stmt {
        let pad = v(if elem == "i8" { "pad8" } else { "pad32" });
        let (mem, mem_ty, idx, vty) = (v(self.mem), self.ty.clone(), self.at.clone(), self.vector_type(elem));
        Stmt::Read { res: v(res), mem, mem_ty, idx, pad, vty, elem }
    }
}

/// `C += A · B` on one block of C in vector form: C's block read once, then for `iv` over the
/// reduction (`0..ub` by `step`) the A and B blocks (their indices naming `iv`) read, widened to
/// int32 and contracted into it (B's block `[n, k]` when `b_transposed`, else `[k, n]`) — and
/// C's block written back.
fn contract_block(c: Block, a: Block, b: Block, (iv, ub, step): (&str, usize, usize), b_transposed: bool) -> Vec<Stmt> {
    let vc = c.vector_type("i32");
    let (wa, wb) = (a.vector_type("i32"), b.vector_type("i32"));
    let reduce = Stmt::For {
        iv: v(iv),
        lb: idx(0),
        ub: idx(ub),
        step: idx(step),
        carried: Some(Carried { arg: v("acc"), init: v("c_in"), yielded: v("sum"), res: v("c_out"), ty: vc.clone() }),
        body: vec![
            a.read("av", "i8"),
            b.read("bv", "i8"),
            Stmt::ExtSI { res: v("aw"), src: v("av"), from: a.vector_type("i8"), to: wa.clone() },
            Stmt::ExtSI { res: v("bw"), src: v("bv"), from: b.vector_type("i8"), to: wb.clone() },
            Stmt::Contract {
                res: v("sum"),
                a: v("aw"),
                b: v("bw"),
                acc: v("acc"),
                tys: [wa, wb, vc.clone()],
                b_transposed,
            },
        ],
    };
    let write = Stmt::Write { val: v("c_out"), mem: v(c.mem), mem_ty: c.ty.clone(), idx: c.at.clone(), vty: vc };
    vec![c.read("c_in", "i32"), reduce, write]
}

/// The two functions every core of a design with per-core tile `mkn` calls.
pub fn core_functions(device: Device, mkn: (usize, usize, usize)) -> Vec<Function> {
    vec![zero_i32(device, mkn), matmul_i8_i32(device, mkn)]
}

/// The memref types of a GEMV core's resident activation part `rows × k` (i8), one streamed
/// weight tile `n × k` (i8, the weight transposed: each output column's `k` weights in a row)
/// and its output tile `rows × n` (i32), all row-major.
pub fn gemv_types((rows, k, n): (usize, usize, usize)) -> [String; 3] {
    [memref(&[rows, k], "i8"), memref(&[n, k], "i8"), memref(&[rows, n], "i32")]
}

/// `gemv_zero_i32(%c)`: every element of a GEMV core's `rows × n` output tile set to 0.
pub fn gemv_zero_i32(rkn: (usize, usize, usize)) -> Function {
    let (rows, _, n) = rkn;
    let [_, _, c_ty] = gemv_types(rkn);
    let mut body = index_consts(&[0, 1, rows, n]);
    body.push(Stmt::Const { res: v("zero"), value: 0, ty: "i32".into() });
    let store = Stmt::Store {
        val: v("zero"),
        mem: v("c"),
        mem_ty: c_ty.clone(),
        idx: ["i", "j"].map(v).to_vec(),
        ty: "i32".into(),
    };
    body.extend(nest(&[("i", rows), ("j", n)], vec![store]));
    Function { name: GEMV_ZERO.into(), params: vec![(v("c"), c_ty)], body: Some(body) }
}

/// `gemv_i8_i32(%a, %w, %c)`: `C[i][j] += Σₗ A[i][l] · W[j][l]` over one K part, products and
/// sums in int32. When the rows are whole micro-blocks of the device (`r` rows; the plans' 8-row
/// blocks are), in vector form: per `r × t` block of C, the `s`-long slices of the reduction
/// read as an `r × s` block of A and a `t × s` block of W, widened and contracted with W's block
/// transposed (mlir-aie shuffles it and multiplies on the array: `aievec.matmul`); otherwise per
/// output element one dot product of an activation row and a weight row, the reduction carried
/// in a register.
pub fn gemv_i8_i32(device: Device, rkn: (usize, usize, usize)) -> Function {
    gemv_i8_i32_rows(device, rkn, rkn.2)
}

/// [`gemv_i8_i32`] on a weight element of `w_rows` ≥ `n` rows, its first `n` the tile's weights
/// (the rest carry what the epilogue reads, see [`crate::qgemv`]).
pub fn gemv_i8_i32_rows(device: Device, rkn: (usize, usize, usize), w_rows: usize) -> Function {
    let (rows, k, n) = rkn;
    let (r, s, t) = device.micro_tile();
    let [a_ty, _, c_ty] = gemv_types(rkn);
    let w_ty = memref(&[w_rows, k], "i8");
    let params = vec![(v("a"), a_ty.clone()), (v("w"), w_ty.clone()), (v("c"), c_ty.clone())];
    if !rows.is_multiple_of(r) || !k.is_multiple_of(s) || !n.is_multiple_of(t) {
        let mut body = index_consts(&[0, 1, rows, k, n]);
        let block = accumulate_dot(k, (&c_ty, &["i", "j"]), ("a", &a_ty, &["i", "l"]), ("w", &w_ty, &["j", "l"]));
        body.extend(nest(&[("i", rows), ("j", n)], block));
        return Function { name: GEMV.into(), params, body: Some(body) };
    }
    let mut body = index_consts(&[0, rows, k, n, r, s, t]);
    body.extend(vector_pads());
    let at = |i: &str, j: &str| vec![v(i), v(j)];
    let block = contract_block(
        Block { mem: "c", ty: &c_ty, at: at("i", "j"), shape: (r, t) },
        Block { mem: "a", ty: &a_ty, at: at("i", "l"), shape: (r, s) },
        Block { mem: "w", ty: &w_ty, at: at("j", "l"), shape: (t, s) },
        ("l", k, s),
        true,
    );
    let step = |iv: &str, ub: usize, step: usize, body| Stmt::For {
        iv: v(iv),
        lb: idx(0),
        ub: idx(ub),
        step: idx(step),
        carried: None,
        body,
    };
    body.push(step("i", rows, r, vec![step("j", n, t, block)]));
    Function { name: GEMV.into(), params, body: Some(body) }
}

/// The two functions every core of a GEMV design with `rows` activation rows, K parts of `k` and
/// output tiles of `n` columns calls.
pub fn gemv_functions(device: Device, rkn: (usize, usize, usize)) -> Vec<Function> {
    vec![gemv_zero_i32(rkn), gemv_i8_i32(device, rkn)]
}

impl Function {
    /// `(T, ...) -> ()`.
    pub fn function_type(&self) -> String {
        let tys: Vec<&str> = self.params.iter().map(|(_, t)| t.as_str()).collect();
        format!("({}) -> ()", tys.join(", "))
    }

    /// The function in generic form, indented by `pad` spaces.
    pub fn generic(&self, pad: usize) -> String {
        let sp = " ".repeat(pad);
        let mut o = format!("{sp}\"func.func\"() ({{\n");
        let attrs = match &self.body {
            Some(body) => {
                let params: Vec<String> = self.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
                let _ = writeln!(o, "{sp}^bb0({}):", params.join(", "));
                generic_stmts(&mut o, body, pad + 2);
                let _ = writeln!(o, "{sp}  \"func.return\"() : () -> ()");
                format!("function_type = {}, sym_name = \"{}\"", self.function_type(), self.name)
            }
            None => format!(
                "function_type = {}, sym_name = \"{}\", sym_visibility = \"private\"",
                self.function_type(),
                self.name
            ),
        };
        let _ = writeln!(o, "{sp}}}) {{{attrs}}} : () -> ()");
        o
    }

    /// The function in custom form, indented by `pad` spaces.
    pub fn pretty(&self, pad: usize) -> String {
        let sp = " ".repeat(pad);
        let Some(body) = &self.body else {
            let tys: Vec<&str> = self.params.iter().map(|(_, t)| t.as_str()).collect();
            return format!("{sp}func.func private @{}({})\n", self.name, tys.join(", "));
        };
        let params: Vec<String> = self.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let mut o = format!("{sp}func.func @{}({}) {{\n", self.name, params.join(", "));
        pretty_stmts(&mut o, body, pad + 2);
        let _ = writeln!(o, "{sp}  return\n{sp}}}");
        o
    }
}

/// `vector.contract`'s indexing maps for `C += A · B` (m, n parallel; k reduced).
pub const MATMUL_MAPS: &str = "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>]";

/// `vector.contract`'s indexing maps for `C += A · Bᵀ`, B read as `[n, k]`.
pub const MATMUL_BT_MAPS: &str = "[affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1)>]";

/// A 2-D transfer's inherent attributes over a memref of `rank`: in bounds, the minor identity
/// map, and its operand segments.
fn transfer_attrs(rank: usize, segments: [usize; 4]) -> String {
    let dims: Vec<String> = (0..rank).map(|d| format!("d{d}")).collect();
    let seg: Vec<String> = segments.iter().map(|x| x.to_string()).collect();
    format!(
        "in_bounds = [true, true], operandSegmentSizes = array<i32: {}>, permutation_map = affine_map<({}) -> ({})>",
        seg.join(", "),
        dims.join(", "),
        dims[rank - 2..].join(", ")
    )
}

fn generic_stmts(o: &mut String, body: &[Stmt], pad: usize) {
    let sp = " ".repeat(pad);
    for s in body {
        match s {
            Stmt::Const { res, value, ty } => {
                let value = constant(*value, ty);
                let _ = writeln!(o, "{sp}{res} = \"arith.constant\"() {{value = {value} : {ty}}} : () -> {ty}");
            }
            Stmt::Load { res, mem, mem_ty, idx, ty } => {
                let ixt = vec!["index"; idx.len()].join(", ");
                let _ =
                    writeln!(o, "{sp}{res} = \"memref.load\"({mem}, {}) : ({mem_ty}, {ixt}) -> {ty}", idx.join(", "));
            }
            Stmt::Store { val, mem, mem_ty, idx, ty } => {
                let ixt = vec!["index"; idx.len()].join(", ");
                let _ = writeln!(
                    o,
                    "{sp}\"memref.store\"({val}, {mem}, {}) : ({ty}, {mem_ty}, {ixt}) -> ()",
                    idx.join(", ")
                );
            }
            Stmt::ExtSI { res, src, from, to } => {
                let _ = writeln!(o, "{sp}{res} = \"arith.extsi\"({src}) : ({from}) -> {to}");
            }
            Stmt::Read { res, mem, mem_ty, idx, pad, vty, elem } => {
                let ixt = vec!["index"; idx.len()].join(", ");
                let attrs = transfer_attrs(idx.len(), [1, idx.len(), 1, 0]);
                let ix = idx.join(", ");
                let _ = writeln!(
                    o,
                    "{sp}{res} = \"vector.transfer_read\"({mem}, {ix}, {pad}) {{{attrs}}} : ({mem_ty}, {ixt}, {elem}) -> {vty}"
                );
            }
            Stmt::Write { val, mem, mem_ty, idx, vty } => {
                let ixt = vec!["index"; idx.len()].join(", ");
                let attrs = transfer_attrs(idx.len(), [1, 1, idx.len(), 0]);
                let ix = idx.join(", ");
                let _ = writeln!(
                    o,
                    "{sp}\"vector.transfer_write\"({val}, {mem}, {ix}) {{{attrs}}} : ({vty}, {mem_ty}, {ixt}) -> ()"
                );
            }
            Stmt::Contract { res, a, b, acc, tys: [ta, tb, tc], b_transposed } => {
                let its = "#vector.iterator_type<parallel>, #vector.iterator_type<parallel>, #vector.iterator_type<reduction>";
                let attrs = contract_attrs(*b_transposed, its);
                let _ = writeln!(
                    o,
                    "{sp}{res} = \"vector.contract\"({a}, {b}, {acc}) {{{attrs}}} : ({ta}, {tb}, {tc}) -> {tc}"
                );
            }
            Stmt::Bin { res, op, a, b, ty } => {
                let _ = writeln!(o, "{sp}{res} = \"arith.{op}\"({a}, {b}) : ({ty}, {ty}) -> {ty}");
            }
            Stmt::For { iv, lb, ub, step, carried, body } => generic_for(o, (iv, lb, ub, step), carried, body, pad),
            other => generic_scalar(o, other, &sp),
        }
    }
}

/// The scalar float, cast, compare and select statements in generic form.
fn generic_scalar(o: &mut String, s: &Stmt, sp: &str) {
    match s {
        Stmt::FConst { res, bits } => {
            let _ = writeln!(o, "{sp}{res} = \"arith.constant\"() {{value = {bits:#010X} : f32}} : () -> f32");
        }
        Stmt::Un { res, op, a, ty } => {
            let _ = writeln!(o, "{sp}{res} = \"{op}\"({a}) : ({ty}) -> {ty}");
        }
        Stmt::Cast { res, op, src, from, to } => {
            let _ = writeln!(o, "{sp}{res} = \"arith.{op}\"({src}) : ({from}) -> {to}");
        }
        Stmt::Cmp { res, float, pred, a, b, ty } => {
            let (name, value) = (if *float { "cmpf" } else { "cmpi" }, predicate_value(*float, pred));
            let i1 = lanes_of(ty, "i1");
            let _ = writeln!(
                o,
                "{sp}{res} = \"arith.{name}\"({a}, {b}) {{predicate = {value} : i64}} : ({ty}, {ty}) -> {i1}"
            );
        }
        Stmt::Select { res, cond, a, b, ty } => {
            let cond_ty = lanes_of(ty, "i1");
            let _ = writeln!(o, "{sp}{res} = \"arith.select\"({cond}, {a}, {b}) : ({cond_ty}, {ty}, {ty}) -> {ty}");
        }
        Stmt::Vector { res, op, kind, src, from, to } => {
            let attrs = kind.map(|k| format!(" {{kind = #vector.kind<{k}>}}")).unwrap_or_default();
            let _ = writeln!(o, "{sp}{res} = \"vector.{op}\"({src}){attrs} : ({from}) -> {to}");
        }
        Stmt::Extract { res, src, at, from, to } => {
            let attrs = format!("{{static_position = array<i64: {at}>}}");
            let _ = writeln!(o, "{sp}{res} = \"vector.extract\"({src}) {attrs} : ({from}) -> {to}");
        }
        _ => unreachable!("printed by generic_stmts"),
    }
}

/// The scalar float, cast, compare and select statements in custom form.
fn pretty_scalar(o: &mut String, s: &Stmt, sp: &str) {
    match s {
        Stmt::FConst { res, bits } => {
            let _ = writeln!(o, "{sp}{res} = arith.constant {bits:#010X} : f32");
        }
        Stmt::Un { res, op, a, ty } => {
            let _ = writeln!(o, "{sp}{res} = {op} {a} : {ty}");
        }
        Stmt::Cast { res, op, src, from, to } => {
            let _ = writeln!(o, "{sp}{res} = arith.{op} {src} : {from} to {to}");
        }
        Stmt::Cmp { res, float, pred, a, b, ty } => {
            let name = if *float { "cmpf" } else { "cmpi" };
            let _ = writeln!(o, "{sp}{res} = arith.{name} {pred}, {a}, {b} : {ty}");
        }
        Stmt::Select { res, cond, a, b, ty } => {
            let cond_ty = if ty.starts_with("vector<") { format!("{}, ", lanes_of(ty, "i1")) } else { String::new() };
            let _ = writeln!(o, "{sp}{res} = arith.select {cond}, {a}, {b} : {cond_ty}{ty}");
        }
        Stmt::Vector { res, op, kind: Some(k), src, from, to } => {
            let _ = writeln!(o, "{sp}{res} = vector.{op} <{k}>, {src} : {from} into {to}");
        }
        Stmt::Vector { res, op, kind: None, src, from, to } => {
            let _ = writeln!(o, "{sp}{res} = vector.{op} {src} : {from} to {to}");
        }
        Stmt::Extract { res, src, at, from, to } => {
            let _ = writeln!(o, "{sp}{res} = vector.extract {src}[{at}] : {to} from {from}");
        }
        _ => unreachable!("printed by pretty_stmts"),
    }
}

/// A matmul contraction's attributes (maps for B as stored or transposed), with the iterator
/// types spelled as the form being printed spells them.
fn contract_attrs(b_transposed: bool, iterator_types: &str) -> String {
    let maps = if b_transposed { MATMUL_BT_MAPS } else { MATMUL_MAPS };
    format!("indexing_maps = {maps}, iterator_types = [{iterator_types}], kind = #vector.kind<add>")
}

fn generic_for(
    o: &mut String,
    (iv, lb, ub, step): (&str, &str, &str, &str),
    c: &Option<Carried>,
    body: &[Stmt],
    pad: usize,
) {
    let sp = " ".repeat(pad);
    match c {
        None => {
            let _ = writeln!(o, "{sp}\"scf.for\"({lb}, {ub}, {step}) ({{\n{sp}^bb0({iv}: index):");
            generic_stmts(o, body, pad + 2);
            let _ = writeln!(o, "{sp}  \"scf.yield\"() : () -> ()\n{sp}}}) : (index, index, index) -> ()");
        }
        Some(Carried { arg, init, yielded, res, ty }) => {
            let _ = writeln!(
                o,
                "{sp}{res} = \"scf.for\"({lb}, {ub}, {step}, {init}) ({{\n{sp}^bb0({iv}: index, {arg}: {ty}):"
            );
            generic_stmts(o, body, pad + 2);
            let _ = writeln!(
                o,
                "{sp}  \"scf.yield\"({yielded}) : ({ty}) -> ()\n{sp}}}) : (index, index, index, {ty}) -> {ty}"
            );
        }
    }
}

fn pretty_stmts(o: &mut String, body: &[Stmt], pad: usize) {
    let sp = " ".repeat(pad);
    for s in body {
        match s {
            Stmt::Const { res, value, ty } => {
                let _ = writeln!(o, "{sp}{res} = arith.constant {} : {ty}", constant(*value, ty));
            }
            Stmt::Load { res, mem, mem_ty, idx, .. } => {
                let _ = writeln!(o, "{sp}{res} = memref.load {mem}[{}] : {mem_ty}", idx.join(", "));
            }
            Stmt::Store { val, mem, mem_ty, idx, .. } => {
                let _ = writeln!(o, "{sp}memref.store {val}, {mem}[{}] : {mem_ty}", idx.join(", "));
            }
            Stmt::ExtSI { res, src, from, to } => {
                let _ = writeln!(o, "{sp}{res} = arith.extsi {src} : {from} to {to}");
            }
            Stmt::Read { res, mem, mem_ty, idx, pad, vty, .. } => {
                let ix = idx.join(", ");
                let _ = writeln!(o, "{sp}{res} = vector.transfer_read {mem}[{ix}], {pad} {{in_bounds = [true, true]}} : {mem_ty}, {vty}");
            }
            Stmt::Write { val, mem, mem_ty, idx, vty } => {
                let ix = idx.join(", ");
                let _ = writeln!(
                    o,
                    "{sp}vector.transfer_write {val}, {mem}[{ix}] {{in_bounds = [true, true]}} : {vty}, {mem_ty}"
                );
            }
            Stmt::Contract { res, a, b, acc, tys: [ta, tb, tc], b_transposed } => {
                let attrs = contract_attrs(*b_transposed, "\"parallel\", \"parallel\", \"reduction\"");
                let _ = writeln!(o, "{sp}{res} = vector.contract {{{attrs}}} {a}, {b}, {acc} : {ta}, {tb} into {tc}");
            }
            Stmt::Bin { res, op, a, b, ty } => {
                let _ = writeln!(o, "{sp}{res} = arith.{op} {a}, {b} : {ty}");
            }
            Stmt::For { iv, lb, ub, step, carried: None, body } => {
                let _ = writeln!(o, "{sp}scf.for {iv} = {lb} to {ub} step {step} {{");
                pretty_stmts(o, body, pad + 2);
                let _ = writeln!(o, "{sp}}}");
            }
            Stmt::For { iv, lb, ub, step, carried: Some(c), body } => {
                let _ = writeln!(
                    o,
                    "{sp}{} = scf.for {iv} = {lb} to {ub} step {step} iter_args({} = {}) -> ({}) {{",
                    c.res, c.arg, c.init, c.ty
                );
                pretty_stmts(o, body, pad + 2);
                let _ = writeln!(o, "{sp}  scf.yield {} : {}\n{sp}}}", c.yielded, c.ty);
            }
            other => pretty_scalar(o, other, &sp),
        }
    }
}
