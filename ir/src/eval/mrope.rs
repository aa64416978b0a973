//! com.microsoft MRotaryEmbedding: the multimodal rotary embedding of Qwen2-VL, Qwen3-VL and
//! Qwen3.5, whose text tokens the onnxruntime-genai builder rotates with it.
//!
//! Each token has three positions (temporal, height, width: `position_ids` `[3, B, S]`), and
//! each of the `rot/2` frequencies takes its cos/sin from the cache row of one of them, chosen
//! by `mrope_section = [t, h, w]` (summing to `rot/2`): layout 0 gives the first t frequencies
//! the temporal position, the next h the height and the last w the width; layout 1 (interleaved)
//! starts from the temporal position everywhere, then gives frequency i the height when
//! `i mod 3 = 1` and `i < 3h`, the width when `i mod 3 = 2` and `i < 3w`. The rotation is then
//! com.microsoft RotaryEmbedding's (rotate-half or interleaved pairs, the first `rot` values of
//! each head). As for RotaryEmbedding, the `scale` attribute is not applied.

use super::attention::{apply_rotary, rotary_layout};
use super::{float_tensor, int_values, require_float, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::Tensor;

/// Which of the three position streams frequency `i` reads.
fn stream_of(i: usize, sections: [usize; 3], interleaved_layout: bool) -> usize {
    if interleaved_layout {
        match i % 3 {
            1 if i < 3 * sections[1] => 1,
            2 if i < 3 * sections[2] => 2,
            _ => 0,
        }
    } else if i < sections[0] {
        0
    } else if i < sections[0] + sections[1] {
        1
    } else {
        2
    }
}

fn read_sections(cx: &Ctx) -> Res<([usize; 3], bool)> {
    let sections = match cx.attrs().ints("mrope_section")? {
        Some(&[t, h, w]) if t >= 0 && h >= 0 && w >= 0 => [t as usize, h as usize, w as usize],
        Some(s) => bail!("mrope_section must be 3 non-negative values, got {s:?}"),
        None => bail!("attribute mrope_section is required"),
    };
    let interleaved_layout = match cx.attrs().int_or("mrope_layout", 0)? {
        0 => false,
        1 => true,
        l => bail!("mrope_layout {l} is not 0 (sectioned) or 1 (interleaved)"),
    };
    Ok((sections, interleaved_layout))
}

/// MRotaryEmbedding: input `[B, S, hidden]` (with `num_heads`) or `[B, N, S, H]`,
/// position_ids `[3, B, S]`, caches `[max_pos, rot/2]`.
pub(super) fn m_rotary_embedding(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, ids, cos, sin) =
        (cx.input(0, "input")?, cx.input(1, "position_ids")?, cx.input(2, "cos_cache")?, cx.input(3, "sin_cache")?);
    require_float(x, "input")?;
    require_float(cos, "cos_cache")?;
    require_float(sin, "sin_cache")?;
    if cx.attrs().int_or("is_packed_batching", 0)? != 0 {
        bail!("packed batching is not supported");
    }
    let (sections, interleaved_layout) = read_sections(cx)?;
    let interleaved = cx.attrs().int_or("interleaved", 0)? != 0;
    let rot_attr = cx.attrs().int_or("rotary_embedding_dim", 0)?.max(0) as usize;
    let mut num_heads = cx.attrs().int_or("num_heads", 0)?.max(0) as usize;
    let half = match cos.shape[..] {
        [_, h] if h > 0 && sin.shape == cos.shape => h,
        _ => bail!("cos {:?} and sin {:?} caches must be one [max_position, rot/2] shape", cos.shape, sin.shape),
    };
    if x.rank() == 3 && num_heads == 0 {
        if rot_attr != 0 {
            bail!("num_heads is required with rotary_embedding_dim");
        }
        num_heads = x.shape[2] / (2 * half);
    }
    let layout = rotary_layout(x, num_heads)?;
    let rot = if rot_attr == 0 { layout.head } else { rot_attr };
    if rot > layout.head || half * 2 != rot || sections.iter().sum::<usize>() != half {
        bail!("rotary dim {rot}, caches {:?} and mrope_section {sections:?} (summing to rot/2) disagree", cos.shape);
    }
    let (batch, seq) = (layout.batch, layout.seq);
    if ids.shape != [3, batch, seq] {
        bail!("position_ids must be [3, {batch}, {seq}], got {:?}", ids.shape);
    }
    let positions = int_values(ids, "position_ids")?;
    let (cv, sv) = (cos.to_f64_vec(), sin.to_f64_vec());
    let rows = cos.shape[0];
    let (mut c, mut s) = (Vec::with_capacity(batch * seq * half), Vec::with_capacity(batch * seq * half));
    for token in 0..batch * seq {
        for i in 0..half {
            let p = positions[stream_of(i, sections, interleaved_layout) * batch * seq + token];
            if p < 0 || p as usize >= rows {
                bail!("position {p} is outside the {rows} rows of the cos/sin cache");
            }
            c.push(cv[p as usize * half + i]);
            s.push(sv[p as usize * half + i]);
        }
    }
    let table = |v: Vec<f64>| float_tensor(DType::F64, vec![batch * seq, half], v);
    let out = apply_rotary(x, layout, (&table(c), &table(s)), interleaved, |b, t| Ok(b * seq + t))?;
    Ok(vec![out])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::stream_of;
    use crate::attr::Attr;

    #[test]
    fn interleaved_layout_assigns_height_and_width_to_every_third_frequency() {
        let streams: Vec<usize> = (0..8).map(|i| stream_of(i, [3, 3, 2], true)).collect();
        assert_eq!(streams, [0, 1, 2, 0, 1, 2, 0, 1]);
        let sectioned: Vec<usize> = (0..8).map(|i| stream_of(i, [3, 3, 2], false)).collect();
        assert_eq!(sectioned, [0, 0, 0, 1, 1, 1, 2, 2]);
    }

    #[test]
    fn malformed_mrope_is_an_error_naming_the_problem() {
        let x = f32t(&[1, 1, 4], &[1.0; 4]);
        let (cache, ids) = (f32t(&[4, 2], &[0.5; 8]), i64t(&[3, 1, 1], &[0, 1, 2]));
        let run = |sections: &[i64], inputs: &[Option<&_>]| {
            let a = [("mrope_section", Attr::Ints(sections.to_vec())), ("num_heads", Attr::Int(1))];
            err_msg(run_ms("MRotaryEmbedding", &a, inputs, 1))
        };
        let ok = [Some(&x), Some(&ids), Some(&cache), Some(&cache)];
        assert!(run(&[1, 2, 0], &ok).contains("mrope_section [1, 2, 0] (summing to rot/2) disagree"));
        assert!(run(&[1, 1], &ok).contains("mrope_section must be 3 non-negative values"));
        let flat_ids = i64t(&[1, 1], &[0]);
        assert!(run(&[1, 1, 0], &[Some(&x), Some(&flat_ids), Some(&cache), Some(&cache)])
            .contains("position_ids must be [3, 1, 1]"));
        let far = i64t(&[3, 1, 1], &[0, 9, 0]);
        assert!(run(&[1, 1, 0], &[Some(&x), Some(&far), Some(&cache), Some(&cache)])
            .contains("position 9 is outside the 4 rows"));
    }
}
