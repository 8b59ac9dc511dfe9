/* Run cancellation through the C API: a run of a Loop of a billion iterations, on its own
 * thread, is cancelled with epx_run_options_set_terminate from this one and fails with
 * EPX_ERROR_CODE_CANCELLED within a second; a session creation watching set run options is
 * cancelled too. Usage: cancel LOOP_MODEL (a model whose int64 scalar input `m` is the Loop's
 * trip count). */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "epx.h"

struct job {
    EpxSession *session;
    EpxRunOptions *options;
    int64_t trips;
    EpxError *error;
};

static void *run(void *arg) {
    struct job *job = arg;
    EpxTensorRef in = {"m", EPX_ELEMENT_TYPE_INT64, NULL, 0, &job->trips, sizeof job->trips};
    EpxOutputs *out = NULL;
    job->error = epx_session_run_with_options(job->session, &in, 1, job->options, &out);
    epx_outputs_free(out);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: cancel LOOP_MODEL");
    EpxEnv *env = NULL;
    CHECK(epx_env_new(NULL, 0, NULL, &env) == NULL, "epx_env_new");
    EpxSession *session = NULL;
    CHECK(epx_session_new(env, argv[1], NULL, &session) == NULL, "epx_session_new");
    EpxRunOptions *options = epx_run_options_new();
    CHECK(options != NULL, "epx_run_options_new");

    struct job job = {session, options, 1000000000, NULL};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, run, &job) == 0, "pthread_create");
    struct timespec wait = {0, 200 * 1000 * 1000};
    nanosleep(&wait, NULL);
    CHECK(epx_run_options_set_terminate(options, true) == NULL, "set_terminate");
    double set_at = now();
    pthread_join(thread, NULL);
    double after = now() - set_at;
    CHECK(job.error != NULL && epx_error_code(job.error) == EPX_ERROR_CODE_CANCELLED,
          "the run was not cancelled: %s", job.error ? epx_error_message(job.error) : "success");
    CHECK(strstr(epx_error_message(job.error), "terminated") != NULL, "message: %s",
          epx_error_message(job.error));
    CHECK(after < 1.0, "the run stopped %.3f s after the flag", after);
    epx_error_free(job.error);
    printf("ok   a running Loop stopped %.3f s after its terminate flag\n", after);

    /* Cleared, the same options run to the end. */
    CHECK(epx_run_options_set_terminate(options, false) == NULL, "clear");
    job.trips = 3;
    run(&job);
    CHECK(job.error == NULL, "a run after clearing: %s", epx_error_message(job.error));

    /* A creation watching set options is cancelled. */
    EpxSessionOptions *session_options = epx_session_options_new();
    CHECK(epx_session_options_set_cancellation(session_options, options) == NULL, "watch");
    CHECK(epx_run_options_set_terminate(options, true) == NULL, "set");
    EpxSession *never = NULL;
    EpxError *e = epx_session_new(env, argv[1], session_options, &never);
    CHECK(e != NULL && epx_error_code(e) == EPX_ERROR_CODE_CANCELLED && never == NULL,
          "the creation was not cancelled");
    epx_error_free(e);
    printf("ok   a session creation watching set run options was cancelled\n");

    /* Stale and foreign handles are refused by name. */
    e = epx_run_options_set_terminate((EpxRunOptions *)session, true);
    CHECK(e != NULL && epx_error_code(e) == EPX_ERROR_CODE_INVALID_ARGUMENT, "a session as options");
    epx_error_free(e);

    epx_session_options_free(session_options);
    epx_run_options_free(options);
    epx_run_options_free(NULL);
    epx_session_free(session);
    epx_env_free(env);
    printf("ALL OK (%d checks)\n", checks);
    return 0;
}
