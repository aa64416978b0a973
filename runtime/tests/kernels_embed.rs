//! Embedding gathers against the reference evaluator (Gather, GatherBlockQuantized): exact.

mod kernel_support;

use ir::{Attr, DType, Domain, Tensor};
use kernel_support::*;
use runtime::kernels::embed::{embed_f32, embed_nbits, embed_packed};
use runtime::kernels::wgemm::{pack_wgemm, MatMulNBits, NBitsZeroPoints};
use runtime::kernels::KernelError;

#[test]
fn f32_rows_are_copied_exactly() {
    let mut rng = kernel_support::Rng::new(3);
    let (rows, hidden) = (11, 24);
    let table = rng.f32s(rows * hidden, -1.0, 1.0);
    let ids = [3u32, 0, 10, 3];
    let idx = Tensor::from_i64(DType::I64, vec![ids.len()], ids.iter().map(|&i| i as i64).collect());
    let want = reference(
        Domain::Onnx,
        "Gather",
        &attrs(&[("axis", Attr::Int(0))]),
        &[Some(&f32t(&[rows, hidden], &table)), Some(&idx)],
        1,
    );
    let mut out = vec![0f32; ids.len() * hidden];
    embed_f32(&table, hidden, &ids, &mut out).unwrap();
    assert_bits("Gather", &out, &f32s(&want[0]));
    assert_eq!(
        embed_f32(&table, hidden, &[11], &mut out[..hidden]),
        Err(KernelError::IdOutOfRange { id: 11, rows: 11 })
    );
}

#[test]
fn quantised_rows_dequantise_exactly_as_gather_block_quantized() {
    let mut rng = kernel_support::Rng::new(5);
    for (bits, block, hidden, zp_kind) in
        [(8, 32, 576, 0), (4, 32, 96, 0), (4, 32, 96, 1), (8, 16, 64, 1), (4, 16, 48, 2)]
    {
        let rows = 37;
        let blocks = hidden / block;
        let b = rng.bytes(rows * hidden * bits / 8);
        let scales = rng.f32s(rows * blocks, -0.05, 0.05);
        let zp_packed = rng.bytes(rows * (blocks * bits).div_ceil(8));
        let zp_float = rng.f32s(rows * blocks, 0.0, 15.0);
        let zero_points = match zp_kind {
            0 => NBitsZeroPoints::Default,
            1 => NBitsZeroPoints::Packed(&zp_packed),
            _ => NBitsZeroPoints::Float(&zp_float),
        };
        let src = MatMulNBits { k: hidden, n: rows, bits, block_size: block, b: &b, scales: &scales, zero_points };
        let ids = [36u32, 0, 17, 17, 5];
        let mut got = vec![f32::NAN; ids.len() * hidden];
        embed_nbits(&src, &ids, &mut got).unwrap();
        let want: Vec<f32> = if zp_kind == 2 {
            // GatherBlockQuantized has no float zero points: (q − z)·s by hand.
            ids.iter()
                .flat_map(|&id| {
                    let id = id as usize;
                    (0..hidden).map(move |k| (id, k))
                })
                .map(|(id, k)| {
                    let byte = b[(id * hidden + k) * bits / 8];
                    let q = ((byte >> ((k * bits) % 8)) & ((1u16 << bits) - 1) as u8) as f32;
                    (q - zp_float[id * blocks + k / block]) * scales[id * blocks + k / block]
                })
                .collect()
        } else {
            let at = attrs(&[
                ("bits", Attr::Int(bits as i64)),
                ("block_size", Attr::Int(block as i64)),
                ("gather_axis", Attr::Int(0)),
                ("quantize_axis", Attr::Int(1)),
            ]);
            let data = u8t(&[rows, hidden * bits / 8], &b);
            let idx = Tensor::from_i64(DType::I64, vec![ids.len()], ids.iter().map(|&i| i as i64).collect());
            let s = f32t(&[rows, blocks], &scales);
            let z = u8t(&[rows, (blocks * bits).div_ceil(8)], &zp_packed);
            let inputs = [Some(&data), Some(&idx), Some(&s), (zp_kind == 1).then_some(&z)];
            f32s(&reference(Domain::Microsoft, "GatherBlockQuantized", &at, &inputs, 1)[0])
        };
        let what = format!("{bits}-bit block {block} zero points {zp_kind}");
        assert_bits(&what, &got, &want);
        // The tied lm_head's packed weights give the same rows.
        let packed = pack_wgemm(&src).unwrap();
        let mut from_packed = vec![f32::NAN; ids.len() * hidden];
        embed_packed(&packed.weights(), &ids, &mut from_packed).unwrap();
        assert_bits(&format!("{what} from packed"), &from_packed, &want);
        assert_eq!(
            embed_packed(&packed.weights(), &[37], &mut from_packed[..hidden]),
            Err(KernelError::IdOutOfRange { id: 37, rows })
        );
    }
}
