//! `xdna/plan.json` as `bundle::xdna` writes and reads it: a plan decodes to what was encoded; a
//! plan with a field missing, misspelled, of the wrong type, of another format, or calling a design
//! it does not list is refused naming the file and the JSON path; and the rows routing.

use bundle::xdna::{
    block_design, route_rows, DesignKind, PlanChunk, PlanDesign, PlanError, PlanGemm, PlanShape, PlanSite, PlanTiling,
    XdnaPlan, PLAN_FILE, PLAN_FORMAT, PLAN_FORMAT_V2,
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
            },
            chunks: vec![PlanChunk {
                col_offset: 0,
                cols: 96,
                decode_design: "gemm_64x64x96_npu1".into(),
                prefill_design: "gemm_256x64x96_npu1".into(),
                gemv_design: Some("gemv_8x64x96_npu1".into()),
            }],
        }],
        mlir: Some("2 designs verified by MLIR (22.1.0)".into()),
        artifacts: None,
    }
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
fn a_site_without_passes_is_one_pass_as_plans_before_stacked_passes_were() {
    let p = decode_edited(|j| {
        j["gemms"][0]["site"].as_object_mut().unwrap().remove("passes");
    })
    .unwrap();
    assert_eq!((plan().gemms[0].site.passes, p.gemms[0].site.passes), (2, 1));
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
        j["format"] = "npuc-xdna-plan/4".into();
        j.as_object_mut().unwrap().remove("designs");
    })
    .unwrap_err();
    assert_eq!(err, PlanError::Format { file: PLAN_FILE, found: "npuc-xdna-plan/4".into(), expected: PLAN_FORMAT });
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
fn each_block_names_its_design() {
    let p = plan();
    let chunk = &p.gemms[0].chunks[0];
    let names: Vec<Option<&str>> = [8, 64, 256].iter().map(|&rows| p.block_design(chunk, rows)).collect();
    assert_eq!(names, [Some("gemv_8x64x96_npu1"), Some("gemm_64x64x96_npu1"), Some("gemm_256x64x96_npu1")]);
    let without = PlanChunk { gemv_design: None, ..chunk.clone() };
    assert_eq!(block_design(&without, 8, 64, 8), None, "a chunk without a GEMV design has none to name");
    assert_eq!(p.design("gemv_8x64x96_npu1").unwrap().kind, DesignKind::Gemv);
}

#[test]
fn a_plan_of_format_2_reads_as_a_plan_without_gemv_designs() {
    let p = decode_edited(|j| {
        j["format"] = PLAN_FORMAT_V2.into();
        j.as_object_mut().unwrap().remove("gemv_rows");
        j["designs"].as_array_mut().unwrap().pop();
        for d in j["designs"].as_array_mut().unwrap() {
            d.as_object_mut().unwrap().remove("kind");
            d.as_object_mut().unwrap().remove("array_columns");
        }
        j["gemms"][0]["chunks"][0].as_object_mut().unwrap().remove("gemv_design");
    })
    .unwrap();
    assert_eq!((p.format.as_str(), p.gemv_rows), (PLAN_FORMAT_V2, 0));
    assert!(p.designs.iter().all(|d| d.kind == DesignKind::Gemm && d.array_columns == d.tiling.cols));
    assert_eq!(p.gemms[0].chunks[0].gemv_design, None);
    assert_eq!(p.route(1), None, "its decode calls stay on the host");
    assert_eq!(p.route(20), Some(vec![(64, 20)]));
}

#[test]
fn a_gemv_block_as_large_as_a_gemm_block_is_refused() {
    let (path, message) = malformed_at(decode_edited(|j| j["gemv_rows"] = 64.into()));
    assert_eq!(path, "gemv_rows");
    assert!(message.contains("ambiguous"), "{message}");
    let (path, _) = malformed_at(decode_edited(|j| j["gemms"][0]["chunks"][0]["gemv_design"] = "gemv_nope".into()));
    assert_eq!(path, "gemms[0].chunks[0].gemv_design");
}
