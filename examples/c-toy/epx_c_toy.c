/*
 * epx_c_toy.c: `toy_c`, an EP in C on host memory: float32 Relu, and Add of two tensors of one
 * static shape. The helpers (epx_status, epx_node, epx_capability_each, ...) are in the header.
 *
 *     cc -std=c11 -O2 -shared -fPIC -I include examples/c-toy/epx_c_toy.c -o libepx_c_toy.so
 */
#include "epx_plugin.h"

static const EpxHostApi *host;

/* Claims float32 Relu, and Add of two float32 tensors of one static shape. */
static bool claims(const EpxGraph *g, uint32_t id) {
    EpxNodeInfo n;
    EpxValueInfo a, b;
    EpxStatus *status = epx_node(host, g, id, &n);
    if (status) {
        epx_status_free(status);
        return false;
    }
    if (n.domain.len != 0 || n.num_inputs < 1 || n.inputs[0] == EPX_VALUE_NONE ||
        !epx_static_tensor(host, g, n.inputs[0], EPX_ELEMENT_TYPE_FLOAT, &a))
        return false;
    if (epx_str_eq(n.op_type, "Relu")) return n.num_inputs == 1;
    if (!epx_str_eq(n.op_type, "Add") || n.num_inputs != 2 || n.inputs[1] == EPX_VALUE_NONE ||
        !epx_static_tensor(host, g, n.inputs[1], EPX_ELEMENT_TYPE_FLOAT, &b) || a.rank != b.rank)
        return false;
    return memcmp(a.dims, b.dims, (size_t)a.rank * sizeof(int64_t)) == 0;
}

static EpxStatus *get_capability(void *state, const EpxGraph *g, const uint32_t *unclaimed,
                                 size_t n, EpxCapability *out) {
    (void)state;
    uint32_t *mine = (uint32_t *)malloc(n * sizeof(uint32_t) + 1);
    if (!mine) return epx_status(host, EPX_STATUS_CODE_OUT_OF_MEMORY, "toy_c: out of memory");
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (claims(g, unclaimed[i])) mine[count++] = unclaimed[i];
    }
    EpxStatus *status = epx_capability_each(host, mine, count, out);
    free(mine);
    return status;
}

/* The kernel's state is non-NULL for Add. */
static EpxStatus *execute(void *add, EpxKernelContext *ctx) {
    const DLTensor *x, *y = NULL;
    DLTensor *out;
    EpxStatus *status = host->kernel_input(ctx, 0, &x);
    if (!status && add) status = host->kernel_input(ctx, 1, &y);
    if (!status) status = host->kernel_output(ctx, 0, x->dtype, x->ndim, x->shape, &out);
    if (status) return status;
    const float *a = (const float *)epx_data(x), *b = y ? (const float *)epx_data(y) : NULL;
    float *o = (float *)epx_data(out);
    for (int64_t i = 0, n = epx_numel(x); i < n; i++) {
        o[i] = b ? a[i] + b[i] : a[i] < 0.0f ? 0.0f : a[i];
    }
    return NULL;
}

static void release_kernel(EpxKernel *kernel) { free(kernel); }

static EpxStatus *compile(void *state, const EpxGraph *g, const EpxSubgraph *sub, EpxKernel **out) {
    (void)state;
    EpxNodeInfo n;
    EpxStatus *status = epx_node(host, g, sub->nodes[0], &n);
    if (status) return status;
    EpxKernel *kernel = (EpxKernel *)calloc(1, sizeof *kernel);
    if (!kernel) return epx_status(host, EPX_STATUS_CODE_OUT_OF_MEMORY, "toy_c: out of memory");
    kernel->struct_size = sizeof *kernel;
    kernel->state = epx_str_eq(n.op_type, "Add") ? (void *)kernel : NULL;
    kernel->execute = execute;
    kernel->release = release_kernel;
    *out = kernel;
    return NULL;
}

static void release_provider(EpxProvider *provider) { free(provider); }

static EpxStatus *create(void *state, size_t n, const EpxStr *keys, const EpxStr *values,
                         EpxProvider **out) {
    (void)state, (void)values;
    if (n > 0)
        return epx_status(host, EPX_STATUS_CODE_INVALID_ARGUMENT,
                          "toy_c takes no options, got `%.*s`", (int)keys[0].len, keys[0].data);
    EpxProvider *p = (EpxProvider *)calloc(1, sizeof *p);
    if (!p) return epx_status(host, EPX_STATUS_CODE_OUT_OF_MEMORY, "toy_c: out of memory");
    p->struct_size = sizeof *p;
    p->get_capability = get_capability;
    p->compile = compile;
    p->release = release_provider;
    *out = p;
    return NULL;
}

static const EpxProviderFactory factory = {
    sizeof(EpxProviderFactory), NULL, "toy_c", "epx examples", "0.1.0", DL_DEVICE_TYPE_CPU,
    EPX_PROVIDER_CONCURRENT_KERNELS, NULL, create, NULL};
static const EpxProviderFactory *const factories[] = {&factory};

static void release_descriptor(EpxPluginDescriptor *descriptor) { (void)descriptor; }

static EpxPluginDescriptor descriptor = {sizeof(EpxPluginDescriptor), EPX_ABI_VERSION_INIT,
                                         "toy_c", "0.1.0", 1, factories, release_descriptor};

EPX_EXPORT EpxStatus *epx_plugin_entry(const EpxHostApi *h, EpxPluginDescriptor **out) {
    if (h->abi_version.major != EPX_ABI_VERSION_MAJOR)
        return epx_status(h, EPX_STATUS_CODE_ABI_MISMATCH, "toy_c is built for ABI %d.x",
                          EPX_ABI_VERSION_MAJOR);
    host = h;
    *out = &descriptor;
    return NULL;
}
