//! The targets `npuc compile` writes bundles for, each one [`Target`]: its name, its pass
//! pipeline, and how its program becomes bundle files. The registry [`TARGETS`] is the one list
//! the CLI, `compile` and `passes` read; adding a target is a pipeline in `passes::targets`, an
//! impl here with its line in [`TARGETS`], and its name in the manifest's `bundle::Target`.

use anyhow::{anyhow, bail, Result};
use bundle::BundleWriter;
use ir::graph::Graph;
use serde_json::Value;

use crate::compile::weights::HostPacking;

/// The options of `npuc compile` that belong to one target or another.
#[derive(Clone, Debug, Default)]
pub struct TargetArgs {
    pub intel: Option<crate::intel::IntelArgs>,
    /// XDNA device (`--device`).
    pub device: Option<String>,
}

/// A compilation target.
pub trait Target: Sync {
    /// The name in the CLI and the manifest.
    fn id(&self) -> bundle::Target;

    /// One line for `--help` and errors.
    fn about(&self) -> &'static str;

    /// The passes that turn an imported graph into this target's program.
    fn pipeline(&self) -> Vec<Box<dyn passes::Pass>> {
        passes::targets::target(self.id().as_str()).expect("every target has a pipeline").pipeline()
    }

    /// Refuses options this target does not take, before any work.
    fn check(&self, args: &TargetArgs) -> Result<()> {
        if let Some(d) = &args.device {
            bail!("--device {d} applies to --target xdna only");
        }
        Ok(())
    }

    /// The pipeline's program lowered for the device: what the bundle stores and emits.
    fn lower(&self, program: Graph, args: &TargetArgs) -> Result<Box<dyn Lowered>>;
}

/// A program lowered for one target.
pub trait Lowered {
    /// The program the host executor runs (the device's numerics, where it has its own).
    fn program(&self) -> &Graph;

    /// Which weights the bundle stores packed for the host kernels.
    fn host_packing(&self) -> HostPacking {
        HostPacking::All
    }

    /// Writes the target's own files into the bundle; returns what the compile summary shows.
    fn emit(&self, w: &mut BundleWriter) -> Result<Emitted>;
}

/// What a target adds to the compile summary: a member of `--json` and lines of text.
#[derive(Default)]
pub struct Emitted {
    pub json: Option<(&'static str, Value)>,
    pub lines: Vec<String>,
}

/// Every target, in the order `--help` lists them.
pub static TARGETS: &[&dyn Target] = &[&Cpu, &Xdna, &IntelNpu];

/// The target called `name`; the error lists the others.
pub fn target(name: &str) -> Result<&'static dyn Target> {
    TARGETS.iter().copied().find(|t| t.id().as_str() == name).ok_or_else(|| {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.id().as_str()).collect();
        anyhow!("unknown target `{name}` (targets: {})", names.join(", "))
    })
}

/// Every target's name and line, for the CLI's value parser (`--help` lists them).
pub fn possible_values() -> Vec<clap::builder::PossibleValue> {
    TARGETS.iter().map(|t| clap::builder::PossibleValue::new(t.id().as_str()).help(t.about())).collect()
}

/// A program for the host executor and nothing else.
struct HostOnly(Graph);

impl Lowered for HostOnly {
    fn program(&self) -> &Graph {
        &self.0
    }

    fn emit(&self, _: &mut BundleWriter) -> Result<Emitted> {
        Ok(Emitted::default())
    }
}

pub struct Cpu;

impl Target for Cpu {
    fn id(&self) -> bundle::Target {
        bundle::Target::Cpu
    }

    fn about(&self) -> &'static str {
        "the host executor: fused float, 4-bit weight-only and A8W8 programs on this CPU"
    }

    fn lower(&self, program: Graph, _: &TargetArgs) -> Result<Box<dyn Lowered>> {
        Ok(Box::new(HostOnly(program)))
    }
}

pub struct Xdna;

struct XdnaProgram {
    program: Graph,
    device: codegen_aie::Device,
}

impl Target for Xdna {
    fn id(&self) -> bundle::Target {
        bundle::Target::Xdna
    }

    fn about(&self) -> &'static str {
        "AMD XDNA NPUs (npu1, npu2): int8 projection GEMMs as MLIR-AIE designs, the rest on the host"
    }

    fn check(&self, args: &TargetArgs) -> Result<()> {
        crate::xdna::device(args.device.as_deref()).map(|_| ())
    }

    fn lower(&self, program: Graph, args: &TargetArgs) -> Result<Box<dyn Lowered>> {
        let device = crate::xdna::device(args.device.as_deref())?;
        Ok(Box::new(XdnaProgram { program, device }))
    }
}

impl Lowered for XdnaProgram {
    fn program(&self) -> &Graph {
        &self.program
    }

    /// The designs stream the `[K, N]` int8 codes (and any f32 weights) themselves.
    fn host_packing(&self) -> HostPacking {
        HostPacking::WGemmOnly
    }

    fn emit(&self, w: &mut BundleWriter) -> Result<Emitted> {
        let summary = crate::xdna::add_to_bundle(&self.program, self.device, w)?;
        Ok(Emitted { lines: crate::xdna::summary_lines(&summary), json: Some(("xdna", summary)) })
    }
}

pub struct IntelNpu;

impl Target for IntelNpu {
    fn id(&self) -> bundle::Target {
        bundle::Target::IntelNpu
    }

    fn about(&self) -> &'static str {
        "Intel NPUs through OpenVINO: weightless fp16 IR segments cut at attention, host paged attention"
    }

    fn lower(&self, program: Graph, args: &TargetArgs) -> Result<Box<dyn Lowered>> {
        let intel = args.intel.clone().ok_or_else(|| anyhow!("intel-npu needs its options"))?;
        Ok(Box::new(crate::intel::compile(&program, &intel)?))
    }
}

/// The IR and the host program it agrees with (symmetric weights).
impl Lowered for codegen_intel::IntelIr {
    fn program(&self) -> &Graph {
        &self.host_program
    }

    fn emit(&self, w: &mut BundleWriter) -> Result<Emitted> {
        crate::intel::write(w, self)?;
        Ok(Emitted {
            json: Some(("intel", crate::intel::summary(self))),
            lines: vec![crate::intel::summary_line(self)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{compile, Options};
    use std::collections::BTreeMap;

    /// A target made here: the cpu pipeline, QGemm codes kept `[K, N]` as a device would stream
    /// them, and one file of its own — everything a new target brings, in one impl.
    struct Toy;

    struct ToyProgram(Graph);

    impl Target for Toy {
        fn id(&self) -> bundle::Target {
            bundle::Target::Cpu
        }

        fn about(&self) -> &'static str {
            "a target that lists its program's ops"
        }

        fn lower(&self, program: Graph, _: &TargetArgs) -> Result<Box<dyn Lowered>> {
            Ok(Box::new(ToyProgram(program)))
        }
    }

    impl Lowered for ToyProgram {
        fn program(&self) -> &Graph {
            &self.0
        }

        fn host_packing(&self) -> HostPacking {
            HostPacking::WGemmOnly
        }

        fn emit(&self, w: &mut BundleWriter) -> Result<Emitted> {
            let census = census(self.0.nodes.iter().map(|n| format!("{}::{}", n.domain, n.op)));
            w.add_file("toy/ops.json", serde_json::to_string(&census)?.as_bytes())?;
            Ok(Emitted { json: Some(("toy", serde_json::json!({ "ops": census.len() }))), lines: vec![] })
        }
    }

    fn census(ops: impl Iterator<Item = String>) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for op in ops {
            *counts.entry(op).or_insert(0) += 1;
        }
        counts
    }

    fn corpus_model(name: &str) -> std::path::PathBuf {
        let fixtures = std::env::var_os("NPUC_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"));
        let model = fixtures.join("corpus").join(name).join("model.onnx");
        assert!(model.is_file(), "{} is missing: run `make corpus`", model.display());
        model
    }

    #[test]
    fn a_target_is_one_impl_and_compile_needs_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let output = tmp.path().join("toy.npub");
        let o = Options {
            model: corpus_model("llama-qdq-per-tensor-s8"),
            target: "toy".to_string(),
            output: output.clone(),
            tokenizer: None,
            overwrite: false,
            sync: true,
            json: true,
            drafter: true,
            args: TargetArgs::default(),
        };
        let written = compile(&Toy, &o).unwrap();
        let b = bundle::Bundle::open(&output, Some("cpu")).unwrap();
        // Its file is in the bundle and lists the program the bundle holds.
        let listed: BTreeMap<String, usize> = serde_json::from_slice(&b.read_file("toy/ops.json").unwrap()).unwrap();
        assert_eq!(listed, census(b.program().nodes.iter().map(|n| n.op.clone())));
        assert!(listed.contains_key("npuc::QGemm"), "{listed:?}");
        // Its packing choice was followed: QGemm codes stored as they are, none packed.
        assert_eq!(written.stored.qgemm, 0);
        assert!(b.tensors().all(|t| !t.name.contains(".qgemm.")));
        assert_eq!(
            written.emitted.json.as_ref().map(|(k, v)| (*k, v["ops"].as_u64())),
            Some(("toy", Some(listed.len() as u64)))
        );
        // The same model for `cpu` packs them: the difference is the target's doing.
        let cpu = Options { output: tmp.path().join("cpu.npub"), target: "cpu".to_string(), ..o };
        assert!(compile(target("cpu").unwrap(), &cpu).unwrap().stored.qgemm > 0);
    }

    #[test]
    fn the_registry_names_every_manifest_target_once() {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.id().as_str()).collect();
        let manifest: Vec<&str> = bundle::Target::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, manifest);
        let error = target("gpu").err().unwrap().to_string();
        assert!(error.contains("gpu") && manifest.iter().all(|n| error.contains(n)), "{error}");
    }
}
