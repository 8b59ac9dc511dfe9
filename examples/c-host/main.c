/*
 * epx-c-host: runs an ONNX model through libepx from C.
 *
 *     epx-c-host MODEL [--plugin-dir DIR]... [--ep NAME]... [INPUT=FILE.npy]...
 *
 * Lists the execution providers libepx finds (with availability and the reason when one cannot
 * run), makes a session with the EPs named by --ep in that order (the CPU EP takes what is
 * left), runs it on the given .npy inputs (float32 or int64, little-endian, C order; inputs not
 * given are filled with zeros), prints every output and the placement report as JSON.
 *
 * Build (installed epx):   cc main.c $(pkg-config --cflags --libs epx) -o epx-c-host
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"

#define MAX_ITEMS 16

/* Prints the error, frees it, and says whether there was one. */
static int failed(EpxError *e, const char *what) {
    if (e == NULL) {
        return 0;
    }
    fprintf(stderr, "error: %s: [code %d] %s\n", what, (int)epx_error_code(e), epx_error_message(e));
    epx_error_free(e);
    return 1;
}

static size_t element_size(int32_t type) {
    switch (type) {
    case EPX_ELEMENT_TYPE_FLOAT: case EPX_ELEMENT_TYPE_INT32: case EPX_ELEMENT_TYPE_UINT32: return 4;
    case EPX_ELEMENT_TYPE_INT64: case EPX_ELEMENT_TYPE_UINT64: case EPX_ELEMENT_TYPE_DOUBLE: return 8;
    case EPX_ELEMENT_TYPE_FLOAT16: case EPX_ELEMENT_TYPE_INT16: case EPX_ELEMENT_TYPE_UINT16: return 2;
    case EPX_ELEMENT_TYPE_UINT8: case EPX_ELEMENT_TYPE_INT8: case EPX_ELEMENT_TYPE_BOOL: return 1;
    default: return 0;
    }
}

/* Reads the data of a .npy file (format 1.x/2.x); *len receives its byte count. */
static void *read_npy(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "error: cannot open %s\n", path);
        return NULL;
    }
    unsigned char head[12];
    size_t header_len = 0, offset = 0;
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "error: %s is not a .npy file\n", path);
        fclose(f);
        return NULL;
    }
    if (head[6] == 1) {
        header_len = (size_t)head[8] | ((size_t)head[9] << 8);
        offset = 10 + header_len;
    } else {
        if (fread(head + 10, 1, 2, f) != 2) {
            fclose(f);
            return NULL;
        }
        header_len = (size_t)head[8] | ((size_t)head[9] << 8) | ((size_t)head[10] << 16)
            | ((size_t)head[11] << 24);
        offset = 12 + header_len;
    }
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    if (end < 0 || (size_t)end < offset) {
        fclose(f);
        return NULL;
    }
    *len = (size_t)end - offset;
    void *data = malloc(*len ? *len : 1);
    fseek(f, (long)offset, SEEK_SET);
    if (data == NULL || fread(data, 1, *len, f) != *len) {
        fprintf(stderr, "error: reading %s failed\n", path);
        free(data);
        data = NULL;
    }
    fclose(f);
    return data;
}

static void list_providers(const EpxEnv *env) {
    size_t n = epx_env_provider_count(env);
    printf("execution providers (%zu):\n", n);
    for (size_t i = 0; i < n; i++) {
        EpxProviderDesc p;
        if (failed(epx_env_provider(env, i, &p), "epx_env_provider")) {
            continue;
        }
        printf("  %-14s %-12s %s%s%s\n", p.name, p.plugin, p.available ? "available" : "unavailable",
               p.reason ? ": " : "", p.reason ? p.reason : "");
    }
}

static void print_output(const EpxTensorRef *t) {
    size_t count = 1;
    printf("output %s: type %d shape [", t->name, (int)t->elem_type);
    for (size_t d = 0; d < t->ndim; d++) {
        printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
        count *= (size_t)t->shape[d];
    }
    printf("] values");
    for (size_t i = 0; i < count; i++) {
        if (t->elem_type == EPX_ELEMENT_TYPE_FLOAT) {
            printf(" %.9g", (double)((const float *)t->data)[i]);
        } else if (t->elem_type == EPX_ELEMENT_TYPE_INT64) {
            printf(" %lld", (long long)((const int64_t *)t->data)[i]);
        } else {
            printf(" ?");
            break;
        }
    }
    printf("\n");
}

int main(int argc, char **argv) {
    const char *model = NULL, *dirs[MAX_ITEMS], *eps[MAX_ITEMS], *given[MAX_ITEMS];
    size_t n_dirs = 0, n_eps = 0, n_given = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && n_dirs < MAX_ITEMS) {
            dirs[n_dirs++] = argv[++i];
        } else if (strcmp(argv[i], "--ep") == 0 && i + 1 < argc && n_eps < MAX_ITEMS) {
            eps[n_eps++] = argv[++i];
        } else if (strchr(argv[i], '=') != NULL && n_given < MAX_ITEMS) {
            given[n_given++] = argv[i];
        } else if (model == NULL) {
            model = argv[i];
        } else {
            fprintf(stderr, "usage: %s MODEL [--plugin-dir DIR]... [--ep NAME]... [INPUT=FILE.npy]...\n", argv[0]);
            return 2;
        }
    }
    if (model == NULL) {
        fprintf(stderr, "usage: %s MODEL [--plugin-dir DIR]... [--ep NAME]... [INPUT=FILE.npy]...\n", argv[0]);
        return 2;
    }
    printf("libepx %s\n", epx_version());

    int status = 1;
    EpxEnv *env = NULL;
    EpxSessionOptions *options = epx_session_options_new();
    EpxSession *session = NULL;
    EpxOutputs *outputs = NULL;
    EpxTensorRef inputs[MAX_ITEMS];
    void *buffers[MAX_ITEMS] = {0};
    size_t n_inputs = 0;
    char *json = NULL;

    if (failed(epx_env_new(dirs, n_dirs, NULL, &env), "epx_env_new")) {
        goto done;
    }
    list_providers(env);
    for (size_t i = 0; i < n_eps; i++) {
        if (failed(epx_session_options_add_provider(options, eps[i], NULL, NULL, 0, true), eps[i])) {
            goto done;
        }
    }
    if (failed(epx_session_new(env, model, options, &session), "epx_session_new")) {
        goto done;
    }

    n_inputs = epx_session_input_count(session);
    if (n_inputs > MAX_ITEMS) {
        fprintf(stderr, "error: the model has more than %d inputs\n", MAX_ITEMS);
        goto done;
    }
    for (size_t i = 0; i < n_inputs; i++) {
        EpxValueDesc d;
        if (failed(epx_session_input(session, i, &d), "epx_session_input")) {
            goto done;
        }
        size_t count = 1, size = element_size(d.elem_type);
        for (int64_t k = 0; k < d.ndim; k++) {
            count *= d.shape[k] < 0 ? 1 : (size_t)d.shape[k]; /* dynamic extents: 1 */
        }
        inputs[i] = (EpxTensorRef){d.name, d.elem_type, d.shape, d.ndim < 0 ? 0 : (size_t)d.ndim,
                                   NULL, count * size};
        size_t name_len = strlen(d.name);
        for (size_t g = 0; g < n_given; g++) {
            if (strncmp(given[g], d.name, name_len) == 0 && given[g][name_len] == '=') {
                buffers[i] = read_npy(given[g] + name_len + 1, &inputs[i].byte_len);
            }
        }
        if (buffers[i] == NULL) {
            buffers[i] = calloc(inputs[i].byte_len ? inputs[i].byte_len : 1, 1);
        }
        if (buffers[i] == NULL) {
            goto done;
        }
        inputs[i].data = buffers[i];
    }
    if (failed(epx_session_run(session, inputs, n_inputs, &outputs), "epx_session_run")) {
        goto done;
    }
    for (size_t i = 0; i < epx_outputs_count(outputs); i++) {
        EpxTensorRef t;
        if (!failed(epx_outputs_get(outputs, i, &t), "epx_outputs_get")) {
            print_output(&t);
        }
    }
    if (failed(epx_session_placement_json(session, &json), "epx_session_placement_json")) {
        goto done;
    }
    printf("placement: %s\n", json);
    status = 0;

done:
    for (size_t i = 0; i < n_inputs; i++) {
        free(buffers[i]);
    }
    epx_string_free(json);
    epx_outputs_free(outputs);
    epx_session_free(session);
    epx_session_options_free(options);
    epx_env_free(env);
    return status;
}
