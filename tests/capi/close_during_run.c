/*
 * A session freed while other threads run it (run by tests/capi.rs, natively and under
 * valgrind):
 *   close_during_run MODEL ROUNDS THREADS
 * Each round makes a session on MODEL (float inputs filled with a ramp), starts THREADS threads
 * that run it in a loop, frees the session once every thread has finished a run, and joins
 * them. Each thread must end on the error "the session is closed" and see no other failure;
 * every run that started before the free must have succeeded or failed cleanly. Prints
 * "ROUNDS <rounds> RUNS <runs> CLOSED <closed>" at the end; exits 1 at the first failure.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epx.h"
#include "check.h"

#define MAX_INPUTS 8
#define MAX_THREADS 64

struct shared {
    EpxSession *session;
    EpxTensorRef refs[MAX_INPUTS];
    size_t n_inputs;
    atomic_int started;
    atomic_long runs;
    atomic_long closed;
};

static void *runner(void *arg) {
    struct shared *sh = arg;
    int first = 1;
    for (;;) {
        EpxOutputs *outs = NULL;
        EpxError *e = epx_session_run(sh->session, sh->refs, sh->n_inputs, &outs);
        if (e != NULL) {
            const char *m = epx_error_message(e);
            CHECK(strstr(m, "the session is closed") != NULL, "a run failed otherwise: %s", m);
            epx_error_free(e);
            atomic_fetch_add(&sh->closed, 1);
            if (first) {
                atomic_fetch_add(&sh->started, 1);
            }
            return NULL;
        }
        EpxTensorRef o;
        CHECK(epx_outputs_get(outs, 0, &o) == NULL && o.byte_len > 0, "output 0");
        epx_outputs_free(outs);
        atomic_fetch_add(&sh->runs, 1);
        if (first) {
            first = 0;
            atomic_fetch_add(&sh->started, 1);
        }
    }
}

int main(int argc, char **argv) {
    CHECK(argc == 4, "usage: close_during_run MODEL ROUNDS THREADS");
    int rounds = atoi(argv[2]), threads = atoi(argv[3]);
    CHECK(threads > 0 && threads <= MAX_THREADS, "1 to %d threads", MAX_THREADS);
    EpxEnv *env = NULL;
    EpxError *e = epx_env_new(NULL, 0, NULL, &env);
    CHECK(e == NULL, "env: %s", epx_error_message(e));
    long total_runs = 0, total_closed = 0;
    float *buffers[MAX_INPUTS];
    for (int r = 0; r < rounds; r++) {
        struct shared sh;
        memset(&sh, 0, sizeof sh);
        e = epx_session_new(env, argv[1], NULL, &sh.session);
        CHECK(e == NULL, "session: %s", epx_error_message(e));
        sh.n_inputs = epx_session_input_count(sh.session);
        CHECK(sh.n_inputs <= MAX_INPUTS, "%zu inputs", sh.n_inputs);
        for (size_t i = 0; i < sh.n_inputs; i++) {
            EpxValueDesc d;
            CHECK(epx_session_input(sh.session, i, &d) == NULL, "input %zu", i);
            CHECK(d.elem_type == EPX_ELEMENT_TYPE_FLOAT, "input %zu is not float", i);
            size_t count = 1;
            for (int64_t k = 0; k < d.ndim; k++) {
                count *= d.shape[k] > 0 ? (size_t)d.shape[k] : 1;
            }
            buffers[i] = malloc(count * sizeof(float));
            for (size_t j = 0; j < count; j++) {
                buffers[i][j] = (float)(j % 17) / 17.0f;
            }
            /* The name and shape belong to the session, which is freed while the threads
             * still read them: copy both. */
            char *name = malloc(strlen(d.name) + 1);
            strcpy(name, d.name);
            int64_t *shape = malloc(sizeof(int64_t) * (d.ndim > 0 ? (size_t)d.ndim : 1));
            for (int64_t k = 0; k < d.ndim; k++) {
                shape[k] = d.shape[k] > 0 ? d.shape[k] : 1;
            }
            EpxTensorRef ref = {name, EPX_ELEMENT_TYPE_FLOAT, shape, (size_t)d.ndim, buffers[i],
                                count * sizeof(float)};
            sh.refs[i] = ref;
        }
        pthread_t ids[MAX_THREADS];
        for (int t = 0; t < threads; t++) {
            CHECK(pthread_create(&ids[t], NULL, runner, &sh) == 0, "pthread_create");
        }
        /* Free while every thread is inside its run loop. */
        while (atomic_load(&sh.started) < threads) {
            sched_yield();
        }
        epx_session_free(sh.session);
        /* A second free, and calls on the freed handle, are errors or no-ops, never a crash. */
        epx_session_free(sh.session);
        CHECK(epx_session_input_count(sh.session) == 0, "a freed session still has inputs");
        EpxValueDesc d;
        e = epx_session_input(sh.session, 0, &d);
        CHECK(e != NULL && strstr(epx_error_message(e), "the session is closed"),
              "describing a freed session");
        epx_error_free(e);
        for (int t = 0; t < threads; t++) {
            CHECK(pthread_join(ids[t], NULL) == 0, "pthread_join");
        }
        CHECK(atomic_load(&sh.closed) == threads, "%ld of %d threads saw the close",
              (long)atomic_load(&sh.closed), threads);
        total_runs += atomic_load(&sh.runs);
        total_closed += atomic_load(&sh.closed);
        for (size_t i = 0; i < sh.n_inputs; i++) {
            free((void *)sh.refs[i].name);
            free((void *)sh.refs[i].shape);
            free(buffers[i]);
        }
    }
    epx_env_free(env);
    /* The environment is gone too. */
    CHECK(epx_env_provider_count(env) == 0, "a freed environment lists EPs");
    printf("ROUNDS %d RUNS %ld CLOSED %ld\n", rounds, total_runs, total_closed);
    return 0;
}
