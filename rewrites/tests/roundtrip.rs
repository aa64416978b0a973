//! Graph → e-graph → extracted graph with no rules is the same program, with identical nodes
//! shared (the e-graph's hash-consing is common-subexpression elimination).

mod common;

#[test]
fn exporters_files_round_trip_through_the_egraph_unchanged() {
    let names = [
        "llama-optimum",
        "llama-torch-dynamo",
        "qwen3-builder-int4",
        "llama-qdq-per-channel-u8",
        "qwen3-torch-dynamo-opset23",
    ];
    for name in names {
        let g = common::import(name);
        let (back, report) = rewrites::saturate::rewrite_with(&g, &[]);
        assert!(report.type_conflicts.is_empty());
        assert!(back.nodes.len() <= g.nodes.len(), "{name}: nodes were added");
        let ops = |g: &ir::Graph| g.op_census().into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(ops(&back), ops(&g), "{name}: the set of ops changed");
        back.verify().unwrap();
        let err = common::worst_relative_error(&back, name);
        assert!(err <= 1e-4, "{name}: {err:e}");
    }
}
