//! Concrete tensors: what the reference evaluator computes with and what small constants hold.
//!
//! Storage is deliberately plain. Every float type is held as `f32` values that are exactly
//! representable in the tensor's dtype (an f16 tensor holds f32 values that are f16 values),
//! `f64` as `f64`, and every integer type and bool as `i64`, so integer arithmetic is exact.

use crate::dtype::DType;
use half::{bf16, f16};
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// F32, F16, BF16 and the 8/6/4-bit float types, values already rounded to the dtype.
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// Every integer type and bool, values inside the dtype's range.
    I64(Vec<i64>),
    Str(Vec<Vec<u8>>),
}

#[derive(Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    #[error("{dtype} tensor of shape {shape:?} needs {expected} bytes, found {found}")]
    ByteSize { dtype: DType, shape: Vec<usize>, expected: u64, found: u64 },
    #[error("element count of shape {0:?} overflows")]
    Overflow(Vec<usize>),
    #[error("dtype {0} has no numeric storage here")]
    Unsupported(DType),
    #[error("{0} elements given for shape {1:?}")]
    Count(usize, Vec<usize>),
}

/// Number of elements of a shape, `None` on overflow.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl Tensor {
    /// A float tensor; values are rounded to `dtype` (round to nearest even).
    pub fn from_f32(dtype: DType, shape: Vec<usize>, mut values: Vec<f32>) -> Tensor {
        assert_eq!(numel(&shape), Some(values.len()), "element count must match shape");
        if dtype == DType::F64 {
            return Tensor { dtype, shape, data: Data::F64(values.into_iter().map(f64::from).collect()) };
        }
        assert!(dtype.is_float(), "from_f32 needs a float dtype, got {dtype}");
        if dtype != DType::F32 {
            for v in values.iter_mut() {
                *v = round_to_float(dtype, *v);
            }
        }
        Tensor { dtype, shape, data: Data::F32(values) }
    }

    pub fn from_f64(shape: Vec<usize>, values: Vec<f64>) -> Tensor {
        assert_eq!(numel(&shape), Some(values.len()), "element count must match shape");
        Tensor { dtype: DType::F64, shape, data: Data::F64(values) }
    }

    /// An integer or bool tensor; values outside the dtype's range wrap as a cast in C would.
    pub fn from_i64(dtype: DType, shape: Vec<usize>, mut values: Vec<i64>) -> Tensor {
        assert_eq!(numel(&shape), Some(values.len()), "element count must match shape");
        assert!(dtype.is_int() || dtype == DType::Bool, "from_i64 needs an integer dtype, got {dtype}");
        for v in values.iter_mut() {
            *v = wrap_int(dtype, *v);
        }
        Tensor { dtype, shape, data: Data::I64(values) }
    }

    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor::from_f32(DType::F32, vec![], vec![v])
    }

    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor::from_i64(DType::I64, vec![], vec![v])
    }

    pub fn numel(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::Str(v) => v.len(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The values as f64, whatever the storage (bools and integers convert exactly up to 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Str(_) => panic!("string tensor has no numeric values"),
        }
    }

    /// The values as f32 (f64 rounds to nearest).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::F64(v) => v.iter().map(|&x| x as f32).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f32).collect(),
            Data::Str(_) => panic!("string tensor has no numeric values"),
        }
    }

    /// The values as i64 when the tensor holds integers or bools.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Decodes little-endian bytes as ONNX's `raw_data` lays them out (sub-byte types packed,
    /// element 2k in the low nibble).
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, TensorError> {
        let n = numel(&shape).ok_or_else(|| TensorError::Overflow(shape.clone()))?;
        if dtype == DType::Str || dtype == DType::C64 || dtype == DType::C128 {
            return Err(TensorError::Unsupported(dtype));
        }
        let expected = dtype.storage_bytes(n as u64).ok_or_else(|| TensorError::Overflow(shape.clone()))?;
        if expected != bytes.len() as u64 {
            return Err(TensorError::ByteSize { dtype, shape, expected, found: bytes.len() as u64 });
        }
        use DType::*;
        let data = match dtype {
            F32 => Data::F32(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
            F64 => Data::F64(bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()),
            F16 => Data::F32(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
            BF16 => Data::F32(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => {
                Data::F32(bytes.iter().map(|&b| decode_minifloat(dtype, b as u32)).collect())
            }
            F4E2M1 => Data::F32(
                (0..n).map(|i| decode_minifloat(dtype, ((bytes[i / 2] >> (4 * (i % 2))) & 0xf) as u32)).collect(),
            ),
            F6E2M3 | F6E3M2 => return Err(TensorError::Unsupported(dtype)),
            I8 => Data::I64(bytes.iter().map(|&b| b as i8 as i64).collect()),
            U8 | Bool => Data::I64(bytes.iter().map(|&b| b as i64).collect()),
            I16 => Data::I64(bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect()),
            U16 => Data::I64(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect()),
            I32 => Data::I64(bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            U32 => Data::I64(bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            I64 => Data::I64(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
            U64 => Data::I64(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as i64).collect()),
            I4 | U4 => {
                Data::I64((0..n).map(|i| wrap_int(dtype, ((bytes[i / 2] >> (4 * (i % 2))) & 0xf) as i64)).collect())
            }
            I2 | U2 => {
                Data::I64((0..n).map(|i| wrap_int(dtype, ((bytes[i / 4] >> (2 * (i % 4))) & 0x3) as i64)).collect())
            }
            Str | C64 | C128 => unreachable!("rejected above"),
        };
        Ok(Tensor { dtype, shape, data })
    }

    /// Encodes as ONNX `raw_data` bytes (the inverse of [`Tensor::from_le_bytes`]).
    pub fn to_le_bytes(&self) -> Result<Vec<u8>, TensorError> {
        use DType::*;
        let mut out = Vec::new();
        match (&self.data, self.dtype) {
            (Data::F32(v), F32) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            (Data::F32(v), F16) => v.iter().for_each(|x| out.extend_from_slice(&f16::from_f32(*x).to_le_bytes())),
            (Data::F32(v), BF16) => v.iter().for_each(|x| out.extend_from_slice(&bf16::from_f32(*x).to_le_bytes())),
            (Data::F64(v), F64) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            (Data::I64(v), I8 | U8 | Bool) => out.extend(v.iter().map(|&x| x as u8)),
            (Data::I64(v), I16 | U16) => v.iter().for_each(|&x| out.extend_from_slice(&(x as u16).to_le_bytes())),
            (Data::I64(v), I32 | U32) => v.iter().for_each(|&x| out.extend_from_slice(&(x as u32).to_le_bytes())),
            (Data::I64(v), I64 | U64) => v.iter().for_each(|&x| out.extend_from_slice(&x.to_le_bytes())),
            (Data::I64(v), I4 | U4) => {
                out.resize(v.len().div_ceil(2), 0);
                for (i, &x) in v.iter().enumerate() {
                    out[i / 2] |= ((x as u8) & 0xf) << (4 * (i % 2));
                }
            }
            _ => return Err(TensorError::Unsupported(self.dtype)),
        }
        Ok(out)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{:?}", self.dtype, self.shape)?;
        let n = self.numel();
        let show = n.min(8);
        match &self.data {
            Data::F32(v) => write!(f, " {:?}", &v[..show])?,
            Data::F64(v) => write!(f, " {:?}", &v[..show])?,
            Data::I64(v) => write!(f, " {:?}", &v[..show])?,
            Data::Str(v) => write!(f, " {} strings", v.len())?,
        }
        if n > show {
            write!(f, " …")?;
        }
        Ok(())
    }
}

/// Wraps an integer into `dtype`'s range the way a two's-complement truncation does; bool maps
/// any non-zero value to 1.
pub fn wrap_int(dtype: DType, v: i64) -> i64 {
    use DType::*;
    match dtype {
        Bool => (v != 0) as i64,
        I8 => v as i8 as i64,
        U8 => v as u8 as i64,
        I16 => v as i16 as i64,
        U16 => v as u16 as i64,
        I32 => v as i32 as i64,
        U32 => v as u32 as i64,
        I64 | U64 => v,
        I4 => ((v & 0xf) ^ 0x8) - 0x8,
        U4 => v & 0xf,
        I2 => ((v & 0x3) ^ 0x2) - 0x2,
        U2 => v & 0x3,
        _ => v,
    }
}

/// Rounds an f32 to the nearest value of a float dtype (ties to even). Values beyond the largest
/// finite value become infinity where the type has one and NaN otherwise, which is what a
/// non-saturating cast does.
pub fn round_to_float(dtype: DType, v: f32) -> f32 {
    use DType::*;
    match dtype {
        F32 => v,
        F64 => v,
        F16 => f16::from_f32(v).to_f32(),
        BF16 => bf16::from_f32(v).to_f32(),
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F4E2M1 => {
            decode_minifloat(dtype, encode_minifloat(dtype, v, false))
        }
        _ => v,
    }
}

/// Layout of a small float format: exponent bits, mantissa bits, bias, and its special values.
struct MiniFloat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// All-ones exponent encodes infinities and NaNs (IEEE style).
    ieee_specials: bool,
    /// "fnuz": no negative zero; the code with only the sign bit set is the one NaN.
    uz: bool,
}

fn layout(dtype: DType) -> MiniFloat {
    use DType::*;
    match dtype {
        F8E4M3FN => MiniFloat { exp_bits: 4, man_bits: 3, bias: 7, ieee_specials: false, uz: false },
        F8E4M3FNUZ => MiniFloat { exp_bits: 4, man_bits: 3, bias: 8, ieee_specials: false, uz: true },
        F8E5M2 => MiniFloat { exp_bits: 5, man_bits: 2, bias: 15, ieee_specials: true, uz: false },
        F8E5M2FNUZ => MiniFloat { exp_bits: 5, man_bits: 2, bias: 16, ieee_specials: false, uz: true },
        F4E2M1 => MiniFloat { exp_bits: 2, man_bits: 1, bias: 1, ieee_specials: false, uz: false },
        _ => unreachable!("no minifloat layout for {dtype}"),
    }
}

/// Decodes one code of an 8- or 4-bit float type.
pub fn decode_minifloat(dtype: DType, code: u32) -> f32 {
    if dtype == DType::F8E8M0 {
        // Exponent only: 2^(code-127), 0xff is NaN.
        return if code == 0xff { f32::NAN } else { (2.0f64).powi(code as i32 - 127) as f32 };
    }
    let l = layout(dtype);
    let width = 1 + l.exp_bits + l.man_bits;
    let sign_bit = 1u32 << (width - 1);
    let exp = (code >> l.man_bits) & ((1 << l.exp_bits) - 1);
    let man = code & ((1 << l.man_bits) - 1);
    let neg = code & sign_bit != 0;
    if l.uz && code == sign_bit {
        return f32::NAN;
    }
    let all_ones_exp = (1 << l.exp_bits) - 1;
    if l.ieee_specials && exp == all_ones_exp {
        return if man == 0 {
            if neg {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            }
        } else {
            f32::NAN
        };
    }
    if dtype == DType::F8E4M3FN && exp == all_ones_exp && man == (1 << l.man_bits) - 1 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man as f64 * 2f64.powi(1 - l.bias - l.man_bits as i32)
    } else {
        (1.0 + man as f64 / (1u32 << l.man_bits) as f64) * 2f64.powi(exp as i32 - l.bias)
    };
    (if neg { -mag } else { mag }) as f32
}

/// Encodes an f32 as the nearest code of a small float type, ties to the even code. With
/// `saturate`, values beyond the largest finite magnitude clamp to it; otherwise they become
/// infinity where the type has one, NaN where it does not.
pub fn encode_minifloat(dtype: DType, v: f32, saturate: bool) -> u32 {
    let codes: u32 = if dtype == DType::F4E2M1 { 16 } else { 256 };
    let nan_code = (0..codes).find(|&c| decode_minifloat(dtype, c).is_nan());
    if v.is_nan() {
        return nan_code.unwrap_or(0);
    }
    let mut best: Option<(u32, f64)> = None;
    let mut max_finite: Option<(u32, f32)> = None;
    for c in 0..codes {
        let d = decode_minifloat(dtype, c);
        if d.is_nan() {
            continue;
        }
        if d.is_finite() && d.signum() == v.signum() && max_finite.is_none_or(|(_, m)| d.abs() > m.abs()) {
            max_finite = Some((c, d));
        }
        if d.is_infinite() {
            continue;
        }
        let err = (d as f64 - v as f64).abs();
        let better = match best {
            None => true,
            Some((bc, be)) => err < be || (err == be && c & 1 == 0 && bc & 1 == 1),
        };
        if better {
            best = Some((c, err));
        }
    }
    let (code, _) = best.expect("every format has finite codes");
    let (max_code, max_val) = max_finite.unwrap_or((code, 0.0));
    if v.abs() > max_val.abs() {
        // Beyond the largest finite value: round-to-nearest may still land on it if within half
        // an ulp, but the simple and conservative reading ONNX uses is saturate-or-overflow.
        if saturate {
            return max_code;
        }
        if let Some(inf) = (0..codes).find(|&c| {
            let d = decode_minifloat(dtype, c);
            d.is_infinite() && d.signum() == v.signum()
        }) {
            return inf;
        }
        return nan_code.unwrap_or(max_code);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_packs_low_nibble_first() {
        let t = Tensor::from_le_bytes(DType::I4, vec![3], &[0x8f, 0x07]).unwrap();
        assert_eq!(t.as_i64().unwrap(), &[-1, -8, 7]);
        assert_eq!(t.to_le_bytes().unwrap(), vec![0x8f, 0x07]);
    }

    #[test]
    fn byte_size_mismatch_is_an_error() {
        let err = Tensor::from_le_bytes(DType::F32, vec![2, 2], &[0u8; 12]).unwrap_err();
        assert_eq!(err, TensorError::ByteSize { dtype: DType::F32, shape: vec![2, 2], expected: 16, found: 12 });
    }

    #[test]
    fn f8e4m3fn_has_no_infinity_and_448_max() {
        assert_eq!(decode_minifloat(DType::F8E4M3FN, 0x7e), 448.0);
        assert!(decode_minifloat(DType::F8E4M3FN, 0x7f).is_nan());
        assert_eq!(decode_minifloat(DType::F8E4M3FN, encode_minifloat(DType::F8E4M3FN, 1000.0, true)), 448.0);
        assert_eq!(decode_minifloat(DType::F8E5M2, 0x7c), f32::INFINITY);
        assert_eq!(decode_minifloat(DType::F8E5M2, 0x7b), 57344.0);
    }

    #[test]
    fn f16_rounding_is_to_nearest_even() {
        // 2049 lies halfway between f16 neighbours 2048 and 2050: ties go to even mantissa (2048).
        assert_eq!(round_to_float(DType::F16, 2049.0), 2048.0);
        assert_eq!(round_to_float(DType::F16, 2051.0), 2052.0);
        assert_eq!(round_to_float(DType::F16, 70000.0), f32::INFINITY);
    }
}
