//! Shared helpers of the kernel tests: a seeded generator, the reference evaluator, and the list
//! of kernel paths this CPU can run (the others are named as skipped in the test output).

#![allow(dead_code)]

use ir::{Attr, Attrs, DType, Domain, OpRef, Tensor};
use runtime::kernels::{Isa, ThreadPool};

/// SplitMix64: small, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn f32s(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.f32(lo, hi)).collect()
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// The paths this CPU runs; prints the ones it skips, once per test.
pub fn isas(test: &str) -> Vec<Isa> {
    let (run, skip): (Vec<Isa>, Vec<Isa>) = Isa::ALL.into_iter().partition(|i| i.is_available());
    for isa in skip {
        println!("{test}: skipping the {isa} path: this CPU lacks its features");
    }
    run
}

/// Pools of 1, 2 and 3 threads.
pub fn pools() -> Vec<ThreadPool> {
    vec![ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)]
}

pub fn attrs(list: &[(&str, Attr)]) -> Attrs {
    let mut a = Attrs::default();
    for (name, v) in list {
        a.set(name, v.clone());
    }
    a
}

/// Runs one op with the reference evaluator.
pub fn reference(domain: Domain, op: &str, a: &Attrs, inputs: &[Option<&Tensor>], outputs: usize) -> Vec<Tensor> {
    let r = OpRef { node: "kernel_test", domain, op, opset: if domain == Domain::Onnx { 23 } else { 1 }, attrs: a };
    ir::eval::eval_op(&r, inputs, outputs).unwrap_or_else(|e| panic!("reference evaluator: {e}"))
}

pub fn f32t(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(DType::F32, shape.to_vec(), v.to_vec())
}

pub fn u8t(shape: &[usize], v: &[u8]) -> Tensor {
    Tensor::from_i64(DType::U8, shape.to_vec(), v.iter().map(|&x| x as i64).collect())
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f32_vec()
}

/// Asserts |got − want| ≤ tol[i] element-wise, naming the first offender.
pub fn assert_within(what: &str, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let t = tol(i);
        assert!((g - w).abs() <= t, "{what}: element {i}: got {g}, want {w}, |diff| {} > tolerance {t}", (g - w).abs());
    }
}

/// Asserts bit-identical f32 slices.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "{what}: element {i}: got {g}, want {w} (bit-exact expected)");
    }
}
