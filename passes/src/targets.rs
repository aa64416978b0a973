//! The targets and their pipelines.
//!
//! Today all three share the host pipeline (canonicalize, saturate with every rule family); the
//! device passes (fp16 rescaling, partitioning, static token blocks, packing, planning) join the
//! `xdna` and `intel-npu` pipelines as they are built.

use crate::passes::{Canonicalize, Saturate};
use crate::{Pass, Target};

pub struct Cpu;
pub struct Xdna;
pub struct IntelNpu;

fn host_pipeline() -> Vec<Box<dyn Pass>> {
    vec![Box::new(Canonicalize), Box::new(Saturate::with_families(rewrites::families()))]
}

impl Target for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn pipeline(&self) -> Vec<Box<dyn Pass>> {
        host_pipeline()
    }
}

impl Target for Xdna {
    fn name(&self) -> &'static str {
        "xdna"
    }
    fn pipeline(&self) -> Vec<Box<dyn Pass>> {
        host_pipeline()
    }
}

impl Target for IntelNpu {
    fn name(&self) -> &'static str {
        "intel-npu"
    }
    fn pipeline(&self) -> Vec<Box<dyn Pass>> {
        host_pipeline()
    }
}

/// The target called `name`.
pub fn target(name: &str) -> Option<Box<dyn Target>> {
    match name {
        "cpu" => Some(Box::new(Cpu)),
        "xdna" => Some(Box::new(Xdna)),
        "intel-npu" => Some(Box::new(IntelNpu)),
        _ => None,
    }
}

pub const TARGET_NAMES: &[&str] = &["cpu", "xdna", "intel-npu"];
