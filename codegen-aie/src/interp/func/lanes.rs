//! Vectors beyond the contraction: an elementwise `arith` or `math` operation on vectors is
//! compiled lane by lane into the scalar operation's instructions (a vector being a run of
//! registers, lane `l`'s result lands in the run's register `l`), a splat `dense<..>` constant
//! into one constant per lane, and `vector.broadcast`, `vector.shape_cast`, `vector.bitcast`
//! (to wider lanes, little-endian), `vector.extract` (a row or a lane, at a static position) and
//! `vector.reduction <maxui>` into copies, packed lanes and unsigned maxima. The semantics per lane are the
//! scalar operation's, so a vector kernel and its scalar form compute the same bits.

use super::{parse_vector, perr, BinOp, Compiler, Instr, Value};
use crate::interp::{result_type, InterpError, Op};

/// `ty` with each `vector<..xT>` replaced by `T`: a vector operation's per-lane signature.
fn scalar_signature(ty: &str) -> String {
    let mut out = String::new();
    let mut rest = ty;
    while let Some(at) = rest.find("vector<") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "vector<".len()..];
        let end = after.find('>').unwrap_or(after.len());
        out.push_str(after[..end].rsplit('x').next().unwrap_or(""));
        rest = after.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

impl Compiler<'_> {
    /// The vector operations of this module; `None` for any other operation.
    pub(super) fn lanewise(&mut self, op: &Op) -> Result<Option<Instr>, InterpError> {
        match op.name.as_str() {
            "vector.broadcast" => return self.broadcast(op).map(Some),
            "vector.shape_cast" => return self.shape_cast(op).map(Some),
            "vector.reduction" => return self.reduction(op).map(Some),
            "vector.bitcast" => return self.bitcast(op).map(Some),
            "vector.extract" => return self.extract(op).map(Some),
            _ => {}
        }
        let elementwise = op.name.starts_with("arith.") || op.name.starts_with("math.");
        if !elementwise || op.name == "arith.extsi" || !result_type(op).starts_with("vector<") {
            return Ok(None);
        }
        self.lanes(op).map(Some)
    }

    /// An elementwise operation, one scalar operation per lane.
    fn lanes(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let res = self.result(op)?.to_string();
        let ty = result_type(op);
        let Some((shape, bits)) = parse_vector(ty) else {
            return perr(op.line, format!("@{}: {} of type {ty}", self.func, op.name));
        };
        let (rows, cols) = match *shape.as_slice() {
            [r, c] => (r, c),
            [c] => (1, c),
            _ => return perr(op.line, format!("@{}: {ty} is not a 1-D or 2-D vector", self.func)),
        };
        let first = self.registers;
        let mut code = vec![];
        for lane in 0..rows * cols {
            let lane_op = self.lane_op(op, lane)?;
            code.push(self.instr(&lane_op)?);
            for name in lane_op.operands.iter().chain(&lane_op.results).filter(|n| n.contains('#')) {
                self.names.remove(name);
            }
        }
        if self.registers != first + rows * cols {
            return perr(op.line, format!("@{}: {} does not give one value per lane", self.func, op.name));
        }
        self.names.insert(res, Value::Vector { first, rows, cols, bits });
        Ok(Instr::Seq(code))
    }

    /// Lane `lane` of `op` as a scalar operation: vector operands as the lane's register, a
    /// splat constant as its value, the types their elements'.
    fn lane_op(&mut self, op: &Op, lane: usize) -> Result<Op, InterpError> {
        let mut operands = vec![];
        for name in &op.operands {
            match self.names.get(name.as_str()).copied() {
                Some(Value::Vector { first, rows, cols, bits }) => {
                    if lane >= rows * cols {
                        return perr(op.line, format!("@{}: {name} has {} lanes", self.func, rows * cols));
                    }
                    let lane_name = format!("{name}#{lane}");
                    self.names.insert(lane_name.clone(), Value::Reg(first + lane, bits));
                    operands.push(lane_name);
                }
                _ => operands.push(name.clone()),
            }
        }
        let attrs = op
            .attrs
            .iter()
            .map(|(k, v)| match v.trim().strip_prefix("dense<") {
                Some(splat) => {
                    let (value, _) = splat.split_once('>').unwrap_or((splat, ""));
                    (k.clone(), format!("{value} : {}", scalar_signature(result_type(op))))
                }
                None => (k.clone(), v.clone()),
            })
            .collect();
        let results = vec![format!("{}#lane", self.result(op)?)];
        Ok(Op { results, operands, attrs, ty: scalar_signature(&op.ty), ..op.clone() })
    }

    /// `vector.broadcast`: a scalar copied into every lane.
    fn broadcast(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let [src] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.broadcast takes one scalar", self.func));
        };
        let (src, _) = self.reg(op, src)?;
        let Value::Vector { first, rows, cols, .. } = self.define_vector(op, self.result(op)?, result_type(op))? else {
            unreachable!("defined as a vector")
        };
        Ok(Instr::Seq((0..rows * cols).map(|l| Instr::Copy { dst: first + l, src }).collect()))
    }

    /// `vector.shape_cast`: the same lanes under another shape (no instruction).
    fn shape_cast(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let [src] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.shape_cast takes one vector", self.func));
        };
        let (first, rows, cols, bits) = self.vector(op, src)?;
        let ty = result_type(op);
        let lanes = parse_vector(ty).map(|(shape, _)| shape.iter().product::<usize>());
        if lanes != Some(rows * cols) {
            return perr(op.line, format!("@{}: vector.shape_cast of {} lanes to {ty}", self.func, rows * cols));
        }
        let (r, c) = match parse_vector(ty).map(|(s, _)| s) {
            Some(s) if s.len() == 2 => (s[0], s[1]),
            _ => (1, rows * cols),
        };
        self.names.insert(self.result(op)?.to_string(), Value::Vector { first, rows: r, cols: c, bits });
        Ok(Instr::Seq(vec![]))
    }

    /// `vector.reduction <maxui>`: the lanes' unsigned maximum.
    fn reduction(&mut self, op: &Op) -> Result<Instr, InterpError> {
        if op.attr("kind").map(str::trim) != Some("#vector.kind<maxui>") {
            return perr(op.line, format!("@{}: vector.reduction other than <maxui>", self.func));
        }
        let [src] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.reduction takes one vector", self.func));
        };
        let (first, rows, cols, bits) = self.vector(op, src)?;
        let dst = self.define(self.result(op)?, bits);
        let mut code = vec![Instr::Copy { dst, src: first }];
        code.extend((1..rows * cols).map(|l| Instr::Bin { dst, op: BinOp::MaxU, a: dst, b: first + l, bits }));
        Ok(Instr::Seq(code))
    }

    /// `vector.bitcast` to lanes a whole number of times wider (`vector<1x32xi8>` to
    /// `vector<1x8xi32>`): each wide lane the narrow ones it covers, the first least significant,
    /// as on a little-endian core.
    fn bitcast(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let [src] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.bitcast takes one vector", self.func));
        };
        let (src, rows, cols, bits) = self.vector(op, src)?;
        let ty = result_type(op);
        let Value::Vector { first, rows: r, cols: c, bits: wide } = self.define_vector(op, self.result(op)?, ty)?
        else {
            unreachable!("defined as a vector")
        };
        let ratio = (wide / bits) as usize;
        if r != rows || wide % bits != 0 || ratio < 1 || c * ratio != cols {
            return perr(op.line, format!("@{}: vector.bitcast of {rows}x{cols} lanes of i{bits} to {ty}", self.func));
        }
        Ok(Instr::Widen { dst: first, src, lanes: r * c, ratio, bits })
    }

    /// `vector.extract` at one static position of the leading dimension: a row of a 2-D vector
    /// (its run of registers, no instruction) or a lane of a 1-D one (that register).
    fn extract(&mut self, op: &Op) -> Result<Instr, InterpError> {
        let [src] = op.operands.as_slice() else {
            return perr(op.line, format!("@{}: vector.extract takes one vector and static positions", self.func));
        };
        let at = op.attr("static_position").and_then(|a| a.trim().strip_prefix("array<i64:")?.strip_suffix('>'));
        let Some(Ok(at)) = at.map(|a| a.trim().parse::<usize>()) else {
            return perr(op.line, format!("@{}: vector.extract other than at one static position", self.func));
        };
        let (first, rows, cols, bits) = self.vector(op, src)?;
        // A vector result is a row of the source, a scalar one a lane.
        let row = parse_vector(result_type(op)).map(|(shape, _)| shape.iter().product::<usize>());
        let (count, width) = if row.is_some() { (rows, cols) } else { (rows * cols, 1) };
        if at >= count || row.is_some_and(|lanes| lanes != width) {
            return perr(
                op.line,
                format!("@{}: vector.extract at {at} of {rows}x{cols} lanes to {}", self.func, result_type(op)),
            );
        }
        let res = self.result(op)?.to_string();
        if row.is_some() {
            self.names.insert(res, Value::Vector { first: first + at * width, rows: 1, cols: width, bits });
            return Ok(Instr::Seq(vec![]));
        }
        let dst = self.define(&res, bits);
        Ok(Instr::Copy { dst, src: first + at })
    }
}
