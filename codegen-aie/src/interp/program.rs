//! Array programs of several designs: a module whose main `aie.device` has a runtime sequence of
//! `aiex.configure @design { aiex.run @sequence(args) }` phases, as mlir-aie reconfigures the
//! array between designs within one command. Each phase runs its design on the program's host
//! buffers the run names, in order, so a phase's output buffer is a later phase's input as
//! written, the host never reading it between them.

use super::{host_buffers, parse_memref, run_device, run_err, Arg, InterpError, Op, RunStats};

/// The module's `aie.device` operations.
pub(super) fn devices(module: &Op) -> Vec<&Op> {
    module.regions.first().map(|b| b.ops.iter().filter(|o| o.name == "aie.device").collect()).unwrap_or_default()
}

/// A device's `aie.runtime_sequence`.
pub(super) fn sequence(device: &Op) -> Option<&Op> {
    device.regions.first()?.ops.iter().find(|o| o.name == "aie.runtime_sequence")
}

/// The device whose runtime sequence configures others, if the module is a program.
pub(super) fn main_device<'o>(devices: &[&'o Op]) -> Option<&'o Op> {
    let configures = |d: &&Op| sequence(d).is_some_and(|s| s.regions[0].ops.iter().any(|o| o.name == "aiex.configure"));
    devices.iter().copied().find(configures)
}

/// Runs the program's phases on host buffers made from `inputs` (the main sequence's
/// arguments); returns the last argument's words and the phases' statistics summed.
pub(super) fn run(devices: &[&Op], main: &Op, inputs: &[Arg]) -> Result<(Vec<Vec<i32>>, RunStats), InterpError> {
    let Some(seq) = sequence(main) else { return run_err("the main device has no aie.runtime_sequence") };
    let block = &seq.regions[0];
    let mut host = host_buffers(block, inputs)?;
    let mut stats = RunStats::default();
    for op in &block.ops {
        if op.name != "aiex.configure" {
            return run_err(format!("line {}: {} in a program's sequence (only aiex.configure)", op.line, op.name));
        }
        let name = op.symbol("symbol")?;
        let sym = format!("\"{name}\"");
        let device = devices.iter().find(|d| d.attr("sym_name") == Some(sym.as_str()));
        let Some(&device) = device.filter(|d| !std::ptr::eq(**d, main)) else {
            return run_err(format!("line {}: aiex.configure of @{name}, which the module has no device for", op.line));
        };
        for run in &op.regions[0].ops {
            let phase = run_phase(device, run, (block, &mut host))?;
            stats.dmas += phase.dmas;
            stats.cores = stats.cores.max(phase.cores);
            for (f, n) in phase.calls {
                *stats.calls.entry(f).or_default() += n;
            }
        }
    }
    Ok((host, stats))
}

/// One `aiex.run` of `device`'s sequence on the main sequence's buffers it names: each of the
/// same type as the argument it becomes, none named twice.
fn run_phase(device: &Op, run: &Op, (main, host): (&super::Block, &mut [Vec<i32>])) -> Result<RunStats, InterpError> {
    let at = |msg: String| run_err(format!("line {}: {msg}", run.line));
    if run.name != "aiex.run" {
        return at(format!("{} in aiex.configure (only aiex.run)", run.name));
    }
    let Some(args) = sequence(device).map(|s| &s.regions[0].args) else { return at("no sequence to run".into()) };
    let mut indices = vec![];
    for (j, operand) in run.operands.iter().enumerate() {
        let Some(i) = main.args.iter().position(|(n, _)| n == operand) else {
            return at(format!("operand {operand} is not an argument of the program's sequence"));
        };
        let (given, want) = (parse_memref(&main.args[i].1), args.get(j).and_then(|(_, ty)| parse_memref(ty)));
        let size = |m: Option<(Vec<usize>, String)>| m.map(|(s, e)| (s.iter().product::<usize>(), e));
        if size(given) != size(want) || indices.contains(&i) {
            return at(format!("argument {j} ({operand}) does not fit the sequence's {:?}", args.get(j)));
        }
        indices.push(i);
    }
    if indices.len() != args.len() {
        return at(format!("{} arguments for a sequence of {}", indices.len(), args.len()));
    }
    let mut phase: Vec<Vec<i32>> = indices.iter().map(|&i| std::mem::take(&mut host[i])).collect();
    let stats = run_device(device, &mut phase);
    for (j, &i) in indices.iter().enumerate() {
        host[i] = std::mem::take(&mut phase[j]);
    }
    stats
}
