//! `xdna/plan.json` as `bundle::xdna` writes and reads it: a plan decodes to what was encoded; a
//! plan with a field missing, misspelled, of the wrong type, of another format, or calling a design
//! it does not list is refused naming the file and the JSON path; and the rows routing.

use bundle::xdna::{
    route_rows, ArrayCall, DesignKind, PlanChain, PlanChunk, PlanDesign, PlanError, PlanGemm, PlanGemvChunk,
    PlanProgram, PlanShape, PlanSite, PlanTiling, QgemvFeed, QgemvLayout, XdnaPlan, PLAN_FILE, PLAN_FORMAT,
};
use serde_json::Value;

fn tiling(m: usize) -> PlanTiling {
    PlanTiling {
        device: "npu1".into(),
        shape: PlanShape { m, k: 64, n: 96 },
        padded: PlanShape { m, k: 64, n: 128 },
        m: 16,
        k: 64,
        n: 32,
        rows: 4,
        cols: 4,
        l1_bytes: 12_288,
        l2_bytes: 65_536,
        compute_cycles: 1_000,
        dma_cycles: 800,
        total_cycles: 1_200,
        utilisation: 0.375,
    }
}

fn design(name: &str, m: usize, built: bool) -> PlanDesign {
    PlanDesign {
        name: name.into(),
        file: format!("xdna/{name}.mlir"),
        pretty: format!("xdna/{name}.pretty.mlir"),
        build: format!("aiecc.py --no-xchesscc xdna/{name}.pretty.mlir"),
        kind: if name.starts_with("gemv") { DesignKind::Gemv } else { DesignKind::Gemm },
        array_columns: 4,
        tiling: tiling(m),
        qgemv: None,
        insts: built.then(|| format!("xdna/{name}.insts.bin")),
        xclbin: built.then(|| format!("xdna/{name}.xclbin")),
        pdi: built.then(|| format!("xdna/{name}.pdi")),
        aiecc_error: (!built).then(|| "aiecc failed (exit status: 1): peano not found".into()),
    }
}

fn plan() -> XdnaPlan {
    XdnaPlan {
        format: PLAN_FORMAT.into(),
        device: "npu1".into(),
        host_threshold_rows: 16,
        gemv_rows: 8,
        decode_rows: 64,
        prefill_rows: 256,
        max_design_cols: 4096,
        max_gemv_cols: 16384,
        designs: vec![
            design("gemm_64x64x96_npu1", 64, true),
            design("gemm_256x64x96_npu1", 256, false),
            design("gemv_8x64x96_npu1", 8, true),
        ],
        gemms: vec![PlanGemm {
            site: PlanSite {
                node: "/q_proj/MatMul".into(),
                op: "npuc::QGemm".into(),
                k: 64,
                n: 96,
                weight: "q.weight".into(),
                transposed: false,
                passes: 2,
                first_pass_columns: 48,
            },
            // The main pass's columns, then its residual pass's, which take the first pass only.
            chunks: [(0, 2), (48, 1)]
                .map(|(col_offset, passes)| PlanChunk {
                    col_offset,
                    cols: 48,
                    decode_design: "gemm_64x64x96_npu1".into(),
                    prefill_design: "gemm_256x64x96_npu1".into(),
                    passes,
                })
                .to_vec(),
            gemv_chunks: vec![PlanGemvChunk { col_offset: 0, cols: 96, design: "gemv_8x64x96_npu1".into() }],
        }],
        chains: vec![],
        programs: vec![],
        mlir: Some("2 designs verified by MLIR (22.1.0)".into()),
        artifacts: None,
    }
}

/// A qgemv design of one row, 64 values a row, 64 outputs summing the weight's two passes.
fn qgemv_design(name: &str) -> PlanDesign {
    let layout = QgemvLayout {
        feed: QgemvFeed::Norm,
        rows: 1,
        padded_k: 64,
        padded_n: 64,
        part_k: 64,
        parts: 1,
        tile_cols: 8,
        tiles: 1,
        streams: 8,
        passes: 2,
        pairs: true,
        w_rows: 17,
        scales_per_row: 16,
    };
    PlanDesign { kind: DesignKind::Qgemv, qgemv: Some(layout), ..design(name, 1, true) }
}

/// [`plan`] with the projection chained: its norm, quantisation, QGemm and passes' sum.
fn chained_plan() -> XdnaPlan {
    let mut p = plan();
    p.designs.push(qgemv_design("qgemv2_1x64x48_npu1_pairs"));
    p.chains.push(PlanChain {
        qgemm: "/q_proj/MatMul".into(),
        feed: QgemvFeed::Norm,
        nodes: ["inverse_rms", "quantize", "scale", "/q_proj/MatMul", "main", "residual", "sum"]
            .map(String::from)
            .to_vec(),
        inputs: vec!["x".into()],
        gamma: Some("norm.weight".into()),
        output: "q".into(),
        sum: None,
        k: 64,
        n: 48,
        pairs: true,
        rows: 1,
        chunks: vec![PlanGemvChunk { col_offset: 0, cols: 48, design: "qgemv2_1x64x48_npu1_pairs".into() }],
        block_rows: 0,
        block_chunks: vec![],
    });
    p
}

#[test]
fn a_chained_plan_decodes_to_what_was_encoded_and_its_chains_must_call_qgemv_designs_that_take_them() {
    let p = chained_plan();
    assert_eq!(XdnaPlan::decode(&p.encode()).unwrap(), p);
    let edited = |edit: &dyn Fn(&mut XdnaPlan)| {
        let mut p = chained_plan();
        edit(&mut p);
        malformed_at(XdnaPlan::decode(&p.encode()))
    };
    let path = "chains[0].chunks[0].design";
    let (at, message) = edited(&|p| p.chains[0].chunks[0].design = "gemv_8x64x96_npu1".into());
    assert_eq!(at, path);
    assert!(message.contains("`/q_proj/MatMul` calls design `gemv_8x64x96_npu1`"), "{message}");
    assert_eq!(edited(&|p| p.chains[0].feed = QgemvFeed::Gate).0, path, "a design of another feed");
    assert_eq!(edited(&|p| p.chains[0].feed = QgemvFeed::SumNorm).0, path, "a sum-fed chain on norm-fed designs");
    let (at, message) = edited(&|p| p.chains[0].sum = Some("/h".into()));
    assert!(at == "chains[0].feed" && message.contains("has one"), "a sum without its design: {at}: {message}");
    let (at, message) = edited(&|p| p.chains[0].inputs.push("o".into()));
    assert!(at == "chains[0].feed" && message.contains("reads 2 and has none"), "{at}: {message}");
    assert_eq!(edited(&|p| p.chains[0].rows = 2).0, path, "more rows than the design's");
    assert_eq!(edited(&|p| p.chains[0].chunks[0].cols = 72).0, path, "more columns than the design's");
    assert_eq!(edited(&|p| p.chains[0].k = 96).0, path, "longer rows than the design's");
    // A verify step's chunks must name designs of its block's rows.
    let block = |p: &mut XdnaPlan| {
        p.chains[0].block_rows = 8;
        p.chains[0].block_chunks = p.chains[0].chunks.clone();
    };
    let (at, message) = edited(&block);
    assert_eq!(at, "chains[0].block_chunks[0].design");
    assert!(message.contains("taking 8 rows"), "{message}");
}

/// The plan's JSON after `edit`, decoded.
fn decode_edited(edit: impl FnOnce(&mut Value)) -> Result<XdnaPlan, PlanError> {
    let mut json: Value = serde_json::from_slice(&plan().encode()).unwrap();
    edit(&mut json);
    XdnaPlan::decode(&serde_json::to_vec(&json).unwrap())
}

fn malformed_at(result: Result<XdnaPlan, PlanError>) -> (String, String) {
    match result {
        Err(PlanError::Malformed { file, path, message }) => {
            assert_eq!(file, PLAN_FILE);
            (path, message)
        }
        other => panic!("expected a malformed plan, got {other:?}"),
    }
}

#[test]
fn a_plan_decodes_to_what_was_encoded() {
    let p = plan();
    let bytes = p.encode();
    assert_eq!(XdnaPlan::decode(&bytes).unwrap(), p);
    // Absent optional members are left out, not written as null.
    let text = String::from_utf8(bytes).unwrap();
    assert!(!text.contains("null") && !text.contains("\"artifacts\""), "{text}");
}

#[test]
fn a_site_without_residual_columns_leaves_the_field_out() {
    let mut p = plan();
    p.gemms[0].site.first_pass_columns = 0;
    let text = String::from_utf8(p.encode()).unwrap();
    assert!(!text.contains("first_pass_columns"), "{text}");
    assert_eq!(XdnaPlan::decode(text.as_bytes()).unwrap(), p);
}

#[test]
fn the_plan_is_written_with_sorted_keys() {
    let text = String::from_utf8(plan().encode()).unwrap();
    let top: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  \"") && !l.starts_with("   "))
        .map(|l| l.trim().split('"').nth(1).unwrap())
        .collect();
    let mut sorted = top.clone();
    sorted.sort_unstable();
    assert_eq!(top, sorted);
}

#[test]
fn a_missing_field_is_refused_naming_its_path() {
    let (path, message) = malformed_at(decode_edited(|j| {
        j["designs"][1]["tiling"]["padded"].as_object_mut().unwrap().remove("n");
    }));
    assert_eq!(path, "designs[1].tiling.padded");
    assert!(message.contains("missing field `n`"), "{message}");
    let (path, message) = malformed_at(decode_edited(|j| {
        j.as_object_mut().unwrap().remove("host_threshold_rows");
    }));
    assert_eq!(path, ".");
    assert!(message.contains("missing field `host_threshold_rows`"), "{message}");
}

#[test]
fn a_misspelled_field_is_refused_naming_it() {
    let (path, message) = malformed_at(decode_edited(|j| {
        let chunk = j["gemms"][0]["chunks"][0].as_object_mut().unwrap();
        let v = chunk.remove("col_offset").unwrap();
        chunk.insert("col_ofset".into(), v);
    }));
    assert!(path.starts_with("gemms[0].chunks[0]"), "{path}");
    assert!(message.contains("unknown field `col_ofset`"), "{message}");
}

#[test]
fn a_field_of_the_wrong_type_is_refused_naming_it() {
    let (path, message) = malformed_at(decode_edited(|j| j["designs"][0]["tiling"]["cols"] = "four".into()));
    assert_eq!(path, "designs[0].tiling.cols");
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn a_chunk_calling_an_unlisted_design_is_refused() {
    let (path, message) =
        malformed_at(decode_edited(|j| j["gemms"][0]["chunks"][0]["prefill_design"] = "gemm_nope".into()));
    assert_eq!(path, "gemms[0].chunks[0].prefill_design");
    assert!(message.contains("/q_proj/MatMul") && message.contains("gemm_nope"), "{message}");
}

#[test]
fn another_format_is_refused_before_its_fields() {
    let err = decode_edited(|j| {
        j["format"] = "npuc-xdna-plan/7".into();
        j.as_object_mut().unwrap().remove("designs");
    })
    .unwrap_err();
    assert_eq!(err, PlanError::Format { file: PLAN_FILE, found: "npuc-xdna-plan/7".into(), expected: PLAN_FORMAT });
    // An older plan (no qgemv layouts, no chains) is refused with the remedy.
    let err = decode_edited(|j| j["format"] = "npuc-xdna-plan/5".into()).unwrap_err();
    assert!(err.to_string().contains("recompile the bundle"), "{err}");
    assert!(err.to_string().contains(PLAN_FILE), "{err}");
    let (path, _) = malformed_at(XdnaPlan::decode(b"{\"designs\": []"));
    assert_eq!(path, ".");
}

#[test]
fn rows_below_the_threshold_run_as_gemv_blocks_and_the_rest_is_cut_into_gemm_blocks() {
    assert_eq!(route_rows(16, 0, 64, 256, 15), None, "no GEMV designs: the host");
    assert_eq!(route_rows(16, 8, 64, 256, 0), None);
    assert_eq!(route_rows(16, 8, 64, 256, 1), Some(vec![(8, 1)]));
    assert_eq!(route_rows(16, 8, 64, 256, 8), Some(vec![(8, 8)]));
    assert_eq!(route_rows(16, 8, 64, 256, 9), Some(vec![(8, 8), (8, 1)]));
    assert_eq!(route_rows(16, 8, 64, 256, 15), Some(vec![(8, 8), (8, 7)]));
    assert_eq!(route_rows(16, 8, 0, 256, 100), None);
    assert_eq!(route_rows(16, 8, 64, 256, 16), Some(vec![(64, 16)]));
    assert_eq!(route_rows(16, 8, 64, 256, 300), Some(vec![(256, 256), (64, 44)]));
    assert_eq!(route_rows(16, 8, 64, 32, 100), Some(vec![(64, 64), (64, 36)]));
    assert_eq!(plan().route(400), Some(vec![(256, 256), (256, 144)]));
    assert_eq!(plan().route(3), Some(vec![(8, 3)]));
}

#[test]
fn a_call_runs_as_gemv_blocks_over_the_gemv_chunks_or_m_blocks_per_chunk_with_its_passes() {
    let p = plan();
    let g = &p.gemms[0];
    let call = |design, (col_offset, cols), (first, used), block_rows| ArrayCall {
        design,
        col_offset,
        cols,
        first,
        used,
        block_rows,
    };
    let gemv = "gemv_8x64x96_npu1";
    // Decode: the stacked passes' rows (here 2 × 6) in 8-row blocks, over the one wide chunk.
    assert_eq!(p.calls(g, 12), Some(vec![call(gemv, (0, 96), (0, 8), 8), call(gemv, (0, 96), (8, 4), 8)]));
    // 2 × 150 rows: the main columns take all 300, the residual's the first pass's 150.
    let (small, large) = ("gemm_64x64x96_npu1", "gemm_256x64x96_npu1");
    assert_eq!(
        p.calls(g, 300),
        Some(vec![
            call(large, (0, 48), (0, 256), 256),
            call(small, (0, 48), (256, 44), 64),
            call(large, (48, 48), (0, 150), 256),
        ])
    );
    let without = PlanGemm { gemv_chunks: vec![], ..g.clone() };
    assert_eq!(p.calls(&without, 12), None, "no GEMV chunks: the host");
    assert_eq!(p.design(gemv).unwrap().kind, DesignKind::Gemv);
}

#[test]
fn a_chunk_of_more_passes_than_its_site_is_refused() {
    let (path, message) = malformed_at(decode_edited(|j| j["gemms"][0]["chunks"][1]["passes"] = 3.into()));
    assert_eq!(path, "gemms[0].chunks[1].passes");
    assert!(message.contains("3 passes"), "{message}");
}

#[test]
fn a_gemv_block_as_large_as_a_gemm_block_is_refused() {
    let (path, message) = malformed_at(decode_edited(|j| j["gemv_rows"] = 64.into()));
    assert_eq!(path, "gemv_rows");
    assert!(message.contains("ambiguous"), "{message}");
    let (path, _) = malformed_at(decode_edited(|j| j["gemms"][0]["gemv_chunks"][0]["design"] = "gemv_nope".into()));
    assert_eq!(path, "gemms[0].gemv_chunks[0].design");
}

#[test]
fn a_program_must_be_a_gate_up_chain_then_a_down_chain() {
    let mut p = chained_plan();
    let mut gate = qgemv_design("gqgemv2_1x24x48_npu1_pairs");
    gate.qgemv.as_mut().unwrap().feed = QgemvFeed::Gate;
    p.designs.push(gate);
    let down = PlanChain {
        qgemm: "/down_proj/MatMul".into(),
        feed: QgemvFeed::Gate,
        inputs: vec!["gate".into(), "up".into()],
        gamma: None,
        k: 24,
        chunks: vec![PlanGemvChunk { col_offset: 0, cols: 48, design: "gqgemv2_1x24x48_npu1_pairs".into() }],
        ..p.chains[0].clone()
    };
    p.chains.push(down);
    p.programs.push(PlanProgram {
        name: "mlp_q".into(),
        file: "xdna/mlp_q.mlir".into(),
        pretty: "xdna/mlp_q.pretty.mlir".into(),
        chains: vec![0, 1],
        between: vec!["gate_slice".into(), "up_slice".into()],
        array_columns: 4,
        insts: None,
        pdi: None,
    });
    assert_eq!(XdnaPlan::decode(&p.encode()).unwrap(), p);
    for chains in [vec![1, 0], vec![0], vec![0, 2], vec![0, 0]] {
        let mut q = p.clone();
        q.programs[0].chains = chains.clone();
        let (at, message) = malformed_at(XdnaPlan::decode(&q.encode()));
        assert_eq!(at, "programs[0].chains", "{chains:?}");
        assert!(message.contains("program `mlp_q` is not a gate/up chain then a down chain"), "{message}");
    }
}
