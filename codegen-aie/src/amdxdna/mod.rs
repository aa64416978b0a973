//! The amdxdna driver as the compiler's tests meet it: [`sim`] is a model of the driver that
//! implements `xdna_driver::Driver` and runs the designs it is given through the design
//! interpreter, so the run path of `xdna-driver` (and the runtime's `xrt` backend on top of it)
//! is exercised without an NPU. The run path itself is in the `xdna-driver` crate, which the
//! runtime uses without depending on the compiler.

pub mod sim;
