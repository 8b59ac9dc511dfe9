/*
 * Hostile models through the C API, all in this one process (built and run by tests/capi.rs):
 *   hostile CASES_FILE GOOD_MODEL
 * CASES_FILE has one case per line, `MODEL_PATH<TAB>TEXT`: the model (one float input `x` of
 * shape [1]) must fail to load or to run with an error whose message contains TEXT. Then an
 * input declared far larger than its buffer, and GOOD_MODEL (add.onnx) must still run. Prints
 * one line per case and "SURVIVED <n>" at the end; exits 1 at the first failed check.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
#include "check.h"


/* Loads `path` and runs it on x = [1.0]: the first error, or NULL when both worked. */
static EpxError *load_and_run(const EpxEnv *env, const char *path) {
    EpxSession *s = NULL;
    EpxError *e = epx_session_new(env, path, NULL, &s);
    if (e != NULL) {
        return e;
    }
    float one = 1.0f;
    int64_t shape[1] = {1};
    EpxTensorRef x = {"x", EPX_ELEMENT_TYPE_FLOAT, shape, 1, &one, sizeof one};
    EpxOutputs *outs = NULL;
    e = epx_session_run(s, &x, 1, &outs);
    epx_outputs_free(outs);
    epx_session_free(s);
    return e;
}

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: hostile CASES_FILE GOOD_MODEL");
    uint64_t limit = epx_set_max_tensor_bytes(1000000000u);
    CHECK(limit == 1000000000u, "the limit is %llu", (unsigned long long)limit);
    EpxEnv *env = NULL;
    EpxError *e = epx_env_new(NULL, 0, NULL, &env);
    CHECK(e == NULL, "env: %s", epx_error_message(e));

    FILE *cases = fopen(argv[1], "r");
    CHECK(cases != NULL, "cannot open %s", argv[1]);
    char line[8192];
    int survived = 0;
    while (fgets(line, sizeof line, cases) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        CHECK(tab != NULL, "no tab in `%s`", line);
        *tab = '\0';
        const char *path = line, *needle = tab + 1;
        e = load_and_run(env, path);
        CHECK(e != NULL, "%s: loaded and ran without an error", path);
        const char *msg = epx_error_message(e);
        CHECK(strstr(msg, needle) != NULL, "%s: message `%s` lacks `%s`", path, msg, needle);
        printf("ok   %s: %s\n", strrchr(path, '/') ? strrchr(path, '/') + 1 : path, msg);
        epx_error_free(e);
        survived++;
    }
    fclose(cases);

    /* An input whose declared shape is far larger than its buffer. */
    EpxSession *s = NULL;
    e = epx_session_new(env, argv[2], NULL, &s);
    CHECK(e == NULL, "%s: %s", argv[2], epx_error_message(e));
    EpxValueDesc in0, in1;
    CHECK(epx_session_input(s, 0, &in0) == NULL && epx_session_input(s, 1, &in1) == NULL,
          "inputs of %s", argv[2]);
    float data[16] = {0};
    int64_t huge[2] = {INT64_C(1) << 33, INT64_C(1) << 30};
    EpxTensorRef lie[2] = {
        {in0.name, EPX_ELEMENT_TYPE_FLOAT, huge, 2, data, sizeof data},
        {in1.name, EPX_ELEMENT_TYPE_FLOAT, huge, 2, data, sizeof data},
    };
    EpxOutputs *outs = NULL;
    e = epx_session_run(s, lie, 2, &outs);
    CHECK(e != NULL, "a [2^33, 2^30] input over a 64-byte buffer ran");
    printf("ok   input [2^33, 2^30] over 64 bytes: %s\n", epx_error_message(e));
    epx_error_free(e);
    survived++;

    /* A session's own limit holds for that session alone. */
    EpxSessionOptions *opts = epx_session_options_new();
    CHECK(epx_session_options_set_max_tensor_bytes(opts, 8) == NULL, "set the session limit");
    EpxSession *small = NULL;
    e = epx_session_new(env, argv[2], opts, &small);
    CHECK(e == NULL, "%s with a limit: %s", argv[2], epx_error_message(e));
    epx_session_options_free(opts);
    float four[4] = {1, 2, 3, 4};
    int64_t four_shape[1] = {4};
    EpxTensorRef over[2] = {
        {in0.name, EPX_ELEMENT_TYPE_FLOAT, four_shape, 1, four, sizeof four},
        {in1.name, EPX_ELEMENT_TYPE_FLOAT, four_shape, 1, four, sizeof four},
    };
    e = epx_session_run(small, over, 2, &outs);
    CHECK(e != NULL && strstr(epx_error_message(e), "more than the 8") != NULL,
          "16 bytes under a session limit of 8: %s", e ? epx_error_message(e) : "ran");
    printf("ok   a session limit of 8 bytes: %s\n", epx_error_message(e));
    epx_error_free(e);
    epx_session_free(small);
    survived++;

    /* The process still runs models. */
    size_t count = 1;
    for (int64_t k = 0; k < in0.ndim; k++) {
        count *= (size_t)in0.shape[k];
    }
    CHECK(count <= 16, "add.onnx input of %zu elements", count);
    for (size_t i = 0; i < count; i++) {
        data[i] = (float)i;
    }
    EpxTensorRef refs[2] = {
        {in0.name, EPX_ELEMENT_TYPE_FLOAT, in0.shape, (size_t)in0.ndim, data, count * sizeof(float)},
        {in1.name, EPX_ELEMENT_TYPE_FLOAT, in1.shape, (size_t)in1.ndim, data, count * sizeof(float)},
    };
    e = epx_session_run(s, refs, 2, &outs);
    CHECK(e == NULL, "add after the hostile cases: %s", epx_error_message(e));
    EpxTensorRef r;
    CHECK(epx_outputs_get(outs, 0, &r) == NULL, "output 0");
    for (size_t i = 0; i < count; i++) {
        CHECK(((const float *)r.data)[i] == 2.0f * (float)i, "sum[%zu]", i);
    }
    epx_outputs_free(outs);
    epx_session_free(s);
    epx_env_free(env);
    printf("SURVIVED %d\n", survived);
    return 0;
}
