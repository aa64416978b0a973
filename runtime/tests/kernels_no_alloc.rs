//! The decode path allocates nothing once its scratch buffers have grown: every kernel, run a
//! second time on the same shapes with 1 and 2 threads, makes no heap allocation on any thread.
//! (One test in its own binary, so nothing else allocates while it counts.)

use runtime::kernels::gemm::{gemm_f32, WeightLayout};
use runtime::kernels::norm::{rms_norm, skip_rms_norm_in_place};
use runtime::kernels::qgemm::{pack_qgemm, qgemm, QActivations, QGemmScratch, QOutput, QWeightCodes};
use runtime::kernels::rope::rope_in_place;
use runtime::kernels::swiglu::swiglu;
use runtime::kernels::wgemm::{pack_wgemm, wgemm, MatMulNBits, NBitsZeroPoints, WGemmPrecision, WGemmScratch};
use runtime::kernels::{Isa, ThreadPool};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, SeqCst);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, SeqCst);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_decode_step_allocates_nothing_after_warm_up() {
    let (k, n) = (96, 80);
    let b: Vec<u8> = (0..n * 3 * 16).map(|i| (i * 7) as u8).collect();
    let scales = vec![0.01f32; n * 3];
    let w4 = pack_wgemm(&MatMulNBits {
        k,
        n,
        bits: 4,
        block_size: 32,
        b: &b,
        scales: &scales,
        zero_points: NBitsZeroPoints::Default,
    })
    .unwrap();
    let wq: Vec<i8> = (0..k * n).map(|i| i as i8).collect();
    let q = pack_qgemm(k, n, QWeightCodes::I8(&wq), &[0.5], &[0]).unwrap();
    let wf: Vec<f32> = (0..k * n).map(|i| i as f32 * 1e-3).collect();
    let a: Vec<f32> = (0..k).map(|i| i as f32 * 0.01 - 0.3).collect();
    let a8: Vec<u8> = (0..k).map(|i| i as u8).collect();
    let gamma = vec![1.0f32; k];
    let cos = vec![0.5f32; k];
    let sin = vec![0.25f32; k];
    let mut y = vec![0f32; n];
    let mut x = a.clone();
    let mut residual = a.clone();
    let mut normed = vec![0f32; k];
    let mut ws = WGemmScratch::default();
    let mut qs = QGemmScratch::default();
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
        for pool in &pools {
            let mut step = || {
                for p in [WGemmPrecision::Int8Activations, WGemmPrecision::Exact] {
                    wgemm(isa, pool, &w4.weights(), &a, 1, None, &mut y, p, &mut ws);
                }
                qgemm(isa, pool, &q, QActivations::U8(&a8), 1, 0.1, 3, QOutput::F32(&mut y), &mut qs);
                gemm_f32(isa, pool, &a, 1, k, &wf, n, WeightLayout::KN, None, &mut y);
                gemm_f32(isa, pool, &a, 1, k, &wf, n, WeightLayout::NK, None, &mut y);
                rms_norm(isa, &a, &gamma, 1e-6, &mut normed);
                skip_rms_norm_in_place(isa, &mut residual, &a, &gamma, None, 1e-6, &mut normed);
                rope_in_place(isa, &mut x, 32, &cos[..32], &sin[..32], 1, false);
                swiglu(isa, &a, &x, &mut normed);
            };
            step();
            let before = ALLOCATIONS.load(SeqCst);
            step();
            let made = ALLOCATIONS.load(SeqCst) - before;
            assert_eq!(made, 0, "{isa} with {} threads allocated {made} times", pool.threads());
        }
    }
}
