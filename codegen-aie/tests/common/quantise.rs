//! The row quantisation's calls as a core makes them, shared by the tests of its exact-value
//! sources (the norm's products, the gate's values).

use codegen_aie::interp;

/// The exact values' row quantisation as a core calls it, K part by K part: the row state
/// reset (`slots` f32 a row), the running maximum (`names[0]`) over every part, the first scale,
/// the codes (`names[1]`), and with two passes the second scale and the residual codes
/// (`names[2]`), each function taking its part (`parts[q]`) first. The codes pass by pass, row
/// by row, and the scales.
pub fn quantise_parts(
    funcs: &[interp::Function],
    names: [&str; 3],
    parts: &[Vec<i32>],
    (m, k, passes, slots): (usize, usize, usize, usize),
) -> (Vec<i8>, Vec<f32>) {
    use codegen_aie::qkernels;
    let f = |name: &str| funcs.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no @{name}"));
    let call = |name: &str, mut args: Vec<Vec<i32>>| {
        f(name).call(&mut args).unwrap_or_else(|e| panic!("@{name}: {e}"));
        args
    };
    let mut rs = call(qkernels::RESET, vec![vec![0; slots * m]]).remove(0);
    for part in parts {
        rs = call(names[0], vec![part.clone(), rs]).remove(1);
    }
    rs = call(qkernels::PRODUCT_SCALE[0], vec![rs]).remove(0);
    let mut codes = Vec::with_capacity(passes * parts.len());
    for (pass, name) in names[1..=passes].iter().enumerate() {
        if pass == 1 {
            rs = call(qkernels::PRODUCT_SCALE[1], vec![rs]).remove(0);
        }
        for part in parts {
            let mut out = call(name, vec![part.clone(), rs, vec![0; m * k]]);
            codes.push(out.remove(2));
            rs = out.remove(1);
        }
    }
    let n = parts.len();
    let ordered = (0..passes).flat_map(|p| (0..m).flat_map(move |i| (0..n).map(move |q| (p * n + q, i))));
    let codes = ordered.flat_map(|(c, i)| codes[c][i * k..(i + 1) * k].iter().map(|&v| v as i8).collect::<Vec<_>>());
    let scales = (0..passes).flat_map(|p| (0..m).map(move |i| (2 * p + 1) * m + i));
    (codes.collect(), scales.map(|at| f32::from_bits(rs[at] as u32)).collect())
}
