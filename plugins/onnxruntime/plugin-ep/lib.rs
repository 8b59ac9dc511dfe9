//! `libepx_ort_plugin_ep`: epx's adapter for ONNX Runtime plugin-EP libraries. It is not a
//! plugin by itself: the host opens it for a `plugin.toml` with `[onnxruntime_ep]` through its
//! entry with settings, which name the vendor's library and its EPs
//! ([`epx_onnxruntime::library`]).

use epx_plugin_api::abi::{EpxHostApi, EpxPluginDescriptor, EpxStatus, EpxStr};
use epx_plugin_api::sdk::{self, Error, ProviderFactory};

const NAME: &str = "onnxruntime-ep";

/// The entry the host calls with the settings of a hosted library.
///
/// # Safety
/// Called by the host as the ABI says: a valid host table, `num_settings` keys and values
/// valid for the call, and a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_plugin_entry_with_settings(
    host: *const EpxHostApi,
    num_settings: usize,
    keys: *const EpxStr,
    values: *const EpxStr,
    out: *mut *mut EpxPluginDescriptor,
) -> *mut EpxStatus {
    let mut made = Vec::new();
    let mut plugin = (NAME.to_owned(), env!("CARGO_PKG_VERSION").to_owned());
    let status = epx_plugin_api::ffi_boundary!({
        sdk::set_log_name(NAME);
        sdk::route_panics_to_host_log();
        if num_settings > 0 && (keys.is_null() || values.is_null()) {
            return Err(Error::invalid_argument("settings with NULL keys or values"));
        }
        let mut settings = Vec::with_capacity(num_settings);
        for i in 0..num_settings {
            // SAFETY: `num_settings` entries valid for the call (host contract); copied here.
            let (k, v) = unsafe { ((*keys.add(i)).as_bytes(), (*values.add(i)).as_bytes()) };
            settings.push((
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            ));
        }
        made = epx_onnxruntime::library::factories(&settings)?;
        plugin = epx_onnxruntime::library::plugin_name(&settings);
        Ok::<(), Error>(())
    });
    if !status.is_null() {
        return status;
    }
    // SAFETY: forwarded unchanged from the host.
    unsafe {
        sdk::plugin_entry(host, out, &plugin.0, &plugin.1, || {
            made.into_iter()
                .map(|f| Box::new(f) as Box<dyn ProviderFactory>)
                .collect()
        })
    }
}

/// Opened as a plain plugin (dropped into a plugin folder), it says what it is.
///
/// # Safety
/// Called by the host as the ABI says.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_plugin_entry(
    _host: *const EpxHostApi,
    _out: *mut *mut EpxPluginDescriptor,
) -> *mut EpxStatus {
    epx_plugin_api::ffi_boundary!({
        Err::<(), Error>(Error::invalid_argument(
            "this is epx's adapter for ONNX Runtime plugin-EP libraries, not a plugin: epx opens \
             it for a plugin.toml with an [onnxruntime_ep] table naming the vendor's library",
        ))
    })
}
