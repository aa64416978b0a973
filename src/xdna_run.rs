//! `npuc run|bench --backend xrt`: an xdna bundle on the host executor with its QGemms on the
//! XDNA NPU (`runtime::xdna`: prefill on the GEMM designs, decode's chained projections and MLP
//! programs on the qgemv designs, the rest on the GEMV designs), or why that cannot happen here.

use anyhow::{anyhow, Result};
use runtime::bundle::Bundle;
use runtime::exec::GemmOffload;

/// The offload for `--backend xrt` on this machine's NPU, or why there is none.
pub fn xrt_offload(bundle: &Bundle) -> Result<Box<dyn GemmOffload>> {
    if bundle.target() != runtime::bundle::Target::Xdna {
        return Err(anyhow!(
            "--backend xrt runs bundles compiled with --target xdna; this one is for {}",
            bundle.target()
        ));
    }
    #[cfg(feature = "xrt")]
    {
        use xdna_driver::{Npu, ACCEL_DIR};
        let npu = Npu::open(std::path::Path::new(ACCEL_DIR))
            .map_err(|e| anyhow!("{e}; run the bundle with --backend host"))?;
        let offload = runtime::xdna::XdnaOffload::new(npu, bundle)?;
        if let Some(name) = offload.unbuilt_programs.first() {
            eprintln!(
                "note: {} array programs (a decode layer's projections after attention as one command; {name}, ...) have no device artifacts in the bundle, so each runs as its chains",
                offload.unbuilt_programs.len()
            );
        }
        Ok(Box::new(offload))
    }
    #[cfg(not(feature = "xrt"))]
    {
        Err(anyhow!(
            "this npuc was built without the `xrt` feature (cargo build --features xrt); run the bundle with --backend host"
        ))
    }
}
