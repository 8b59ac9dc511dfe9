/*
 * epx_c_example.c: an epx execution provider (EP) written in plain C11 against
 * include/epx_plugin.h, the way a third party would write one. See README.md next to this file.
 *
 * The EP, `c_example`, runs float32 Relu, Sigmoid, Tanh, Add and Mul. It keeps its tensors in
 * its own memory space (DLPack device type 12, kDLExtDev): memory comes from its `allocate`,
 * which puts a header with a magic number in front of every block, and its kernels refuse any
 * tensor that is not such a block. A successful run therefore shows that the host copied the
 * inputs into this EP's memory, allocated the outputs there, and copied the results back.
 *
 * Build (from the repository root):
 *
 *     cc -std=c11 -O2 -shared -fPIC -I include examples/c-plugin/epx_c_example.c -lm \
 *        -o libepx_c_example.so
 */

#include "epx_plugin.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define EXAMPLE_EXPORT __declspec(dllexport)
#else
#define EXAMPLE_EXPORT __attribute__((visibility("default")))
#endif

#define PLUGIN_NAME "c_example"
#define PLUGIN_VERSION "0.1.0"
#define EP_NAME "c_example"
#define EP_VENDOR "epx examples"
#define EP_VERSION "0.1.0"

/* This EP's memory space: DLPack's kDLExtDev. */
#define EP_DEVICE_TYPE DL_DEVICE_TYPE_EXT_DEV

/* ONNX TensorProto.DataType of float32, as value infos report it. */
#define ONNX_FLOAT EPX_ELEMENT_TYPE_FLOAT

/* "EPXCDEVM": marks every block that came from this EP's allocate. */
#define BLOCK_MAGIC UINT64_C(0x4550584344455643)

/* Where a reader may stop reading a struct of ABI 1.0 (see the preamble of epx_plugin.h). */
#define FIELD_END(type, field) (offsetof(type, field) + sizeof(void *))

/* ------------------------------------------------------------------------------------------ */
/* Global state: the host's table (kept from the entry call) and the live allocation count.   */

static const EpxHostApi *g_host;
static atomic_long g_live_allocations;

/* ------------------------------------------------------------------------------------------ */
/* Statuses and logging                                                                        */

/* A status this plugin owns, for the rare case the host cannot make one (a host table too
 * small, or status_create returning NULL). */
typedef struct OwnStatus {
    EpxStatus status;
    char message[];
} OwnStatus;

static void own_status_release(EpxStatus *status) {
    free(status);
}

static void static_status_release(EpxStatus *status) {
    (void)status;
}

static const EpxStatus k_out_of_memory_status = {
    sizeof(EpxStatus),
    EPX_STATUS_CODE_OUT_OF_MEMORY,
    PLUGIN_NAME ": out of memory while reporting an error",
    static_status_release,
};

static EpxStatus *own_status(uint32_t code, const char *message) {
    size_t len = strlen(message);
    OwnStatus *s = malloc(sizeof(OwnStatus) + len + 1);
    if (s == NULL) {
        /* The host only reads a status and calls its release, which does nothing here. */
        return (EpxStatus *)&k_out_of_memory_status;
    }
    memcpy(s->message, message, len + 1);
    s->status.struct_size = sizeof(EpxStatus);
    s->status.code = code;
    s->status.message = s->message;
    s->status.release = own_status_release;
    return &s->status;
}

/* Makes an error status whose message starts with the plugin's name. Never returns NULL. */
static EpxStatus *fail(uint32_t code, const char *format, ...) {
    char message[640];
    int prefix = snprintf(message, sizeof message, "%s: ", PLUGIN_NAME);
    va_list args;
    va_start(args, format);
    vsnprintf(message + prefix, sizeof message - (size_t)prefix, format, args);
    va_end(args);
    if (g_host != NULL && g_host->status_create != NULL) {
        EpxStr text = {(const uint8_t *)message, strlen(message)};
        EpxStatus *status = g_host->status_create(code, text);
        if (status != NULL) {
            return status;
        }
    }
    return own_status(code, message);
}

static void log_message(uint32_t level, const char *format, ...) {
    if (g_host == NULL || g_host->log == NULL) {
        return;
    }
    char message[512];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    EpxStr text = {(const uint8_t *)message, strlen(message)};
    g_host->log(level, PLUGIN_NAME, text);
}

/* An EpxStr as a printf argument: "%.*s", STR_ARG(s). */
#define STR_ARG(s) (int)((s).len > 200 ? 200 : (s).len), ((s).data ? (const char *)(s).data : "")

static int str_eq(EpxStr s, const char *text) {
    size_t len = strlen(text);
    return s.len == len && (len == 0 || memcmp(s.data, text, len) == 0);
}

/* A NUL-terminated copy of an EpxStr, or NULL when out of memory. */
static char *str_dup(EpxStr s) {
    char *copy = malloc(s.len + 1);
    if (copy != NULL) {
        if (s.len > 0) {
            memcpy(copy, s.data, s.len);
        }
        copy[s.len] = '\0';
    }
    return copy;
}

/* ------------------------------------------------------------------------------------------ */
/* This EP's memory: malloc blocks with a header in front                                      */

typedef struct BlockHeader {
    uint64_t magic;
    size_t size; /* usable bytes after the header */
    void *base;  /* what malloc returned */
    uint64_t reserved;
} BlockHeader;

static void *device_alloc(size_t bytes, size_t alignment) {
    if (alignment < 16) {
        alignment = 16;
    }
    if ((alignment & (alignment - 1)) != 0) {
        return NULL;
    }
    size_t overhead = sizeof(BlockHeader) + alignment - 1;
    if (bytes > SIZE_MAX - overhead) {
        return NULL;
    }
    char *base = malloc(bytes + overhead);
    if (base == NULL) {
        return NULL;
    }
    uintptr_t user = ((uintptr_t)base + sizeof(BlockHeader) + alignment - 1) &
                     ~(uintptr_t)(alignment - 1);
    BlockHeader header = {BLOCK_MAGIC, bytes, base, 0};
    memcpy((char *)user - sizeof(BlockHeader), &header, sizeof header);
    atomic_fetch_add(&g_live_allocations, 1);
    return (void *)user;
}

/* The header of a block from device_alloc, or 0 when `ptr` does not carry the magic. Only call
 * it for pointers that claim to be in this EP's memory (device type 12): it reads the bytes in
 * front of `ptr`. */
static int device_block(const void *ptr, BlockHeader *header) {
    if (ptr == NULL) {
        return 0;
    }
    memcpy(header, (const char *)ptr - sizeof(BlockHeader), sizeof *header);
    return header->magic == BLOCK_MAGIC;
}

static void device_free(void *ptr) {
    BlockHeader header;
    if (ptr == NULL) {
        return;
    }
    if (!device_block(ptr, &header)) {
        log_message(EPX_LOG_LEVEL_ERROR, "free: %p was not allocated by this EP; not freed", ptr);
        return;
    }
    uint64_t dead = 0;
    memcpy((char *)ptr - sizeof(BlockHeader), &dead, sizeof dead);
    free(header.base);
    atomic_fetch_sub(&g_live_allocations, 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */

static const DLDataType k_float32 = {DL_DATA_TYPE_CODE_FLOAT, 32, 1};

static int is_float32(DLDataType t) {
    return t.code == k_float32.code && t.bits == k_float32.bits && t.lanes == k_float32.lanes;
}

/* The byte size of a tensor's elements, with every field checked; 0 on success. */
static int tensor_bytes(const DLTensor *t, size_t *bytes, size_t *count) {
    if (t->ndim < 0 || (t->ndim > 0 && t->shape == NULL) || t->dtype.bits % 8 != 0 ||
        t->dtype.lanes == 0) {
        return -1;
    }
    size_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || (n != 0 && (uint64_t)t->shape[d] > SIZE_MAX / n)) {
            return -1;
        }
        n *= (size_t)t->shape[d];
    }
    size_t element = (size_t)(t->dtype.bits / 8) * t->dtype.lanes;
    if (n != 0 && element > SIZE_MAX / n) {
        return -1;
    }
    *bytes = n * element;
    if (count != NULL) {
        *count = n;
    }
    return 0;
}

/* Whether `t` is compact row-major (strides NULL, or equal to the row-major ones). */
static int is_compact(const DLTensor *t) {
    if (t->strides == NULL) {
        return 1;
    }
    int64_t expected = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expected) {
            return 0;
        }
        expected *= t->shape[d];
    }
    return 1;
}

static int same_shape(const DLTensor *a, const DLTensor *b) {
    if (a->ndim != b->ndim) {
        return 0;
    }
    for (int32_t d = 0; d < a->ndim; d++) {
        if (a->shape[d] != b->shape[d]) {
            return 0;
        }
    }
    return 1;
}

/* Checks that `t` lives in this EP's memory: device type 12, its data a block from
 * device_alloc (unless it is empty) that holds all `bytes` from byte_offset on. `what` names the
 * tensor in the message. */
static EpxStatus *check_in_ep_memory(const DLTensor *t, size_t bytes, const char *what) {
    BlockHeader header;
    if (t->device.device_type != EP_DEVICE_TYPE) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "%s is in the memory of DLPack device type %d, not in this EP's memory "
                    "(device type %d): the host did not copy it here",
                    what, (int)t->device.device_type, (int)EP_DEVICE_TYPE);
    }
    if (bytes == 0) {
        return NULL;
    }
    if (!device_block(t->data, &header)) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "%s claims device type %d but its data %p was not allocated by this EP's "
                    "allocate",
                    what, (int)EP_DEVICE_TYPE, t->data);
    }
    if (t->byte_offset > header.size || bytes > header.size - t->byte_offset) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "%s needs %zu bytes from offset %llu but its block holds %zu", what, bytes,
                    (unsigned long long)t->byte_offset, header.size);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Data transfer                                                                               */

static EpxStatus *ep_allocate(void *state, size_t bytes, size_t alignment, void **out) {
    (void)state;
    if (out == NULL) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "allocate: NULL out-pointer");
    }
    *out = NULL;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "allocate: alignment %zu is not a power of two", alignment);
    }
    void *ptr = device_alloc(bytes, alignment);
    if (ptr == NULL) {
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "allocate: cannot allocate %zu bytes", bytes);
    }
    *out = ptr;
    return NULL;
}

static void ep_free(void *state, void *ptr) {
    (void)state;
    device_free(ptr);
}

/* Copies between host memory and this EP's memory after checking both sides. */
static EpxStatus *copy_tensor(const char *what, const DLTensor *src, DLTensor *dst,
                              int32_t src_device, int32_t dst_device) {
    size_t src_bytes = 0;
    size_t dst_bytes = 0;
    EpxStatus *status;
    if (src == NULL || dst == NULL) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "%s: NULL tensor", what);
    }
    if (src->device.device_type != src_device || dst->device.device_type != dst_device) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "%s: copies from device type %d to %d, got %d to %d", what, (int)src_device,
                    (int)dst_device, (int)src->device.device_type,
                    (int)dst->device.device_type);
    }
    if (src->dtype.code != dst->dtype.code || src->dtype.bits != dst->dtype.bits ||
        src->dtype.lanes != dst->dtype.lanes) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "%s: element types differ (code %u bits %u lanes %u vs code %u bits %u "
                    "lanes %u)",
                    what, src->dtype.code, src->dtype.bits, src->dtype.lanes, dst->dtype.code,
                    dst->dtype.bits, dst->dtype.lanes);
    }
    if (tensor_bytes(src, &src_bytes, NULL) != 0 || tensor_bytes(dst, &dst_bytes, NULL) != 0) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "%s: malformed tensor", what);
    }
    if (!same_shape(src, dst)) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "%s: shapes differ (rank %d vs %d)", what,
                    (int)src->ndim, (int)dst->ndim);
    }
    if (!is_compact(src) || !is_compact(dst)) {
        return fail(EPX_STATUS_CODE_NOT_IMPLEMENTED, "%s: only compact tensors are copied",
                    what);
    }
    const DLTensor *device_side = src_device == EP_DEVICE_TYPE ? src : dst;
    status = check_in_ep_memory(device_side, src_bytes, src_device == EP_DEVICE_TYPE
                                                            ? "the source tensor"
                                                            : "the destination tensor");
    if (status != NULL) {
        return status;
    }
    if (src_bytes > 0) {
        memcpy((char *)dst->data + dst->byte_offset, (const char *)src->data + src->byte_offset,
               src_bytes);
    }
    return NULL;
}

static EpxStatus *ep_copy_to_device(void *state, const DLTensor *src, DLTensor *dst) {
    (void)state;
    return copy_tensor("copy_to_device", src, dst, DL_DEVICE_TYPE_CPU, EP_DEVICE_TYPE);
}

static EpxStatus *ep_copy_to_host(void *state, const DLTensor *src, DLTensor *dst) {
    (void)state;
    return copy_tensor("copy_to_host", src, dst, EP_DEVICE_TYPE, DL_DEVICE_TYPE_CPU);
}

/* ------------------------------------------------------------------------------------------ */
/* Operators                                                                                   */

typedef enum OpKind { OP_RELU, OP_SIGMOID, OP_TANH, OP_ADD, OP_MUL } OpKind;

static const struct {
    const char *name;
    OpKind kind;
    size_t arity;
} k_ops[] = {
    {"Relu", OP_RELU, 1}, {"Sigmoid", OP_SIGMOID, 1}, {"Tanh", OP_TANH, 1},
    {"Add", OP_ADD, 2},   {"Mul", OP_MUL, 2},
};

#define NUM_OPS (sizeof k_ops / sizeof k_ops[0])

/* The index in k_ops of a node's op, or -1. */
static int find_op(const EpxNodeInfo *node) {
    if (node->domain.len != 0 && !str_eq(node->domain, "ai.onnx")) {
        return -1;
    }
    for (size_t i = 0; i < NUM_OPS; i++) {
        if (str_eq(node->op_type, k_ops[i].name)) {
            return (int)i;
        }
    }
    return -1;
}

static void run_op(OpKind op, const float *a, const float *b, float *y, size_t n) {
    size_t i;
    switch (op) {
    case OP_RELU:
        for (i = 0; i < n; i++) {
            y[i] = a[i] > 0.0f ? a[i] : 0.0f;
        }
        break;
    case OP_SIGMOID:
        for (i = 0; i < n; i++) {
            y[i] = 1.0f / (1.0f + expf(-a[i]));
        }
        break;
    case OP_TANH:
        for (i = 0; i < n; i++) {
            y[i] = tanhf(a[i]);
        }
        break;
    case OP_ADD:
        for (i = 0; i < n; i++) {
            y[i] = a[i] + b[i];
        }
        break;
    case OP_MUL:
        for (i = 0; i < n; i++) {
            y[i] = a[i] * b[i];
        }
        break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Capability                                                                                  */

static int read_node(const EpxGraph *graph, uint32_t id, EpxNodeInfo *node) {
    memset(node, 0, sizeof *node);
    node->struct_size = sizeof *node;
    EpxStatus *status = g_host->graph_node(graph, id, node);
    if (status != NULL) {
        status->release(status);
        return -1;
    }
    return 0;
}

static int read_value(const EpxGraph *graph, uint32_t id, EpxValueInfo *value) {
    memset(value, 0, sizeof *value);
    value->struct_size = sizeof *value;
    EpxStatus *status = g_host->graph_value(graph, id, value);
    if (status != NULL) {
        status->release(status);
        return -1;
    }
    return 0;
}

/* Whether this EP takes node `id`: a supported op whose inputs are computed float32 tensors
 * (not initializers); for Add and Mul both shapes must be known, static and equal (this EP
 * does not broadcast). When not, `why` says why, for the debug log. */
static int node_supported(const EpxGraph *graph, uint32_t id, const char **why) {
    EpxNodeInfo node;
    EpxValueInfo values[2];
    if (read_node(graph, id, &node) != 0) {
        *why = "the host could not describe it";
        return 0;
    }
    int op = find_op(&node);
    if (op < 0) {
        *why = "op not supported";
        return 0;
    }
    if (node.num_inputs != k_ops[op].arity || node.num_outputs != 1 || node.outputs == NULL ||
        node.outputs[0] == EPX_VALUE_NONE || node.num_attributes != 0) {
        *why = "unexpected inputs, outputs or attributes";
        return 0;
    }
    for (size_t i = 0; i < node.num_inputs; i++) {
        if (node.inputs[i] == EPX_VALUE_NONE || read_value(graph, node.inputs[i], &values[i]) != 0) {
            *why = "an input is absent";
            return 0;
        }
        if ((values[i].flags & EPX_VALUE_INITIALIZER) != 0) {
            *why = "an input is an initializer (this EP does not copy constants)";
            return 0;
        }
        /* Unary ops also take an input whose type the graph does not say (the host runs no
         * shape inference); execute checks it. */
        int type_ok = values[i].elem_type == ONNX_FLOAT ||
                      (k_ops[op].arity == 1 && values[i].elem_type == 0);
        if (!type_ok) {
            *why = "an input is not float32";
            return 0;
        }
    }
    if (k_ops[op].arity == 2) {
        const EpxValueInfo *a = &values[0];
        const EpxValueInfo *b = &values[1];
        if (a->rank < 0 || a->rank != b->rank || (a->rank > 0 && (!a->dims || !b->dims))) {
            *why = "the input shapes are not known to be equal";
            return 0;
        }
        for (int64_t d = 0; d < a->rank; d++) {
            if (a->dims[d] < 0 || a->dims[d] != b->dims[d]) {
                *why = "the input shapes are not static and equal (no broadcasting here)";
                return 0;
            }
        }
    }
    return 1;
}

/* The capability answer's arrays live in one block, freed by release. */
static void capability_release(EpxCapability *capability) {
    free(capability->private_data);
    capability->private_data = NULL;
    capability->group_sizes = NULL;
    capability->nodes = NULL;
    capability->num_groups = 0;
}

/* Claims every supported node, one group per run of consecutive node ids. Ids are topological,
 * so every path between two nodes of such a run stays inside it: the group is convex. */
static EpxStatus *ep_get_capability(void *state, const EpxGraph *graph, const uint32_t *unclaimed,
                                    size_t num_unclaimed, EpxCapability *out) {
    (void)state;
    if (out == NULL || out->struct_size < FIELD_END(EpxCapability, private_data)) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "get_capability: the answer struct is missing or too small");
    }
    if (num_unclaimed == 0) {
        return NULL;
    }
    if (unclaimed == NULL) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "get_capability: NULL unclaimed ids");
    }
    /* Worst case: every node its own group. */
    size_t *sizes = malloc(num_unclaimed * (sizeof(size_t) + sizeof(uint32_t)));
    if (sizes == NULL) {
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "get_capability: out of memory");
    }
    uint32_t *nodes = (uint32_t *)(sizes + num_unclaimed);
    size_t num_groups = 0;
    size_t num_nodes = 0;
    uint32_t previous = EPX_VALUE_NONE;
    for (size_t i = 0; i < num_unclaimed; i++) {
        uint32_t id = unclaimed[i];
        const char *why = "";
        if (!node_supported(graph, id, &why)) {
            EpxNodeInfo node;
            if (read_node(graph, id, &node) == 0) {
                log_message(EPX_LOG_LEVEL_DEBUG, "not taking node `%.*s` (%.*s): %s",
                            STR_ARG(node.name), STR_ARG(node.op_type), why);
            }
            continue;
        }
        if (num_groups == 0 || previous == EPX_VALUE_NONE || id != previous + 1) {
            sizes[num_groups++] = 0;
        }
        sizes[num_groups - 1]++;
        nodes[num_nodes++] = id;
        previous = id;
    }
    if (num_groups == 0) {
        free(sizes);
        return NULL;
    }
    out->num_groups = num_groups;
    out->group_sizes = sizes;
    out->nodes = nodes;
    out->release = capability_release;
    out->private_data = sizes;
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Kernels                                                                                     */

typedef struct KernelNode {
    OpKind op;
    size_t num_inputs;
    uint32_t inputs[2];
    uint32_t output;
    char *name;    /* for messages */
    char *op_name; /* for messages */
} KernelNode;

typedef struct Kernel {
    EpxKernel kernel; /* first: the host's EpxKernel * is the whole Kernel */
    size_t num_nodes;
    KernelNode *nodes;
    size_t num_inputs;
    uint32_t *inputs;
    char **input_names; /* for messages */
    size_t num_outputs;
    uint32_t *outputs;
} Kernel;

static void kernel_free(Kernel *k) {
    if (k == NULL) {
        return;
    }
    for (size_t i = 0; i < k->num_nodes; i++) {
        free(k->nodes[i].name);
        free(k->nodes[i].op_name);
    }
    free(k->nodes);
    if (k->input_names != NULL) {
        for (size_t i = 0; i < k->num_inputs; i++) {
            free(k->input_names[i]);
        }
    }
    free(k->input_names);
    free(k->inputs);
    free(k->outputs);
    free(k);
}

static void kernel_release(EpxKernel *kernel) {
    kernel_free((Kernel *)kernel);
}

/* A value the kernel has in hand while executing: float32 data in this EP's memory. */
typedef struct Binding {
    uint32_t value;
    const float *data;
    int32_t ndim;
    const int64_t *shape;
    size_t count;
} Binding;

static const Binding *find_binding(const Binding *bindings, size_t n, uint32_t value) {
    for (size_t i = 0; i < n; i++) {
        if (bindings[i].value == value) {
            return &bindings[i];
        }
    }
    return NULL;
}

static long index_of(const uint32_t *ids, size_t n, uint32_t value) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == value) {
            return (long)i;
        }
    }
    return -1;
}

/* "input `x` of node `Relu_r` (Relu)": kernel input `i` and the first node reading it. */
static void describe_input(const Kernel *k, size_t i, char *buf, size_t size) {
    for (size_t n = 0; n < k->num_nodes; n++) {
        for (size_t j = 0; j < k->nodes[n].num_inputs; j++) {
            if (k->nodes[n].inputs[j] == k->inputs[i]) {
                snprintf(buf, size, "input `%s` of node `%s` (%s)", k->input_names[i],
                         k->nodes[n].name, k->nodes[n].op_name);
                return;
            }
        }
    }
    snprintf(buf, size, "kernel input `%s`", k->input_names[i]);
}

static EpxStatus *kernel_execute(void *state, EpxKernelContext *ctx) {
    const Kernel *k = state;
    EpxStatus *status = NULL;
    char what[320];
    size_t num_bindings = 0;
    size_t num_scratch = 0;
    Binding *bindings = malloc((k->num_inputs + k->num_nodes + 1) * sizeof(Binding));
    void **scratch = malloc((k->num_nodes + 1) * sizeof(void *));
    if (bindings == NULL || scratch == NULL) {
        status = fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "execute: out of memory");
        goto done;
    }
    if (g_host->kernel_input_count(ctx) != k->num_inputs ||
        g_host->kernel_output_count(ctx) != k->num_outputs) {
        status = fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                      "execute: the host passes %zu inputs and %zu outputs, the kernel was "
                      "compiled for %zu and %zu",
                      g_host->kernel_input_count(ctx), g_host->kernel_output_count(ctx),
                      k->num_inputs, k->num_outputs);
        goto done;
    }

    /* Inputs: they must be float32 tensors in this EP's memory. */
    for (size_t i = 0; i < k->num_inputs; i++) {
        const DLTensor *t = NULL;
        size_t bytes = 0;
        size_t count = 0;
        status = g_host->kernel_input(ctx, i, &t);
        if (status != NULL) {
            goto done;
        }
        describe_input(k, i, what, sizeof what);
        if (t == NULL || tensor_bytes(t, &bytes, &count) != 0) {
            status = fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "%s is absent or malformed", what);
            goto done;
        }
        if (!is_float32(t->dtype) || !is_compact(t)) {
            status = fail(EPX_STATUS_CODE_NOT_IMPLEMENTED,
                          "%s is not a compact float32 tensor (DLPack code %u, bits %u)", what,
                          t->dtype.code, t->dtype.bits);
            goto done;
        }
        status = check_in_ep_memory(t, bytes, what);
        if (status != NULL) {
            goto done;
        }
        Binding b = {k->inputs[i], (const float *)((const char *)t->data + t->byte_offset),
                     t->ndim, t->shape, count};
        bindings[num_bindings++] = b;
    }

    /* Nodes in order: each result goes into its output tensor, or into scratch memory from
     * this EP's own allocator when nothing outside the kernel reads it. */
    for (size_t n = 0; n < k->num_nodes; n++) {
        const KernelNode *node = &k->nodes[n];
        const Binding *a = find_binding(bindings, num_bindings, node->inputs[0]);
        const Binding *b =
            node->num_inputs == 2 ? find_binding(bindings, num_bindings, node->inputs[1]) : NULL;
        float *y = NULL;
        if (a == NULL || (node->num_inputs == 2 && b == NULL)) {
            status = fail(EPX_STATUS_CODE_INVALID_GRAPH,
                          "node `%s` (%s): an input was not computed before it", node->name,
                          node->op_name);
            goto done;
        }
        if (b != NULL) {
            int same = a->ndim == b->ndim;
            for (int32_t d = 0; same && d < a->ndim; d++) {
                same = a->shape[d] == b->shape[d];
            }
            if (!same) {
                status = fail(EPX_STATUS_CODE_RUNTIME_ERROR,
                              "node `%s` (%s): the inputs have different shapes, and this EP "
                              "does not broadcast",
                              node->name, node->op_name);
                goto done;
            }
        }
        long out_index = index_of(k->outputs, k->num_outputs, node->output);
        if (out_index >= 0) {
            DLTensor *out = NULL;
            size_t bytes = 0;
            status = g_host->kernel_output(ctx, (size_t)out_index, k_float32, a->ndim, a->shape,
                                           &out);
            if (status != NULL) {
                goto done;
            }
            snprintf(what, sizeof what, "the output of node `%s` (%s)", node->name,
                     node->op_name);
            if (out == NULL || tensor_bytes(out, &bytes, NULL) != 0 ||
                bytes != a->count * sizeof(float)) {
                status = fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                              "%s: the host returned a missing or wrongly sized tensor", what);
                goto done;
            }
            status = check_in_ep_memory(out, bytes, what);
            if (status != NULL) {
                goto done;
            }
            y = (float *)((char *)out->data + out->byte_offset);
        } else {
            y = device_alloc(a->count * sizeof(float), 64);
            if (y == NULL) {
                status = fail(EPX_STATUS_CODE_OUT_OF_MEMORY,
                              "node `%s` (%s): cannot allocate %zu bytes of scratch memory",
                              node->name, node->op_name, a->count * sizeof(float));
                goto done;
            }
            scratch[num_scratch++] = y;
        }
        if (a->count > 0) {
            run_op(node->op, a->data, b != NULL ? b->data : NULL, y, a->count);
        }
        Binding result = {node->output, y, a->ndim, a->shape, a->count};
        bindings[num_bindings++] = result;
    }

done:
    if (scratch != NULL) {
        for (size_t i = 0; i < num_scratch; i++) {
            device_free(scratch[i]);
        }
    }
    free(scratch);
    free(bindings);
    return status;
}

static EpxStatus *ep_compile(void *state, const EpxGraph *graph, const EpxSubgraph *subgraph,
                             EpxKernel **out) {
    (void)state;
    EpxStatus *status = NULL;
    if (out == NULL) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "compile: NULL out-pointer");
    }
    *out = NULL;
    if (subgraph == NULL || subgraph->struct_size < FIELD_END(EpxSubgraph, outputs) ||
        subgraph->num_nodes == 0 || subgraph->nodes == NULL ||
        (subgraph->num_inputs > 0 && subgraph->inputs == NULL) ||
        (subgraph->num_outputs > 0 && subgraph->outputs == NULL)) {
        return fail(EPX_STATUS_CODE_INVALID_GRAPH, "compile: malformed subgraph");
    }
    Kernel *k = calloc(1, sizeof(Kernel));
    if (k == NULL) {
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "compile: out of memory");
    }
    k->nodes = calloc(subgraph->num_nodes, sizeof(KernelNode));
    k->inputs = malloc((subgraph->num_inputs + 1) * sizeof(uint32_t));
    k->input_names = calloc(subgraph->num_inputs + 1, sizeof(char *));
    k->outputs = malloc((subgraph->num_outputs + 1) * sizeof(uint32_t));
    if (k->nodes == NULL || k->inputs == NULL || k->input_names == NULL || k->outputs == NULL) {
        kernel_free(k);
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "compile: out of memory");
    }
    k->num_inputs = subgraph->num_inputs;
    for (size_t i = 0; i < k->num_inputs; i++) {
        EpxValueInfo value;
        k->inputs[i] = subgraph->inputs[i];
        if (read_value(graph, k->inputs[i], &value) != 0) {
            status = fail(EPX_STATUS_CODE_INVALID_GRAPH, "compile: cannot read value %u",
                          (unsigned)k->inputs[i]);
            goto failed;
        }
        k->input_names[i] = str_dup(value.name);
        if (k->input_names[i] == NULL) {
            status = fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "compile: out of memory");
            goto failed;
        }
    }
    k->num_outputs = subgraph->num_outputs;
    if (k->num_outputs > 0) {
        memcpy(k->outputs, subgraph->outputs, k->num_outputs * sizeof(uint32_t));
    }

    /* Copy each node: its op and value ids, and its name for messages. */
    for (size_t n = 0; n < subgraph->num_nodes; n++) {
        EpxNodeInfo info;
        if (read_node(graph, subgraph->nodes[n], &info) != 0) {
            status = fail(EPX_STATUS_CODE_INVALID_GRAPH, "compile: cannot read node %u",
                          (unsigned)subgraph->nodes[n]);
            goto failed;
        }
        KernelNode *node = &k->nodes[k->num_nodes];
        node->name = str_dup(info.name);
        node->op_name = str_dup(info.op_type);
        k->num_nodes++;
        if (node->name == NULL || node->op_name == NULL) {
            status = fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "compile: out of memory");
            goto failed;
        }
        int op = find_op(&info);
        if (op < 0 || info.num_inputs != k_ops[op].arity || info.num_outputs != 1) {
            status = fail(EPX_STATUS_CODE_INVALID_GRAPH,
                          "compile: node `%s` (%s) is not one this EP claimed", node->name,
                          node->op_name);
            goto failed;
        }
        node->op = k_ops[op].kind;
        node->num_inputs = info.num_inputs;
        node->output = info.outputs[0];
        /* Every input must come from the kernel's inputs or from an earlier node. */
        for (size_t i = 0; i < info.num_inputs; i++) {
            uint32_t v = info.inputs[i];
            int known = index_of(k->inputs, k->num_inputs, v) >= 0;
            for (size_t p = 0; !known && p + 1 < k->num_nodes; p++) {
                known = k->nodes[p].output == v;
            }
            if (!known) {
                status = fail(EPX_STATUS_CODE_INVALID_GRAPH,
                              "compile: node `%s` (%s) reads value %u, which is neither a "
                              "subgraph input nor computed by an earlier node of the group",
                              node->name, node->op_name, (unsigned)v);
                goto failed;
            }
            node->inputs[i] = v;
        }
    }
    /* Every output must be computed by a node. */
    for (size_t o = 0; o < k->num_outputs; o++) {
        int made = 0;
        for (size_t n = 0; !made && n < k->num_nodes; n++) {
            made = k->nodes[n].output == k->outputs[o];
        }
        if (!made) {
            status = fail(EPX_STATUS_CODE_INVALID_GRAPH,
                          "compile: subgraph output %u is not computed by the group",
                          (unsigned)k->outputs[o]);
            goto failed;
        }
    }

    k->kernel.struct_size = sizeof(EpxKernel);
    k->kernel.state = k;
    k->kernel.execute = kernel_execute;
    k->kernel.release = kernel_release;
    *out = &k->kernel;
    return NULL;

failed:
    kernel_free(k);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Provider, factory, descriptor                                                               */

static void provider_release(EpxProvider *provider) {
    free(provider);
}

static EpxStatus *factory_create(void *state, size_t num_options, const EpxStr *keys,
                                 const EpxStr *values, EpxProvider **out) {
    (void)state;
    (void)values;
    if (out == NULL) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT, "create: NULL out-pointer");
    }
    *out = NULL;
    if (num_options > 0) {
        return fail(EPX_STATUS_CODE_INVALID_ARGUMENT,
                    "unknown option `%.*s`: this EP takes no options (valid keys: none)",
                    STR_ARG(keys[0]));
    }
    EpxProvider *p = calloc(1, sizeof(EpxProvider));
    if (p == NULL) {
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "create: out of memory");
    }
    p->struct_size = sizeof(EpxProvider);
    p->state = NULL;
    p->get_capability = ep_get_capability;
    p->compile = ep_compile;
    p->allocate = ep_allocate;
    p->free = ep_free;
    p->copy_to_device = ep_copy_to_device;
    p->copy_to_host = ep_copy_to_host;
    p->copy_on_device = NULL;
    p->release = provider_release;
    *out = p;
    return NULL;
}

/* The descriptor, its one factory and the factory list, in one block. */
typedef struct Plugin {
    EpxPluginDescriptor descriptor; /* first: release gets the whole Plugin */
    EpxProviderFactory factory;
    const EpxProviderFactory *factories[1];
} Plugin;

static void descriptor_release(EpxPluginDescriptor *descriptor) {
    free(descriptor);
}

/* The live blocks this EP's allocate handed out and its free has not taken back yet (scratch
 * memory included). For tests: 0 once every session using the EP is gone. */
EXAMPLE_EXPORT int epx_c_example_live_allocations(void) {
    return (int)atomic_load(&g_live_allocations);
}

EXAMPLE_EXPORT EpxStatus *epx_plugin_entry(const EpxHostApi *host, EpxPluginDescriptor **out) {
    if (out == NULL || host == NULL) {
        return own_status(EPX_STATUS_CODE_INVALID_ARGUMENT,
                          PLUGIN_NAME ": epx_plugin_entry: NULL argument");
    }
    *out = NULL;
    if (host->struct_size < FIELD_END(EpxHostApi, kernel_output)) {
        return own_status(EPX_STATUS_CODE_ABI_MISMATCH,
                          PLUGIN_NAME ": the host's function table is smaller than ABI 1.0's");
    }
    if (host->abi_version.major != EPX_ABI_VERSION_MAJOR) {
        char message[200];
        snprintf(message, sizeof message,
                 "%s: built for epx plugin ABI %d.%d, the host implements %u.%u", PLUGIN_NAME,
                 EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR,
                 (unsigned)host->abi_version.major, (unsigned)host->abi_version.minor);
        return own_status(EPX_STATUS_CODE_ABI_MISMATCH, message);
    }
    if (host->status_create == NULL || host->graph_node == NULL || host->graph_value == NULL ||
        host->kernel_input_count == NULL || host->kernel_input == NULL ||
        host->kernel_output_count == NULL || host->kernel_output == NULL) {
        return own_status(EPX_STATUS_CODE_ABI_MISMATCH,
                          PLUGIN_NAME ": the host's function table lacks functions this EP uses");
    }
    g_host = host;

    Plugin *plugin = calloc(1, sizeof(Plugin));
    if (plugin == NULL) {
        return fail(EPX_STATUS_CODE_OUT_OF_MEMORY, "epx_plugin_entry: out of memory");
    }
    EpxProviderFactory *f = &plugin->factory;
    f->struct_size = sizeof(EpxProviderFactory);
    f->state = NULL;
    f->name = EP_NAME;
    f->vendor = EP_VENDOR;
    f->version = EP_VERSION;
    f->device_type = EP_DEVICE_TYPE;
    /* Kernels keep no mutable state (scratch memory is per call), so they may run
     * concurrently. */
    f->flags = EPX_PROVIDER_CONCURRENT_KERNELS;
    f->is_available = NULL; /* always available */
    f->create = factory_create;
    plugin->factories[0] = f;

    EpxPluginDescriptor *d = &plugin->descriptor;
    d->struct_size = sizeof(EpxPluginDescriptor);
    d->abi_version.major = EPX_ABI_VERSION_MAJOR;
    d->abi_version.minor = EPX_ABI_VERSION_MINOR;
    d->abi_version.patch = EPX_ABI_VERSION_PATCH;
    d->name = PLUGIN_NAME;
    d->version = PLUGIN_VERSION;
    d->num_providers = 1;
    d->providers = plugin->factories;
    d->release = descriptor_release;
    *out = d;
    return NULL;
}
