//! The bundle's program (`npuc-program/1`, written by `npuc compile`) decoded into typed values
//! and nodes, with symbolic dims parsed into polynomials the executor evaluates once the step's
//! sequence length is known.

use serde_json::Value as Json;

use super::error::ExecError;

pub const PROGRAM_FORMAT: &str = "npuc-program/1";

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

#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub name: String,
    /// `domain::op`.
    pub op: String,
    pub attrs: serde_json::Map<String, Json>,
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
}

impl NodeInfo {
    pub fn attr_f32(&self, name: &str) -> Option<f32> {
        self.attrs.get(name).and_then(Json::as_f64).map(|v| v as f32)
    }

    pub fn attr_i64(&self, name: &str) -> Option<i64> {
        self.attrs.get(name).and_then(Json::as_i64)
    }

    pub fn attr_ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attrs.get(name)?.as_array()?.iter().map(Json::as_i64).collect()
    }

    pub fn input(&self, i: usize) -> Option<usize> {
        self.inputs.get(i).copied().flatten()
    }
}

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

fn index_list(json: &Json, path: &str, values: usize) -> Result<Vec<Option<usize>>, ExecError> {
    let list = json.as_array().ok_or_else(|| bad(path, "is not a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Json::Null => Ok(None),
            _ => match v.as_u64().map(|n| n as usize) {
                Some(n) if n < values => Ok(Some(n)),
                _ => Err(bad(format!("{path}[{i}]"), format!("`{v}` is not a value index below {values}"))),
            },
        })
        .collect()
}

fn required(list: Vec<Option<usize>>, path: &str) -> Result<Vec<usize>, ExecError> {
    list.into_iter().map(|v| v.ok_or_else(|| bad(path, "holds null where a value is required"))).collect()
}

impl Program {
    /// Decodes a program, refusing another format, malformed fields, out-of-range value
    /// indices and symbolic sizes other than batch, sequence, past and total lengths.
    pub fn from_json(program: &Json) -> Result<Program, ExecError> {
        let format = program.get("format").and_then(Json::as_str).unwrap_or("");
        if format != PROGRAM_FORMAT {
            return Err(bad("format", format!("`{format}` is not {PROGRAM_FORMAT}")));
        }
        let raw_values = program.get("values").and_then(Json::as_array).ok_or_else(|| bad("values", "missing"))?;
        let mut values = Vec::with_capacity(raw_values.len());
        for (i, v) in raw_values.iter().enumerate() {
            values.push(decode_value(v, &format!("values[{i}]"))?);
        }
        let n = values.len();
        let raw_nodes = program.get("nodes").and_then(Json::as_array).ok_or_else(|| bad("nodes", "missing"))?;
        let mut nodes = Vec::with_capacity(raw_nodes.len());
        for (i, node) in raw_nodes.iter().enumerate() {
            let path = format!("nodes[{i}]");
            let field = |name: &str| node.get(name).ok_or_else(|| bad(format!("{path}.{name}"), "missing"));
            let name = field("name")?.as_str().ok_or_else(|| bad(format!("{path}.name"), "not text"))?.to_string();
            let op = field("op")?.as_str().ok_or_else(|| bad(format!("{path}.op"), "not text"))?.to_string();
            let attrs = match node.get("attrs") {
                None | Some(Json::Null) => serde_json::Map::new(),
                Some(Json::Object(m)) => m.clone(),
                Some(_) => return Err(bad(format!("{path}.attrs"), "not an object")),
            };
            let inputs = index_list(field("inputs")?, &format!("{path}.inputs"), n)?;
            let outputs = required(index_list(field("outputs")?, &format!("{path}.outputs"), n)?, &path)?;
            nodes.push(NodeInfo { name, op, attrs, inputs, outputs });
        }
        let list = |name: &str| -> Result<Vec<usize>, ExecError> {
            let json = program.get(name).ok_or_else(|| bad(name, "missing"))?;
            required(index_list(json, name, n)?, name)
        };
        Ok(Program { inputs: list("inputs")?, outputs: list("outputs")?, values, nodes })
    }
}

fn decode_value(v: &Json, path: &str) -> Result<ValueInfo, ExecError> {
    let name = v.get("name").and_then(Json::as_str).ok_or_else(|| bad(format!("{path}.name"), "missing"))?;
    let dtype = v.get("dtype").and_then(Json::as_str).ok_or_else(|| bad(format!("{path}.dtype"), "missing"))?;
    let elem = match dtype {
        "f32" => Some(ElemType::F32),
        "i64" => Some(ElemType::I64),
        _ => None,
    };
    let raw_shape = v.get("shape").and_then(Json::as_array).ok_or_else(|| bad(format!("{path}.shape"), "missing"))?;
    let mut shape = Vec::with_capacity(raw_shape.len());
    for (i, d) in raw_shape.iter().enumerate() {
        let dim = match d {
            Json::Number(n) => n.as_i64().map(DimExpr::constant).ok_or_else(|| format!("`{n}` is not an integer")),
            Json::String(text) => DimExpr::parse(text),
            _ => Err(format!("`{d}` is neither a number nor a dim expression")),
        };
        shape.push(dim.map_err(|problem| bad(format!("{path}.shape[{i}] of `{name}`"), problem))?);
    }
    let def = match v.get("def") {
        Some(Json::String(s)) if s == "input" => ValueDef::Input,
        Some(Json::String(s)) if s == "node" => ValueDef::Node,
        Some(Json::Object(m)) if m.contains_key("weight") => {
            let weight = m["weight"].as_str().ok_or_else(|| bad(format!("{path}.def.weight"), "not text"))?;
            ValueDef::Weight(weight.to_string())
        }
        Some(Json::Object(m)) if m.contains_key("const") => decode_const(&m["const"], &format!("{path}.def.const"))?,
        _ => return Err(bad(format!("{path}.def"), "is not input, node, {weight} or {const}")),
    };
    Ok(ValueInfo { name: name.to_string(), elem, dtype: dtype.to_string(), shape, def })
}

fn decode_const(c: &Json, path: &str) -> Result<ValueDef, ExecError> {
    let dtype = c.get("dtype").and_then(Json::as_str).unwrap_or("");
    let data = c.get("data").and_then(Json::as_array).ok_or_else(|| bad(format!("{path}.data"), "missing"))?;
    let not_numbers = || bad(format!("{path}.data"), format!("holds something other than {dtype} numbers"));
    match dtype {
        "f32" | "f64" | "f16" | "bf16" => {
            let v: Option<Vec<f32>> = data.iter().map(|x| x.as_f64().map(|f| f as f32)).collect();
            v.map(ValueDef::ConstF32).ok_or_else(not_numbers)
        }
        "str" => Ok(ValueDef::ConstI64(Vec::new())),
        _ => {
            let v: Option<Vec<i64>> = data.iter().map(|x| x.as_i64().or_else(|| x.as_bool().map(i64::from))).collect();
            v.map(ValueDef::ConstI64).ok_or_else(not_numbers)
        }
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
