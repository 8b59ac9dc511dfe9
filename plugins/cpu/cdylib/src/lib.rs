//! The CPU EP as a plugin library (`libepx_cpu.so`): the same code the host links in, exported
//! through the plugin ABI, so loading it exercises every boundary a vendor plugin crosses.

epx_plugin_api::export_plugin!(name: "cpu", version: env!("CARGO_PKG_VERSION"), providers: [epx_cpu::CpuFactory]);
