//! The cores' code a design carries (`codegen_aie::kernels`), executed from its MLIR text by the
//! interpreter, against an independent Rust reference of the same blocked-layout int8 GEMM:
//! int32-exact on random blocks (accumulating into random int32, wrapping) for npu1's 4×8×8 and
//! npu2's 8×8×8 micro-tiles (the GEMM cores' vector form, the GEMV cores' scalar loops fused and
//! unfused alike); and a body whose arithmetic is wrong — a loop bound off by one, a wrong block
//! — gives a wrong result.

mod common;

use codegen_aie::interp::{self, Function};
use codegen_aie::kernels::{self, MATMUL, ZERO};
use codegen_aie::Device;

/// `c += a · b` on the micro-block layout: `a` [m/r][k/s][r][s], `b` [k/s][n/t][s][t], `c`
/// [m/r][n/t][r][t], in wrapping int32.
fn reference(device: Device, (m, k, n): (usize, usize, usize), a: &[i32], b: &[i32], c: &mut [i32]) {
    let (r, s, t) = device.micro_tile();
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0i32;
            for kk in 0..k {
                let av = a[((i / r) * (k / s) + kk / s) * r * s + (i % r) * s + kk % s];
                let bv = b[((kk / s) * (n / t) + j / t) * s * t + (kk % s) * t + j % t];
                acc = acc.wrapping_add(av * bv);
            }
            let at = ((i / r) * (n / t) + j / t) * r * t + (i % r) * t + j % t;
            c[at] = c[at].wrapping_add(acc);
        }
    }
}

/// The generic text of a module holding the core functions of a tile.
fn module_text(device: Device, mkn: (usize, usize, usize)) -> String {
    let funcs: String = kernels::core_functions(device, mkn).iter().map(|f| f.generic(2)).collect();
    format!("\"builtin.module\"() ({{\n{funcs}}}) : () -> ()\n")
}

fn function<'f>(funcs: &'f [Function], name: &str) -> &'f Function {
    funcs.iter().find(|f| f.name == name).unwrap()
}

fn random_i32(len: usize, seed: u64) -> Vec<i32> {
    common::xorshift(seed).take(len).map(|x| (x >> 16) as u32 as i32).collect()
}

/// The interpreted `matmul_i8_i32` of `text` and the reference on the same random blocks.
fn matmul_both(text: &str, fused: bool, device: Device, mkn: (usize, usize, usize), seed: u64) -> (Vec<i32>, Vec<i32>) {
    let (m, k, n) = mkn;
    let funcs = interp::module_functions(text, fused).unwrap();
    let a: Vec<i32> = common::values(m * k, seed).into_iter().map(i32::from).collect();
    let b: Vec<i32> = common::values(k * n, seed + 1).into_iter().map(i32::from).collect();
    // Near-extreme accumulators so a sum that does not wrap as int32 shows.
    let c: Vec<i32> = random_i32(m * n, seed + 2).into_iter().map(|x| x | 0x7fff_0000).collect();
    let mut want = c.clone();
    reference(device, mkn, &a, &b, &mut want);
    let mut mems = vec![a, b, c];
    function(&funcs, MATMUL).call(&mut mems).unwrap();
    (mems.pop().unwrap(), want)
}

const SHAPES: [(usize, usize, usize); 3] = [(8, 8, 8), (16, 32, 24), (32, 64, 64)];

#[test]
fn the_matmul_body_equals_the_reference_int32_exactly_on_npu1_and_npu2() {
    for device in [Device::Npu1, Device::Npu2] {
        for (i, &mkn) in SHAPES.iter().enumerate() {
            let text = module_text(device, mkn);
            for fused in [true, false] {
                let (got, want) = matmul_both(&text, fused, device, mkn, 10 + i as u64);
                assert_eq!(got, want, "{device:?} {mkn:?} fused {fused}");
            }
        }
    }
}

#[test]
fn the_zero_body_clears_every_element() {
    for device in [Device::Npu1, Device::Npu2] {
        let funcs = interp::module_functions(&module_text(device, (32, 64, 64)), true).unwrap();
        let mut mems = vec![random_i32(32 * 64, 3)];
        function(&funcs, ZERO).call(&mut mems).unwrap();
        assert!(mems[0].iter().all(|&x| x == 0));
    }
}

#[test]
fn a_body_with_wrong_arithmetic_gives_a_wrong_result() {
    let (device, mkn) = (Device::Npu1, (16, 32, 24));
    let text = module_text(device, mkn);
    // The reduction over the 4 slices of k stops one short.
    let reduce = "\"scf.for\"(%idx0, %idx4, %idx1, %c_in)";
    assert!(text.contains(reduce));
    let short = text.replacen(reduce, "\"scf.for\"(%idx0, %idx3, %idx1, %c_in)", 1);
    // Every slice of B multiplies A's first slice.
    let a_slice = "\"vector.transfer_read\"(%a, %mb, %kb, %idx0, %idx0, %pad8)";
    let first_slice = text.replacen(a_slice, "\"vector.transfer_read\"(%a, %mb, %idx0, %idx0, %idx0, %pad8)", 1);
    assert_ne!(first_slice, text);
    for (broken, what) in [(&short, "short reduction"), (&first_slice, "first slice")] {
        let (got, want) = matmul_both(broken, true, device, mkn, 4);
        assert_ne!(got, want, "{what}");
    }
}

#[test]
fn an_unknown_operation_or_an_index_out_of_bounds_is_a_clear_error() {
    let text = module_text(Device::Npu1, (16, 32, 24));
    let odd = text.replacen("\"vector.contract\"(%aw, %bw, %acc)", "\"vector.outerproduct\"(%aw, %bw, %acc)", 1);
    let err = interp::module_functions(&odd, true).unwrap_err().to_string();
    assert!(err.contains("unsupported operation vector.outerproduct") && err.contains("@matmul_i8_i32"), "{err}");
    // A's 4-row blocks read from row 1: the block's last row is past the 4 rows.
    let a_block = "\"vector.transfer_read\"(%a, %mb, %kb, %idx0, %idx0, %pad8)";
    let far = text.replacen(a_block, "\"vector.transfer_read\"(%a, %mb, %kb, %idx1, %idx0, %pad8)", 1);
    let funcs = interp::module_functions(&far, true).unwrap();
    let mut mems = vec![vec![0; 16 * 32], vec![0; 32 * 24], vec![0; 16 * 24]];
    let err = function(&funcs, MATMUL).call(&mut mems).unwrap_err();
    assert!(err.to_string().contains("index 4 outside a dimension of 4"), "{err}");
    // A transfer the interpreter does not model (here: not in bounds) is refused, not guessed.
    let masked = text.replacen("in_bounds = [true, true]", "in_bounds = [false, true]", 1);
    let err = interp::module_functions(&masked, true).unwrap_err().to_string();
    assert!(err.contains("in bounds over the innermost dimensions"), "{err}");
}

#[test]
fn fused_and_unfused_reductions_wrap_alike_at_other_widths() {
    // The GEMV body accumulating in int16: sums of int8 products overflow it, and both ways of
    // running the reduction wrap them as int16 does.
    let rkn = (2, 64, 8);
    let funcs: String = kernels::gemv_functions(Device::Npu1, rkn).iter().map(|f| f.generic(2)).collect();
    let text = format!("\"builtin.module\"() ({{\n{funcs}}}) : () -> ()\n");
    let text = text.replace("xi32>", "xi16>").replace(": i32", ": i16").replace("i32)", "i16)");
    let text = text.replace("-> i32", "-> i16").replace("i32,", "i16,");
    assert!(text.contains("\"arith.addi\"(%acc, %prod) : (i16, i16) -> i16") && !text.contains("i32>"), "{text}");
    let (rows, k, n) = rkn;
    let a: Vec<i32> = common::values(rows * k, 21).into_iter().map(|x| i32::from(x).abs().clamp(100, 127)).collect();
    let w: Vec<i32> = common::values(n * k, 22).into_iter().map(|x| i32::from(x).abs().clamp(100, 127)).collect();
    let mut want = vec![0; rows * n];
    gemv_reference(rkn, &a, &w, &mut want);
    let run = |fused| {
        let funcs = interp::module_functions(&text, fused).unwrap();
        let mut mems = vec![a.clone(), w.clone(), vec![0; rows * n]];
        function(&funcs, kernels::GEMV).call(&mut mems).unwrap();
        mems.pop().unwrap()
    };
    let (fused, unfused) = (run(true), run(false));
    assert_eq!(fused, unfused);
    assert_ne!(fused, want);
    assert_eq!(fused, want.iter().map(|&x| x as i16 as i32).collect::<Vec<_>>());
}

/// `c[i][j] += Σₗ a[i][l] · w[j][l]` with `a` `[rows][k]`, `w` the weight transposed `[n][k]`, in
/// wrapping int32.
fn gemv_reference((rows, k, n): (usize, usize, usize), a: &[i32], w: &[i32], c: &mut [i32]) {
    for i in 0..rows {
        for j in 0..n {
            let dot = (0..k).fold(0i32, |acc, l| acc.wrapping_add(a[i * k + l] * w[j * k + l]));
            c[i * n + j] = c[i * n + j].wrapping_add(dot);
        }
    }
}

/// Rows that are not whole micro-blocks (1, 3) take the scalar loops; 8 rows, the plans' blocks,
/// the vector form on both devices.
#[test]
fn the_gemv_bodies_equal_the_reference_int32_exactly_fused_and_unfused() {
    let cases = [(1, 8, 8), (3, 64, 24), (8, 1016, 16), (8, 64, 24)].into_iter().enumerate();
    for (i, (device, rkn)) in cases.flat_map(|(i, c)| [(i, (Device::Npu1, c)), (i, (Device::Npu2, c))]) {
        let (rows, k, n) = rkn;
        let funcs = kernels::gemv_functions(device, rkn);
        let vector = funcs.iter().any(|f| f.generic(0).contains("vector.contract"));
        assert_eq!(vector, rows == 8, "{device:?} {rkn:?}");
        let funcs: String = funcs.iter().map(|f| f.generic(2)).collect();
        let text = format!("\"builtin.module\"() ({{\n{funcs}}}) : () -> ()\n");
        for fused in [true, false] {
            let funcs = interp::module_functions(&text, fused).unwrap();
            let seed = 60 + i as u64;
            let a: Vec<i32> = common::values(rows * k, seed).into_iter().map(i32::from).collect();
            let w: Vec<i32> = common::values(n * k, seed + 1).into_iter().map(i32::from).collect();
            let c: Vec<i32> = random_i32(rows * n, seed + 2).into_iter().map(|x| x | 0x7fff_0000).collect();
            let mut want = c.clone();
            gemv_reference(rkn, &a, &w, &mut want);
            let mut mems = vec![a, w, c];
            function(&funcs, kernels::GEMV).call(&mut mems).unwrap();
            assert_eq!(mems[2], want, "{device:?} {rkn:?} fused {fused}");
            let mut zeroed = vec![mems.pop().unwrap()];
            function(&funcs, kernels::GEMV_ZERO).call(&mut zeroed).unwrap();
            assert!(zeroed[0].iter().all(|&x| x == 0), "{rkn:?}");
        }
    }
}
