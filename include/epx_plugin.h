/*
 * epx_plugin.h: the C ABI between the epx host and its execution-provider (EP) plugins.
 *
 * GENERATED FILE, DO NOT EDIT. cbindgen makes it from plugin-api/src/abi.rs, dlpack.rs and
 * dtype.rs with plugin-api/cbindgen.toml (the cbindgen version is pinned in tests/Cargo.toml).
 * After changing the ABI, regenerate it with
 *
 *     EPX_UPDATE_HEADERS=1 cargo test -p epx-tests --test headers
 *
 * docs/ABI.md is the contract this header declares; read it before writing a plugin.
 *
 * Struct versions: every struct exchanged starts with `size_t struct_size`, the sizeof its
 * writer was built with, and fields are only ever appended. A reader uses a field only when
 * `struct_size` covers it; a struct from an ABI 1.0 peer is at least
 * `offsetof(T, last_1_0_field) + sizeof(void *)` bytes, where last_1_0_field is the last field
 * of T in ABI 1.0 (`release` for EpxPluginDescriptor, EpxProvider and EpxKernel, `create` for
 * EpxProviderFactory, `kernel_output` for EpxHostApi).
 *
 * The DLPack types (DLDevice, DLDataType, DLTensor) have DLPack's layout but not dlpack.h's
 * enumerator names; do not include this header and dlpack.h in the same translation unit.
 */


#ifndef EPX_PLUGIN_H
#define EPX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/** Opaque: a model graph, read-only, owned by the host; read it through EpxHostApi. */
typedef struct EpxGraph EpxGraph;

/**
 * Opaque: the host's side of one kernel call; read inputs and allocate outputs through
 * EpxHostApi. Valid only during the `execute` call it was passed to.
 */
typedef struct EpxKernelContext EpxKernelContext;

/**
 * Opaque (ABI 1.3): a value of any kind (tensor, strings included; sequence; map; optional);
 * read it and make one through the value_* functions of EpxHostApi.
 */
typedef struct EpxValue EpxValue;

/* Declared ahead for epx_plugin_entry below; defined further down. */
struct EpxStatus;
struct EpxHostApi;
struct EpxPluginDescriptor;

/** The name of the one symbol a plugin library exports, of type EpxPluginEntryFn. */
#define EPX_PLUGIN_ENTRY_SYMBOL "epx_plugin_entry"
/**
 * The name of the optional entry function with settings, of type EpxPluginEntryWithSettingsFn:
 * exported by a library that learns what it provides from its host (epx's ONNX Runtime plugin-EP
 * adapter); the host calls it instead of epx_plugin_entry when it has settings for the library.
 */
#define EPX_PLUGIN_ENTRY_WITH_SETTINGS_SYMBOL "epx_plugin_entry_with_settings"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * The entry function every plugin library defines and exports, with C linkage (see
 * EpxPluginEntryFn and docs/ABI.md section 3.1).
 */
struct EpxStatus *epx_plugin_entry(const struct EpxHostApi *host,
                                   struct EpxPluginDescriptor **out);

#ifdef __cplusplus
}  /* extern "C" */
#endif


/**
 * Major version of this ABI. A plugin built for another major version is refused.
 */
#define EPX_ABI_VERSION_MAJOR 1

/**
 * Minor version of this ABI. A plugin built for an older minor version is accepted.
 */
#define EPX_ABI_VERSION_MINOR 8

/**
 * Patch version of this ABI (documentation fixes only).
 */
#define EPX_ABI_VERSION_PATCH 0

/**
 * A value id meaning "no value" (an absent optional input or output of a node).
 */
#define EPX_VALUE_NONE UINT32_MAX

/**
 * Flag of [`EpxValueInfo::flags`]: the value is an input of the graph.
 */
#define EPX_VALUE_GRAPH_INPUT 1

/**
 * Flag of [`EpxValueInfo::flags`]: the value is an output of the graph.
 */
#define EPX_VALUE_GRAPH_OUTPUT 2

/**
 * Flag of [`EpxValueInfo::flags`]: the value is an initializer (a constant with data).
 */
#define EPX_VALUE_INITIALIZER 4

/**
 * Flag of [`EpxProviderFactory::flags`]: a kernel of this EP may be executed from several
 * threads at once. Without it the host serializes calls to each kernel's `execute`.
 */
#define EPX_PROVIDER_CONCURRENT_KERNELS 1

/**
 * (ABI 1.3) The DLPack type code of a string tensor's `DLTensor`: its `data` points at one
 * [`EpxStr`] per element (C order) and `bits` is `8 * sizeof(EpxStr)`. DLPack has no string
 * type; this form is epx's own and only ever appears where a string value is expected.
 */
#define EPX_DLPACK_STRING_CODE 3

/**
 * Log levels of [`EpxHostApi::log`]; they map onto `tracing` levels.
 */
enum EpxLogLevel
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    EPX_LOG_LEVEL_ERROR = 1,
    EPX_LOG_LEVEL_WARN = 2,
    EPX_LOG_LEVEL_INFO = 3,
    EPX_LOG_LEVEL_DEBUG = 4,
    EPX_LOG_LEVEL_TRACE = 5,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum EpxLogLevel EpxLogLevel;
#else
typedef uint32_t EpxLogLevel;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Status codes. Values are fixed and never renumbered; new codes are only appended.
 */
enum EpxStatusCode
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    /**
     * Unspecified failure.
     */
    EPX_STATUS_CODE_FAIL = 1,
    /**
     * An argument or option was wrong (unknown key, bad value, NULL where not allowed).
     */
    EPX_STATUS_CODE_INVALID_ARGUMENT = 2,
    /**
     * The operation, op or data type is not supported.
     */
    EPX_STATUS_CODE_NOT_IMPLEMENTED = 3,
    /**
     * The EP cannot run here (missing driver, wrong OS, no device).
     */
    EPX_STATUS_CODE_UNAVAILABLE = 4,
    /**
     * An allocation failed.
     */
    EPX_STATUS_CODE_OUT_OF_MEMORY = 5,
    /**
     * Code on the other side of the boundary panicked; the panic was caught there.
     */
    EPX_STATUS_CODE_PANIC = 6,
    /**
     * The graph or subgraph handed over is malformed.
     */
    EPX_STATUS_CODE_INVALID_GRAPH = 7,
    /**
     * Running a kernel failed.
     */
    EPX_STATUS_CODE_RUNTIME_ERROR = 8,
    /**
     * The ABI versions of host and plugin are incompatible.
     */
    EPX_STATUS_CODE_ABI_MISMATCH = 9,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum EpxStatusCode EpxStatusCode;
#else
typedef uint32_t EpxStatusCode;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Attribute kinds, numbered as ONNX numbers `AttributeProto.AttributeType`.
 */
enum EpxAttributeKind
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    EPX_ATTRIBUTE_KIND_UNDEFINED = 0,
    EPX_ATTRIBUTE_KIND_FLOAT = 1,
    EPX_ATTRIBUTE_KIND_INT = 2,
    EPX_ATTRIBUTE_KIND_STRING = 3,
    EPX_ATTRIBUTE_KIND_TENSOR = 4,
    EPX_ATTRIBUTE_KIND_GRAPH = 5,
    EPX_ATTRIBUTE_KIND_FLOATS = 6,
    EPX_ATTRIBUTE_KIND_INTS = 7,
    EPX_ATTRIBUTE_KIND_STRINGS = 8,
    EPX_ATTRIBUTE_KIND_TENSORS = 9,
    EPX_ATTRIBUTE_KIND_GRAPHS = 10,
    EPX_ATTRIBUTE_KIND_SPARSE_TENSOR = 11,
    EPX_ATTRIBUTE_KIND_SPARSE_TENSORS = 12,
    EPX_ATTRIBUTE_KIND_TYPE_PROTO = 13,
    EPX_ATTRIBUTE_KIND_TYPE_PROTOS = 14,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum EpxAttributeKind EpxAttributeKind;
#else
typedef uint32_t EpxAttributeKind;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Where a tensor's memory lives. Values are DLPack's `DLDeviceType` and never change.
 */
enum DLDeviceType
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    DL_DEVICE_TYPE_CPU = 1,
    DL_DEVICE_TYPE_CUDA = 2,
    DL_DEVICE_TYPE_CUDA_HOST = 3,
    DL_DEVICE_TYPE_OPEN_CL = 4,
    DL_DEVICE_TYPE_VULKAN = 7,
    DL_DEVICE_TYPE_METAL = 8,
    DL_DEVICE_TYPE_VPI = 9,
    DL_DEVICE_TYPE_ROCM = 10,
    DL_DEVICE_TYPE_ROCM_HOST = 11,
    DL_DEVICE_TYPE_EXT_DEV = 12,
    DL_DEVICE_TYPE_CUDA_MANAGED = 13,
    DL_DEVICE_TYPE_ONE_API = 14,
    DL_DEVICE_TYPE_WEB_GPU = 15,
    DL_DEVICE_TYPE_HEXAGON = 16,
    DL_DEVICE_TYPE_MAIA = 17,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum DLDeviceType DLDeviceType;
#else
typedef int32_t DLDeviceType;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * Type codes of [`DLDataType::code`]. Values are DLPack's and never change.
 */
enum DLDataTypeCode
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : uint8_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    DL_DATA_TYPE_CODE_INT = 0,
    DL_DATA_TYPE_CODE_U_INT = 1,
    DL_DATA_TYPE_CODE_FLOAT = 2,
    DL_DATA_TYPE_CODE_OPAQUE_HANDLE = 3,
    DL_DATA_TYPE_CODE_BFLOAT = 4,
    DL_DATA_TYPE_CODE_COMPLEX = 5,
    DL_DATA_TYPE_CODE_BOOL = 6,
    /**
     * The 8-bit and 4-bit floats of DLPack 1.1 (codes 7–9, 15 and 16 have no ONNX type).
     */
    DL_DATA_TYPE_CODE_FLOAT8_E4M3FN = 10,
    DL_DATA_TYPE_CODE_FLOAT8_E4M3FNUZ = 11,
    DL_DATA_TYPE_CODE_FLOAT8_E5M2 = 12,
    DL_DATA_TYPE_CODE_FLOAT8_E5M2FNUZ = 13,
    DL_DATA_TYPE_CODE_FLOAT8_E8M0FNU = 14,
    DL_DATA_TYPE_CODE_FLOAT4_E2M1FN = 17,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum DLDataTypeCode DLDataTypeCode;
#else
typedef uint8_t DLDataTypeCode;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * The element type of a tensor, numbered as ONNX numbers `TensorProto.DataType`.
 *
 * The numbers are part of the ABI (they travel as `i32` in value infos) and never change.
 */
enum EpxElementType
#if defined(__cplusplus) || __STDC_VERSION__ >= 202311L
  : int32_t
#endif // defined(__cplusplus) || __STDC_VERSION__ >= 202311L
 {
    EPX_ELEMENT_TYPE_UNDEFINED = 0,
    EPX_ELEMENT_TYPE_FLOAT = 1,
    EPX_ELEMENT_TYPE_UINT8 = 2,
    EPX_ELEMENT_TYPE_INT8 = 3,
    EPX_ELEMENT_TYPE_UINT16 = 4,
    EPX_ELEMENT_TYPE_INT16 = 5,
    EPX_ELEMENT_TYPE_INT32 = 6,
    EPX_ELEMENT_TYPE_INT64 = 7,
    EPX_ELEMENT_TYPE_STRING = 8,
    EPX_ELEMENT_TYPE_BOOL = 9,
    EPX_ELEMENT_TYPE_FLOAT16 = 10,
    EPX_ELEMENT_TYPE_DOUBLE = 11,
    EPX_ELEMENT_TYPE_UINT32 = 12,
    EPX_ELEMENT_TYPE_UINT64 = 13,
    EPX_ELEMENT_TYPE_COMPLEX64 = 14,
    EPX_ELEMENT_TYPE_COMPLEX128 = 15,
    EPX_ELEMENT_TYPE_BFLOAT16 = 16,
    EPX_ELEMENT_TYPE_FLOAT8_E4M3FN = 17,
    EPX_ELEMENT_TYPE_FLOAT8_E4M3FNUZ = 18,
    EPX_ELEMENT_TYPE_FLOAT8_E5M2 = 19,
    EPX_ELEMENT_TYPE_FLOAT8_E5M2FNUZ = 20,
    EPX_ELEMENT_TYPE_UINT4 = 21,
    EPX_ELEMENT_TYPE_INT4 = 22,
    EPX_ELEMENT_TYPE_FLOAT4_E2M1 = 23,
    EPX_ELEMENT_TYPE_FLOAT8_E8M0 = 24,
    EPX_ELEMENT_TYPE_UINT2 = 25,
    EPX_ELEMENT_TYPE_INT2 = 26,
};
#ifndef __cplusplus
#if __STDC_VERSION__ >= 202311L
typedef enum EpxElementType EpxElementType;
#else
typedef int32_t EpxElementType;
#endif // __STDC_VERSION__ >= 202311L
#endif // __cplusplus

/**
 * A version triple.
 */
typedef struct EpxVersion {
    uint32_t major;
    uint32_t minor;
    uint32_t patch;
} EpxVersion;

/**
 * A borrowed UTF-8 string: pointer and length, not NUL-terminated.
 */
typedef struct EpxStr {
    const uint8_t *data;
    size_t len;
} EpxStr;

/**
 * An error: a code and a message, made and freed by the same side.
 *
 * Returned as `*mut EpxStatus` by every fallible call, NULL meaning success. The receiver reads
 * `code` and `message`, then calls `release(status)` exactly once.
 */
typedef struct EpxStatus {
    size_t struct_size;
    /**
     * An [`EpxStatusCode`] value.
     */
    uint32_t code;
    /**
     * NUL-terminated UTF-8, owned by the status.
     */
    const char *message;
    /**
     * Frees the status and its message. Set by its maker; never NULL.
     */
    void (*release)(struct EpxStatus *status);
} EpxStatus;

/**
 * Bytes made by one side and handed to the other, freed through `release`.
 */
typedef struct EpxBuffer {
    size_t struct_size;
    uint8_t *data;
    size_t len;
    /**
     * Frees `data`; the receiver calls it exactly once. NULL when nothing was handed over.
     */
    void (*release)(struct EpxBuffer *buffer);
    /**
     * The maker's bookkeeping; the receiver never reads it.
     */
    void *private_data;
} EpxBuffer;

/**
 * One node of a graph, as [`EpxHostApi::graph_node`] describes it. All pointers borrow from the
 * graph and live as long as the graph handle they came from.
 */
typedef struct EpxNodeInfo {
    size_t struct_size;
    struct EpxStr name;
    struct EpxStr op_type;
    /**
     * The operator domain; empty for the default ONNX domain (`ai.onnx`).
     */
    struct EpxStr domain;
    /**
     * The opset version the model imports for `domain`.
     */
    int64_t opset;
    size_t num_inputs;
    /**
     * Value ids; [`EPX_VALUE_NONE`] for an absent optional input.
     */
    const uint32_t *inputs;
    size_t num_outputs;
    /**
     * Value ids; [`EPX_VALUE_NONE`] for an absent optional output.
     */
    const uint32_t *outputs;
    size_t num_attributes;
    /**
     * (ABI 1.1) Values of this graph that the node's nested graphs (If/Loop/Scan bodies) read
     * by name. They are inputs of the node for scheduling and partitioning: a compiled group
     * receives them among its subgraph inputs.
     */
    size_t num_implicit_inputs;
    /**
     * (ABI 1.1) Value ids, `num_implicit_inputs` of them.
     */
    const uint32_t *implicit_inputs;
} EpxNodeInfo;

/**
 * One value (edge) of a graph. Pointers borrow from the graph.
 */
typedef struct EpxValueInfo {
    size_t struct_size;
    struct EpxStr name;
    /**
     * ONNX `TensorProto.DataType` code; 0 when not known.
     */
    int32_t elem_type;
    /**
     * Number of dimensions; -1 when not known.
     */
    int64_t rank;
    /**
     * `rank` extents; -1 for an extent not known statically.
     */
    const int64_t *dims;
    /**
     * `EPX_VALUE_*` flags.
     */
    uint32_t flags;
    /**
     * The node producing this value, or [`EPX_VALUE_NONE`] for graph inputs and initializers.
     */
    uint32_t producer;
    /**
     * (ABI 1.3) An [`EpxValueKind`]: tensor, sequence, map or optional, as declared or
     * inferred; 0 when not known. For a non-tensor, `elem_type` is the element type of the
     * tensors inside (0 when not known) and `rank` is -1.
     */
    uint32_t kind;
} EpxValueInfo;

/**
 * A device: its type (a `DLDeviceType` value) and ordinal.
 */
typedef struct DLDevice {
    /**
     * A `DLDeviceType` value.
     */
    int32_t device_type;
    int32_t device_id;
} DLDevice;

/**
 * An element type: a `DLDataTypeCode` value, the bits of one lane, and the number of lanes.
 */
typedef struct DLDataType {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

/**
 * A tensor, laid out as DLPack's `DLTensor`.
 *
 * `data + byte_offset` is the first element. `shape` points at `ndim` extents. `strides` is
 * either NULL (compact row-major) or points at `ndim` strides counted in elements. None of the
 * pointers is owned by the `DLTensor` itself: the ABI function that hands one out says who owns
 * the memory and how long it lives.
 */
typedef struct DLTensor {
    void *data;
    struct DLDevice device;
    int32_t ndim;
    struct DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

/**
 * One attribute of a node. Which fields carry the value depends on `kind`; pointers borrow
 * from the graph. Kinds this version cannot describe (graphs, sparse tensors, type protos) are
 * reported with their `kind` and no value.
 */
typedef struct EpxAttribute {
    size_t struct_size;
    struct EpxStr name;
    /**
     * An [`EpxAttributeKind`] value.
     */
    uint32_t kind;
    float f;
    int64_t i;
    /**
     * Bytes of a `String` attribute (not necessarily UTF-8).
     */
    struct EpxStr s;
    /**
     * Element count of `floats`, `ints` or `strings`.
     */
    size_t num_values;
    const float *floats;
    const int64_t *ints;
    const struct EpxStr *strings;
    /**
     * A `Tensor` attribute, in host memory; NULL otherwise. From ABI 1.3 a string tensor comes
     * in the form of [`EPX_DLPACK_STRING_CODE`] (NULL before).
     */
    const struct DLTensor *tensor;
    /**
     * (ABI 1.1) A `Graph` attribute: the nested graph, readable with the same graph functions
     * and living as long as the graph it belongs to; NULL otherwise. Values it reads from
     * enclosing graphs appear in it with no producer and carry the enclosing value's name.
     */
    const EpxGraph *graph;
} EpxAttribute;

/**
 * A group of nodes handed to `compile`. Ids borrow from the host for the call.
 */
typedef struct EpxSubgraph {
    size_t struct_size;
    size_t num_nodes;
    /**
     * Node ids, in topological order.
     */
    const uint32_t *nodes;
    size_t num_inputs;
    /**
     * Values the group reads that are produced outside it and are not initializers, in the
     * order `execute` receives them.
     */
    const uint32_t *inputs;
    size_t num_outputs;
    /**
     * Values produced in the group that are read outside it (or are graph outputs), in the
     * order `execute` must produce them.
     */
    const uint32_t *outputs;
} EpxSubgraph;

/**
 * A capability answer: groups of node ids, each to be fused and compiled as one kernel.
 * Filled by the plugin; the host calls `release` once it has read it.
 */
typedef struct EpxCapability {
    size_t struct_size;
    size_t num_groups;
    /**
     * `num_groups` sizes; the groups' ids follow each other in `nodes`.
     */
    const size_t *group_sizes;
    const uint32_t *nodes;
    /**
     * Frees the arrays; NULL when the plugin returned no groups.
     */
    void (*release)(struct EpxCapability *capability);
    void *private_data;
    /**
     * (ABI 1.4) How many nodes the EP says why it declined (optional; 0 says nothing). Write
     * the three `declined` fields only when `struct_size` (the host's) covers them.
     */
    size_t num_declined;
    /**
     * (ABI 1.4) `num_declined` node ids, each one of `unclaimed` and not in a group.
     */
    const uint32_t *declined_nodes;
    /**
     * (ABI 1.4) `num_declined` reasons (UTF-8), one per id: what a user reads in the placement
     * report. Plugin memory until `release`, like the groups.
     */
    const struct EpxStr *declined_reasons;
} EpxCapability;

/**
 * Functions the host gives every plugin. Valid from the entry call until the library is
 * unloaded; every function may be called from any thread.
 */
typedef struct EpxHostApi {
    size_t struct_size;
    /**
     * The ABI version the host implements.
     */
    struct EpxVersion abi_version;
    /**
     * NUL-terminated version of the host library, for messages.
     */
    const char *host_version;
    /**
     * Writes a message into the host's log (`tracing`), under `target` (NUL-terminated,
     * usually the plugin's name; NULL means "plugin").
     */
    void (*log)(uint32_t level, const char *target, struct EpxStr message);
    /**
     * Makes a status the host owns (its `release` frees it), for plugins that do not make
     * their own. Returns NULL only when `code` is 0.
     */
    struct EpxStatus *(*status_create)(uint32_t code, struct EpxStr message);
    /**
     * Number of nodes; ids run from 0 to this minus one, in topological order.
     */
    size_t (*graph_node_count)(const EpxGraph *graph);
    /**
     * Number of values; ids run from 0 to this minus one.
     */
    size_t (*graph_value_count)(const EpxGraph *graph);
    /**
     * Describes node `node` into `*out` (whose `struct_size` the caller sets).
     */
    struct EpxStatus *(*graph_node)(const EpxGraph *graph, uint32_t node, struct EpxNodeInfo *out);
    /**
     * Describes attribute `index` (0..num_attributes) of node `node` into `*out`.
     */
    struct EpxStatus *(*graph_node_attribute)(const EpxGraph *graph,
                                              uint32_t node,
                                              size_t index,
                                              struct EpxAttribute *out);
    /**
     * Describes value `value` into `*out`.
     */
    struct EpxStatus *(*graph_value)(const EpxGraph *graph, uint32_t value, struct EpxValueInfo *out);
    /**
     * Fills `*out` with the data of initializer `value`, in host memory, borrowed from the graph.
     * Fails with `InvalidArgument` when the value is not an initializer.
     */
    struct EpxStatus *(*graph_initializer)(const EpxGraph *graph,
                                           uint32_t value,
                                           struct DLTensor *out);
    /**
     * Serializes `subgraph` as a standalone ONNX model (its inputs as graph inputs, its
     * outputs as graph outputs, the initializers it reads included) into `*out`, which the
     * caller frees through `out.release`.
     */
    struct EpxStatus *(*graph_serialize_subgraph)(const EpxGraph *graph,
                                                  const struct EpxSubgraph *subgraph,
                                                  struct EpxBuffer *out);
    /**
     * Number of inputs of this kernel call (the subgraph's `num_inputs`).
     */
    size_t (*kernel_input_count)(const EpxKernelContext *ctx);
    /**
     * Input `index`, in the EP's memory space, borrowed for the call.
     */
    struct EpxStatus *(*kernel_input)(const EpxKernelContext *ctx,
                                      size_t index,
                                      const struct DLTensor **out);
    /**
     * Number of outputs of this kernel call (the subgraph's `num_outputs`).
     */
    size_t (*kernel_output_count)(const EpxKernelContext *ctx);
    /**
     * Allocates output `index` with the given type and shape in the EP's memory space and
     * returns it, owned by the host, writable until `execute` returns. Each output is
     * allocated exactly once per call.
     */
    struct EpxStatus *(*kernel_output)(EpxKernelContext *ctx,
                                       size_t index,
                                       struct DLDataType dtype,
                                       int32_t ndim,
                                       const int64_t *shape,
                                       struct DLTensor **out);
    /**
     * (ABI 1.1) The graph's inputs (initializers excluded), in the model's order: writes a
     * pointer to the value ids and their count, borrowed from the graph.
     */
    struct EpxStatus *(*graph_inputs)(const EpxGraph *graph,
                                      const uint32_t **out_ids,
                                      size_t *out_len);
    /**
     * (ABI 1.1) The graph's outputs, in the model's order, as for `graph_inputs`.
     */
    struct EpxStatus *(*graph_outputs)(const EpxGraph *graph,
                                       const uint32_t **out_ids,
                                       size_t *out_len);
    /**
     * (ABI 1.3) Input `index` as a value of any kind, borrowed for the call; `*out` NULL for an
     * absent optional input. Host-memory inputs only.
     */
    struct EpxStatus *(*kernel_input_value)(const EpxKernelContext *ctx,
                                            size_t index,
                                            const EpxValue **out);
    /**
     * (ABI 1.3) Sets output `index` to `value` (made with a `value_new_*` function), taking it
     * over whatever the outcome. Instead of `kernel_output` for that output.
     */
    struct EpxStatus *(*kernel_output_value)(EpxKernelContext *ctx, size_t index, EpxValue *value);
    /**
     * (ABI 1.3) The [`EpxValueKind`] of a value; 0 for NULL.
     */
    uint32_t (*value_kind)(const EpxValue *value);
    /**
     * (ABI 1.3) The tensor a tensor value holds, in host memory, borrowed from the value. A
     * string tensor comes in the form of [`EPX_DLPACK_STRING_CODE`].
     */
    struct EpxStatus *(*value_tensor)(const EpxValue *value, const struct DLTensor **out);
    /**
     * (ABI 1.3) A sequence's length and the ONNX element type of its tensors (0 when the
     * sequence holds maps or the type is not known).
     */
    struct EpxStatus *(*value_sequence)(const EpxValue *value, size_t *len, int32_t *elem_type);
    /**
     * (ABI 1.3) Item `index` of a sequence, borrowed from it.
     */
    struct EpxStatus *(*value_sequence_at)(const EpxValue *value, size_t index, const EpxValue **out);
    /**
     * (ABI 1.3) A map's keys and values: two 1-D tensor values of one length, borrowed.
     */
    struct EpxStatus *(*value_map)(const EpxValue *value,
                                   const EpxValue **keys,
                                   const EpxValue **values);
    /**
     * (ABI 1.3) An optional's value, borrowed; `*out` NULL when it holds none.
     */
    struct EpxStatus *(*value_optional)(const EpxValue *value, const EpxValue **out);
    /**
     * (ABI 1.3) A new host-memory tensor value of the given type and shape, with a copy of
     * `data` (C order; `ndim` extents in `shape`), or zeros when `data` is NULL. For strings
     * (`dtype.code` [`EPX_DLPACK_STRING_CODE`]) `data` points at one [`EpxStr`] per element.
     */
    struct EpxStatus *(*value_new_tensor)(struct DLDataType dtype,
                                          int32_t ndim,
                                          const int64_t *shape,
                                          const void *data,
                                          EpxValue **out);
    /**
     * (ABI 1.3) A new sequence of `num_items` values, taking them over whatever the outcome.
     * `elem_type` is the ONNX element type of its tensors (needed when it is empty; 0 for a
     * sequence of maps).
     */
    struct EpxStatus *(*value_new_sequence)(int32_t elem_type,
                                            EpxValue *const *items,
                                            size_t num_items,
                                            EpxValue **out);
    /**
     * (ABI 1.3) A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length,
     * taking both over whatever the outcome.
     */
    struct EpxStatus *(*value_new_map)(EpxValue *keys, EpxValue *values, EpxValue **out);
    /**
     * (ABI 1.3) A new optional holding `value` (taken over), or none when `value` is NULL.
     */
    struct EpxStatus *(*value_new_optional)(EpxValue *value, EpxValue **out);
    /**
     * (ABI 1.3) Frees a value made with a `value_new_*` function and not handed over.
     */
    void (*value_release)(EpxValue *value);
    /**
     * (ABI 1.8) The run's terminate flag: a byte, 0 while the run goes on, set to 1 from
     * another thread when the application cancels it (ONNX Runtime's `RunOptions.terminate`).
     * Valid until `execute` returns; read it atomically (a relaxed load is enough) as often as
     * is cheap (between nodes, loop iterations) and return an error status soon after it is
     * set. NULL when this run cannot be cancelled.
     */
    const uint8_t *(*kernel_terminate_flag)(const EpxKernelContext *ctx);
} EpxHostApi;

/**
 * A compiled kernel: one fused group, ready to run. Made by `EpxProvider::compile`.
 */
typedef struct EpxKernel {
    size_t struct_size;
    /**
     * The plugin's state, passed back to every function below.
     */
    void *state;
    /**
     * Runs the kernel: read inputs and allocate outputs through the host API with `ctx`.
     * Thread safety: see [`EPX_PROVIDER_CONCURRENT_KERNELS`].
     */
    struct EpxStatus *(*execute)(void *state, EpxKernelContext *ctx);
    /**
     * Frees the kernel (and this struct). Called once, after the last `execute` returned.
     */
    void (*release)(struct EpxKernel *kernel);
} EpxKernel;

/**
 * An EP instance, made by `EpxProviderFactory::create` with the user's options.
 */
typedef struct EpxProvider {
    size_t struct_size;
    void *state;
    /**
     * Which nodes of `graph` this EP runs, as groups (see [`EpxCapability`]). Only ids among
     * the `unclaimed` ones may be returned; the host validates every id. `graph` and
     * `unclaimed` are borrowed for the call.
     */
    struct EpxStatus *(*get_capability)(void *state,
                                        const EpxGraph *graph,
                                        const uint32_t *unclaimed,
                                        size_t num_unclaimed,
                                        struct EpxCapability *out);
    /**
     * Compiles one group into a kernel. `graph` and `subgraph` are borrowed for the call: copy
     * whatever the kernel needs later (initializers included).
     */
    struct EpxStatus *(*compile)(void *state,
                                 const EpxGraph *graph,
                                 const struct EpxSubgraph *subgraph,
                                 struct EpxKernel **out);
    /**
     * Data transfer, for EPs whose memory is not host memory (NULL for host-memory EPs).
     * Allocates `bytes` bytes aligned to `alignment` on the EP's device.
     */
    struct EpxStatus *(*allocate)(void *state, size_t bytes, size_t alignment, void **out);
    /**
     * Frees memory from `allocate`.
     */
    void (*free)(void *state, void *ptr);
    /**
     * Copies a host tensor into a device tensor of the same type and shape.
     */
    struct EpxStatus *(*copy_to_device)(void *state,
                                        const struct DLTensor *src,
                                        struct DLTensor *dst);
    /**
     * Copies a device tensor into a host tensor of the same type and shape.
     */
    struct EpxStatus *(*copy_to_host)(void *state, const struct DLTensor *src, struct DLTensor *dst);
    /**
     * Copies between two tensors on the EP's device (optional).
     */
    struct EpxStatus *(*copy_on_device)(void *state,
                                        const struct DLTensor *src,
                                        struct DLTensor *dst);
    /**
     * Frees the provider (and this struct). Called once, after every kernel it made was released.
     */
    void (*release)(struct EpxProvider *provider);
    /**
     * (ABI 1.6, optional, with `kernel_deserialize`) Writes bytes from which
     * `kernel_deserialize` rebuilds `kernel` (one this provider compiled) into `out`, which the
     * host passes zeroed except `struct_size`. The plugin fills `data`, `len`, `release` and
     * `private_data`; the host copies the bytes and calls `out->release` once. A
     * `NotImplemented` status says this kernel cannot be stored (not an error); the host then
     * compiles it again next time.
     */
    struct EpxStatus *(*kernel_serialize)(void *state,
                                          const struct EpxKernel *kernel,
                                          struct EpxBuffer *out);
    /**
     * (ABI 1.6, optional, with `kernel_serialize`) Rebuilds a kernel from bytes an earlier
     * `kernel_serialize` wrote, for the same group: the host passes the graph and subgraph a
     * compile would get, and the `len` bytes at `data`, all borrowed for the call. The bytes
     * come from a file: a plugin checks what it reads and fails on anything it does not
     * recognise (another version, another device, damage); the host then compiles instead.
     */
    struct EpxStatus *(*kernel_deserialize)(void *state,
                                            const EpxGraph *graph,
                                            const struct EpxSubgraph *subgraph,
                                            const uint8_t *data,
                                            size_t len,
                                            struct EpxKernel **out);
    /**
     * (ABI 1.7, optional, with `kernel_profile_read`) Starts recording where `kernel`'s runs
     * spend their time, part by part (a part: a node, or nodes the EP fused), from zero again
     * when it was recording already. The host calls it once a session with profiling on is
     * made, from one thread, before any run. A `NotImplemented` status says this kernel does
     * not record parts (not an error): the host still times the kernel as a whole.
     */
    struct EpxStatus *(*kernel_profile_start)(void *state, const struct EpxKernel *kernel);
    /**
     * (ABI 1.7, optional, with `kernel_profile_start`) Writes what `kernel` recorded since
     * `kernel_profile_start`, and how the EP compiled it, into `out` as for `kernel_serialize`:
     * one UTF-8 JSON object, `{"parts": [{"name", "op", "calls", "ns"}], "passes": [{"name",
     * "changed", "note"}]}` (docs/ABI.md gives the rules). May be called while runs go on.
     */
    struct EpxStatus *(*kernel_profile_read)(void *state,
                                             const struct EpxKernel *kernel,
                                             struct EpxBuffer *out);
} EpxProvider;

/**
 * One device an EP can run on (ABI 1.5). Strings are UTF-8, plugin memory until the list's
 * `release`; an empty string means unknown.
 */
typedef struct EpxDevice {
    size_t struct_size;
    /**
     * An [`EpxDeviceKind`] value.
     */
    uint32_t kind;
    /**
     * The EP's own number for the device (`cuda:1` is id 1); unique within the EP.
     */
    uint32_t device_id;
    /**
     * The name a user asks for the device by, when it is not its number (OpenVINO's `GPU.0`);
     * empty to use the number.
     */
    struct EpxStr id_name;
    struct EpxStr vendor;
    /**
     * The product name (`NVIDIA A100-SXM4-80GB`).
     */
    struct EpxStr name;
    /**
     * Memory of the device in bytes; 0 when unknown or shared with the host.
     */
    uint64_t memory_bytes;
    /**
     * Driver or runtime version, as the vendor writes it.
     */
    struct EpxStr driver_version;
    /**
     * Empty when the EP can use the device; else why not (driver too old, library missing).
     */
    struct EpxStr unusable_reason;
} EpxDevice;

/**
 * The devices of one EP, filled by `get_devices` (ABI 1.5).
 */
typedef struct EpxDeviceList {
    size_t struct_size;
    size_t num_devices;
    /**
     * `num_devices` entries, each `device_size` bytes apart (the plugin's `sizeof(EpxDevice)`).
     */
    const struct EpxDevice *devices;
    size_t device_size;
    /**
     * Frees the array and its strings; NULL when there is nothing to free.
     */
    void (*release)(struct EpxDeviceList *list);
    void *private_data;
} EpxDeviceList;

/**
 * One EP a library offers: what it is, whether it can run here, and how to make one.
 * Lives as long as the plugin descriptor it belongs to.
 */
typedef struct EpxProviderFactory {
    size_t struct_size;
    void *state;
    /**
     * NUL-terminated EP name, unique among loaded plugins (e.g. `cpu`, `cuda`).
     */
    const char *name;
    /**
     * NUL-terminated vendor name.
     */
    const char *vendor;
    /**
     * NUL-terminated EP version (semver).
     */
    const char *version;
    /**
     * The memory space of the EP's tensors: a `DLDeviceType` value (`1` = host memory).
     */
    int32_t device_type;
    /**
     * `EPX_PROVIDER_*` flags.
     */
    uint32_t flags;
    /**
     * Whether the EP can run on this machine: NULL when it can, else a status whose message
     * says why not (missing driver, wrong OS, ...).
     */
    struct EpxStatus *(*is_available)(void *state);
    /**
     * Makes an EP instance from string options. An unknown key or a bad value is an error whose
     * message names the valid keys.
     */
    struct EpxStatus *(*create)(void *state,
                                size_t num_options,
                                const struct EpxStr *keys,
                                const struct EpxStr *values,
                                struct EpxProvider **out);
    /**
     * (ABI 1.5) The devices this EP can run on, present ones it cannot use included (with the
     * reason). Optional: NULL, or an answer of zero devices, says nothing about devices. The
     * host passes `out` zeroed except `struct_size`; the plugin fills it, and the host calls
     * `out->release` once it has read it.
     */
    struct EpxStatus *(*get_devices)(void *state, struct EpxDeviceList *out);
} EpxProviderFactory;

/**
 * What a plugin library provides. Returned by the entry function; freed through `release`.
 */
typedef struct EpxPluginDescriptor {
    size_t struct_size;
    /**
     * The ABI version the plugin was built against.
     */
    struct EpxVersion abi_version;
    /**
     * NUL-terminated plugin name.
     */
    const char *name;
    /**
     * NUL-terminated plugin version (semver).
     */
    const char *version;
    size_t num_providers;
    const struct EpxProviderFactory *const *providers;
    /**
     * Frees the descriptor and its factories. Called once, after every provider made from it
     * was released.
     */
    void (*release)(struct EpxPluginDescriptor *descriptor);
} EpxPluginDescriptor;

/**
 * The entry function every plugin library exports as `epx_plugin_entry`.
 *
 * The host passes its API table (valid until the library is unloaded). On success the plugin
 * writes its descriptor to `*out` and returns NULL; on failure it returns a status saying why
 * and leaves `*out` NULL. The plugin must not call back into the host before returning except
 * through `host.log`.
 */
typedef struct EpxStatus *(*EpxPluginEntryFn)(const struct EpxHostApi *host,
                                              struct EpxPluginDescriptor **out);

/**
 * The entry function with settings, exported as `epx_plugin_entry_with_settings` by a library
 * that needs them. As [`EpxPluginEntryFn`], with `num_settings` key/value pairs (UTF-8, valid
 * for the call) that the plugin copies what it needs of. An unknown key is an error naming it.
 */
typedef struct EpxStatus *(*EpxPluginEntryWithSettingsFn)(const struct EpxHostApi *host,
                                                          size_t num_settings,
                                                          const struct EpxStr *keys,
                                                          const struct EpxStr *values,
                                                          struct EpxPluginDescriptor **out);

#endif  /* EPX_PLUGIN_H */

/* ------------------------------------------------------------------------------------------ */
/* Helpers for plugins written in C (header-only; not part of the ABI).                        */

#ifndef EPX_PLUGIN_HELPERS_H
#define EPX_PLUGIN_HELPERS_H

/** Exports a function from the plugin library: `EPX_EXPORT EpxStatus *epx_plugin_entry(...)`. */
#if defined(_WIN32)
#define EPX_EXPORT __declspec(dllexport)
#else
#define EPX_EXPORT __attribute__((visibility("default")))
#endif

/** The ABI version of this header, for `EpxPluginDescriptor.abi_version`. */
#define EPX_ABI_VERSION_INIT { EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR, EPX_ABI_VERSION_PATCH }

/** Whether the host's table has `field` (an older host of the same major has a shorter one). */
#define EPX_HOST_HAS(host, field) \
    ((host)->struct_size >= offsetof(EpxHostApi, field) + sizeof((host)->field) && (host)->field)

/** Where a pointer-sized field ends: a struct of ABI 1.0 is at least
 *  `EPX_FIELD_END(type, last_1_0_field)` bytes (see the preamble). */
#define EPX_FIELD_END(type, field) (offsetof(type, field) + sizeof(void *))

static inline void epx__static_status_release(EpxStatus *status) {
    (void)status;
}

/**
 * A status with `code` and a printf-style message, made by the host (`status_create`). Never
 * NULL: when the host cannot make one, a static status says so. Return NULL for success.
 */
static inline EpxStatus *epx_status(const EpxHostApi *host, uint32_t code, const char *format, ...) {
    static EpxStatus no_status = {sizeof(EpxStatus), EPX_STATUS_CODE_RUNTIME_ERROR,
                                  "the host could not make a status", epx__static_status_release};
    char message[512];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(message, sizeof message, format, args);
    va_end(args);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof message ? (size_t)n : sizeof message - 1;
    EpxStr text = {(const uint8_t *)message, len};
    EpxStatus *status = host && EPX_HOST_HAS(host, status_create) ? host->status_create(code, text) : NULL;
    return status ? status : &no_status;
}

/** Frees a status (NULL is a no-op). */
static inline void epx_status_free(EpxStatus *status) {
    if (status) status->release(status);
}

/** Whether `s` holds exactly the C string `c`. */
static inline bool epx_str_eq(EpxStr s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

/** Node `id` of `graph` into `*out` (zeroed, `struct_size` set, as the host expects). */
static inline EpxStatus *epx_node(const EpxHostApi *host, const EpxGraph *graph, uint32_t id,
                                  EpxNodeInfo *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return host->graph_node(graph, id, out);
}

/** Value `id` of `graph` into `*out` (zeroed, `struct_size` set). */
static inline EpxStatus *epx_value(const EpxHostApi *host, const EpxGraph *graph, uint32_t id,
                                   EpxValueInfo *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return host->graph_value(graph, id, out);
}

/** Whether value `id` is a tensor of `elem_type` (EpxElementType) whose extents are all known. */
static inline bool epx_static_tensor(const EpxHostApi *host, const EpxGraph *graph, uint32_t id,
                                     int32_t elem_type, EpxValueInfo *out) {
    EpxStatus *status = epx_value(host, graph, id, out);
    if (status) {
        epx_status_free(status);
        return false;
    }
    if (out->elem_type != elem_type || out->rank < 0) return false;
    for (int64_t d = 0; d < out->rank; d++) {
        if (out->dims[d] < 0) return false;
    }
    return true;
}

static inline void epx__capability_release(EpxCapability *capability) {
    free(capability->private_data);
}

/** Answers `get_capability` with each of `ids` as a group of its own (copied). */
static inline EpxStatus *epx_capability_each(const EpxHostApi *host, const uint32_t *ids, size_t n,
                                             EpxCapability *out) {
    char *block = (char *)malloc(n * (sizeof(size_t) + sizeof(uint32_t)) + 1);
    if (!block) return epx_status(host, EPX_STATUS_CODE_OUT_OF_MEMORY, "capability: out of memory");
    size_t *sizes = (size_t *)block;
    uint32_t *nodes = (uint32_t *)(block + n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        sizes[i] = 1;
        nodes[i] = ids[i];
    }
    out->num_groups = n;
    out->group_sizes = sizes;
    out->nodes = nodes;
    out->release = epx__capability_release;
    out->private_data = block;
    return NULL;
}

/** The element count of a tensor (the product of its extents). */
static inline int64_t epx_numel(const DLTensor *t) {
    int64_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/** A tensor's data, at its byte offset. */
static inline void *epx_data(const DLTensor *t) {
    return (char *)t->data + t->byte_offset;
}

#endif  /* EPX_PLUGIN_HELPERS_H */
