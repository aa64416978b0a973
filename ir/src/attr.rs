//! Node attributes, kept as ONNX names them so the printer and the evaluator read the same thing.

use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    Strs(Vec<String>),
    Tensor(Tensor),
}

/// Attributes by name, sorted so printing is stable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs(pub BTreeMap<String, Attr>);

/// An attribute is present with the wrong kind.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("attribute `{name}` should be {expected}")]
pub struct AttrError {
    pub name: String,
    pub expected: &'static str,
}

impl Attrs {
    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.get(name)
    }

    pub fn set(&mut self, name: &str, value: Attr) {
        self.0.insert(name.to_string(), value);
    }

    /// Removes an attribute; its value, if it had one.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        self.0.remove(name)
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "an int" }),
        }
    }

    pub fn int_or(&self, name: &str, default: i64) -> Result<i64, AttrError> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    pub fn float(&self, name: &str) -> Result<Option<f32>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Float(v)) => Ok(Some(*v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "a float" }),
        }
    }

    pub fn float_or(&self, name: &str, default: f32) -> Result<f32, AttrError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn ints(&self, name: &str) -> Result<Option<&[i64]>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "a list of ints" }),
        }
    }

    pub fn floats(&self, name: &str) -> Result<Option<&[f32]>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "a list of floats" }),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&str>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Str(v)) => Ok(Some(v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "a string" }),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<Option<&Tensor>, AttrError> {
        match self.0.get(name) {
            None => Ok(None),
            Some(Attr::Tensor(v)) => Ok(Some(v)),
            Some(_) => Err(AttrError { name: name.into(), expected: "a tensor" }),
        }
    }
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, v: &[T]) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{x}")?;
            }
            f.write_str("]")
        }
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => write!(f, "{v:e}"),
            Attr::Str(v) => write!(f, "{v:?}"),
            Attr::Ints(v) => list(f, v),
            Attr::Floats(v) => {
                let s: Vec<String> = v.iter().map(|x| format!("{x:e}")).collect();
                list(f, &s)
            }
            Attr::Strs(v) => {
                let s: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
                list(f, &s)
            }
            Attr::Tensor(t) => {
                if t.numel() <= 8 {
                    write!(f, "tensor<{}{:?}>{:?}", t.dtype, t.shape, crate::tensor::Data::clone(&t.data))
                } else {
                    write!(f, "tensor<{}{:?}>", t.dtype, t.shape)
                }
            }
        }
    }
}
