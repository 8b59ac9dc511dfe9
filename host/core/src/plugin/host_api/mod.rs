//! The host's half of the ABI: the function table every plugin receives. The callbacks live
//! with what they read: [`graph`] (the read-only graph view a plugin is asked about and
//! compiles from), [`kernel`] (the per-call kernel context: inputs, outputs, allocation) and
//! [`values`] (the handles of sequences, maps and optionals).

use std::ffi::c_char;
use std::sync::OnceLock;

use epx_plugin_api::abi::*;
use epx_plugin_api::ffi_boundary;
use epx_plugin_api::sdk::{Error as SdkError, into_raw_status};

mod args;
mod graph;
mod kernel;
mod values;

pub(crate) use graph::AbiGraph;
pub(crate) use kernel::KernelCall;

use graph::*;
use kernel::*;
use values::*;

/// The host crate's version, NUL-terminated, checked at compile time.
static HOST_VERSION: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
) {
    Ok(v) => v,
    Err(_) => panic!("the crate version holds a NUL byte"),
};

/// The table passed to every plugin's entry function; lives for the whole process.
pub(crate) fn host_api() -> &'static EpxHostApi {
    static API: OnceLock<HostApiCell> = OnceLock::new();
    &API.get_or_init(|| {
        HostApiCell(EpxHostApi {
            struct_size: std::mem::size_of::<EpxHostApi>(),
            abi_version: EpxVersion::CURRENT,
            host_version: HOST_VERSION.as_ptr(),
            log: Some(host_log),
            status_create: Some(host_status_create),
            graph_node_count: Some(graph_node_count),
            graph_value_count: Some(graph_value_count),
            graph_node: Some(graph_node),
            graph_node_attribute: Some(graph_node_attribute),
            graph_value: Some(graph_value),
            graph_initializer: Some(graph_initializer),
            graph_serialize_subgraph: Some(graph_serialize_subgraph),
            kernel_input_count: Some(kernel_input_count),
            kernel_input: Some(kernel_input),
            kernel_output_count: Some(kernel_output_count),
            kernel_output: Some(kernel_output),
            graph_inputs: Some(graph_inputs),
            graph_outputs: Some(graph_outputs),
            kernel_input_value: Some(kernel_input_value),
            kernel_output_value: Some(kernel_output_value),
            value_kind: Some(value_kind),
            value_tensor: Some(value_tensor),
            value_sequence: Some(value_sequence),
            value_sequence_at: Some(value_sequence_at),
            value_map: Some(value_map),
            value_optional: Some(value_optional),
            value_new_tensor: Some(value_new_tensor),
            value_new_sequence: Some(value_new_sequence),
            value_new_map: Some(value_new_map),
            value_new_optional: Some(value_new_optional),
            value_release: Some(value_release),
            kernel_terminate_flag: Some(kernel_terminate_flag),
        })
    })
    .0
}

struct HostApiCell(EpxHostApi);
// SAFETY: the table holds function pointers and a pointer to a static C string; nothing in it
// is ever mutated after construction.
unsafe impl Send for HostApiCell {}
// SAFETY: as above.
unsafe impl Sync for HostApiCell {}

unsafe extern "C" fn host_log(level: u32, target: *const c_char, message: EpxStr) {
    ffi_boundary!({
        // SAFETY: plugin contract: `target` is NULL or a C string, `message` valid for the call.
        let (target, message) = unsafe {
            let t = epx_plugin_api::sdk::cstr_or_empty(target).into_owned();
            (
                if t.is_empty() {
                    "plugin".to_string()
                } else {
                    t
                },
                String::from_utf8_lossy(message.as_bytes()).into_owned(),
            )
        };
        match level {
            1 => tracing::error!(target: "epx::plugin", plugin = %target, "{message}"),
            2 => tracing::warn!(target: "epx::plugin", plugin = %target, "{message}"),
            3 => tracing::info!(target: "epx::plugin", plugin = %target, "{message}"),
            4 => tracing::debug!(target: "epx::plugin", plugin = %target, "{message}"),
            _ => tracing::trace!(target: "epx::plugin", plugin = %target, "{message}"),
        }
    })
}

unsafe extern "C" fn host_status_create(code: u32, message: EpxStr) -> *mut EpxStatus {
    ffi_boundary!({
        if code == 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: plugin contract: `message` is valid for the call.
        let text = String::from_utf8_lossy(unsafe { message.as_bytes() }).into_owned();
        into_raw_status(SdkError::new(EpxStatusCode::from_raw(code), text))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::ElementType;
    use epx_plugin_api::dlpack::DLTensor;

    /// A new int64 tensor value `[v]`, owned by the caller.
    fn scalar_value(v: i64) -> *mut EpxValue {
        let mut out = std::ptr::null_mut();
        let shape = [1i64];
        // SAFETY: shape holds 1 extent and data one i64, both alive for the call.
        let status = unsafe {
            value_new_tensor(
                ElementType::Int64.to_dlpack().unwrap(),
                1,
                shape.as_ptr(),
                (&v as *const i64).cast(),
                &mut out,
            )
        };
        assert!(status.is_null());
        out
    }

    fn failed(status: *mut EpxStatus) -> bool {
        // SAFETY: a status from a host function.
        unsafe { epx_plugin_api::sdk::take_status(status) }.is_err()
    }

    #[test]
    fn values_handed_over_twice_or_from_inside_another_are_refused_not_freed() {
        // One value twice in a sequence: refused, taken once.
        let a = scalar_value(1);
        let mut seq = std::ptr::null_mut();
        // SAFETY: two pointers to one live value; the call takes it (once).
        assert!(failed(unsafe {
            value_new_sequence(0, [a, a].as_ptr(), 2, &mut seq)
        }));
        assert!(seq.is_null());

        // An item read back from a sequence is part of it: releasing or handing it over fails
        // and leaves it to the sequence, which frees it once.
        let b = scalar_value(2);
        // SAFETY: one live value, handed over.
        assert!(!failed(unsafe {
            value_new_sequence(0, [b].as_ptr(), 1, &mut seq)
        }));
        let mut item: *const EpxValue = std::ptr::null();
        // SAFETY: a live sequence of one item.
        assert!(!failed(unsafe { value_sequence_at(seq, 0, &mut item) }));
        let mut opt = std::ptr::null_mut();
        // SAFETY: `item` is live (inside `seq`); the call must refuse it.
        assert!(failed(unsafe {
            value_new_optional(item.cast_mut(), &mut opt)
        }));
        // SAFETY: as above; a no-op with a warning.
        unsafe { value_release(item.cast_mut()) };
        // SAFETY: the sequence is the caller's; it still holds its item.
        assert!(!failed(unsafe { value_sequence_at(seq, 0, &mut item) }));
        let mut t: *const DLTensor = std::ptr::null();
        // SAFETY: a live tensor value.
        assert!(!failed(unsafe { value_tensor(item, &mut t) }));
        // SAFETY: `t` points at one int64.
        assert_eq!(unsafe { *(*t).data.cast::<i64>() }, 2);
        // SAFETY: owned by the caller, released once.
        unsafe { value_release(seq) };

        // A map of one value as both keys and values: refused.
        let k = scalar_value(3);
        let mut map = std::ptr::null_mut();
        // SAFETY: one live value twice; taken once.
        assert!(failed(unsafe { value_new_map(k, k, &mut map) }));
    }
}
