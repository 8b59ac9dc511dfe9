/*
 * The C API's contract, checked from C (built and run by tests/capi.rs):
 *   contract MODEL_DIR
 * Prints one line per check and "ALL OK" at the end; exits 1 at the first failed check.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "epx.h"
#include "check.h"



/* Expects `e` to be an error with `code` whose message contains `needle`; frees it. */
static void expect_error(EpxError *e, EpxErrorCode code, const char *needle, const char *what) {
    CHECK(e != NULL, "%s: expected an error, got success", what);
    const char *msg = epx_error_message(e);
    CHECK(epx_error_code(e) == code, "%s: code %d, expected %d (%s)", what, (int)epx_error_code(e),
          (int)code, msg);
    CHECK(strstr(msg, needle) != NULL, "%s: message `%s` lacks `%s`", what, msg, needle);
    printf("ok   %s: %s\n", what, msg);
    epx_error_free(e);
}

static int select_calls = 0;

/* A selection function: checks what it is given and asks for the CPU EP on its device 0. */
static size_t choose_cpu(const char *devices_json, const char *model_json, char *eps,
                         size_t capacity, void *user_data) {
    CHECK(user_data == &select_calls, "user_data passed through");
    CHECK(strstr(devices_json, "\"selector\":\"cpu:0\"") != NULL, "devices: %s", devices_json);
    CHECK(strstr(model_json, "\"op_types\"") != NULL, "model: %s", model_json);
    select_calls++;
    const char *list = "cpu:0";
    size_t n = strlen(list);
    if (n < capacity) memcpy(eps, list, n + 1);
    return n;
}

static size_t cannot_choose(const char *devices_json, const char *model_json, char *eps,
                            size_t capacity, void *user_data) {
    (void)devices_json, (void)model_json, (void)eps, (void)capacity, (void)user_data;
    return SIZE_MAX;
}

static void expect_ok(EpxError *e, const char *what) {
    CHECK(e == NULL, "%s: %s", what, epx_error_message(e));
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(*len);
    CHECK(data != NULL && fread(data, 1, *len, f) == *len, "cannot read %s", path);
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: contract MODEL_DIR");
    char add_path[4096], mnist_path[4096];
    snprintf(add_path, sizeof add_path, "%s/add.onnx", argv[1]);
    snprintf(mnist_path, sizeof mnist_path, "%s/mnist-cnn.onnx", argv[1]);

    /* Every free accepts NULL. */
    epx_error_free(NULL);
    epx_string_free(NULL);
    epx_env_free(NULL);
    epx_session_options_free(NULL);
    epx_session_free(NULL);
    epx_outputs_free(NULL);
    CHECK(epx_env_provider_count(NULL) == 0 && epx_session_input_count(NULL) == 0
              && epx_outputs_count(NULL) == 0,
          "counts of NULL are 0");
    CHECK(epx_error_code(NULL) == EPX_ERROR_CODE_INTERNAL && strcmp(epx_error_message(NULL), "") == 0,
          "NULL error");
    printf("ok   free(NULL) and NULL queries\n");

    /* Versions agree. */
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", EPX_VERSION_MAJOR, EPX_VERSION_MINOR,
             EPX_VERSION_PATCH);
    CHECK(strcmp(version, epx_version()) == 0, "header %s vs library %s", version, epx_version());

    /* NULL arguments. */
    EpxEnv *env = NULL;
    expect_error(epx_env_new(NULL, 0, NULL, NULL), EPX_ERROR_CODE_INVALID_ARGUMENT, "`out` is NULL",
                 "epx_env_new(out = NULL)");
    expect_error(epx_env_new(NULL, 2, NULL, &env), EPX_ERROR_CODE_INVALID_ARGUMENT, "plugin_dirs",
                 "epx_env_new(plugin_dirs = NULL, 2)");
    expect_ok(epx_env_new(NULL, 0, NULL, &env), "epx_env_new");
    CHECK(env != NULL, "env");

    /* EP listing: the built-in CPU EP is there and available. */
    size_t n = epx_env_provider_count(env);
    int cpu = 0;
    for (size_t i = 0; i < n; i++) {
        EpxProviderDesc p;
        expect_ok(epx_env_provider(env, i, &p), "epx_env_provider");
        if (strcmp(p.name, "cpu") == 0 && p.available && p.reason == NULL && p.library == NULL) {
            cpu = 1;
        }
    }
    CHECK(cpu, "the built-in cpu EP is listed as available");
    EpxProviderDesc p;
    expect_error(epx_env_provider(env, n, &p), EPX_ERROR_CODE_INVALID_ARGUMENT, "out of range",
                 "epx_env_provider(out of range)");

    /* Doctor. */
    bool all_ok = false;
    char *report = NULL;
    expect_ok(epx_env_doctor(env, &all_ok, &report), "epx_env_doctor");
    CHECK(report != NULL && strstr(report, "plugin search path") != NULL, "doctor report: %s", report);
    epx_string_free(report);
    printf("ok   doctor\n");

    /* Sessions: malformed models, unknown EPs, strict mode. */
    EpxSession *s = NULL;
    expect_error(epx_session_new_from_bytes(env, "not a model", 11, NULL, &s), EPX_ERROR_CODE_MODEL,
                 "<memory>", "garbage bytes");
    expect_error(epx_session_new(env, "/nonexistent/model.onnx", NULL, &s), EPX_ERROR_CODE_IO,
                 "/nonexistent/model.onnx", "missing model file");
    expect_error(epx_session_new(env, NULL, NULL, &s), EPX_ERROR_CODE_INVALID_ARGUMENT, "model_path",
                 "model_path = NULL");
    EpxSessionOptions *opts = epx_session_options_new();
    expect_ok(epx_session_options_add_provider(opts, "frobnicator", NULL, NULL, 0, true),
              "add_provider");
    expect_error(epx_session_new(env, add_path, opts, &s), EPX_ERROR_CODE_PROVIDER_SETUP, "cpu",
                 "unknown EP with error_on_failure (names the known EPs)");
    epx_session_options_free(opts);
    opts = epx_session_options_new();
    const char *keys[] = {"colour"}, *values[] = {"red"};
    expect_ok(epx_session_options_add_provider(opts, "cpu", keys, values, 1, true), "add cpu");
    expect_error(epx_session_new(env, add_path, opts, &s), EPX_ERROR_CODE_PROVIDER_SETUP, "colour",
                 "unknown option");
    epx_session_options_free(opts);
    expect_error(epx_session_options_add_provider(NULL, "cpu", NULL, NULL, 0, true),
                 EPX_ERROR_CODE_INVALID_ARGUMENT, "options", "add_provider(options = NULL)");

    /* A session from bytes: describe, run both ways, compare. */
    size_t len = 0;
    char *bytes = read_file(add_path, &len);
    opts = epx_session_options_new();
    expect_ok(epx_session_options_set_strict(opts, true), "strict");
    expect_ok(epx_session_new_from_bytes(env, bytes, len, opts, &s), "session from bytes");
    free(bytes); /* the library copied it */
    epx_session_options_free(opts);
    CHECK(epx_session_input_count(s) == 2 && epx_session_output_count(s) == 1, "add has 2 in, 1 out");
    EpxValueDesc in0, out0;
    expect_ok(epx_session_input(s, 0, &in0), "input 0");
    expect_ok(epx_session_output(s, 0, &out0), "output 0");
    CHECK(in0.elem_type == EPX_ELEMENT_TYPE_FLOAT && in0.ndim >= 1, "input 0 is float with a rank");
    expect_error(epx_session_input(s, 2, &in0), EPX_ERROR_CODE_INVALID_ARGUMENT, "out of range",
                 "input index out of range");
    printf("ok   add: inputs %s, output %s\n", in0.name, out0.name);

    EpxValueDesc in1;
    expect_ok(epx_session_input(s, 1, &in1), "input 1");
    size_t count = 1;
    for (int64_t k = 0; k < in0.ndim; k++) {
        count *= (size_t)in0.shape[k];
    }
    float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        a[i] = (float)i;
        b[i] = 0.5f * (float)i;
    }
    EpxTensorRef refs[2] = {
        {in0.name, EPX_ELEMENT_TYPE_FLOAT, in0.shape, (size_t)in0.ndim, a, count * sizeof(float)},
        {in1.name, EPX_ELEMENT_TYPE_FLOAT, in1.shape, (size_t)in1.ndim, b, count * sizeof(float)},
    };
    EpxOutputs *outs = NULL;
    expect_ok(epx_session_run(s, refs, 2, &outs), "run");
    EpxTensorRef r;
    expect_ok(epx_outputs_get(outs, 0, &r), "outputs_get");
    CHECK(strcmp(r.name, out0.name) == 0 && r.byte_len == count * sizeof(float), "output shape");
    for (size_t i = 0; i < count; i++) {
        CHECK(((const float *)r.data)[i] == 1.5f * (float)i, "sum[%zu] = %g", i,
              (double)((const float *)r.data)[i]);
    }
    printf("ok   run with plain buffers\n");

    /* The same through DLPack. */
    int64_t shape[8];
    for (int64_t k = 0; k < in0.ndim; k++) {
        shape[k] = in0.shape[k];
    }
    DLTensor ta = {a, {DL_DEVICE_TYPE_CPU, 0}, (int32_t)in0.ndim, {DL_DATA_TYPE_CODE_FLOAT, 32, 1},
                   shape, NULL, 0};
    DLTensor tb = ta;
    tb.data = b;
    const char *names[2] = {in0.name, in1.name};
    const DLTensor *dls[2] = {&ta, &tb};
    EpxOutputs *outs2 = NULL;
    expect_ok(epx_session_run_dlpack(s, names, dls, 2, &outs2), "run_dlpack");
    const DLTensor *t = NULL;
    const char *tname = NULL;
    expect_ok(epx_outputs_dltensor(outs2, 0, &tname, &t), "outputs_dltensor");
    CHECK(t->device.device_type == DL_DEVICE_TYPE_CPU && t->dtype.code == DL_DATA_TYPE_CODE_FLOAT
              && t->dtype.bits == 32 && t->ndim == (int32_t)in0.ndim,
          "DLPack output description");
    CHECK(memcmp(t->data, r.data, r.byte_len) == 0, "DLPack and buffer runs agree");
    printf("ok   run with DLPack tensors (%s)\n", tname);

    /* Bad inputs. */
    ta.device.device_type = DL_DEVICE_TYPE_CUDA;
    expect_error(epx_session_run_dlpack(s, names, dls, 2, &outs2), EPX_ERROR_CODE_INVALID_ARGUMENT,
                 "host memory", "a CUDA tensor");
    ta.device.device_type = DL_DEVICE_TYPE_CPU;
    refs[1].name = "nope";
    expect_error(epx_session_run(s, refs, 2, &outs), EPX_ERROR_CODE_INVALID_INPUT, "nope",
                 "unknown input name");
    refs[1].name = in1.name;
    refs[1].elem_type = 12345;
    expect_error(epx_session_run(s, refs, 2, &outs), EPX_ERROR_CODE_INVALID_ARGUMENT, "12345",
                 "bad element type");
    refs[1].elem_type = EPX_ELEMENT_TYPE_FLOAT;
    refs[1].byte_len = 4;
    expect_error(epx_session_run(s, refs, 2, &outs), EPX_ERROR_CODE_INVALID_INPUT, "needs 16 bytes",
                 "byte_len that does not match the shape");
    expect_error(epx_outputs_get(outs, 5, &r), EPX_ERROR_CODE_INVALID_ARGUMENT, "out of range",
                 "output index out of range");

    /* Placement JSON. */
    char *json = NULL;
    expect_ok(epx_session_placement_json(s, &json), "placement_json");
    CHECK(json[0] == '{' && strstr(json, "\"nodes\"") && strstr(json, "\"provider\":\"cpu\""),
          "placement JSON: %s", json);
    printf("ok   placement %s\n", json);
    epx_string_free(json);
    epx_outputs_free(outs);
    epx_outputs_free(outs2);
    epx_session_free(s);
    free(a);
    free(b);

    /* Devices, a device by name, and EPs chosen by policy or by the program's function. */
    expect_ok(epx_env_devices_json(env, &json), "devices_json");
    CHECK(strstr(json, "\"selector\":\"cpu:0\"") && strstr(json, "\"kind\":\"cpu\""),
          "devices JSON: %s", json);
    epx_string_free(json);
    opts = epx_session_options_new();
    expect_ok(epx_session_options_add_provider(opts, "cpu:7", NULL, NULL, 0, true), "cpu:7");
    expect_error(epx_session_new(env, add_path, opts, &s), EPX_ERROR_CODE_PROVIDER_SETUP,
                 "has no device `7`", "a device the EP does not list");
    epx_session_options_free(opts);
    opts = epx_session_options_new();
    expect_error(epx_session_options_set_selection_policy(opts, "fastest"),
                 EPX_ERROR_CODE_INVALID_INPUT, "the policies are", "an unknown policy");
    expect_ok(epx_session_options_set_selection_policy(opts, "prefer-cpu"), "prefer-cpu");
    expect_ok(epx_session_new(env, add_path, opts, &s), "session by policy");
    expect_ok(epx_session_placement_json(s, &json), "placement_json");
    CHECK(strstr(json, "\"policy\":\"prefer-cpu\""), "placement: %s", json);
    epx_string_free(json);
    epx_session_free(s);
    expect_ok(epx_session_options_set_selection_function(opts, choose_cpu, &select_calls),
              "selection function");
    expect_ok(epx_session_new(env, add_path, opts, &s), "session by function");
    CHECK(select_calls == 1, "the function ran once");
    expect_ok(epx_session_placement_json(s, &json), "placement_json");
    CHECK(strstr(json, "\"chosen\":[\"cpu:0\"]") && strstr(json, "\"policy\":\"custom\""),
          "placement: %s", json);
    epx_string_free(json);
    epx_session_free(s);
    expect_ok(epx_session_options_set_selection_function(opts, cannot_choose, NULL), "refusing");
    expect_error(epx_session_new(env, add_path, opts, &s), EPX_ERROR_CODE_INVALID_INPUT,
                 "the selection function failed", "a function that cannot choose");
    epx_session_options_free(opts);
    printf("ok   devices and selection policies\n");

    /* A model path that is a device or a FIFO is refused at once, not read forever. */
    expect_error(epx_session_new(env, "/dev/zero", NULL, &s), EPX_ERROR_CODE_IO,
                 "not a regular file", "a model path that is a device");
    char fifo[] = "/tmp/epx-contract-fifo-XXXXXX";
    CHECK(mkdtemp(fifo) != NULL, "mkdtemp");
    char fifo_model[4200];
    snprintf(fifo_model, sizeof fifo_model, "%s/p.onnx", fifo);
    CHECK(mkfifo(fifo_model, 0600) == 0, "mkfifo");
    expect_error(epx_session_new(env, fifo_model, NULL, &s), EPX_ERROR_CODE_IO, "a FIFO",
                 "a model path that is a FIFO");
    unlink(fifo_model);
    rmdir(fifo);

    /* A freed session or environment handle is an error by name, never freed memory. */
    expect_ok(epx_session_new(env, add_path, NULL, &s), "add session");
    epx_session_free(s);
    EpxOutputs *gone = NULL;
    expect_error(epx_session_run(s, NULL, 0, &gone), EPX_ERROR_CODE_INVALID_ARGUMENT,
                 "the session is closed", "a run on a freed session");
    expect_error(epx_session_new((EpxEnv *)s, add_path, NULL, &s), EPX_ERROR_CODE_INVALID_ARGUMENT,
                 "is not an environment handle", "a session handle passed as an environment");

    /* A session outlives its environment. */
    expect_ok(epx_session_new(env, mnist_path, NULL, &s), "mnist session");
    epx_env_free(env);
    CHECK(epx_session_input_count(s) == 1, "mnist has one input");
    epx_session_free(s);

    printf("ALL OK (%d checks)\n", checks);
    return 0;
}
