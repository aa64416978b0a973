//! The bundle's program (`bundle::program`, written by `npuc compile`) as the executor holds it:
//! dtypes it computes in, constants decoded, symbolic dims parsed into polynomials it evaluates
//! once the step's sequence length is known.

use crate::bundle::program::{self as format, Dim, Tensor};

use super::error::ExecError;

pub use crate::bundle::program::PROGRAM_FORMAT;

/// Element types the executor holds in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    F32,
    I64,
}

/// The sizes a symbolic dim may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    /// `batch_size`: always 1.
    Batch,
    /// `sequence_length`: the tokens of the step.
    Seq,
    /// `past_sequence_length`: the tokens the cache held before the step.
    Past,
    /// `total_sequence_length`: past + seq.
    Total,
}

/// `Σ coefficient · Π symbols`, as `ir::Dim` prints it (`past_sequence_length + sequence_length`,
/// `2*sequence_length`, `576`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DimExpr {
    terms: Vec<(i64, Vec<Sym>)>,
}

/// The sizes of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDims {
    pub seq: usize,
    pub past: usize,
}

impl DimExpr {
    pub fn constant(c: i64) -> DimExpr {
        DimExpr { terms: vec![(c, Vec::new())] }
    }

    /// The value when it does not depend on the step.
    pub fn as_const(&self) -> Option<usize> {
        let mut total = 0i64;
        for (c, syms) in &self.terms {
            if syms.iter().any(|s| *s != Sym::Batch) {
                return None;
            }
            total += c;
        }
        usize::try_from(total).ok()
    }

    pub fn eval(&self, dims: StepDims) -> usize {
        let size = |s: &Sym| match s {
            Sym::Batch => 1i64,
            Sym::Seq => dims.seq as i64,
            Sym::Past => dims.past as i64,
            Sym::Total => (dims.past + dims.seq) as i64,
        };
        let total: i64 = self.terms.iter().map(|(c, syms)| c * syms.iter().map(size).product::<i64>()).sum();
        usize::try_from(total).unwrap_or(0)
    }

    fn parse(text: &str) -> Result<DimExpr, String> {
        let mut terms = Vec::new();
        let mut sign = 1i64;
        let mut expect_term = true;
        for token in text.split_whitespace() {
            if !expect_term {
                sign = match token {
                    "+" => 1,
                    "-" => -1,
                    _ => return Err(format!("expected + or - before `{token}`")),
                };
                expect_term = true;
                continue;
            }
            let (negated, body) = match token.strip_prefix('-') {
                Some(rest) => (-1, rest),
                None => (1, token),
            };
            let mut coefficient = sign * negated;
            let mut syms = Vec::new();
            for factor in body.split('*') {
                if let Ok(n) = factor.parse::<i64>() {
                    coefficient *= n;
                    continue;
                }
                syms.push(match factor {
                    "batch_size" | "batch" => Sym::Batch,
                    "sequence_length" => Sym::Seq,
                    "past_sequence_length" => Sym::Past,
                    "total_sequence_length" => Sym::Total,
                    other => return Err(format!("symbolic size `{other}` is not one the host executor knows")),
                });
            }
            terms.push((coefficient, syms));
            expect_term = false;
        }
        if expect_term {
            return Err(format!("`{text}` is not a dim expression"));
        }
        Ok(DimExpr { terms })
    }
}

/// Where a value comes from.
#[derive(Clone, Debug)]
pub enum ValueDef {
    Input,
    Node,
    Weight(String),
    ConstF32(Vec<f32>),
    ConstI64(Vec<i64>),
}

#[derive(Clone, Debug)]
pub struct ValueInfo {
    pub name: String,
    /// `None` for a dtype the executor does not hold (refused when a node reads the value).
    pub elem: Option<ElemType>,
    pub dtype: String,
    pub shape: Vec<DimExpr>,
    pub def: ValueDef,
}

/// A node as the bundle's program holds it (its attribute readers are the format's).
pub type NodeInfo = format::Node;

#[derive(Clone, Debug)]
pub struct Program {
    pub values: Vec<ValueInfo>,
    pub nodes: Vec<NodeInfo>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
}

fn bad(path: impl Into<String>, problem: impl Into<String>) -> ExecError {
    ExecError::Program { path: path.into(), problem: problem.into() }
}

impl Program {
    /// The executor's form of a bundle's program, refusing another format, out-of-range value
    /// indices and symbolic sizes other than batch, sequence, past and total lengths.
    pub fn from_format(program: &format::Program) -> Result<Program, ExecError> {
        program.check().map_err(|e| bad(e.path, e.problem))?;
        let values = program.values.iter().enumerate().map(|(i, v)| decode_value(v, i)).collect::<Result<_, _>>()?;
        let nodes = program.nodes.clone();
        Ok(Program { values, nodes, inputs: program.inputs.clone(), outputs: program.outputs.clone() })
    }
}

fn decode_value(v: &format::Value, index: usize) -> Result<ValueInfo, ExecError> {
    let path = format!("values[{index}]");
    let elem = match v.dtype.as_str() {
        "f32" => Some(ElemType::F32),
        "i64" => Some(ElemType::I64),
        _ => None,
    };
    let mut shape = Vec::with_capacity(v.shape.len());
    for (i, d) in v.shape.iter().enumerate() {
        let dim = match d {
            Dim::Known(n) => Ok(DimExpr::constant(*n)),
            Dim::Symbolic(text) => DimExpr::parse(text),
        };
        shape.push(dim.map_err(|problem| bad(format!("{path}.shape[{i}] of `{}`", v.name), problem))?);
    }
    let def = match &v.def {
        format::ValueDef::Input => ValueDef::Input,
        format::ValueDef::Node => ValueDef::Node,
        format::ValueDef::Weight(w) => ValueDef::Weight(w.clone()),
        format::ValueDef::Const(t) => decode_const(t, &format!("{path}.def.const"))?,
    };
    Ok(ValueInfo { name: v.name.clone(), elem, dtype: v.dtype.clone(), shape, def })
}

fn decode_const(t: &Tensor, path: &str) -> Result<ValueDef, ExecError> {
    let not_numbers = || bad(format!("{path}.data"), format!("holds something other than {} numbers", t.dtype));
    match t.dtype.as_str() {
        "f32" | "f64" | "f16" | "bf16" => t.floats().map(ValueDef::ConstF32).ok_or_else(not_numbers),
        "str" => Ok(ValueDef::ConstI64(Vec::new())),
        _ => t.ints().map(|v| ValueDef::ConstI64(v.to_vec())).ok_or_else(not_numbers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim_expressions_evaluate_per_step() {
        let step = StepDims { seq: 5, past: 7 };
        let total = DimExpr::parse("past_sequence_length + sequence_length").unwrap();
        assert_eq!(total.eval(step), 12);
        assert_eq!(DimExpr::parse("2*sequence_length - 1").unwrap().eval(step), 9);
        assert_eq!(DimExpr::parse("batch_size*sequence_length").unwrap().eval(step), 5);
        assert_eq!(DimExpr::parse("batch_size").unwrap().as_const(), Some(1));
        assert!(DimExpr::parse("unknown_length").unwrap_err().contains("unknown_length"));
    }
}
