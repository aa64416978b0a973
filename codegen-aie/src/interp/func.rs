//! The functions a design defines for its cores, executed from their generic text: each body is
//! compiled once into a tree of instructions over numbered registers (SSA values as i64, wrapped
//! to their integer width after every operation; an f32 as its bits) and the call's memrefs (flat
//! element buffers, row-major). The operations are the ones a core's code needs:
//!
//! - integers: `arith.constant`, `extsi`, `extui`, `trunci`, `addi`, `subi`, `muli`, `shli`,
//!   `shrui`, `ori`, `andi`, `xori`, `maxui`, `divui`, `remui`, `cmpi`, `select` (a shift by the
//!   width or more, and a division by zero, are errors: poison or undefined in MLIR);
//! - f32: `arith.addf`, `subf`, `mulf`, `divf`, `maxnumf`, `minnumf`, `cmpf`, `sitofp`, `fptosi`,
//!   `bitcast`, `math.absf`, `math.roundeven` (IEEE single precision rounded to nearest even, as
//!   Rust's `f32`; an `fptosi` of NaN or out of range, poison in MLIR, is an error);
//! - `memref.load`, `memref.store`, `scf.for` (with carried values), `scf.yield`, `func.return`;
//! - vectors (a vector is a run of registers, row-major): 2-D `vector.transfer_read` /
//!   `vector.transfer_write` (in bounds, over a memref's two innermost dimensions), `arith.extsi`
//!   of vectors, `vector.contract` with the matmul maps, and ([`lanes`]) any elementwise
//!   operation above on vectors, splat constants, `vector.broadcast`, `vector.shape_cast`,
//!   `vector.bitcast` to wider lanes, `vector.extract` at a static position and
//!   `vector.reduction <maxui>`.
//!
//! Anything else is an error naming the operation, the function and the line. Loads, stores and
//! transfers check every index against the memref's shape.

use super::{parse_memref, result_type, split_top, Block, InterpError, Op};

mod lanes;
use std::collections::HashMap;

/// A memref parameter: its shape, row-major strides and element width in bits.
#[derive(Debug, Clone, PartialEq)]
pub struct MemType {
    pub shape: Vec<usize>,
    strides: Vec<usize>,
    bits: u32,
}

impl MemType {
    fn parse(ty: &str) -> Option<MemType> {
        let (shape, elem) = parse_memref(ty)?;
        let bits = elem_bits(&elem)?;
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        Some(MemType { shape, strides, bits })
    }

    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Bits of an integer type (`i8`, `i32`; `index` as 64).
fn int_bits(ty: &str) -> Option<u32> {
    match ty.trim() {
        "index" => Some(64),
        t => t.strip_prefix('i')?.parse().ok().filter(|b| (1..=64).contains(b)),
    }
}

/// Bits of a scalar a register or a memref element holds: an integer's, or `f32`'s 32 (its bit
/// pattern, which the float operations read and write).
fn elem_bits(ty: &str) -> Option<u32> {
    match ty.trim() {
        "f32" => Some(32),
        t => int_bits(t),
    }
}

/// A register's f32 value (its low 32 bits).
fn f32_of(x: i64) -> f32 {
    f32::from_bits(x as u32)
}

/// An f32's register value: its bits, sign-extended as every 32-bit value is.
fn reg_of(x: f32) -> i64 {
    x.to_bits() as i32 as i64
}

/// `x` wrapped to a signed integer of `bits`.
fn wrap(x: i64, bits: u32) -> i64 {
    if bits >= 64 {
        x
    } else {
        let shift = 64 - bits;
        (x << shift) >> shift
    }
}

/// Values one `scf.for` may carry.
const MAX_CARRIED: usize = 8;

#[derive(Debug, Clone, Copy)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Shl,
    /// `shrui`: a logical right shift of the operand's `bits`.
    ShrU,
    /// `maxui`: the larger read as unsigned.
    MaxU,
    Or,
    And,
    Xor,
}

/// `arith.divui` / `arith.remui`: unsigned, and an error on a zero divisor.
#[derive(Debug, Clone, Copy)]
enum DivOp {
    Div,
    Rem,
}

/// The f32 operations, IEEE-754 single precision with round-to-nearest-even, as Rust's `f32`
/// computes them; `maxnumf` / `minnumf` return the operand that is not NaN.
#[derive(Debug, Clone, Copy)]
enum FOp {
    Add,
    Sub,
    Mul,
    Div,
    MaxNum,
    MinNum,
    Abs,
    RoundEven,
}

/// The casts: `sitofp` (signed integer of `bits` to f32, rounded to nearest even), `fptosi` (f32
/// to a signed integer of `bits`, toward zero; a NaN or a value outside the type is poison in
/// MLIR and an error here), `extui` (zero-extension of `bits`), `bitcast` (the bits unchanged).
#[derive(Debug, Clone, Copy)]
enum CastOp {
    SiToFp,
    FpToSi,
    ExtUi,
    Bitcast,
    /// `trunci`: the low `bits`.
    Trunc,
}

#[derive(Debug)]
enum Instr {
    Const {
        dst: usize,
        value: i64,
    },
    Copy {
        dst: usize,
        src: usize,
    },
    Bin {
        dst: usize,
        op: BinOp,
        a: usize,
        b: usize,
        bits: u32,
    },
    Load {
        dst: usize,
        mem: usize,
        idx: Vec<usize>,
        line: usize,
    },
    Store {
        val: usize,
        mem: usize,
        idx: Vec<usize>,
        line: usize,
    },
    For(Box<Loop>),
    Dot(Box<Dot>),
    /// A 2-D block of a memref at `idx` (its two innermost dimensions) into `rows × cols`
    /// registers from `dst`, or those registers from `val` into it.
    Read {
        dst: usize,
        mem: usize,
        idx: Vec<usize>,
        rows: usize,
        cols: usize,
        line: usize,
    },
    Write {
        val: usize,
        mem: usize,
        idx: Vec<usize>,
        rows: usize,
        cols: usize,
        line: usize,
    },
    Div {
        dst: usize,
        op: DivOp,
        a: usize,
        b: usize,
        bits: u32,
        line: usize,
    },
    /// A float operation of one (`b` unused) or two operands.
    Float {
        dst: usize,
        op: FOp,
        a: usize,
        b: usize,
    },
    Cast {
        dst: usize,
        op: CastOp,
        src: usize,
        /// The source's bits (`sitofp`, `extui`) or the result's (`fptosi`).
        bits: u32,
        line: usize,
    },
    /// `arith.cmpf` (`float`) or `arith.cmpi` with the predicate's enum value, on `bits`.
    Cmp {
        dst: usize,
        float: bool,
        pred: u8,
        a: usize,
        b: usize,
        bits: u32,
    },
    Select {
        dst: usize,
        cond: usize,
        a: usize,
        b: usize,
    },
    /// Instructions run in order (an elementwise operation on a vector, one per lane).
    Seq(Vec<Instr>),
    /// `vector.bitcast` to wider lanes: `dst` lane `l` is the `ratio` source lanes from
    /// `src + l·ratio` of `bits` each, the first the least significant (little-endian).
    Widen {
        dst: usize,
        src: usize,
        lanes: usize,
        ratio: usize,
        bits: u32,
    },
    /// `len` registers copied (a vector's `arith.extsi`).
    CopyN {
        dst: usize,
        src: usize,
        len: usize,
    },
    /// `dst[m × n] = acc + a[m × k] · b[k × n]` (`b` [n × k] when `bt`), every product and sum
    /// wrapped to `bits`.
    Contract {
        dst: usize,
        a: usize,
        b: usize,
        acc: usize,
        mkn: [usize; 3],
        bits: u32,
        bt: bool,
    },
}

/// `affine_map<(d0, .., dR-1) -> (dR-2, dR-1)>`, R ≥ 2: a 2-D transfer of the innermost dimensions.
fn minor_identity_2d(map: &str) -> bool {
    let inner = map.trim().strip_prefix("affine_map<(").and_then(|m| m.strip_suffix(")>"));
    let Some((dims, results)) = inner.and_then(|m| m.split_once(") -> (")) else { return false };
    let dims: Vec<&str> = dims.split(',').map(str::trim).collect();
    let results: Vec<&str> = results.split(',').map(str::trim).collect();
    let rank = dims.len();
    rank >= 2
        && dims.iter().enumerate().all(|(i, d)| *d == format!("d{i}"))
        && results == [format!("d{}", rank - 2), format!("d{}", rank - 1)]
}

/// Elements one `scf.for` may carry in all (a carried vector is its elements).
const MAX_CARRIED_ELEMENTS: usize = 64;

/// Shape and element bits of a `vector<RxCxT>` (or `vector<NxT>`), `T` an integer or `f32`.
fn parse_vector(ty: &str) -> Option<(Vec<usize>, u32)> {
    let body = ty.trim().strip_prefix("vector<")?.strip_suffix('>')?;
    let mut parts: Vec<&str> = body.split('x').collect();
    let bits = elem_bits(parts.pop()?)?;
    Some((parts.iter().map(|d| d.parse().ok()).collect::<Option<_>>()?, bits))
}

/// A reduction loop `acc' = acc + ext(load A[..iv..]) * ext(load B[..iv..])` run as one
/// instruction: the same loads, wraps and bounds checks, without dispatching each operation.
#[derive(Debug)]
struct Dot {
    bounds: [usize; 3],
    init: usize,
    result: usize,
    operands: [DotOperand; 2],
    mul_bits: u32,
    add_bits: u32,
    line: usize,
}

/// A load of the reduction: its memref, index registers, and where the loop's index is among
/// them (if anywhere).
#[derive(Debug)]
struct DotOperand {
    mem: usize,
    idx: Vec<usize>,
    iv_at: Option<usize>,
}

#[derive(Debug)]
struct Loop {
    bounds: [usize; 3],
    iv: usize,
    /// Carried values: (initial value's register, the body's argument register).
    carried: Vec<(usize, usize)>,
    body: Vec<Instr>,
    yielded: Vec<usize>,
    results: Vec<usize>,
    line: usize,
}

/// A function compiled from its text; `None` body: a declaration.
#[derive(Debug)]
pub struct Function {
    pub name: String,
    pub params: Vec<MemType>,
    /// `(T, ...) -> ()` as the text declares it.
    pub function_type: String,
    body: Option<Vec<Instr>>,
    registers: usize,
}

/// What an SSA name stands for while compiling: a register, a memref parameter, or a 2-D
/// vector (`rows × cols` registers from the first).
#[derive(Clone, Copy)]
enum Value {
    Reg(usize, u32),
    Mem(usize),
    Vector { first: usize, rows: usize, cols: usize, bits: u32 },
}

struct Compiler<'f> {
    func: &'f str,
    /// Run reduction loops as [`Dot`]s.
    fuse: bool,
    /// Each memref parameter's rank.
    ranks: Vec<usize>,
    names: HashMap<String, Value>,
    registers: usize,
}

fn perr<T>(line: usize, msg: String) -> Result<T, InterpError> {
    Err(InterpError::Parse { line, msg })
}

impl Compiler<'_> {
    fn define(&mut self, name: &str, bits: u32) -> usize {
        let r = self.registers;
        self.registers += 1;
        self.names.insert(name.to_string(), Value::Reg(r, bits));
        r
    }

    fn reg(&self, op: &Op, name: &str) -> Result<(usize, u32), InterpError> {
        match self.names.get(name) {
            Some(&Value::Reg(r, bits)) => Ok((r, bits)),
            Some(Value::Mem(_) | Value::Vector { .. }) => {
                perr(op.line, format!("@{}: {} takes {name}, not a scalar, as a scalar", self.func, op.name))
            }
            None => perr(op.line, format!("@{}: {name} is not defined", self.func)),
        }
    }

    /// A 2-D vector named `name` of type `ty`, its registers allocated.
    fn define_vector(&mut self, op: &Op, name: &str, ty: &str) -> Result<Value, InterpError> {
        let Some((shape, bits)) = parse_vector(ty) else {
            return perr(op.line, format!("@{}: {ty} is not a vector of integers or f32", self.func));
        };
        let (rows, cols) = match *shape.as_slice() {
            [rows, cols] => (rows, cols),
            [cols] => (1, cols),
            _ => return perr(op.line, format!("@{}: {ty} is not a 1-D or 2-D vector", self.func)),
        };
        let v = Value::Vector { first: self.registers, rows, cols, bits };
        self.registers += rows * cols;
        self.names.insert(name.to_string(), v);
        Ok(v)
    }

    /// The vector value `name`: (first register, rows, cols, bits).
    fn vector(&self, op: &Op, name: &str) -> Result<(usize, usize, usize, u32), InterpError> {
        match self.names.get(name) {
            Some(&Value::Vector { first, rows, cols, bits }) => Ok((first, rows, cols, bits)),
            _ => perr(op.line, format!("@{}: {} takes {name}, which is not a vector", self.func, op.name)),
        }
    }

    /// The registers of a scalar or vector value, in order.
    fn regs(&self, op: &Op, name: &str) -> Result<Vec<usize>, InterpError> {
        match self.names.get(name) {
            Some(&Value::Vector { first, rows, cols, .. }) => Ok((first..first + rows * cols).collect()),
            _ => Ok(vec![self.reg(op, name)?.0]),
        }
    }

    fn mem(&self, op: &Op, name: &str) -> Result<usize, InterpError> {
        match self.names.get(name) {
            Some(&Value::Mem(m)) => Ok(m),
            _ => perr(op.line, format!("@{}: {} on {name}, which is not a memref parameter", self.func, op.name)),
        }
    }

    fn result_bits(&self, op: &Op) -> Result<u32, InterpError> {
        elem_bits(result_type(op)).ok_or_else(|| InterpError::Parse {
            line: op.line,
            msg: format!("@{}: {} of type {}, not an integer", self.func, op.name, op.ty),
        })
    }

    fn result<'o>(&self, op: &'o Op) -> Result<&'o str, InterpError> {
        match op.results.as_slice() {
            [r] => Ok(r),
            _ => perr(op.line, format!("@{}: {} needs one result", self.func, op.name)),
        }
    }

    fn block(&mut self, block: &Block, out: &mut Vec<Instr>) -> Result<Vec<usize>, InterpError> {
        for op in &block.ops {
            match op.name.as_str() {
                "scf.yield" | "func.return" => {
                    let regs = op.operands.iter().map(|o| self.regs(op, o)).collect::<Result<Vec<_>, _>>()?;
                    return Ok(regs.concat());
                }
                _ => out.push(self.instr(op)?),
            }
        }
        Ok(vec![])
    }

    fn instr(&mut self, op: &Op) -> Result<Instr, InterpError> {
        if let Some(i) = self.lanewise(op)? {
            return Ok(i);
        }
        if let Some(i) = self.scalar(op)? {
            return Ok(i);
        }
        let arith = match op.name.as_str() {
            "arith.addi" => Some(BinOp::Add),
            "arith.subi" => Some(BinOp::Sub),
            "arith.muli" => Some(BinOp::Mul),
            "arith.shli" => Some(BinOp::Shl),
            "arith.shrui" => Some(BinOp::ShrU),
            "arith.maxui" => Some(BinOp::MaxU),
            "arith.ori" => Some(BinOp::Or),
            "arith.xori" => Some(BinOp::Xor),
            "arith.andi" => Some(BinOp::And),
            _ => None,
        };
        if let Some(bop) = arith {
            let [a, b] = op.operands.as_slice() else {
                return perr(op.line, format!("@{}: {} takes two operands", self.func, op.name));
            };
            let ((a, _), (b, _)) = (self.reg(op, a)?, self.reg(op, b)?);
            let bits = self.result_bits(op)?;
            let dst = self.define(self.result(op)?, bits);
            return Ok(Instr::Bin { dst, op: bop, a, b, bits });
        }
        match op.name.as_str() {
            "arith.constant" if result_type(op) == "f32" => {
                let value = float_constant(op)?;
                Ok(Instr::Const { dst: self.define(self.result(op)?, 32), value })
            }
            "arith.constant" => {
                let bits = self.result_bits(op)?;
                let value = wrap(op.int("value")?, bits);
                Ok(Instr::Const { dst: self.define(self.result(op)?, bits), value })
            }
            "arith.extsi" => {
                let [src] = op.operands.as_slice() else {
                    return perr(op.line, format!("@{}: arith.extsi takes one operand", self.func));
                };
                if let Some(Value::Vector { first, rows, cols, .. }) = self.names.get(src.as_str()).copied() {
                    let Value::Vector { first: dst, rows: r2, cols: c2, .. } =
                        self.define_vector(op, self.result(op)?, result_type(op))?
                    else {
                        unreachable!("defined as a vector")
                    };
                    if (r2, c2) != (rows, cols) {
                        return perr(op.line, format!("@{}: arith.extsi changes the vector's shape", self.func));
                    }
                    return Ok(Instr::CopyN { dst, src: first, len: rows * cols });
                }
                let (src, _) = self.reg(op, src)?;
                let bits = self.result_bits(op)?;
                Ok(Instr::Copy { dst: self.define(self.result(op)?, bits), src })
            }
            "memref.load" => {
                let (mem, idx) = self.access(op, 0)?;
                let bits = self.result_bits(op)?;
                Ok(Instr::Load { dst: self.define(self.result(op)?, bits), mem, idx, line: op.line })
            }
            "memref.store" => {
                let (mem, idx) = self.access(op, 1)?;
                let (val, _) = self.reg(op, &op.operands[0])?;
                Ok(Instr::Store { val, mem, idx, line: op.line })
            }
            "scf.for" => self.for_loop(op),
            "vector.transfer_read" | "vector.transfer_write" => self.transfer(op),
            "vector.contract" => self.contract(op),
            other => perr(op.line, format!("@{}: unsupported operation {other} in a function body", self.func)),
        }
    }

    /// The memref and index registers of a load (`first` = 0) or store (`first` = 1).
    fn access(&self, op: &Op, first: usize) -> Result<(usize, Vec<usize>), InterpError> {
        let Some(mem) = op.operands.get(first) else {
            return perr(op.line, format!("@{}: {} without a memref", self.func, op.name));
        };
        let mem = self.mem(op, mem)?;
        let idx: Vec<usize> =
            op.operands[first + 1..].iter().map(|o| self.reg(op, o).map(|r| r.0)).collect::<Result<_, _>>()?;
        if idx.len() != self.ranks[mem] {
            return perr(
                op.line,
                format!(
                    "@{}: {} with {} indices into a memref of rank {}",
                    self.func,
                    op.name,
                    idx.len(),
                    self.ranks[mem]
                ),
            );
        }
        Ok((mem, idx))
    }

    /// A 2-D `vector.transfer_read` (memref, indices, padding) or `transfer_write` (vector,
    /// memref, indices), in bounds and over the memref's two innermost dimensions: anything else
    /// is refused, not guessed.
    fn transfer(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let read = op.name == "vector.transfer_read";
        if !op.attr("permutation_map").is_some_and(minor_identity_2d) || op.attr("in_bounds") != Some("[true, true]") {
            return perr(
                op.line,
                format!("@{}: {} other than in bounds over the innermost dimensions", self.func, op.name),
            );
        }
        let (mem, idx) = match read {
            true => {
                let (mem, idx) = self.access(
                    &Op { operands: op.operands[..op.operands.len().saturating_sub(1)].to_vec(), ..op.clone() },
                    0,
                )?;
                (mem, idx)
            }
            false => self.access(op, 1)?,
        };
        let line = op.line;
        if read {
            let Value::Vector { first, rows, cols, .. } = self.define_vector(op, self.result(op)?, result_type(op))?
            else {
                unreachable!("defined as a vector")
            };
            Ok(Instr::Read { dst: first, mem, idx, rows, cols, line })
        } else {
            let (val, rows, cols, _) = self.vector(op, &op.operands[0])?;
            Ok(Instr::Write { val, mem, idx, rows, cols, line })
        }
    }

    /// `vector.contract` with the matmul maps: `acc + a · b`.
    fn contract(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let maps = op.attr("indexing_maps").map(|m| m.split_whitespace().collect::<String>());
        let is = |want: &str| maps.as_deref() == Some(&want.split_whitespace().collect::<String>());
        let bt = is(crate::kernels::MATMUL_BT_MAPS);
        if !(bt || is(crate::kernels::MATMUL_MAPS)) || op.attr("kind") != Some("#vector.kind<add>") {
            return perr(op.line, format!("@{}: vector.contract other than C + A · B or C + A · Bᵀ", self.func));
        }
        let [a, b, acc] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.contract takes a, b and acc", self.func));
        };
        let ((a, m, k, _), (b, b_rows, b_cols, _), (acc, m2, n2, bits)) =
            (self.vector(op, a)?, self.vector(op, b)?, self.vector(op, acc)?);
        let (k2, n) = if bt { (b_cols, b_rows) } else { (b_rows, b_cols) };
        if k != k2 || (m, n) != (m2, n2) {
            return perr(op.line, format!("@{}: vector.contract of {m}x{k} and {k2}x{n} into {m2}x{n2}", self.func));
        }
        let Value::Vector { first: dst, .. } = self.define_vector(op, self.result(op)?, result_type(op))? else {
            unreachable!("defined as a vector")
        };
        Ok(Instr::Contract { dst, a, b, acc, mkn: [m, k, n], bits, bt })
    }

    /// The operands' registers of an operation taking `n` scalars.
    fn operands<const N: usize>(&self, op: &Op) -> Result<[(usize, u32); N], InterpError> {
        let Ok(names) = <&[String; N]>::try_from(op.operands.as_slice()) else {
            return perr(op.line, format!("@{}: {} takes {N} operand(s)", self.func, op.name));
        };
        let mut regs = [(0, 0); N];
        for (r, name) in regs.iter_mut().zip(names) {
            *r = self.reg(op, name)?;
        }
        Ok(regs)
    }

    /// The scalar float, division, cast, compare and select operations; `None` for any other.
    fn scalar(&mut self, op: &Op) -> Result<Option<Instr>, InterpError> {
        let float = |f| match op.name.as_str() {
            "arith.addf" => Some(FOp::Add),
            "arith.subf" => Some(FOp::Sub),
            "arith.mulf" => Some(FOp::Mul),
            "arith.divf" => Some(FOp::Div),
            "arith.maxnumf" => Some(FOp::MaxNum),
            "arith.minnumf" => Some(FOp::MinNum),
            "math.absf" if f => Some(FOp::Abs),
            "math.roundeven" if f => Some(FOp::RoundEven),
            _ => None,
        };
        if let Some(fop) = float(true) {
            if result_type(op) != "f32" {
                return perr(op.line, format!("@{}: {} of {}, not f32", self.func, op.name, op.ty));
            }
            let (a, b) = match fop {
                FOp::Abs | FOp::RoundEven => (self.operands::<1>(op)?[0].0, 0),
                _ => {
                    let [a, b] = self.operands::<2>(op)?;
                    (a.0, b.0)
                }
            };
            return Ok(Some(Instr::Float { dst: self.define(self.result(op)?, 32), op: fop, a, b }));
        }
        let instr = match op.name.as_str() {
            "arith.divui" | "arith.remui" => {
                let [(a, _), (b, _)] = self.operands::<2>(op)?;
                let divop = if op.name == "arith.divui" { DivOp::Div } else { DivOp::Rem };
                let bits = self.result_bits(op)?;
                Instr::Div { dst: self.define(self.result(op)?, bits), op: divop, a, b, bits, line: op.line }
            }
            "arith.sitofp" | "arith.fptosi" | "arith.extui" | "arith.bitcast" | "arith.trunci" => self.cast(op)?,
            "arith.cmpf" | "arith.cmpi" => {
                let [(a, bits), (b, _)] = self.operands::<2>(op)?;
                let float = op.name == "arith.cmpf";
                let limit = if float { 15 } else { 9 };
                let pred = op.int("predicate")?;
                if !(0..=limit).contains(&pred) {
                    return perr(op.line, format!("@{}: {} predicate {pred}", self.func, op.name));
                }
                Instr::Cmp { dst: self.define(self.result(op)?, 1), float, pred: pred as u8, a, b, bits }
            }
            "arith.select" => {
                let [(cond, _), (a, _), (b, bits)] = self.operands::<3>(op)?;
                Instr::Select { dst: self.define(self.result(op)?, bits), cond, a, b }
            }
            _ => return Ok(None),
        };
        Ok(Some(instr))
    }

    fn cast(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let [(src, from)] = self.operands::<1>(op)?;
        let to = self.result_bits(op)?;
        let (cast, bits) = match op.name.as_str() {
            "arith.sitofp" => (CastOp::SiToFp, from),
            "arith.fptosi" => (CastOp::FpToSi, to),
            "arith.extui" => (CastOp::ExtUi, from),
            "arith.trunci" => (CastOp::Trunc, to),
            _ => (CastOp::Bitcast, to),
        };
        let float_side = match cast {
            CastOp::SiToFp => result_type(op) == "f32",
            CastOp::FpToSi => op.ty.contains("(f32)"),
            CastOp::ExtUi | CastOp::Bitcast => true,
            CastOp::Trunc => to < from,
        };
        if !float_side || (matches!(cast, CastOp::Bitcast) && from != to) {
            return perr(op.line, format!("@{}: {} of type {}", self.func, op.name, op.ty));
        }
        Ok(Instr::Cast { dst: self.define(self.result(op)?, to), op: cast, src, bits, line: op.line })
    }

    fn for_loop(&mut self, op: &Op) -> Result<Instr, InterpError> {
        if op.operands.len() < 3 || op.regions.len() != 1 {
            return perr(op.line, format!("@{}: scf.for needs bounds, a step and a body", self.func));
        }
        let mut bounds = [0; 3];
        for (b, name) in bounds.iter_mut().zip(&op.operands) {
            *b = self.reg(op, name)?.0;
        }
        if op.operands.len() - 3 > MAX_CARRIED {
            return perr(op.line, format!("@{}: scf.for carries more than {MAX_CARRIED} values", self.func));
        }
        let inits = &op.operands[3..];
        let body = &op.regions[0];
        if body.args.len() != 1 + inits.len() || op.results.len() != inits.len() {
            return perr(
                op.line,
                format!(
                    "@{}: scf.for carries {} values into {} block arguments and {} results",
                    self.func,
                    inits.len(),
                    body.args.len().saturating_sub(1),
                    op.results.len()
                ),
            );
        }
        let iv = self.define(&body.args[0].0, 64);
        let mut carried = vec![];
        for ((name, ty), init) in body.args[1..].iter().zip(&op.operands[3..]) {
            let (inits, args) = match elem_bits(ty) {
                Some(bits) => (vec![self.reg(op, init)?.0], vec![self.define(name, bits)]),
                None => {
                    let inits = self.regs(op, init)?;
                    let Value::Vector { first, rows, cols, .. } = self.define_vector(op, name, ty)? else {
                        unreachable!("defined as a vector")
                    };
                    if inits.len() != rows * cols {
                        return perr(op.line, format!("@{}: carried {name} of type {ty} from {init}", self.func));
                    }
                    (inits, (first..first + rows * cols).collect())
                }
            };
            carried.extend(inits.into_iter().zip(args));
        }
        if carried.len() > MAX_CARRIED_ELEMENTS {
            return perr(op.line, format!("@{}: scf.for carries more than {MAX_CARRIED_ELEMENTS} elements", self.func));
        }
        let mut code = vec![];
        let yielded = self.block(body, &mut code)?;
        if yielded.len() != carried.len() {
            let what = format!("scf.for yields {} values for {} carried", yielded.len(), carried.len());
            return perr(op.line, format!("@{}: {what}", self.func));
        }
        let mut results = vec![];
        for (r, (name, ty)) in op.results.iter().zip(&body.args[1..]) {
            match self.names.get(name.as_str()).copied() {
                Some(Value::Vector { .. }) => {
                    let Value::Vector { first, rows, cols, .. } = self.define_vector(op, r, ty)? else {
                        unreachable!("defined as a vector")
                    };
                    results.extend(first..first + rows * cols);
                }
                _ => results.push(self.define(r, elem_bits(ty).unwrap_or(64))),
            }
        }
        let l = Loop { bounds, iv, carried, body: code, yielded, results, line: op.line };
        Ok(match fuse_dot(&l) {
            Some(dot) if self.fuse => Instr::Dot(Box::new(dot)),
            _ => Instr::For(Box::new(l)),
        })
    }
}

/// An f32 `arith.constant`'s value as its register holds it: `value = 0x3F800000 : f32` (the
/// bits) or a decimal literal.
fn float_constant(op: &Op) -> Result<i64, InterpError> {
    let v = op.need("value")?;
    let lit = v.split(':').next().unwrap_or("").trim();
    let value = match lit.strip_prefix("0x").or_else(|| lit.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok().map(f32::from_bits),
        None => lit.parse::<f32>().ok(),
    };
    value.map(reg_of).ok_or_else(|| InterpError::Parse {
        line: op.line,
        msg: format!("arith.constant: `value` = {v} is not an f32"),
    })
}

/// The register an instruction defines.
fn defined(i: &Instr) -> Option<usize> {
    match i {
        Instr::Const { dst, .. }
        | Instr::Copy { dst, .. }
        | Instr::Bin { dst, .. }
        | Instr::Load { dst, .. }
        | Instr::Div { dst, .. }
        | Instr::Float { dst, .. }
        | Instr::Cast { dst, .. }
        | Instr::Cmp { dst, .. }
        | Instr::Select { dst, .. } => Some(*dst),
        _ => None,
    }
}

/// The loop as a [`Dot`], when its body is exactly one carried sum of a product of two
/// (sign-extended) loads whose indices are the loop's index or values from outside the loop.
fn fuse_dot(l: &Loop) -> Option<Dot> {
    let (&[(init, acc)], &[sum], &[result]) = (&l.carried[..], &l.yielded[..], &l.results[..]) else { return None };
    let def = |r: usize| l.body.iter().find(|i| defined(i) == Some(r));
    let mut used = 1;
    let Some(&Instr::Bin { op: BinOp::Add, a, b, bits: add_bits, .. }) = def(sum) else { return None };
    let prod = match (a == acc, b == acc) {
        (true, false) => b,
        (false, true) => a,
        _ => return None,
    };
    let Some(&Instr::Bin { op: BinOp::Mul, a: x, b: y, bits: mul_bits, .. }) = def(prod) else { return None };
    used += 1;
    let inside = |r: usize| r == acc || l.body.iter().any(|i| defined(i) == Some(r));
    let mut operand = |mut r: usize| {
        while let Some(&Instr::Copy { src, .. }) = def(r) {
            used += 1;
            r = src;
        }
        let Some(Instr::Load { mem, idx, .. }) = def(r) else { return None };
        used += 1;
        if idx.iter().any(|&i| i != l.iv && inside(i)) || idx.iter().filter(|&&i| i == l.iv).count() > 1 {
            return None;
        }
        Some(DotOperand { mem: *mem, idx: idx.clone(), iv_at: idx.iter().position(|&i| i == l.iv) })
    };
    let operands = [operand(x)?, operand(y)?];
    (used == l.body.len()).then_some(Dot { bounds: l.bounds, init, result, operands, mul_bits, add_bits, line: l.line })
}

/// Compiles a `func.func` of the design: its parameters (memrefs of integers) and its body.
pub fn compile(op: &Op) -> Result<Function, InterpError> {
    compile_with(op, true)
}

/// [`compile`] without [`Dot`]: every operation dispatched on its own (tests compare the two).
pub fn compile_unfused(op: &Op) -> Result<Function, InterpError> {
    compile_with(op, false)
}

fn compile_with(op: &Op, fuse: bool) -> Result<Function, InterpError> {
    let name = op.need("sym_name")?.trim_matches('"').to_string();
    let function_type = op.need("function_type")?.to_string();
    let types = function_type.trim().strip_prefix('(').and_then(|t| t.split_once(')')).map(|(p, _)| split_top(p));
    let Some(types) = types else { return perr(op.line, format!("@{name}: function_type {function_type}")) };
    let params =
        types.iter().map(|t| MemType::parse(t)).collect::<Option<Vec<_>>>().ok_or_else(|| InterpError::Parse {
            line: op.line,
            msg: format!("@{name}: a parameter is not a memref of integers: {function_type}"),
        })?;
    let block = op.regions.first().filter(|b| !b.ops.is_empty() || !b.args.is_empty());
    let Some(block) = block else { return Ok(Function { name, params, function_type, body: None, registers: 0 }) };
    if block.args.len() != params.len() {
        return perr(op.line, format!("@{name}: {} block arguments for {} parameters", block.args.len(), params.len()));
    }
    let ranks = params.iter().map(|p| p.shape.len()).collect();
    let mut c = Compiler { func: &name, fuse, ranks, names: HashMap::new(), registers: 0 };
    for (i, (arg, _)) in block.args.iter().enumerate() {
        c.names.insert(arg.clone(), Value::Mem(i));
    }
    let mut code = vec![];
    c.block(block, &mut code)?;
    let registers = c.registers;
    Ok(Function { name, params, function_type, body: Some(code), registers })
}

impl Function {
    pub fn has_body(&self) -> bool {
        self.body.is_some()
    }

    /// Runs the body on `mems`, one flat buffer per parameter, each as long as its memref.
    pub fn call(&self, mems: &mut [Vec<i32>]) -> Result<(), InterpError> {
        let Some(code) = &self.body else {
            return Err(InterpError::Run(format!("@{} has no body in the design", self.name)));
        };
        if mems.len() != self.params.len() || mems.iter().zip(&self.params).any(|(m, p)| m.len() != p.elems()) {
            return Err(InterpError::Run(format!(
                "@{} called with buffers that are not its {}",
                self.name, self.function_type
            )));
        }
        let mut regs = vec![0i64; self.registers];
        let mut run = Run { func: self, regs: &mut regs, mems };
        run.exec(code)
    }
}

struct Run<'a> {
    func: &'a Function,
    regs: &'a mut [i64],
    mems: &'a mut [Vec<i32>],
}

impl Run<'_> {
    fn exec(&mut self, code: &[Instr]) -> Result<(), InterpError> {
        for instr in code {
            match instr {
                Instr::Const { dst, value } => self.regs[*dst] = *value,
                Instr::Copy { dst, src } => self.regs[*dst] = self.regs[*src],
                Instr::Bin { dst, op, a, b, bits } => {
                    self.regs[*dst] = self.binary(*op, (self.regs[*a], self.regs[*b]), *bits)?;
                }
                Instr::Div { dst, op, a, b, bits, line } => {
                    self.regs[*dst] = self.divide(*op, (self.regs[*a], self.regs[*b]), *bits, *line)?;
                }
                Instr::Float { dst, op, a, b } => self.regs[*dst] = float(*op, self.regs[*a], self.regs[*b]),
                Instr::Cast { dst, op, src, bits, line } => {
                    self.regs[*dst] = self.cast(*op, self.regs[*src], *bits, *line)?;
                }
                Instr::Cmp { dst, float, pred, a, b, bits } => {
                    let (x, y) = (self.regs[*a], self.regs[*b]);
                    self.regs[*dst] = i64::from(if *float { cmpf(*pred, x, y) } else { cmpi(*pred, x, y, *bits) });
                }
                Instr::Select { dst, cond, a, b } => {
                    self.regs[*dst] = if self.regs[*cond] & 1 != 0 { self.regs[*a] } else { self.regs[*b] };
                }
                Instr::Load { dst, mem, idx, line } => {
                    let at = self.offset(*mem, idx, *line)?;
                    self.regs[*dst] = wrap(self.mems[*mem][at] as i64, self.func.params[*mem].bits);
                }
                Instr::Store { val, mem, idx, line } => {
                    let at = self.offset(*mem, idx, *line)?;
                    self.mems[*mem][at] = wrap(self.regs[*val], self.func.params[*mem].bits) as i32;
                }
                Instr::For(l) => self.exec_loop(l)?,
                Instr::Dot(d) => self.exec_dot(d)?,
                Instr::Read { dst, mem, idx, rows, cols, line } => {
                    let (at, stride) = self.block_at(*mem, idx, (*rows, *cols), *line)?;
                    let bits = self.func.params[*mem].bits;
                    for (i, row) in self.regs[*dst..*dst + rows * cols].chunks_mut(*cols).enumerate() {
                        let from = &self.mems[*mem][at + i * stride..at + i * stride + cols];
                        row.iter_mut().zip(from).for_each(|(r, &x)| *r = wrap(x as i64, bits));
                    }
                }
                Instr::Write { val, mem, idx, rows, cols, line } => {
                    let (at, stride) = self.block_at(*mem, idx, (*rows, *cols), *line)?;
                    let bits = self.func.params[*mem].bits;
                    for (i, row) in self.regs[*val..*val + rows * cols].chunks(*cols).enumerate() {
                        let to = &mut self.mems[*mem][at + i * stride..at + i * stride + cols];
                        to.iter_mut().zip(row).for_each(|(x, &r)| *x = wrap(r, bits) as i32);
                    }
                }
                Instr::CopyN { dst, src, len } => self.regs.copy_within(*src..*src + len, *dst),
                Instr::Widen { dst, src, lanes, ratio, bits } => {
                    let mask = (1i64 << bits) - 1;
                    for l in 0..*lanes {
                        let parts = &self.regs[src + l * ratio..][..*ratio];
                        let word = parts.iter().rev().fold(0i64, |w, &p| (w << bits) | (p & mask));
                        self.regs[dst + l] = wrap(word, bits * *ratio as u32);
                    }
                }
                Instr::Seq(code) => self.exec(code)?,
                Instr::Contract { dst, a, b, acc, mkn: [m, k, n], bits, bt } => {
                    let (b_row, b_col) = if *bt { (1, *k) } else { (*n, 1) };
                    for i in 0..*m {
                        for j in 0..*n {
                            let mut sum = self.regs[acc + i * n + j];
                            for l in 0..*k {
                                let bv = self.regs[b + l * b_row + j * b_col];
                                let p = wrap(self.regs[a + i * k + l].wrapping_mul(bv), *bits);
                                sum = wrap(sum.wrapping_add(p), *bits);
                            }
                            self.regs[dst + i * n + j] = sum;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// An integer operation of two `bits`-wide values, wrapped to `bits`; a shift by `bits` or
    /// more (poison in MLIR) is an error.
    fn binary(&self, op: BinOp, (x, y): (i64, i64), bits: u32) -> Result<i64, InterpError> {
        if matches!(op, BinOp::Shl | BinOp::ShrU) && !(0..i64::from(bits)).contains(&wrap(y, bits)) {
            let what = format!("a shift by {} of an i{bits} is poison", wrap(y, bits));
            return Err(InterpError::Run(format!("@{}: {what}", self.func.name)));
        }
        let v = match op {
            BinOp::Add => x.wrapping_add(y),
            BinOp::Sub => x.wrapping_sub(y),
            BinOp::Mul => x.wrapping_mul(y),
            BinOp::Shl => x.wrapping_shl(y as u32 & 63),
            BinOp::ShrU => {
                let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                ((x as u64 & mask).wrapping_shr(y as u32 & 63)) as i64
            }
            BinOp::MaxU => {
                let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                if (x as u64 & mask) >= (y as u64 & mask) {
                    x
                } else {
                    y
                }
            }
            BinOp::Or => x | y,
            BinOp::And => x & y,
            BinOp::Xor => x ^ y,
        };
        Ok(wrap(v, bits))
    }

    /// `divui` / `remui` of two `bits`-wide values read as unsigned; a zero divisor is an error.
    fn divide(&self, op: DivOp, (x, y): (i64, i64), bits: u32, line: usize) -> Result<i64, InterpError> {
        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let (x, y) = (x as u64 & mask, y as u64 & mask);
        if y == 0 {
            return Err(InterpError::Run(format!("@{} line {line}: division by zero", self.func.name)));
        }
        Ok(wrap(if matches!(op, DivOp::Div) { x / y } else { x % y } as i64, bits))
    }

    /// A cast (see [`CastOp`]); `fptosi` of a NaN or of a value outside its type is an error.
    fn cast(&self, op: CastOp, x: i64, bits: u32, line: usize) -> Result<i64, InterpError> {
        Ok(match op {
            CastOp::SiToFp => reg_of(wrap(x, bits) as f32),
            CastOp::ExtUi => (x as u64 & ((1u64 << bits.min(63)) - 1)) as i64,
            CastOp::Bitcast | CastOp::Trunc => wrap(x, bits),
            CastOp::FpToSi => {
                let f = f32_of(x).trunc();
                let limit = 2f64.powi(bits as i32 - 1);
                if f.is_nan() || f64::from(f) >= limit || f64::from(f) < -limit {
                    let what = format!("fptosi of {} to i{bits} is poison", f32_of(x));
                    return Err(InterpError::Run(format!("@{} line {line}: {what}", self.func.name)));
                }
                f as i64
            }
        })
    }

    /// A 2-D block's flat offset and the stride between its rows, every index and the block's
    /// far corner inside the memref.
    fn block_at(
        &self,
        mem: usize,
        idx: &[usize],
        (rows, cols): (usize, usize),
        line: usize,
    ) -> Result<(usize, usize), InterpError> {
        let at = self.offset(mem, idx, line)?;
        let t = &self.func.params[mem];
        let r = t.shape.len();
        for (d, extent) in [(r - 2, rows), (r - 1, cols)] {
            let last = self.regs[idx[d]] + extent as i64 - 1;
            if last as u64 >= t.shape[d] as u64 {
                return Err(self.out_of_bounds(mem, last, t.shape[d], line));
            }
        }
        Ok((at, t.strides[r - 2]))
    }

    /// The flat offset of an access, every index inside its dimension (the count of indices is
    /// the memref's rank, checked when compiling).
    #[inline]
    fn offset(&self, mem: usize, idx: &[usize], line: usize) -> Result<usize, InterpError> {
        let t = &self.func.params[mem];
        let mut at = 0;
        for ((&r, &dim), &stride) in idx.iter().zip(&t.shape).zip(&t.strides) {
            let i = self.regs[r];
            if i as u64 >= dim as u64 {
                return Err(self.out_of_bounds(mem, i, dim, line));
            }
            at += i as usize * stride;
        }
        Ok(at)
    }

    #[cold]
    fn out_of_bounds(&self, mem: usize, i: i64, dim: usize, line: usize) -> InterpError {
        let what = format!("index {i} outside a dimension of {dim} (memref {:?})", self.func.params[mem].shape);
        InterpError::Run(format!("@{} line {line}: {what}", self.func.name))
    }

    /// A [`Dot`]: each operand's offset at the first index and its step, every index checked
    /// (the loop's at its first and last value), then the loads, products and sums in order.
    fn exec_dot(&mut self, d: &Dot) -> Result<(), InterpError> {
        let [lb, ub, step] = d.bounds.map(|r| self.regs[r]);
        if step <= 0 {
            return Err(InterpError::Run(format!("@{} line {}: scf.for step {step}", self.func.name, d.line)));
        }
        let mut acc = self.regs[d.init];
        let trips = if ub > lb { ((ub - lb + step - 1) / step) as usize } else { 0 };
        if trips > 0 {
            let last = lb + (trips as i64 - 1) * step;
            let mut walks = [(0usize, 0usize); 2];
            for (w, o) in walks.iter_mut().zip(&d.operands) {
                *w = self.walk(o, lb, last, step, d.line)?;
            }
            let [(mut ia, sa), (mut ib, sb)] = walks;
            let (ma, mb) = (&self.mems[d.operands[0].mem], &self.mems[d.operands[1].mem]);
            let (ba, bb) = (self.func.params[d.operands[0].mem].bits, self.func.params[d.operands[1].mem].bits);
            if (ba, bb, d.mul_bits, d.add_bits) == (8, 8, 32, 32) {
                // int8 × int8 summed in int32: the same wraps, as Rust's integer types.
                let mut sum = acc as i32;
                for _ in 0..trips {
                    sum = sum.wrapping_add(ma[ia] as i8 as i32 * mb[ib] as i8 as i32);
                    ia += sa;
                    ib += sb;
                }
                acc = sum as i64;
            } else {
                for _ in 0..trips {
                    let p = wrap(wrap(ma[ia] as i64, ba).wrapping_mul(wrap(mb[ib] as i64, bb)), d.mul_bits);
                    acc = wrap(acc.wrapping_add(p), d.add_bits);
                    ia += sa;
                    ib += sb;
                }
            }
        }
        self.regs[d.result] = acc;
        Ok(())
    }

    /// An operand's offset at the loop's first index and its step per iteration, with its
    /// indices checked at the first and the last.
    fn walk(
        &mut self,
        o: &DotOperand,
        first: i64,
        last: i64,
        step: i64,
        line: usize,
    ) -> Result<(usize, usize), InterpError> {
        let Some(at) = o.iv_at else { return Ok((self.offset(o.mem, &o.idx, line)?, 0)) };
        let dim = self.func.params[o.mem].shape[at];
        if last as u64 >= dim as u64 {
            return Err(self.out_of_bounds(o.mem, last, dim, line));
        }
        self.regs[o.idx[at]] = first;
        Ok((self.offset(o.mem, &o.idx, line)?, self.func.params[o.mem].strides[at] * step as usize))
    }

    fn exec_loop(&mut self, l: &Loop) -> Result<(), InterpError> {
        let [lb, ub, step] = l.bounds.map(|r| self.regs[r]);
        if step <= 0 {
            return Err(InterpError::Run(format!("@{} line {}: scf.for step {step}", self.func.name, l.line)));
        }
        for &(init, arg) in &l.carried {
            self.regs[arg] = self.regs[init];
        }
        // Yields assign all carried values at once; a loop carries few.
        let mut next = [0i64; MAX_CARRIED_ELEMENTS];
        let next = &mut next[..l.yielded.len()];
        let mut i = lb;
        while i < ub {
            self.regs[l.iv] = i;
            self.exec(&l.body)?;
            for (n, &y) in next.iter_mut().zip(&l.yielded) {
                *n = self.regs[y];
            }
            for (&(_, arg), &n) in l.carried.iter().zip(next.iter()) {
                self.regs[arg] = n;
            }
            i += step;
        }
        for (&res, &(_, arg)) in l.results.iter().zip(&l.carried) {
            self.regs[res] = self.regs[arg];
        }
        Ok(())
    }
}

/// A float operation on registers (see [`FOp`]).
fn float(op: FOp, a: i64, b: i64) -> i64 {
    let (x, y) = (f32_of(a), f32_of(b));
    reg_of(match op {
        FOp::Add => x + y,
        FOp::Sub => x - y,
        FOp::Mul => x * y,
        FOp::Div => x / y,
        FOp::MaxNum => x.max(y),
        FOp::MinNum => x.min(y),
        FOp::Abs => x.abs(),
        FOp::RoundEven => x.round_ties_even(),
    })
}

/// `arith.cmpf` with the predicate's enum value ([`crate::kernels::CMPF_PREDICATES`]): ordered
/// predicates are false and unordered ones true when an operand is NaN.
fn cmpf(pred: u8, a: i64, b: i64) -> bool {
    let (x, y) = (f32_of(a), f32_of(b));
    let unordered = x.is_nan() || y.is_nan();
    let ordered = |c: bool| !unordered && c;
    let or_unordered = |c: bool| unordered || c;
    match pred {
        0 => false,
        1 => ordered(x == y),
        2 => ordered(x > y),
        3 => ordered(x >= y),
        4 => ordered(x < y),
        5 => ordered(x <= y),
        6 => ordered(x != y),
        7 => !unordered,
        8 => or_unordered(x == y),
        9 => or_unordered(x > y),
        10 => or_unordered(x >= y),
        11 => or_unordered(x < y),
        12 => or_unordered(x <= y),
        13 => or_unordered(x != y),
        14 => unordered,
        _ => true,
    }
}

/// `arith.cmpi` with the predicate's enum value ([`crate::kernels::CMPI_PREDICATES`]) on values
/// of `bits`, the unsigned predicates reading them unsigned.
fn cmpi(pred: u8, a: i64, b: i64, bits: u32) -> bool {
    let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let (ua, ub) = (a as u64 & mask, b as u64 & mask);
    let (sa, sb) = (wrap(a, bits), wrap(b, bits));
    match pred {
        0 => sa == sb,
        1 => sa != sb,
        2 => sa < sb,
        3 => sa <= sb,
        4 => sa > sb,
        5 => sa >= sb,
        6 => ua < ub,
        7 => ua <= ub,
        8 => ua > ub,
        _ => ua >= ub,
    }
}
