//! Elementwise ops: arithmetic, comparison and logic with numpy broadcasting, unary math, Where,
//! variadic Max/Min/Sum/Mean, Cast/CastLike and Clip.

use super::layout::{broadcast_shapes, BroadcastMap};
use super::{dtype_from_code, numeric_values, round_f64, Ctx, Res};
use crate::dtype::DType;
use crate::tensor::{decode_minifloat, encode_minifloat, numel, Data, Tensor};

/// Applies `f` to the pairs of elements that broadcasting `a` and `b` to `out_shape` lines up.
pub(crate) fn zip_broadcast<A: Copy, B: Copy, O>(
    (a, a_shape): (&[A], &[usize]),
    (b, b_shape): (&[B], &[usize]),
    out_shape: &[usize],
    mut f: impl FnMut(A, B) -> O,
) -> Vec<O> {
    if a_shape == out_shape && b_shape == out_shape {
        return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
    }
    let (am, bm) = (BroadcastMap::new(a_shape, out_shape), BroadcastMap::new(b_shape, out_shape));
    let n = numel(out_shape).unwrap_or(0);
    (0..n).map(|i| f(a[am.at(i)], b[bm.at(i)])).collect()
}

fn bool_tensor(shape: Vec<usize>, values: Vec<bool>) -> Tensor {
    Tensor { dtype: DType::Bool, shape, data: Data::I64(values.into_iter().map(i64::from).collect()) }
}

fn same_dtype(a: &Tensor, b: &Tensor) -> Res<()> {
    if a.dtype != b.dtype {
        bail!("operands have different dtypes {} and {}", a.dtype, b.dtype);
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

/// Add, Sub, Mul, Div and Mod. Integer division truncates toward zero; Mod follows Python's `%`
/// (sign of the divisor) unless `fmod=1`, which gives C's `fmod` (sign of the dividend) and is
/// the only form allowed for floats. Integer results wrap to the dtype.
pub(super) fn arith(cx: &Ctx, kind: Arith) -> Res<Vec<Tensor>> {
    let (a, b) = (cx.input(0, "A")?, cx.input(1, "B")?);
    same_dtype(a, b)?;
    let fmod = kind == Arith::Mod && cx.attrs().int_or("fmod", 0)? != 0;
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let dtype = a.dtype;
    let (sa, sb) = (&a.shape[..], &b.shape[..]);
    if kind == Arith::Mod && dtype.is_float() && !fmod {
        bail!("Mod on {dtype} needs fmod=1");
    }
    let out = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => Tensor::from_f32(
            dtype,
            shape.clone(),
            zip_broadcast((x, sa), (y, sb), &shape, |p, q| float_arith(kind, p, q)),
        ),
        (Data::F64(x), Data::F64(y)) => {
            Tensor::from_f64(shape.clone(), zip_broadcast((x, sa), (y, sb), &shape, |p, q| float_arith(kind, p, q)))
        }
        (Data::I64(x), Data::I64(y)) if dtype != DType::Bool => {
            if matches!(kind, Arith::Div | Arith::Mod) && y.contains(&0) {
                bail!("integer division by zero");
            }
            let unsigned = dtype == DType::U64;
            let v = zip_broadcast((x, sa), (y, sb), &shape, |p, q| int_arith(kind, fmod, unsigned, p, q));
            Tensor::from_i64(dtype, shape, v)
        }
        _ => bail!("{:?} is not defined for {dtype} tensors", kind),
    };
    Ok(vec![out])
}

fn float_arith<
    T: std::ops::Add<Output = T>
        + std::ops::Sub<Output = T>
        + std::ops::Mul<Output = T>
        + std::ops::Div<Output = T>
        + std::ops::Rem<Output = T>,
>(
    kind: Arith,
    p: T,
    q: T,
) -> T {
    match kind {
        Arith::Add => p + q,
        Arith::Sub => p - q,
        Arith::Mul => p * q,
        Arith::Div => p / q,
        // Rust's float `%` is C's fmod.
        Arith::Mod => p % q,
    }
}

fn int_arith(kind: Arith, fmod: bool, unsigned: bool, p: i64, q: i64) -> i64 {
    match kind {
        Arith::Add => p.wrapping_add(q),
        Arith::Sub => p.wrapping_sub(q),
        Arith::Mul => p.wrapping_mul(q),
        Arith::Div if unsigned => ((p as u64) / (q as u64)) as i64,
        Arith::Div => p.wrapping_div(q),
        Arith::Mod if unsigned => ((p as u64) % (q as u64)) as i64,
        Arith::Mod => {
            let r = p.wrapping_rem(q);
            if !fmod && r != 0 && (r < 0) != (q < 0) {
                r + q
            } else {
                r
            }
        }
    }
}

/// Pow with any mix of float and integer base and exponent; the result has the base's dtype.
/// Float results are computed in f64 and rounded once, so small integer powers (`x^2`, common in
/// normalisation patterns) are exact before rounding. Integer bases give exact wrapping integer
/// powers for integer exponents and truncate toward zero for float exponents.
pub(super) fn pow(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, y) = (cx.input(0, "X")?, cx.input(1, "Y")?);
    let shape = broadcast_shapes(&[&x.shape, &y.shape])?;
    if x.dtype == DType::Bool || y.dtype == DType::Bool {
        bail!("Pow does not take bool operands");
    }
    let (sx, sy) = (&x.shape[..], &y.shape[..]);
    let out = match (&x.data, &y.data) {
        (Data::F32(_) | Data::F64(_), _) => {
            let (xv, yv) = (numeric_values(x, "base")?, numeric_values(y, "exponent")?);
            let v = zip_broadcast((&xv, sx), (&yv, sy), &shape, f64::powf);
            super::float_tensor(x.dtype, shape, v)
        }
        (Data::I64(xv), Data::I64(yv)) => {
            let v: Res<Vec<i64>> = zip_broadcast((xv, sx), (yv, sy), &shape, int_pow).into_iter().collect();
            Tensor::from_i64(x.dtype, shape, v?)
        }
        (Data::I64(xv), Data::F32(_) | Data::F64(_)) => {
            let yv = numeric_values(y, "exponent")?;
            let v = zip_broadcast((xv, sx), (&yv, sy), &shape, |p, q| (p as f64).powf(q) as i64);
            Tensor::from_i64(x.dtype, shape, v)
        }
        _ => bail!("Pow is not defined for {} and {}", x.dtype, y.dtype),
    };
    Ok(vec![out])
}

/// `base^exp` with wrapping; negative exponents truncate the fraction toward zero.
fn int_pow(base: i64, exp: i64) -> Res<i64> {
    if exp < 0 {
        return match base {
            0 => bail!("integer 0 raised to the negative power {exp}"),
            1 => Ok(1),
            -1 => Ok(if exp % 2 == 0 { 1 } else { -1 }),
            _ => Ok(0),
        };
    }
    let (mut acc, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    Ok(acc)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Compare {
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

fn ordered<T: PartialOrd>(kind: Compare, p: T, q: T) -> bool {
    match kind {
        Compare::Equal => p == q,
        Compare::Less => p < q,
        Compare::LessOrEqual => p <= q,
        Compare::Greater => p > q,
        Compare::GreaterOrEqual => p >= q,
    }
}

/// Comparisons, producing bool; NaN compares false (unequal) to everything.
pub(super) fn compare(cx: &Ctx, kind: Compare) -> Res<Vec<Tensor>> {
    let (a, b) = (cx.input(0, "A")?, cx.input(1, "B")?);
    same_dtype(a, b)?;
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let (sa, sb) = (&a.shape[..], &b.shape[..]);
    let v = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => zip_broadcast((x, sa), (y, sb), &shape, |p, q| ordered(kind, p, q)),
        (Data::F64(x), Data::F64(y)) => zip_broadcast((x, sa), (y, sb), &shape, |p, q| ordered(kind, p, q)),
        (Data::I64(x), Data::I64(y)) if a.dtype == DType::U64 => {
            zip_broadcast((x, sa), (y, sb), &shape, |p, q| ordered(kind, p as u64, q as u64))
        }
        (Data::I64(x), Data::I64(y)) => zip_broadcast((x, sa), (y, sb), &shape, |p, q| ordered(kind, p, q)),
        (Data::Str(x), Data::Str(y)) if kind == Compare::Equal => {
            let (am, bm) = (BroadcastMap::new(sa, &shape), BroadcastMap::new(sb, &shape));
            (0..numel(&shape).unwrap_or(0)).map(|i| x[am.at(i)] == y[bm.at(i)]).collect()
        }
        _ => bail!("{kind:?} is not defined for {} tensors", a.dtype),
    };
    Ok(vec![bool_tensor(shape, v)])
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Logic {
    And,
    Or,
    Xor,
}

/// And, Or and Xor on bool tensors.
pub(super) fn logic(cx: &Ctx, kind: Logic) -> Res<Vec<Tensor>> {
    let (a, b) = (cx.input(0, "A")?, cx.input(1, "B")?);
    let (Data::I64(x), Data::I64(y), DType::Bool, DType::Bool) = (&a.data, &b.data, a.dtype, b.dtype) else {
        bail!("{kind:?} needs bool operands, got {} and {}", a.dtype, b.dtype);
    };
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let v = zip_broadcast((x, &a.shape), (y, &b.shape), &shape, |p, q| {
        let (p, q) = (p != 0, q != 0);
        match kind {
            Logic::And => p && q,
            Logic::Or => p || q,
            Logic::Xor => p != q,
        }
    });
    Ok(vec![bool_tensor(shape, v)])
}

/// Where(condition, X, Y) with three-way broadcasting; X and Y share a dtype.
pub(super) fn where_op(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (c, x, y) = (cx.input(0, "condition")?, cx.input(1, "X")?, cx.input(2, "Y")?);
    let (DType::Bool, Data::I64(cond)) = (c.dtype, &c.data) else {
        bail!("condition must be bool, got {}", c.dtype);
    };
    same_dtype(x, y)?;
    let shape = broadcast_shapes(&[&c.shape, &x.shape, &y.shape])?;
    let n = numel(&shape).unwrap_or(0);
    let (cm, xm, ym) =
        (BroadcastMap::new(&c.shape, &shape), BroadcastMap::new(&x.shape, &shape), BroadcastMap::new(&y.shape, &shape));
    fn select<T: Clone>(
        n: usize,
        pick: impl Fn(usize) -> bool,
        a: &[T],
        am: &BroadcastMap,
        b: &[T],
        bm: &BroadcastMap,
    ) -> Vec<T> {
        (0..n).map(|i| if pick(i) { a[am.at(i)].clone() } else { b[bm.at(i)].clone() }).collect()
    }
    let pick = |i: usize| cond[cm.at(i)] != 0;
    let data = match (&x.data, &y.data) {
        (Data::F32(a), Data::F32(b)) => Data::F32(select(n, pick, a, &xm, b, &ym)),
        (Data::F64(a), Data::F64(b)) => Data::F64(select(n, pick, a, &xm, b, &ym)),
        (Data::I64(a), Data::I64(b)) => Data::I64(select(n, pick, a, &xm, b, &ym)),
        (Data::Str(a), Data::Str(b)) => Data::Str(select(n, pick, a, &xm, b, &ym)),
        _ => bail!("X and Y have different storage"),
    };
    Ok(vec![Tensor { dtype: x.dtype, shape, data }])
}

/// Variadic Max/Min with broadcasting; a NaN in any operand gives NaN.
pub(super) fn min_max(cx: &Ctx, is_max: bool) -> Res<Vec<Tensor>> {
    let mut operands = cx.present_inputs();
    let Some(first) = operands.next() else {
        bail!("needs at least one input");
    };
    let mut acc = first.clone();
    for t in operands {
        same_dtype(&acc, t)?;
        let shape = broadcast_shapes(&[&acc.shape, &t.shape])?;
        let (sa, sb) = (&acc.shape[..], &t.shape[..]);
        let data = match (&acc.data, &t.data) {
            (Data::F32(x), Data::F32(y)) => Data::F32(zip_broadcast((x, sa), (y, sb), &shape, |p, q| {
                if p.is_nan() || q.is_nan() {
                    f32::NAN
                } else if is_max {
                    p.max(q)
                } else {
                    p.min(q)
                }
            })),
            (Data::F64(x), Data::F64(y)) => Data::F64(zip_broadcast((x, sa), (y, sb), &shape, |p, q| {
                if p.is_nan() || q.is_nan() {
                    f64::NAN
                } else if is_max {
                    p.max(q)
                } else {
                    p.min(q)
                }
            })),
            (Data::I64(x), Data::I64(y)) => {
                let unsigned = acc.dtype == DType::U64;
                Data::I64(zip_broadcast((x, sa), (y, sb), &shape, |p, q| {
                    let p_wins = if unsigned { (p as u64 > q as u64) == is_max } else { (p > q) == is_max };
                    if p_wins {
                        p
                    } else {
                        q
                    }
                }))
            }
            _ => bail!("not defined for {} tensors", acc.dtype),
        };
        acc = Tensor { dtype: acc.dtype, shape, data };
    }
    Ok(vec![acc])
}

/// Variadic Sum (or Mean, `mean == true`) of float tensors with broadcasting, accumulated in f64
/// and rounded once.
pub(super) fn sum_mean(cx: &Ctx, mean: bool) -> Res<Vec<Tensor>> {
    let operands: Vec<&Tensor> = cx.present_inputs().collect();
    let Some(first) = operands.first() else {
        bail!("needs at least one input");
    };
    for t in &operands {
        super::require_float(t, "every input")?;
        same_dtype(first, t)?;
    }
    let shapes: Vec<&[usize]> = operands.iter().map(|t| &t.shape[..]).collect();
    let shape = broadcast_shapes(&shapes)?;
    let mut acc = vec![0.0; numel(&shape).unwrap_or(0)];
    for t in &operands {
        let (values, map) = (t.to_f64_vec(), BroadcastMap::new(&t.shape, &shape));
        acc.iter_mut().enumerate().for_each(|(i, a)| *a += values[map.at(i)]);
    }
    if mean {
        acc.iter_mut().for_each(|a| *a /= operands.len() as f64);
    }
    Ok(vec![super::float_tensor(first.dtype, shape, acc)])
}

/// Float methods the unary ops need beyond `std`.
trait FloatExt: Copy {
    fn gauss_erf(self) -> Self;
    fn logistic(self) -> Self;
    /// `x·Φ(x)` exactly (`tanh` false) or with the tanh approximation, computed in f64.
    fn gelu(self, tanh: bool) -> Self;
    /// `ln(eˣ + 1)`, computed in f64.
    fn softplus(self) -> Self;
}

/// Gelu in f64: `0.5·x·(1 + erf(x/√2))`, or `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
fn gelu_f64(x: f64, tanh: bool) -> f64 {
    if tanh {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
    }
}

impl FloatExt for f64 {
    fn gauss_erf(self) -> f64 {
        erf(self)
    }

    fn gelu(self, tanh: bool) -> f64 {
        gelu_f64(self, tanh)
    }

    fn softplus(self) -> f64 {
        self.exp().ln_1p()
    }

    fn logistic(self) -> f64 {
        // Written so exp never overflows: for negative x use e^x / (1 + e^x).
        if self >= 0.0 {
            1.0 / (1.0 + (-self).exp())
        } else {
            let e = self.exp();
            e / (1.0 + e)
        }
    }
}

impl FloatExt for f32 {
    fn gauss_erf(self) -> f32 {
        erf(self as f64) as f32
    }

    fn gelu(self, tanh: bool) -> f32 {
        gelu_f64(self as f64, tanh) as f32
    }

    fn softplus(self) -> f32 {
        (self as f64).exp().ln_1p() as f32
    }

    /// The pinned σ (`crate::pinned_gate`): the one the gate's kernels compute, so a decomposed
    /// SiLU and the fused `SwiGlu` give the same bits.
    fn logistic(self) -> f32 {
        crate::pinned_gate::sigmoid(self)
    }
}

/// The error function, accurate to a few f64 ulps. Uses the all-positive series
/// erf(x) = 2/√π · e^{-x²} · Σ (2x²)^n x / (2n+1)!!, which has no cancellation; beyond |x| = 6,
/// erf(x) is ±1 to f64 precision.
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let two_x2 = 2.0 * x * x;
    let (mut term, mut sum) = (x, x);
    let mut n = 0.0;
    while term.abs() > sum.abs() * 1e-17 && n < 1000.0 {
        n += 1.0;
        term *= two_x2 / (2.0 * n + 1.0);
        sum += term;
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp() * sum
}

/// Maps a float tensor elementwise, in f32 for f32-stored dtypes (rounding to the dtype after)
/// and in f64 for f64.
macro_rules! map_float {
    ($t:expr, $name:expr, |$x:ident| $body:expr) => {
        match &$t.data {
            Data::F32(v) => Tensor::from_f32($t.dtype, $t.shape.clone(), v.iter().map(|&$x: &f32| $body).collect()),
            Data::F64(v) => Tensor::from_f64($t.shape.clone(), v.iter().map(|&$x: &f64| $body).collect()),
            _ => bail!("{} needs a float tensor, got {}", $name, $t.dtype),
        }
    };
}

/// The one-input elementwise ops.
pub(super) fn unary(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "X")?;
    let name = cx.op.op;
    let ints = match (&x.data, x.dtype) {
        (Data::I64(v), d) if d != DType::Bool => Some(v),
        _ => None,
    };
    let out = match (name, ints) {
        ("Not", _) => {
            let (DType::Bool, Data::I64(v)) = (x.dtype, &x.data) else {
                bail!("Not needs a bool tensor, got {}", x.dtype);
            };
            bool_tensor(x.shape.clone(), v.iter().map(|&b| b == 0).collect())
        }
        ("IsNaN", _) => bool_tensor(x.shape.clone(), float_flags(x, name, |v| v.is_nan())?),
        ("IsInf", _) => {
            let negative = cx.attrs().int_or("detect_negative", 1)? != 0;
            let positive = cx.attrs().int_or("detect_positive", 1)? != 0;
            let flags = float_flags(x, name, |v| v.is_infinite() && if v > 0.0 { positive } else { negative })?;
            bool_tensor(x.shape.clone(), flags)
        }
        ("Neg" | "Abs" | "Relu", Some(v)) => {
            if !x.dtype.is_signed_int() && name == "Neg" {
                bail!("Neg needs a signed type, got {}", x.dtype);
            }
            let f = match name {
                "Neg" => i64::wrapping_neg,
                "Abs" => i64::wrapping_abs,
                _ => |p: i64| p.max(0),
            };
            Tensor::from_i64(x.dtype, x.shape.clone(), v.iter().map(|&p| f(p)).collect())
        }
        ("Neg", _) => map_float!(x, name, |v| -v),
        ("Abs", _) => map_float!(x, name, |v| v.abs()),
        // Written as a comparison so NaN passes through (max(NaN, 0) would give 0).
        ("Relu", _) => map_float!(x, name, |v| if v < 0.0 { 0.0 } else { v }),
        ("Sqrt", _) => map_float!(x, name, |v| v.sqrt()),
        ("Reciprocal", _) => map_float!(x, name, |v| 1.0 / v),
        ("Exp", _) => map_float!(x, name, |v| v.exp()),
        ("Log", _) => map_float!(x, name, |v| v.ln()),
        ("Sin", _) => map_float!(x, name, |v| v.sin()),
        ("Cos", _) => map_float!(x, name, |v| v.cos()),
        ("Tanh", _) => map_float!(x, name, |v| v.tanh()),
        ("Erf", _) => map_float!(x, name, |v| v.gauss_erf()),
        ("Sigmoid", _) => map_float!(x, name, |v| v.logistic()),
        ("Softplus", _) => map_float!(x, name, |v| v.softplus()),
        ("Gelu", _) => {
            let tanh = match cx.attrs().str("approximate")?.unwrap_or("none") {
                "none" => false,
                "tanh" => true,
                other => bail!("Gelu approximate must be none or tanh, got {other}"),
            };
            map_float!(x, name, |v| v.gelu(tanh))
        }
        ("Floor", _) => map_float!(x, name, |v| v.floor()),
        ("Ceil", _) => map_float!(x, name, |v| v.ceil()),
        ("Round", _) => map_float!(x, name, |v| v.round_ties_even()),
        _ => bail!("{name} is not a unary op"),
    };
    Ok(vec![out])
}

fn float_flags(x: &Tensor, name: &str, f: impl Fn(f64) -> bool) -> Res<Vec<bool>> {
    match &x.data {
        Data::F32(v) => Ok(v.iter().map(|&p| f(p as f64)).collect()),
        Data::F64(v) => Ok(v.iter().map(|&p| f(p)).collect()),
        _ => bail!("{name} needs a float tensor, got {}", x.dtype),
    }
}

/// Cast to the `to` attribute's dtype.
pub(super) fn cast(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    let Some(code) = cx.attrs().int("to")? else {
        bail!("attribute `to` is required");
    };
    let to = dtype_from_code(code, "attribute `to`")?;
    let saturate = cx.attrs().int_or("saturate", 1)? != 0;
    Ok(vec![cast_tensor_rounding(x, to, saturate, e8m0_rounding(cx)?)?])
}

/// Cast to the dtype of the second input.
pub(super) fn cast_like(cx: &Ctx) -> Res<Vec<Tensor>> {
    let (x, like) = (cx.input(0, "input")?, cx.input(1, "target_type")?);
    let saturate = cx.attrs().int_or("saturate", 1)? != 0;
    Ok(vec![cast_tensor_rounding(x, like.dtype, saturate, e8m0_rounding(cx)?)?])
}

/// How a cast to float8e8m0 rounds a value between two powers of two (the `round_mode`
/// attribute of opset 24): to the larger (the default), the smaller, or the nearer (measured
/// linearly, the midpoint `1.5·2^e` going up).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum E8m0Rounding {
    Up,
    Down,
    Nearest,
}

fn e8m0_rounding(cx: &Ctx) -> Res<E8m0Rounding> {
    Ok(match cx.attrs().str("round_mode")?.unwrap_or("up") {
        "up" => E8m0Rounding::Up,
        "down" => E8m0Rounding::Down,
        "nearest" => E8m0Rounding::Nearest,
        other => bail!("unknown round_mode `{other}`"),
    })
}

fn is_minifloat(d: DType) -> bool {
    use DType::*;
    matches!(d, F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F4E2M1)
}

/// Converts a tensor to `to` per ONNX Cast: float to integer truncates toward zero (values
/// outside the target range, undefined in ONNX, saturate to i64 and then wrap to the target as
/// a C cast through a wide integer does; NaN becomes 0); anything to bool is "non-zero"; integers
/// wrap; float targets round to nearest even. `saturate` governs float8 overflow: with it,
/// out-of-range values and infinities clamp to the largest finite value of their sign; without
/// it they become infinity (E5M2) or NaN. Casts to float8e8m0 round up (see
/// [`cast_tensor_rounding`]).
pub(crate) fn cast_tensor(x: &Tensor, to: DType, saturate: bool) -> Res<Tensor> {
    cast_tensor_rounding(x, to, saturate, E8m0Rounding::Up)
}

/// [`cast_tensor`] with the rounding of casts to float8e8m0 chosen.
pub(crate) fn cast_tensor_rounding(x: &Tensor, to: DType, saturate: bool, e8m0: E8m0Rounding) -> Res<Tensor> {
    use DType::*;
    if x.dtype == to {
        return Ok(x.clone());
    }
    if to == Str || x.dtype == Str {
        bail!("casts between strings and numbers are not supported (from {} to {to})", x.dtype);
    }
    if matches!(to, C64 | C128 | F6E2M3 | F6E3M2) {
        bail!("cast to {to} is not supported");
    }
    let shape = x.shape.clone();
    if to.is_float() {
        let values = numeric_values(x, "input")?;
        if to == F64 {
            return Ok(Tensor::from_f64(shape, values));
        }
        let rounded: Vec<f32> = if to == F8E8M0 {
            values.iter().map(|&v| cast_to_e8m0(v as f32, saturate, e8m0)).collect()
        } else if is_minifloat(to) {
            values.iter().map(|&v| cast_to_minifloat(to, v as f32, saturate)).collect()
        } else {
            values.iter().map(|&v| round_f64(to, v)).collect()
        };
        return Ok(Tensor { dtype: to, shape, data: Data::F32(rounded) });
    }
    let ints: Vec<i64> = match &x.data {
        Data::I64(v) => v.clone(),
        Data::F32(v) => v.iter().map(|&f| float_to_int(f as f64, to)).collect(),
        Data::F64(v) => v.iter().map(|&f| float_to_int(f, to)).collect(),
        Data::Str(_) => unreachable!("strings rejected above"),
    };
    // from_i64 wraps into the target's range and maps non-zero to true for bool.
    Ok(Tensor::from_i64(to, shape, ints))
}

fn float_to_int(f: f64, to: DType) -> i64 {
    if to == DType::Bool {
        return (f != 0.0) as i64;
    }
    if to == DType::U64 && f >= 9_223_372_036_854_775_808.0 {
        return (f as u64) as i64;
    }
    // `as` truncates toward zero, saturates at the i64 range and maps NaN to 0.
    f as i64
}

fn cast_to_minifloat(to: DType, v: f32, saturate: bool) -> f32 {
    decode_minifloat(to, encode_minifloat(to, v, saturate))
}

/// Float8e8m0 holds `2^(code - 127)` for codes 0..=254 and NaN at 255. A value takes the f32
/// exponent of its magnitude (negative values are undefined in ONNX; zero and f32 subnormals
/// have exponent 0, so they become `2^-127`), moved up one when the rounding says so; with
/// `saturate`, never past `2^127`, which infinities also become; otherwise beyond it is NaN.
fn cast_to_e8m0(v: f32, saturate: bool, rounding: E8m0Rounding) -> f32 {
    const MAX_CODE: u32 = 254;
    let bits = v.to_bits();
    let (exponent, fraction) = ((bits >> 23) & 0xff, bits & 0x7f_ffff);
    let code = if v.is_nan() {
        0xff
    } else if v.is_infinite() {
        if saturate {
            MAX_CODE
        } else {
            0xff
        }
    } else {
        let half = 0x40_0000;
        let up = match rounding {
            E8m0Rounding::Up => fraction != 0,
            E8m0Rounding::Down => false,
            // At exactly the midpoint the tie goes up, except below the normal range.
            E8m0Rounding::Nearest => fraction & half != 0 && (exponent > 0 || fraction != half),
        };
        (exponent + up as u32).min(if saturate { MAX_CODE } else { 0xff })
    };
    decode_minifloat(DType::F8E8M0, code)
}

/// Clip to optional `min`/`max` inputs (attributes before opset 11), computed as
/// `Min(max, Max(x, min))`: NaN passes through, and `min > max` gives `max` everywhere.
pub(super) fn clip(cx: &Ctx) -> Res<Vec<Tensor>> {
    let x = cx.input(0, "input")?;
    if matches!(x.dtype, DType::Bool | DType::Str) {
        bail!("Clip does not take {} tensors", x.dtype);
    }
    let bounds: [Option<Tensor>; 2] = if cx.opset() < 11 {
        let from_attr = |name: &str| -> Res<Option<Tensor>> {
            match cx.attrs().float(name)? {
                Some(v) if x.dtype.is_float() => Ok(Some(Tensor::from_f32(x.dtype, vec![], vec![v]))),
                Some(_) => bail!("attribute {name} needs a float input, got {}", x.dtype),
                None => Ok(None),
            }
        };
        [from_attr("min")?, from_attr("max")?]
    } else {
        [cx.opt(1).cloned(), cx.opt(2).cloned()]
    };
    for (t, name) in bounds.iter().zip(["min", "max"]) {
        if let Some(t) = t {
            if t.dtype != x.dtype || t.numel() != 1 {
                bail!("{name} must be one {} value, got {} of shape {:?}", x.dtype, t.dtype, t.shape);
            }
        }
    }
    let [lo, hi] = &bounds;
    let float_bound = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_f64_vec()[0]);
    let int_bound = |t: &Option<Tensor>| t.as_ref().and_then(|t| t.as_i64()).map(|v| v[0]);
    fn clip_one<T: PartialOrd + Copy>(v: T, lo: Option<T>, hi: Option<T>) -> T {
        let v = match lo {
            Some(l) if v < l => l,
            _ => v,
        };
        match hi {
            Some(h) if v > h => h,
            _ => v,
        }
    }
    let data = match &x.data {
        Data::F32(v) => {
            let (lo, hi) = (float_bound(lo).map(|b| b as f32), float_bound(hi).map(|b| b as f32));
            Data::F32(v.iter().map(|&p| clip_one(p, lo, hi)).collect())
        }
        Data::F64(v) => {
            let (lo, hi) = (float_bound(lo), float_bound(hi));
            Data::F64(v.iter().map(|&p| clip_one(p, lo, hi)).collect())
        }
        Data::I64(v) if x.dtype == DType::U64 => {
            let (lo, hi) = (int_bound(lo).map(|b| b as u64), int_bound(hi).map(|b| b as u64));
            Data::I64(v.iter().map(|&p| clip_one(p as u64, lo, hi) as i64).collect())
        }
        Data::I64(v) => {
            let (lo, hi) = (int_bound(lo), int_bound(hi));
            Data::I64(v.iter().map(|&p| clip_one(p, lo, hi)).collect())
        }
        Data::Str(_) => unreachable!("strings rejected above"),
    };
    Ok(vec![Tensor { dtype: x.dtype, shape: x.shape.clone(), data }])
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use crate::attr::Attr;
    use crate::dtype::DType;
    use crate::tensor::Tensor;

    #[test]
    fn add_broadcasts_numpy_style() {
        let y = run1("Add", &[], &[&f32t(&[2, 1], &[1.0, 2.0]), &f32t(&[3], &[10.0, 20.0, 30.0])]);
        assert_eq!(y.shape, vec![2, 3]);
        assert_eq!(f32s(&y), vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    }

    #[test]
    fn integer_div_truncates_and_mod_takes_the_divisor_sign() {
        let a = typed(DType::I32, &[4], &[-7, 7, -7, 7]);
        let b = typed(DType::I32, &[4], &[2, -2, -2, 2]);
        assert_eq!(ints(&run1("Div", &[], &[&a, &b])), vec![-3, -3, 3, 3]);
        // Python semantics: the result has the divisor's sign.
        assert_eq!(ints(&run1("Mod", &[], &[&a, &b])), vec![1, -1, -1, 1]);
        // C fmod: the result has the dividend's sign.
        assert_eq!(ints(&run1("Mod", &[("fmod", Attr::Int(1))], &[&a, &b])), vec![-1, 1, -1, 1]);
    }

    #[test]
    fn integer_results_wrap_to_the_dtype() {
        let a = typed(DType::I8, &[1], &[100]);
        assert_eq!(ints(&run1("Add", &[], &[&a, &a])), vec![-56]);
    }

    #[test]
    fn integer_division_by_zero_and_float_mod_without_fmod_are_errors() {
        let a = i64t(&[2], &[1, 2]);
        let b = i64t(&[2], &[1, 0]);
        assert!(err_msg(run("Div", &[], &[Some(&a), Some(&b)], 1)).contains("division by zero"));
        let f = f32t(&[1], &[1.0]);
        assert!(err_msg(run("Mod", &[], &[Some(&f), Some(&f)], 1)).contains("fmod=1"));
        let mixed = run("Add", &[], &[Some(&a), Some(&f)], 1).unwrap_err();
        assert_eq!(mixed.node, "n");
        assert_eq!(mixed.op, "Add");
        assert!(mixed.msg.contains("different dtypes"), "{}", mixed.msg);
    }

    #[test]
    fn pow_mixes_integer_and_float_operands() {
        let y = run1("Pow", &[], &[&f32t(&[3], &[3.0, -2.0, 0.5]), &f32t(&[], &[2.0])]);
        assert_eq!(f32s(&y), vec![9.0, 4.0, 0.25]);
        let y = run1("Pow", &[], &[&i64t(&[4], &[2, 3, -2, 2]), &i64t(&[4], &[10, 2, 3, -1])]);
        assert_eq!(ints(&y), vec![1024, 9, -8, 0]);
        let y = run1("Pow", &[], &[&f32t(&[1], &[1.5]), &i64t(&[1], &[3])]);
        assert_eq!(f32s(&y), vec![3.375]);
        // An integer base keeps its type: 7^0.5 = 2.645... truncates to 2.
        let y = run1("Pow", &[], &[&typed(DType::I32, &[1], &[7]), &f32t(&[1], &[0.5])]);
        assert_eq!((y.dtype, ints(&y)), (DType::I32, vec![2]));
    }

    #[test]
    fn comparisons_produce_bool_and_nan_compares_false() {
        let a = f32t(&[3], &[1.0, f32::NAN, 3.0]);
        let b = f32t(&[3], &[2.0, 2.0, 3.0]);
        let lt = run1("Less", &[], &[&a, &b]);
        assert_eq!((lt.dtype, ints(&lt)), (DType::Bool, vec![1, 0, 0]));
        assert_eq!(ints(&run1("LessOrEqual", &[], &[&a, &b])), vec![1, 0, 1]);
        assert_eq!(ints(&run1("Equal", &[], &[&a, &a])), vec![1, 0, 1]);
        // Unsigned 64-bit values above i64::MAX still order as unsigned.
        let big = typed(DType::U64, &[1], &[-1]);
        let one = typed(DType::U64, &[1], &[1]);
        assert_eq!(ints(&run1("Greater", &[], &[&big, &one])), vec![1]);
    }

    #[test]
    fn where_broadcasts_all_three_operands() {
        let cond = booleans(&[2], &[true, false]);
        let y = run1("Where", &[], &[&cond, &f32t(&[2, 1], &[1.0, 2.0]), &f32t(&[], &[0.0])]);
        assert_eq!(y.shape, vec![2, 2]);
        assert_eq!(f32s(&y), vec![1.0, 0.0, 2.0, 0.0]);
        let not_bool = i64t(&[2], &[1, 0]);
        let e = err_msg(run("Where", &[], &[Some(&not_bool), Some(&cond), Some(&cond)], 1));
        assert!(e.contains("condition must be bool"), "{e}");
    }

    #[test]
    fn variadic_max_and_min_broadcast_and_propagate_nan() {
        let (a, b, c) = (f32t(&[2], &[1.0, 5.0]), f32t(&[2, 1], &[3.0, 4.0]), f32t(&[], &[2.0]));
        let y = run1("Max", &[], &[&a, &b, &c]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2], vec![3.0, 5.0, 4.0, 5.0]));
        assert_eq!(f32s(&run1("Min", &[], &[&a, &b, &c])), vec![1.0, 2.0, 1.0, 2.0]);
        let y = run1("Max", &[], &[&f32t(&[2], &[f32::NAN, 1.0]), &f32t(&[2], &[0.0, 0.0])]);
        assert!(f32s(&y)[0].is_nan());
        assert_eq!(f32s(&y)[1], 1.0);
    }

    #[test]
    fn round_is_half_to_even() {
        let x = f32t(&[7], &[0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, -2.5000002]);
        assert_eq!(f32s(&run1("Round", &[], &[&x])), vec![0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0]);
    }

    #[test]
    fn cast_from_float_truncates_toward_zero_and_wraps() {
        let x = f32t(&[5], &[2.9, -2.9, 300.0, f32::NAN, -0.5]);
        let to = |d: DType| run1("Cast", &[("to", Attr::Int(d.onnx_code() as i64))], &[&x]);
        assert_eq!(ints(&to(DType::I8)), vec![2, -2, 44, 0, 0]);
        assert_eq!(ints(&to(DType::U8)), vec![2, 254, 44, 0, 0]);
        assert_eq!(ints(&to(DType::Bool)), vec![1, 1, 1, 1, 1]);
        let signed_zeros = f32t(&[4], &[0.0, -0.0, f32::NAN, 0.1]);
        let b = run1("Cast", &[("to", Attr::Int(DType::Bool.onnx_code() as i64))], &[&signed_zeros]);
        assert_eq!(ints(&b), vec![0, 0, 1, 1]);
    }

    #[test]
    fn cast_to_narrow_floats_rounds_to_nearest_even() {
        let to = |x: &Tensor, d: DType, extra: &[(&str, Attr)]| {
            let mut a = vec![("to", Attr::Int(d.onnx_code() as i64))];
            a.extend(extra.iter().cloned());
            f32s(&run1("Cast", &a, &[x]))
        };
        // 2049 is halfway between the f16 neighbours 2048 and 2050.
        assert_eq!(to(&i64t(&[1], &[2049]), DType::F16, &[]), vec![2048.0]);
        // 65520 is halfway between 65504 and the first overflow value: it rounds to infinity.
        assert_eq!(to(&f32t(&[1], &[65520.0]), DType::F16, &[]), vec![f32::INFINITY]);
        let big = f32t(&[3], &[1000.0, 0.3, f32::INFINITY]);
        assert_eq!(to(&big, DType::F8E4M3FN, &[]), vec![448.0, 0.3125, 448.0]);
        let unsat = to(&big, DType::F8E4M3FN, &[("saturate", Attr::Int(0))]);
        assert!(unsat[0].is_nan() && unsat[2].is_nan());
        let huge = f32t(&[1], &[1e6]);
        assert_eq!(to(&huge, DType::F8E5M2, &[("saturate", Attr::Int(0))]), vec![f32::INFINITY]);
        assert_eq!(to(&huge, DType::F8E5M2, &[]), vec![57344.0]);
        assert_eq!(to(&big, DType::F8E5M2, &[])[2], 57344.0);
        // Saturation clamps infinities on every float8 type, fnuz included (240 is E4M3FNUZ's
        // largest value), and without it they are NaN where the type has no infinity.
        assert_eq!(to(&big, DType::F8E4M3FNUZ, &[])[2], 240.0);
        assert!(to(&big, DType::F8E4M3FNUZ, &[("saturate", Attr::Int(0))])[2].is_nan());
    }

    #[test]
    fn cast_to_e8m0_rounds_between_powers_of_two_by_round_mode() {
        let e8m0 = |mode: &str, saturate: i64, v: f32| {
            let a = [
                ("to", Attr::Int(DType::F8E8M0.onnx_code() as i64)),
                ("round_mode", Attr::Str(mode.into())),
                ("saturate", Attr::Int(saturate)),
            ];
            f32s(&run1("Cast", &a, &[&f32t(&[1], &[v])]))[0]
        };
        // 1.1 lies between 1 and 2; 3 is the midpoint of 2 and 4 (1.5·2), which `nearest` sends up.
        assert_eq!([e8m0("up", 1, 1.1), e8m0("down", 1, 1.1), e8m0("nearest", 1, 1.1)], [2.0, 1.0, 1.0]);
        assert_eq!([e8m0("nearest", 1, 3.0), e8m0("nearest", 1, 2.9), e8m0("up", 1, 4.0)], [4.0, 2.0, 4.0]);
        // Zero has exponent field 0: the smallest code, 2^-127.
        assert_eq!(e8m0("up", 1, 0.0), 2f32.powi(-127));
        // Above 2^127 rounding up saturates to 2^127, or overflows to NaN without saturate.
        assert_eq!(e8m0("up", 1, 1.5 * 2f32.powi(127)), 2f32.powi(127));
        assert!(e8m0("up", 0, 1.5 * 2f32.powi(127)).is_nan());
        assert_eq!(e8m0("up", 1, f32::INFINITY), 2f32.powi(127));
    }

    #[test]
    fn sum_and_mean_broadcast_every_input() {
        let (a, b) = (f32t(&[2], &[1.0, 2.0]), f32t(&[2, 1], &[10.0, 20.0]));
        let y = run1("Sum", &[], &[&a, &b]);
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2], vec![11.0, 12.0, 21.0, 22.0]));
        let ones = [f32t(&[1], &[1.0]), f32t(&[1], &[2.0]), f32t(&[1], &[6.0])];
        assert_eq!(f32s(&run1("Mean", &[], &[&ones[0], &ones[1], &ones[2]])), vec![3.0]);
        assert!(err_msg(run("Sum", &[], &[Some(&i64t(&[1], &[1]))], 1)).contains("float"));
    }

    #[test]
    fn cast_like_takes_the_second_inputs_dtype() {
        let like = Tensor::from_f32(DType::F16, vec![1], vec![0.0]);
        let y = run1("CastLike", &[], &[&i64t(&[2], &[3, 4097]), &like]);
        assert_eq!((y.dtype, f32s(&y)), (DType::F16, vec![3.0, 4096.0]));
    }

    #[test]
    fn clip_bounds_are_optional_and_min_above_max_gives_max() {
        let x = f32t(&[4], &[-2.0, 0.5, 3.0, f32::NAN]);
        let y = f32s(&run1("Clip", &[], &[&x, &f32t(&[], &[-1.0]), &f32t(&[], &[1.0])]));
        assert_eq!(&y[..3], &[-1.0, 0.5, 1.0]);
        assert!(y[3].is_nan());
        let y = f32s(&run1("Clip", &[], &[&x, &f32t(&[], &[2.0]), &f32t(&[], &[1.0])]));
        assert_eq!(&y[..3], &[1.0, 1.0, 1.0]);
        let xi = typed(DType::I32, &[2], &[-5, 5]);
        let y = run("Clip", &[], &[Some(&xi), None, Some(&typed(DType::I32, &[], &[0]))], 1).unwrap();
        assert_eq!(ints(&y[0]), vec![-5, 0]);
        let y = run_at("Clip", 6, &[("min", Attr::Float(0.0))], &[Some(&x)], 1).unwrap();
        assert_eq!(&f32s(&y[0])[..3], &[0.0, 0.5, 3.0]);
    }

    #[test]
    fn unary_math_matches_reference_values() {
        let relu = f32s(&run1("Relu", &[], &[&f32t(&[3], &[f32::NAN, -1.0, 2.0])]));
        assert!(relu[0].is_nan());
        assert_eq!(&relu[1..], &[0.0, 2.0]);
        // Reference values of erf from tables (to f32 precision).
        let erf = f32s(&run1("Erf", &[], &[&f32t(&[5], &[0.5, -2.0, 3.5, 1e-10, 7.0])]));
        assert_close(&erf, &[0.520_499_9, -0.995_322_3, 0.999_999_3, 1.128_379_2e-10, 1.0], 1e-7);
        assert_eq!(super::erf(0.0), 0.0);
        assert!((super::erf(1.0) - 0.842_700_792_949_714_9).abs() < 1e-15);
        let sig = f32s(&run1("Sigmoid", &[], &[&f32t(&[3], &[0.0, -100.0, 100.0])]));
        assert_eq!(sig[0], 0.5);
        assert!(sig[1] > 0.0 && sig[1] < 1e-40);
        assert_eq!(sig[2], 1.0);
        let inf = run1(
            "IsInf",
            &[("detect_negative", Attr::Int(0))],
            &[&f32t(&[4], &[f32::INFINITY, f32::NEG_INFINITY, 1.0, f32::NAN])],
        );
        assert_eq!(ints(&inf), vec![1, 0, 0, 0]);
        assert_eq!(ints(&run1("Abs", &[], &[&typed(DType::I8, &[2], &[-128, -3])])), vec![-128, 3]);
        let e = err_msg(run("Neg", &[], &[Some(&typed(DType::U8, &[1], &[1]))], 1));
        assert!(e.contains("signed"), "{e}");
        assert!(err_msg(run("Exp", &[], &[Some(&i64t(&[1], &[1]))], 1)).contains("needs a float tensor"));
    }

    #[test]
    fn logic_ops_take_bools() {
        let (a, b) = (booleans(&[4], &[false, false, true, true]), booleans(&[4], &[false, true, false, true]));
        assert_eq!(ints(&run1("And", &[], &[&a, &b])), vec![0, 0, 0, 1]);
        assert_eq!(ints(&run1("Or", &[], &[&a, &b])), vec![0, 1, 1, 1]);
        assert_eq!(ints(&run1("Xor", &[], &[&a, &b])), vec![0, 1, 1, 0]);
        assert_eq!(ints(&run1("Not", &[], &[&a])), vec![1, 1, 0, 0]);
        assert!(err_msg(run("And", &[], &[Some(&i64t(&[1], &[1])), Some(&a)], 1)).contains("bool"));
    }
}
