//! The program a bundle runs (`npuc-program/1`), stored in `manifest.json`: the pipeline's final
//! graph, value by value and node by node.
//!
//! ```text
//! {"format": "npuc-program/1",
//!  "values": [{"name", "dtype", "shape": [dim, ...],
//!              "def": "input" | "node" | {"weight": NAME} | {"const": {"dtype", "shape", "data"}}}],
//!  "nodes":  [{"name", "op": "domain::op", "attrs": {...},
//!              "inputs": [value index | null], "outputs": [value index]}],
//!  "inputs": [value index], "outputs": [value index]}
//! ```
//!
//! A dim is a number or the text of a symbolic dim (`past_sequence_length + sequence_length`); a
//! weight is named as `weights.safetensors` stores it. The compiler builds a [`Program`] and the
//! runtime decodes one, so the two read the same fields; [`Program::check`] holds what serde alone
//! cannot (the format tag, every value index in range, every value defined once).

use serde::{Deserialize, Serialize};

/// The program format this crate writes and reads.
pub const PROGRAM_FORMAT: &str = "npuc-program/1";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    pub format: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<usize>,
    pub outputs: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Value {
    pub name: String,
    /// The IR's dtype name (`f32`, `i64`, `u8`, ...).
    pub dtype: String,
    pub shape: Vec<Dim>,
    pub def: ValueDef,
}

/// One dimension: a size, or a symbolic size as text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    Known(i64),
    Symbolic(String),
}

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueDef {
    /// A graph input, bound by the executor (ids, positions, the cache).
    Input,
    /// The output of a node.
    Node,
    /// A tensor of `weights.safetensors`, by name.
    Weight(String),
    /// A small constant stored in the program itself.
    Const(Tensor),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

/// A constant's elements. Decoding takes integers when every element is one, so a float
/// tensor's data may come back as `Ints`: [`Tensor::floats`] and [`Tensor::ints`] read either.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TensorData {
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Doubles(Vec<f64>),
    Strs(Vec<String>),
}

impl Tensor {
    /// The elements as f32 (integers converted), or `None` for text.
    pub fn floats(&self) -> Option<Vec<f32>> {
        match &self.data {
            TensorData::Ints(v) => Some(v.iter().map(|&x| x as f32).collect()),
            TensorData::Floats(v) => Some(v.clone()),
            TensorData::Doubles(v) => Some(v.iter().map(|&x| x as f32).collect()),
            TensorData::Strs(_) => None,
        }
    }

    /// The elements when every one is an integer.
    pub fn ints(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::Ints(v) => Some(v),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    /// `domain::op`, e.g. `npuc::Attention`, `ai.onnx::Add`.
    pub op: String,
    #[serde(default)]
    pub attrs: std::collections::BTreeMap<String, Attr>,
    /// Value indices; `null` for an optional input left out.
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
}

/// A node attribute, as ONNX types them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strs(Vec<String>),
    Tensor { tensor: Tensor },
}

impl Node {
    /// A number attribute (an integer one converted).
    pub fn attr_f32(&self, name: &str) -> Option<f32> {
        match self.attrs.get(name)? {
            Attr::Float(v) => Some(*v),
            Attr::Int(v) => Some(*v as f32),
            _ => None,
        }
    }

    pub fn attr_i64(&self, name: &str) -> Option<i64> {
        match self.attrs.get(name)? {
            Attr::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        match self.attrs.get(name)? {
            Attr::Ints(v) => Some(v),
            _ => None,
        }
    }

    pub fn attr_str(&self, name: &str) -> Option<&str> {
        match self.attrs.get(name)? {
            Attr::Str(v) => Some(v),
            _ => None,
        }
    }

    /// The value index of input `i`, when the node has it.
    pub fn input(&self, i: usize) -> Option<usize> {
        self.inputs.get(i).copied().flatten()
    }
}

/// What [`Program::check`] refuses: `path` is where in the program (`nodes[3].inputs[1]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("program `{path}`: {problem}")]
pub struct ProgramError {
    pub path: String,
    pub problem: String,
}

impl Program {
    pub fn new(values: Vec<Value>, nodes: Vec<Node>, inputs: Vec<usize>, outputs: Vec<usize>) -> Program {
        Program { format: PROGRAM_FORMAT.to_string(), values, nodes, inputs, outputs }
    }

    /// The format tag, and every value index below the number of values.
    pub fn check(&self) -> Result<(), ProgramError> {
        if self.format != PROGRAM_FORMAT {
            return Err(err("format", format!("`{}` is not {PROGRAM_FORMAT}", self.format)));
        }
        let n = self.values.len();
        let in_range = |path: String, i: usize| match i < n {
            true => Ok(()),
            false => Err(err(path, format!("`{i}` is not a value index below {n}"))),
        };
        for (k, node) in self.nodes.iter().enumerate() {
            for (s, i) in node.inputs.iter().enumerate() {
                if let Some(i) = *i {
                    in_range(format!("nodes[{k}].inputs[{s}]"), i)?;
                }
            }
            for (s, &i) in node.outputs.iter().enumerate() {
                in_range(format!("nodes[{k}].outputs[{s}]"), i)?;
            }
        }
        for (list, name) in [(&self.inputs, "inputs"), (&self.outputs, "outputs")] {
            for (s, &i) in list.iter().enumerate() {
                in_range(format!("{name}[{s}]"), i)?;
            }
        }
        Ok(())
    }

    /// The names of the weights the program reads, each once, in value order.
    pub fn weight_names(&self) -> Vec<&str> {
        let mut seen = std::collections::BTreeSet::new();
        self.values
            .iter()
            .filter_map(|v| match &v.def {
                ValueDef::Weight(w) => Some(w.as_str()),
                _ => None,
            })
            .filter(|w| seen.insert(*w))
            .collect()
    }
}

fn err(path: impl Into<String>, problem: String) -> ProgramError {
    ProgramError { path: path.into(), problem }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Program {
        let value = |name: &str, def| Value {
            name: name.to_string(),
            dtype: "f32".to_string(),
            shape: vec![Dim::Known(1), Dim::Symbolic("past_sequence_length + sequence_length".to_string())],
            def,
        };
        let eps = Tensor { dtype: "f32".to_string(), shape: vec![2], data: TensorData::Floats(vec![1e-5, 0.5]) };
        let values = vec![
            value("x", ValueDef::Input),
            value("w", ValueDef::Weight("model.norm.weight".to_string())),
            value("c", ValueDef::Const(eps)),
            value("y", ValueDef::Node),
        ];
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("epsilon".to_string(), Attr::Float(1e-6));
        attrs.insert("axes".to_string(), Attr::Ints(vec![-1]));
        attrs.insert("mode".to_string(), Attr::Str("rms".to_string()));
        let node = Node {
            name: "norm".to_string(),
            op: "npuc::RmsNorm".to_string(),
            attrs,
            inputs: vec![Some(0), Some(1), None],
            outputs: vec![3],
        };
        Program::new(values, vec![node], vec![0], vec![3])
    }

    #[test]
    fn a_program_round_trips_through_its_json() {
        let p = sample();
        let text = serde_json::to_string(&p).unwrap();
        let back: Program = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        back.check().unwrap();
        assert_eq!(back.nodes[0].attr_f32("epsilon"), Some(1e-6));
        assert_eq!(back.weight_names(), ["model.norm.weight"]);
    }

    #[test]
    fn the_documented_spellings_decode() {
        let v: Value =
            serde_json::from_str(r#"{"name": "a", "dtype": "i64", "shape": [3], "def": {"const": {"dtype": "i64", "shape": [3], "data": [1, 2, 3]}}}"#)
                .unwrap();
        assert!(matches!(&v.def, ValueDef::Const(t) if t.ints() == Some(&[1, 2, 3][..])));
        let v: Value = serde_json::from_str(r#"{"name": "a", "dtype": "f32", "shape": [], "def": "input"}"#).unwrap();
        assert_eq!(v.def, ValueDef::Input);
        // Whole-number floats are written with a point and come back as floats.
        let t = Tensor { dtype: "f32".to_string(), shape: vec![1], data: TensorData::Floats(vec![2.0]) };
        let back: Tensor = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back.floats(), Some(vec![2.0]));
    }

    #[test]
    fn a_misspelled_field_and_an_index_out_of_range_are_refused_naming_them() {
        let mut json = serde_json::to_value(sample()).unwrap();
        json["nodes"][0]["input"] = json["nodes"][0]["inputs"].take();
        json["nodes"][0].as_object_mut().unwrap().remove("inputs");
        let error = serde_json::from_value::<Program>(json).unwrap_err().to_string();
        assert!(error.contains("input"), "{error}");

        let mut p = sample();
        p.nodes[0].inputs[1] = Some(9);
        let error = p.check().unwrap_err();
        assert_eq!(error.path, "nodes[0].inputs[1]");
        assert!(error.problem.contains("below 4"), "{error}");
        p = sample();
        p.format = "npuc-program/2".to_string();
        assert_eq!(p.check().unwrap_err().path, "format");
    }
}
