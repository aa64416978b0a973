//! A small fixed thread pool for splitting one kernel call into tasks.
//!
//! [`ThreadPool::run`] publishes a job (a borrowed closure and a task count), takes part in it
//! from the calling thread, and returns once every task has finished. Tasks are claimed one at a
//! time with a compare-and-swap on a single state word (generation, task count, next index), so a
//! worker that is preempted holds up only the task it already claimed: the others, and the caller,
//! take the rest. That matters on shared cores, where a static split waits for the slowest thread.
//!
//! Waiting never spins forever. Idle workers spin for a short budget (so the back-to-back kernel
//! calls of one decode step find them awake), then sleep on a condition variable; the caller
//! waiting for the last tasks does the same. Both use the classic announce-then-check order with
//! sequentially consistent atomics, so a wake-up cannot be lost.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread spins before it sleeps, unless [`ThreadPool::with_spin`] says otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// The most tasks one `run` may have.
pub const MAX_TASKS: usize = INDEX_MASK as usize;

type Job = *const (dyn Fn(usize) + Sync);

static NOOP: fn(usize) = |_| {};

struct Shared {
    /// generation (16 bits) | task count (24 bits) | next task index (24 bits).
    state: AtomicU64,
    /// The current job. Written by the caller before it publishes a generation; read by a thread
    /// only after it claimed a task of that generation, which keeps the caller inside `run`.
    job: UnsafeCell<Job>,
    done: AtomicUsize,
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    caller_sleeping: AtomicBool,
    shutdown: AtomicBool,
    /// Workers that have started running.
    started: AtomicUsize,
    lock: Mutex<()>,
    work: Condvar,
    finished: Condvar,
    spin: Duration,
}

// SAFETY: `job` is written only by the thread inside `run` (serialised by `ThreadPool::serial`)
// before the state store that publishes it, and read only after a successful claim of a task of
// that generation (an acquire on the same state word).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn count(state: u64) -> u64 {
    (state >> INDEX_BITS) & INDEX_MASK
}

fn has_task(state: u64) -> bool {
    (state & INDEX_MASK) < count(state)
}

impl Shared {
    /// Claims and runs tasks of the current job until none is left.
    fn work(&self) {
        loop {
            let s = self.state.load(Acquire);
            if !has_task(s) {
                return;
            }
            if self.state.compare_exchange_weak(s, s + 1, AcqRel, Acquire).is_err() {
                continue;
            }
            // SAFETY: task `s & INDEX_MASK` of this generation is claimed and not finished, so
            // the caller is still inside `run` and the job pointer is that generation's.
            let job = unsafe { &**self.job.get() };
            if catch_unwind(AssertUnwindSafe(|| job((s & INDEX_MASK) as usize))).is_err() {
                self.panicked.store(true, SeqCst);
            }
            let finished = self.done.fetch_add(1, SeqCst) + 1;
            if finished as u64 == count(s) && self.caller_sleeping.load(SeqCst) {
                let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.finished.notify_all();
            }
        }
    }

    fn worker_loop(&self) {
        loop {
            self.work();
            let woke = spin_until(self.spin, || self.shutdown.load(Acquire) || has_task(self.state.load(Acquire)));
            if self.shutdown.load(Acquire) {
                return;
            }
            if !woke {
                let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.sleepers.fetch_add(1, SeqCst);
                while !has_task(self.state.load(SeqCst)) && !self.shutdown.load(SeqCst) {
                    guard = self.work.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                self.sleepers.fetch_sub(1, SeqCst);
            }
        }
    }
}

/// Waits for `ready` for up to `budget`: a few microseconds of pure spinning, then spinning that
/// yields the CPU between checks, so that a thread we wait for which shares our core (two
/// threads on one busy core) gets to run. Returns whether `ready` became true.
fn spin_until(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    const PURE_SPINS: u32 = 256;
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if ready() {
            return true;
        }
        spins += 1;
        if spins < PURE_SPINS {
            std::hint::spin_loop();
            continue;
        }
        if start.elapsed() > budget {
            return false;
        }
        std::thread::yield_now();
    }
}

/// A pool of `threads - 1` workers plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    serial: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs tasks on `threads` threads in all (the caller included); 0 counts as 1.
    pub fn new(threads: usize) -> ThreadPool {
        ThreadPool::with_spin(threads, DEFAULT_SPIN)
    }

    /// As [`ThreadPool::new`], with the time idle threads spin before they sleep.
    pub fn with_spin(threads: usize, spin: Duration) -> ThreadPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(&NOOP as &(dyn Fn(usize) + Sync) as Job),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            caller_sleeping: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            started: AtomicUsize::new(0),
            lock: Mutex::new(()),
            work: Condvar::new(),
            finished: Condvar::new(),
            spin,
        });
        let workers = (1..threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("npuc-kernel-{i}"))
                    .spawn(move || {
                        s.started.fetch_add(1, SeqCst);
                        s.worker_loop()
                    })
                    .expect("spawning a kernel thread")
            })
            .collect();
        // Returning once every worker runs keeps what a thread's start allocates out of the first
        // kernel calls (their "nothing allocated per token" holds from the first call on).
        while shared.started.load(SeqCst) < threads - 1 {
            std::thread::yield_now();
        }
        ThreadPool { shared, workers, threads, serial: Mutex::new(()) }
    }

    /// Threads taking part in each `run`, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `task(i)` for every `i` in `0..tasks`, spread over the pool, and returns when all
    /// have finished. Tasks run in no particular order and on any thread. A panic in a task is
    /// re-raised here once the others have finished.
    pub fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if self.threads == 1 || tasks == 1 {
            (0..tasks).for_each(task);
            return;
        }
        assert!(tasks <= MAX_TASKS, "{tasks} tasks exceed the pool's limit of {MAX_TASKS}");
        let _serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: the lifetime is erased for storage only; the pointer is dereferenced only while
        // a task of this generation is unfinished, and `run` does not return before they all are.
        unsafe {
            let job: Job = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(task);
            *sh.job.get() = job;
        }
        sh.done.store(0, SeqCst);
        sh.panicked.store(false, SeqCst);
        let generation = (sh.state.load(Relaxed) >> (2 * INDEX_BITS)).wrapping_add(1) & 0xffff;
        sh.state.store((generation << (2 * INDEX_BITS)) | ((tasks as u64) << INDEX_BITS), SeqCst);
        if sh.sleepers.load(SeqCst) > 0 {
            let _guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.work.notify_all();
        }
        sh.work();
        self.wait_done(tasks);
        if sh.panicked.load(SeqCst) {
            panic!("a kernel task panicked");
        }
    }

    fn wait_done(&self, tasks: usize) {
        let sh = &*self.shared;
        if spin_until(sh.spin, || sh.done.load(Acquire) >= tasks) {
            return;
        }
        let mut guard = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.caller_sleeping.store(true, SeqCst);
        while sh.done.load(SeqCst) < tasks {
            guard = sh.finished.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        sh.caller_sleeping.store(false, SeqCst);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.shutdown.store(true, SeqCst);
            self.shared.work.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in [1, 2, 3, 5] {
            let pool = ThreadPool::new(threads);
            for tasks in [0, 1, 2, 7, 100] {
                let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                pool.run(tasks, &|i| {
                    hits[i].fetch_add(1, Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "threads {threads}, tasks {tasks}");
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_job() {
        let pool = ThreadPool::with_spin(3, Duration::from_micros(1));
        for round in 0..50 {
            if round % 10 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            let sum = AtomicUsize::new(0);
            pool.run(16, &|i| {
                sum.fetch_add(i, Relaxed);
            });
            assert_eq!(sum.load(Relaxed), 120);
        }
    }

    #[test]
    fn a_slow_task_does_not_stop_the_others() {
        let pool = ThreadPool::new(2);
        let ran = AtomicUsize::new(0);
        pool.run(8, &|i| {
            if i == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            ran.fetch_add(1, Relaxed);
        });
        assert_eq!(ran.load(Relaxed), 8);
    }

    #[test]
    fn a_panicking_task_is_reported_to_the_caller() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(4, &|i| assert!(i != 2, "task two fails"))));
        assert!(r.is_err());
        // The pool still works afterwards.
        let n = AtomicUsize::new(0);
        pool.run(4, &|_| {
            n.fetch_add(1, Relaxed);
        });
        assert_eq!(n.load(Relaxed), 4);
    }
}
