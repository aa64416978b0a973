//! ARCHITECTURE.md's crate graph is the workspace's: the ```crates block lists each workspace crate
//! with the workspace crates it depends on (normal dependencies; `name(feature)` for an optional
//! one and the feature that enables it), and cargo's own metadata must say the same.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

type Graph = BTreeMap<String, Vec<String>>;

/// The graph the document draws.
fn documented() -> Graph {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ARCHITECTURE.md")).unwrap();
    let start = text.find("```crates\n").expect("ARCHITECTURE.md has a ```crates block") + "```crates\n".len();
    let block = &text[start..start + text[start..].find("```").expect("the block is closed")];
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            let name = words.next().unwrap();
            let mut deps: Vec<String> = words.collect();
            deps.sort();
            (name, deps)
        })
        .collect()
}

/// The graph cargo resolves from the manifests.
fn actual() -> Graph {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    let members: Vec<&str> = packages.iter().map(|p| p["name"].as_str().unwrap()).collect();
    packages.iter().map(|p| (p["name"].as_str().unwrap().to_string(), workspace_deps(p, &members))).collect()
}

/// A package's normal dependencies on workspace crates, an optional one with its feature.
fn workspace_deps(package: &Value, members: &[&str]) -> Vec<String> {
    let features = package["features"].as_object().unwrap();
    let mut deps: Vec<String> = package["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"].is_null() && members.contains(&d["name"].as_str().unwrap()))
        .map(|d| {
            let name = d["name"].as_str().unwrap();
            if !d["optional"].as_bool().unwrap_or(false) {
                return name.to_string();
            }
            let enabling = format!("dep:{name}");
            let feature = features
                .iter()
                .find(|(_, enables)| enables.as_array().unwrap().iter().any(|e| e.as_str() == Some(enabling.as_str())))
                .map(|(f, _)| f.as_str())
                .unwrap_or("?");
            format!("{name}({feature})")
        })
        .collect();
    deps.sort();
    deps
}

#[test]
fn the_documented_crate_graph_is_cargos() {
    let (documented, actual) = (documented(), actual());
    for (name, deps) in &actual {
        assert_eq!(documented.get(name), Some(deps), "crate `{name}`: ARCHITECTURE.md against Cargo.toml");
    }
    let extra: Vec<&String> = documented.keys().filter(|k| !actual.contains_key(*k)).collect();
    assert!(extra.is_empty(), "ARCHITECTURE.md lists crates the workspace does not have: {extra:?}");
}

#[test]
fn the_runtime_side_reaches_no_compiler_crate_in_the_documented_graph() {
    // What the document promises in words, read off its own graph: below the runtime are only
    // crates that are not the compiler's.
    let g = documented();
    let mut below = vec!["runtime".to_string()];
    let mut seen = Vec::new();
    while let Some(c) = below.pop() {
        for d in &g[&c] {
            let d = d.split('(').next().unwrap().to_string();
            if !seen.contains(&d) {
                seen.push(d.clone());
                below.push(d);
            }
        }
    }
    seen.sort();
    assert_eq!(seen, ["bundle", "xdna-driver"]);
}
