//! The targets and their pipelines.
//!
//! `cpu` runs the host pipeline: canonicalize, then saturate with every default rule family,
//! extracting under the host cost model, then position-tables and lower-slices. `xdna` adds `array-int8`: every projection becomes the
//! int8 × int8 → int32 `QGemm` the AIE array computes (per-channel int8 weights, activations
//! quantised per row at run time), so its program has the array's numerics wherever it runs;
//! then `array-norms`: a norm feeding a projection quantises `x·γ` and multiplies the row
//! scales by its `1/rms`; then `array-gates`: a SwiGlu feeding one is computed in integers with
//! its quantisation (`QuantizeSwiGlu`).
//! `intel-npu` computes in fp16, so its saturate adds a third phase, the `fp16-rescale` family,
//! and extracts under `Fp16Cost`: its program has the row-scaled RmsNorm, SkipRmsNorm and WGemm.

use crate::array_gates::ArrayGates;
use crate::array_int8::ArrayInt8;
use crate::array_norms::ArrayNorms;
use crate::passes::{Canonicalize, LowerSlices, Saturate};
use crate::position_tables::PositionTables;

/// Rows of the position tables: the positions a compiled program of a model that computes RoPE
/// in the graph can run at.
pub const POSITION_TABLE_ROWS: usize = 8192;
use crate::{Pass, Target};

pub struct Cpu;
pub struct Xdna;
pub struct IntelNpu;

fn host_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Canonicalize),
        Box::new(Saturate::with_families(rewrites::families())),
        Box::new(PositionTables { rows: POSITION_TABLE_ROWS }),
        Box::new(LowerSlices),
    ]
}

/// The host pipeline with the fp16 phase in saturate.
fn fp16_pipeline() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Canonicalize),
        Box::new(Saturate::for_fp16(rewrites::families(), rewrites::fp16_families())),
        Box::new(PositionTables { rows: POSITION_TABLE_ROWS }),
        Box::new(LowerSlices),
    ]
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
        let mut p = host_pipeline();
        p.push(Box::new(ArrayInt8));
        p.push(Box::new(ArrayNorms));
        p.push(Box::new(ArrayGates));
        p
    }
}

impl Target for IntelNpu {
    fn name(&self) -> &'static str {
        "intel-npu"
    }
    fn pipeline(&self) -> Vec<Box<dyn Pass>> {
        fp16_pipeline()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver;
    use ir::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
    use ir::{Attr, Attrs, DType, Dim, Domain, Tensor};
    use std::collections::HashMap;

    const HIDDEN: usize = 16;

    fn value(g: &mut Graph, name: &str, dtype: DType, shape: &[usize], def: ValueDef) -> ValueId {
        let shape = shape.iter().map(|&d| Dim::known(d as i64)).collect();
        g.values.push(Value { name: name.into(), dtype, shape, def });
        ValueId(g.values.len() as u32 - 1)
    }

    fn konst(g: &mut Graph, name: &str, t: Tensor) -> ValueId {
        let (dtype, shape) = (t.dtype, t.shape.clone());
        value(g, name, dtype, &shape, ValueDef::Const(t))
    }

    fn node(
        g: &mut Graph,
        domain: Domain,
        op: &'static str,
        attrs: &[(&str, Attr)],
        inputs: &[ValueId],
        out: &str,
    ) -> ValueId {
        let mut a = Attrs::default();
        for (k, v) in attrs {
            a.set(k, v.clone());
        }
        let id = NodeId(g.nodes.len() as u32);
        let y = value(g, out, DType::F32, &[2, HIDDEN], ValueDef::Node { node: id, output: 0 });
        g.nodes.push(Node {
            name: out.into(),
            domain,
            op,
            opset: 21,
            attrs: a,
            inputs: inputs.iter().map(|&v| Some(v)).collect(),
            outputs: vec![y],
        });
        y
    }

    /// A decoder layer's skeleton over two tokens of width 16, as onnxruntime-genai writes it:
    /// `h = MatMulNBits(SimplifiedLayerNormalization(x)); out = SimplifiedLayerNormalization(x + h)`.
    fn layer() -> Graph {
        let mut g = Graph {
            name: "layer".into(),
            values: vec![],
            nodes: vec![],
            inputs: vec![],
            outputs: vec![],
            weights: Default::default(),
            assumptions: vec![],
        };
        let x = value(&mut g, "x", DType::F32, &[2, HIDDEN], ValueDef::Input);
        g.inputs.push(x);
        let gamma: Vec<f32> = (0..HIDDEN).map(|i| 0.5 + i as f32 / 16.0).collect();
        let g1 = konst(&mut g, "gamma1", Tensor::from_f32(DType::F32, vec![HIDDEN], gamma.clone()));
        let g2 =
            konst(&mut g, "gamma2", Tensor::from_f32(DType::F32, vec![HIDDEN], gamma.iter().rev().copied().collect()));
        let codes: Vec<i64> = (0..HIDDEN * HIDDEN / 2).map(|i| ((i * 37 + 11) % 256) as i64).collect();
        let b = konst(&mut g, "B", Tensor::from_i64(DType::U8, vec![HIDDEN, 1, HIDDEN / 2], codes));
        let scales = konst(
            &mut g,
            "scales",
            Tensor::from_f32(DType::F32, vec![HIDDEN], (0..HIDDEN).map(|i| 0.01 + i as f32 * 1e-3).collect()),
        );
        let eps = [("epsilon", Attr::Float(1e-5)), ("axis", Attr::Int(-1))];
        let y = node(&mut g, Domain::Onnx, "SimplifiedLayerNormalization", &eps, &[x, g1], "y");
        let nbits = [
            ("K", Attr::Int(HIDDEN as i64)),
            ("N", Attr::Int(HIDDEN as i64)),
            ("bits", Attr::Int(4)),
            ("block_size", Attr::Int(HIDDEN as i64)),
        ];
        let h = node(&mut g, Domain::Microsoft, "MatMulNBits", &nbits, &[y, b, scales], "h");
        let s = node(&mut g, Domain::Onnx, "Add", &[], &[x, h], "s");
        let out = node(&mut g, Domain::Onnx, "SimplifiedLayerNormalization", &eps, &[s, g2], "out");
        g.outputs.push(out);
        g.verify().unwrap();
        g
    }

    fn ops_after(target_name: &str) -> (Vec<String>, Graph) {
        let t = target(target_name).unwrap();
        let out = driver::run(&t.pipeline(), layer(), None, |_, _| {}).unwrap_or_else(|e| panic!("{target_name}: {e}"));
        let mut ops: Vec<String> =
            out.graph.nodes.iter().filter(|n| n.domain == Domain::Npuc).map(|n| n.op.to_string()).collect();
        ops.sort();
        (ops, out.graph)
    }

    /// Residual rows of magnitude ~4·10⁴ (x² = 1.6·10⁹ is far beyond fp16) and rows of magnitude
    /// ~0.02 (mean square 4·10⁻⁴; ε = 10⁻⁵ is subnormal in fp16).
    fn adversarial_input() -> HashMap<String, Tensor> {
        let big = (0..HIDDEN).map(|i| if i % 3 == 0 { -4.0e4 } else { 3.1e4 + i as f32 });
        let small = (0..HIDDEN).map(|i| 0.02 * if i % 2 == 0 { 1.0 } else { -0.75 });
        HashMap::from([("x".to_string(), Tensor::from_f32(DType::F32, vec![2, HIDDEN], big.chain(small).collect()))])
    }

    #[test]
    fn xdna_computes_the_projection_in_int8() {
        let (ops, xdna) = ops_after("xdna");
        // The activations in two int8 passes, stacked rows of one QGemm over the weight; the
        // norm feeding it as x·γ and its 1/rms, the one writing the output as it was.
        assert_eq!(ops, ["InverseRms", "QGemm", "QuantizeRows", "SkipRmsNorm"]);
        let passes = |op: &str| xdna.nodes.iter().find(|n| n.op == op).map(|n| n.attrs.int("passes").unwrap());
        assert_eq!((passes("QuantizeRows"), passes("QGemm")), (Some(Some(2)), Some(Some(2))));
        let (_, cpu) = ops_after("cpu");
        let input = adversarial_input();
        let (a, b) = (ir::run::run_graph(&xdna, &input).unwrap(), ir::run::run_graph(&cpu, &input).unwrap());
        let (a, b) = (a["out"].to_f64_vec(), b["out"].to_f64_vec());
        let worst = a.iter().zip(&b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        // int8 rows and columns: the output (a normalised sum) moves, by less than 5%.
        assert!(worst > 0.0 && worst < 0.05 * b.iter().fold(0.0f64, |m, v| m.max(v.abs())), "{worst}");
    }

    #[test]
    fn intel_npu_extracts_the_row_scaled_forms_and_cpu_does_not() {
        let (npu, npu_graph) = ops_after("intel-npu");
        assert_eq!(npu, ["RmsNormRowScaled", "SkipRmsNormRowScaled", "WGemmRowScaled"]);
        {
            let host = "cpu";
            let (ops, host_graph) = ops_after(host);
            assert_eq!(ops, ["RmsNorm", "SkipRmsNorm", "WGemm"], "{host}");
            let input = adversarial_input();
            let want = &ir::run::run_graph(&host_graph, &input).unwrap()["out"];
            let got = &ir::run::run_graph(&npu_graph, &input).unwrap()["out"];
            let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
            let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let worst = a.iter().zip(&b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
            assert!(worst <= 1e-6 * scale, "{host}: {worst:e} of {scale:e}");
        }
    }

    #[test]
    fn intel_npu_saturate_reports_the_fp16_phase() {
        let t = target("intel-npu").unwrap();
        let out = driver::run(&t.pipeline(), layer(), Some("saturate"), |_, _| {}).unwrap();
        let summary = &out.reports.last().unwrap().detail.summary;
        assert!(summary.contains("fp16: saturated"), "{summary}");
        let t = target("cpu").unwrap();
        let out = driver::run(&t.pipeline(), layer(), Some("saturate"), |_, _| {}).unwrap();
        let summary = &out.reports.last().unwrap().detail.summary;
        assert!(!summary.contains("fp16"), "{summary}");
    }
}
