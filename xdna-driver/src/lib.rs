//! The run-time side of XDNA NPUs: running a design on an XDNA NPU through the amdxdna driver's
//! ioctls (Linux ≥ 6.14, device nodes `/dev/accel/accel*`), with no XRT in between. The crate
//! depends on no workspace crate: the runtime's `xrt` backend uses it, and so does the compiler
//! (`codegen-aie` tests its driver model against [`Driver`]). The host plan that says which calls
//! run on the array is a bundle file, and the `bundle` crate owns it (`bundle::xdna`).
//!
//! The sequence, as the driver's UAPI (`include/uapi/drm/amdxdna_accel.h`) and its command
//! handling define it:
//!
//! 1. `GET_INFO(QUERY_AIE_METADATA)`: columns and core rows of the array.
//! 2. A `DEV_HEAP` buffer object, mapped: the driver sub-allocates every `DEV` buffer from it, and
//!    a hardware context can only be created once the heap exists.
//! 3. The design's PDI (from mlir-aie's toolchain) in a `DEV` buffer; `CREATE_HWCTX` for the
//!    columns the design uses (`num_tiles` = columns × core rows), then `CONFIG_HWCTX(CONFIG_CU)`
//!    with that buffer as CU 0.
//! 4. The instruction stream in a `DEV` buffer, inputs and output in mapped `SHMEM` buffers, each
//!    synced to the device (`SYNC_BO`).
//! 5. A `CMD` buffer holding one ERT command: header (state NEW, payload word count, opcode
//!    `ERT_START_CU`), the CU mask, then the arguments in the register map mlir-aie's kernels
//!    declare — opcode 3 (u64), instruction address (u64), instruction count (u32 words), one
//!    device address (u64) per buffer; `EXEC_CMD` with every buffer it names returns a sequence
//!    number.
//! 6. `SYNCOBJ_TIMELINE_WAIT` on the context's syncobj at that point (absolute timeout), the
//!    command's state read back from the header (COMPLETED or an error naming the state), and the
//!    output synced from the device.
//!
//! Every ioctl goes through the [`Driver`] trait: [`AccelFile`] is the device node, and tests put
//! a model of the driver's checks in its place (codegen-aie's `amdxdna::sim`, which runs the
//! designs it is given through the compiler's design interpreter), so everything up to the ioctl
//! boundary runs without an NPU.
//!
//! - [`uapi`]: the driver's UAPI structures, constants and ioctl numbers.
//! - [`Driver`], [`Ioctl`], [`AccelFile`]: the ioctl boundary.
//! - [`Npu`]: heap, buffer objects, hardware contexts, commands ([`command_words`]).

mod driver;
mod npu;
pub mod uapi;

pub use driver::{AccelFile, Driver, Ioctl, ACCEL_DIR};
pub use npu::{command_words, Bo, HwContext, Npu, NpuError, COMMAND_TIMEOUT_NS, HEAP_BYTES};
