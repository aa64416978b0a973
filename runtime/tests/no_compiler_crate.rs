//! The runtime depends on no compiler crate, under any feature: a bundle is the only thing that
//! crosses from the compiler to the runtime. Cargo's own resolve (`cargo metadata`, every feature
//! of the workspace on, this host's platform) is walked from the runtime along normal
//! dependencies, as `cargo tree -p runtime --all-features -e normal` shows them.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::process::Command;

/// The compiler's crates and the e-graph library only the compiler links.
const COMPILER_CRATES: [&str; 7] = ["ir", "egg", "rewrites", "passes", "frontend", "codegen-aie", "codegen-intel"];

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

/// This host's target triple, as rustc reports it.
fn host_triple() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().expect("running rustc -vV");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().find_map(|l| l.strip_prefix("host: ")).expect("rustc -vV names the host").trim().to_string()
}

/// `cargo metadata` with every feature on, offline when the sources are already here.
fn metadata() -> Value {
    let args = ["metadata", "--format-version", "1", "--all-features", "--filter-platform", &host_triple()];
    let offline = cargo().args(args).arg("--offline").output().expect("running cargo metadata");
    let out = if offline.status.success() { offline } else { cargo().args(args).output().expect("cargo metadata") };
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Every package reached from `root` along normal (not dev, not build) dependency edges, by name,
/// with the chain of package names that reaches it.
fn reached_normally(meta: &Value, root: &str) -> HashMap<String, Vec<String>> {
    let name_of: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id"), p["name"].as_str().expect("name")))
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("a resolve")
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root_id = name_of.iter().find(|(_, &n)| n == root).map(|(&id, _)| id).expect("the root package");
    let mut chains: HashMap<String, Vec<String>> = HashMap::from([(root.to_string(), vec![root.to_string()])]);
    let mut queue = VecDeque::from([root_id]);
    while let Some(id) = queue.pop_front() {
        let chain = chains[name_of[id]].clone();
        for dep in nodes[id]["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            let dep_id = dep["pkg"].as_str().expect("pkg");
            let name = name_of[dep_id];
            if normal && !chains.contains_key(name) {
                chains.insert(name.to_string(), [chain.clone(), vec![name.to_string()]].concat());
                queue.push_back(dep_id);
            }
        }
    }
    chains
}

#[test]
fn the_runtime_reaches_no_compiler_crate_under_any_feature() {
    let reached = reached_normally(&metadata(), "runtime");
    // The walk saw the optional dependencies, so the features were on.
    for optional in ["xdna-driver", "openvino"] {
        assert!(reached.contains_key(optional), "the walk did not reach `{optional}`: were the features on?");
    }
    let mut found: Vec<&Vec<String>> = COMPILER_CRATES.iter().filter_map(|c| reached.get(*c)).collect();
    found.sort_by_key(|chain| chain.len());
    let chains: Vec<String> = found.iter().map(|chain| chain.join(" → ")).collect();
    assert!(chains.is_empty(), "the runtime depends on compiler crates: {}", chains.join("; "));
}
