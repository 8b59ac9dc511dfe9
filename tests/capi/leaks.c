/*
 * The C API's whole life cycle, for valgrind (run by tests/capi.rs):
 *   leaks MODEL CYCLES RUNS
 * CYCLES times: an environment, a session on MODEL (its inputs filled with a ramp), RUNS runs
 * (outputs read and freed), an error provoked and freed, the placement JSON taken and freed,
 * then everything freed. Prints "DONE" at the end; exits 1 at the first failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "epx.h"
#include "check.h"


#define MAX_INPUTS 8

int main(int argc, char **argv) {
    CHECK(argc == 4, "usage: leaks MODEL CYCLES RUNS");
    int cycles = atoi(argv[2]), runs = atoi(argv[3]);
    for (int c = 0; c < cycles; c++) {
        EpxEnv *env = NULL;
        EpxError *e = epx_env_new(NULL, 0, NULL, &env);
        CHECK(e == NULL, "env: %s", epx_error_message(e));
        EpxSession *s = NULL;
        e = epx_session_new(env, argv[1], NULL, &s);
        CHECK(e == NULL, "session: %s", epx_error_message(e));
        size_t n = epx_session_input_count(s);
        CHECK(n <= MAX_INPUTS, "%zu inputs", n);
        EpxTensorRef refs[MAX_INPUTS];
        float *buffers[MAX_INPUTS];
        for (size_t i = 0; i < n; i++) {
            EpxValueDesc d;
            CHECK(epx_session_input(s, i, &d) == NULL, "input %zu", i);
            CHECK(d.elem_type == EPX_ELEMENT_TYPE_FLOAT, "input %zu is not float", i);
            size_t count = 1;
            for (int64_t k = 0; k < d.ndim; k++) {
                count *= d.shape[k] > 0 ? (size_t)d.shape[k] : 1;
            }
            buffers[i] = malloc(count * sizeof(float));
            for (size_t j = 0; j < count; j++) {
                buffers[i][j] = (float)(j % 17) / 17.0f;
            }
            EpxTensorRef r = {d.name, EPX_ELEMENT_TYPE_FLOAT, d.shape, (size_t)d.ndim, buffers[i],
                              count * sizeof(float)};
            refs[i] = r;
        }
        for (int r = 0; r < runs; r++) {
            EpxOutputs *outs = NULL;
            e = epx_session_run(s, refs, n, &outs);
            CHECK(e == NULL, "run: %s", epx_error_message(e));
            EpxTensorRef o;
            CHECK(epx_outputs_get(outs, 0, &o) == NULL && o.byte_len > 0, "output 0");
            epx_outputs_free(outs);
        }
        /* An error, freed. */
        EpxOutputs *outs = NULL;
        e = epx_session_run(s, refs, 0, &outs);
        CHECK(e != NULL, "a run without inputs worked");
        epx_error_free(e);
        char *json = NULL;
        CHECK(epx_session_placement_json(s, &json) == NULL, "placement");
        epx_string_free(json);
        for (size_t i = 0; i < n; i++) {
            free(buffers[i]);
        }
        epx_session_free(s);
        epx_env_free(env);
    }
    printf("DONE\n");
    return 0;
}
