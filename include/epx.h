/*
 * epx.h: the C API of libepx, the epx host. Link with -lepx (pkg-config: epx).
 *
 * GENERATED FILE, DO NOT EDIT. cbindgen makes it from the files of host/capi/src with
 * host/capi/cbindgen.toml (the cbindgen version is pinned in tests/Cargo.toml). After changing
 * the C API, regenerate it with
 *
 *     EPX_UPDATE_HEADERS=1 cargo test -p epx-tests --test headers
 *
 * The DLPack types (DLTensor, ...) and EpxElementType come from epx_plugin.h, included below.
 *
 * Conventions:
 * - A function that can fail returns an EpxError pointer: NULL on success, otherwise an error
 *   with a code (epx_error_code) and a message (epx_error_message), freed with epx_error_free.
 * - Every object handed out has one matching *_free function, and every *_free accepts NULL.
 * - Strings and arrays reached through a descriptor (EpxProviderDesc, EpxValueDesc,
 *   EpxTensorRef) belong to the object they were read from and live as long as it does; strings
 *   returned through a char ** are freed with epx_string_free.
 * - No function lets a Rust panic unwind into the caller: a panic becomes EPX_ERROR_CODE_PANIC.
 * - An EpxSession may be run from several threads at once.
 */


#ifndef EPX_H
#define EPX_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "epx_plugin.h"

/**
 * The version of libepx: the `epx` crates' version.
 */
#define EPX_VERSION_MAJOR 0

/**
 * See [`EPX_VERSION_MAJOR`].
 */
#define EPX_VERSION_MINOR 1

/**
 * See [`EPX_VERSION_MAJOR`].
 */
#define EPX_VERSION_PATCH 0

/**
 * What kind of failure an [`EpxError`] reports. Values are fixed; new codes are only appended.
 */
typedef enum EpxErrorCode {
    /**
     * A NULL or malformed argument, an unknown option, or a value that is not valid UTF-8.
     */
    EPX_ERROR_CODE_INVALID_ARGUMENT = 1,
    /**
     * A model file or buffer that is not a readable ONNX model, or not a valid graph.
     */
    EPX_ERROR_CODE_MODEL = 2,
    /**
     * A file could not be read.
     */
    EPX_ERROR_CODE_IO = 3,
    /**
     * A plugin library could not be loaded (missing dependency, wrong ABI, refused, ...).
     */
    EPX_ERROR_CODE_PLUGIN_LOAD = 4,
    /**
     * An EP is unknown, unavailable on this machine, or rejected its options.
     */
    EPX_ERROR_CODE_PROVIDER_SETUP = 5,
    /**
     * An EP failed (or panicked) during a call.
     */
    EPX_ERROR_CODE_PROVIDER = 6,
    /**
     * No EP can run some node.
     */
    EPX_ERROR_CODE_UNSUPPORTED = 7,
    /**
     * Inputs given to a run do not match the model.
     */
    EPX_ERROR_CODE_INVALID_INPUT = 8,
    /**
     * A run failed.
     */
    EPX_ERROR_CODE_RUN = 9,
    /**
     * A panic was caught at the C API boundary (a bug in epx; the message says where).
     */
    EPX_ERROR_CODE_PANIC = 10,
    /**
     * Anything else.
     */
    EPX_ERROR_CODE_INTERNAL = 11,
    /**
     * A run or a session creation was cancelled by the application
     * ([`epx_run_options_set_terminate`](crate::epx_run_options_set_terminate)).
     */
    EPX_ERROR_CODE_CANCELLED = 12,
} EpxErrorCode;

/**
 * The plugin directories, default EPs and loaded plugins every session starts from. A handle,
 * not an address: freeing it while another thread uses it is safe, and a call made with it
 * after [`epx_env_free`] is an error.
 */
typedef struct EpxEnv EpxEnv;

/**
 * A failure: a code and a message. NULL means success wherever an `EpxError *` is returned.
 * Free with [`epx_error_free`].
 */
typedef struct EpxError EpxError;

/**
 * A value owned by the application (ABI-independent): a host tensor (strings included), a
 * sequence, a map or an optional. Made with the `epx_value_new_*` functions and freed with
 * [`epx_value_free`]; values read from a run's outputs belong to the outputs.
 */
typedef struct EpxHostValue EpxHostValue;

/**
 * The outputs of one run, in host memory, in the model's output order. Free with
 * [`epx_outputs_free`].
 */
typedef struct EpxOutputs EpxOutputs;

/**
 * A run's options: its terminate flag, which another thread sets to cancel the runs made with
 * them (ONNX Runtime's `RunOptions.terminate`), and which a session's creation can watch too
 * ([`epx_session_options_set_cancellation`](crate::epx_session_options_set_cancellation)). A
 * handle, not an address: freeing it while a run uses it is safe.
 */
typedef struct EpxRunOptions EpxRunOptions;

/**
 * A model partitioned across EPs and compiled, ready to run (from several threads at once). A
 * handle, not an address: each run holds its own reference, so [`epx_session_free`] while
 * other threads run it lets those runs finish, and a run started after it fails with "the
 * session is closed".
 */
typedef struct EpxSession EpxSession;

/**
 * An ordered list of EPs with their options, for sessions ([`epx_session_new`]) and as an
 * environment's default EPs ([`epx_env_new`]). A handle, not an address: freeing it while
 * another thread makes a session from it is safe (that call keeps its own reference), and a
 * call made with it after [`epx_session_options_free`] is an error.
 */
typedef struct EpxSessionOptions EpxSessionOptions;

/**
 * One EP as [`epx_env_provider`] describes it. Strings belong to the environment.
 */
typedef struct EpxProviderDesc {
    /**
     * The EP name, as sessions ask for it.
     */
    const char *name;
    /**
     * The plugin that provides it (`builtin` for the CPU EP linked into libepx).
     */
    const char *plugin;
    /**
     * The EP's version ("" when its plugin failed to load).
     */
    const char *version;
    /**
     * The plugin library's path; NULL for the built-in EPs.
     */
    const char *library;
    /**
     * Whether the EP can run on this machine.
     */
    bool available;
    /**
     * Why it cannot (or why its plugin failed to load); NULL when available.
     */
    const char *reason;
} EpxProviderDesc;

/**
 * See [`epx_session_options_set_selection_function`].
 */
typedef size_t (*EpxSelectionFn)(const char *devices_json,
                                 const char *model_json,
                                 char *eps,
                                 size_t capacity,
                                 void *user_data);

/**
 * A tensor in host memory as a plain pointer, shape and element type: an input to
 * [`epx_session_run`], or an output read with [`epx_outputs_get`].
 */
typedef struct EpxTensorRef {
    /**
     * The model input or output name.
     */
    const char *name;
    /**
     * An `EpxElementType` value (epx_plugin.h).
     */
    int32_t elem_type;
    /**
     * `ndim` extents (NULL when `ndim` is 0).
     */
    const int64_t *shape;
    size_t ndim;
    /**
     * The elements, densely packed in row-major order (NULL only when `byte_len` is 0).
     */
    const void *data;
    /**
     * Bytes at `data`: the element count times the element size.
     */
    size_t byte_len;
} EpxTensorRef;

/**
 * A model input or output as [`epx_session_input`] / [`epx_session_output`] describe it. Strings
 * and arrays belong to the session: valid until it is freed.
 */
typedef struct EpxValueDesc {
    const char *name;
    /**
     * An `EpxElementType` value (epx_plugin.h); 0 (`EPX_ELEMENT_TYPE_UNDEFINED`) when unknown.
     */
    int32_t elem_type;
    /**
     * The rank; -1 when the model does not give it.
     */
    int64_t ndim;
    /**
     * `ndim` extents, -1 for a dynamic one; NULL when `ndim` is -1 or 0.
     */
    const int64_t *shape;
} EpxValueDesc;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The library version as text, e.g. `"0.1.0"`; static, never freed.
 */
const char *epx_version(void);

/**
 * The plugin ABI version this host speaks, as `"major.minor"` (e.g. `"1.3"`): plugins built
 * for this major and a minor up to this one load. Static, never freed.
 */
const char *epx_plugin_abi_version(void);

/**
 * Sets the largest tensor (in bytes) epx allocates, for the whole process: a model or an input
 * asking for more gets an error naming the shape and the size, never an abort. The default is
 * `EPX_MAX_TENSOR_BYTES` when set, else the machine's physical memory; 0 restores nothing and is
 * taken as 1. Returns the limit now in force.
 */
uint64_t epx_set_max_tensor_bytes(uint64_t bytes);

/**
 * The largest tensor (in bytes) epx allocates now ([`epx_set_max_tensor_bytes`]).
 */
uint64_t epx_max_tensor_bytes(void);

/**
 * Makes an environment: plugins are searched in `plugin_dirs` (absolute, or relative to the
 * current folder), then in each absolute folder of `EPX_PLUGIN_PATH`, then in the default
 * folder next to libepx (`<prefix>/lib/epx/plugins` when installed) and next to the program.
 * `default_providers` (may be NULL) lists EPs every session tries after its own; its strict flag
 * is ignored. Plugins are loaded when first needed, each opened first in a child process (the
 * `epx` executable beside libepx, when there is one). No Python package is imported unless
 * `EPX_PYTHON_EPS` asks for the search (`1`: every Python environment epx sees, `own`: the one
 * libepx is installed in). Free with [`epx_env_free`].
 *
 * # Safety
 * `plugin_dirs` points at `n_dirs` strings (or is NULL when `n_dirs` is 0);
 * `default_providers` is NULL or a live option set; `out` is writable.
 */
struct EpxError *epx_env_new(const char *const *plugin_dirs,
                             size_t n_dirs,
                             const struct EpxSessionOptions *default_providers,
                             struct EpxEnv **out);

/**
 * Frees an environment. Sessions made from it keep what they need and stay usable; a call
 * in flight on it finishes. NULL, or an environment freed already, is a no-op.
 *
 * Pointers: `env` is NULL or from [`epx_env_new`].
 */
void epx_env_free(struct EpxEnv *env);

/**
 * How many EPs [`epx_env_provider`] lists: those of every plugin found (loading each, after
 * opening it in a child process when an `epx` executable is beside libepx, `../bin/epx` or
 * `EPX_PROBE_EXE`, so that a library that crashes the loader is listed as broken), then the
 * built-in ones. 0 for NULL.
 *
 * Pointers: `env` is NULL or a live environment.
 */
size_t epx_env_provider_count(const struct EpxEnv *env);

/**
 * Describes EP `index` (see [`epx_env_provider_count`]), with its availability and the reason
 * when it is not available. Strings live until `env` is freed.
 *
 * Pointers: `env` is a live environment; `out` is writable.
 */
struct EpxError *epx_env_provider(const struct EpxEnv *env,
                                  size_t index,
                                  struct EpxProviderDesc *out);

/**
 * The doctor report (what `epx doctor` prints): every plugin folder searched, every plugin found
 * with its manifest, ABI and each library it depends on, found or not and where it was looked
 * for. `*all_ok` (may be NULL) says whether every plugin is usable. Plugins are opened in a
 * child process first, as for [`epx_env_provider_count`]. Free `*report` with
 * [`epx_string_free`].
 *
 * # Safety
 * `env` is a live environment; `report` is writable; `all_ok` is NULL or writable.
 */
struct EpxError *epx_env_doctor(const struct EpxEnv *env, bool *all_ok, char **report);

/**
 * Every device the environment's EPs can run on (ABI 1.5), as JSON: an array of `selector`
 * (how a session names the EP on that device: `cuda:1`, `openvino:GPU.0`), `provider`,
 * `plugin`, and `device` (`kind`: cpu, gpu, npu or other; `id`; `id_name`; `vendor`; `name`;
 * `memory_bytes`, null when unknown; `driver_version`; `unusable`, null or why the EP cannot
 * use it). Plugins are opened in a child process first, as for [`epx_env_provider_count`].
 * Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `env` is a live environment; `json` is writable.
 */
struct EpxError *epx_env_devices_json(const struct EpxEnv *env, char **json);

/**
 * The code of `error` ([`EpxErrorCode::Internal`] for NULL).
 *
 * Pointers: `error` is NULL or an error from this library, not yet freed.
 */
enum EpxErrorCode epx_error_code(const struct EpxError *error);

/**
 * The message of `error`, valid until the error is freed ("" for NULL).
 *
 * Pointers: `error` is NULL or an error from this library, not yet freed.
 */
const char *epx_error_message(const struct EpxError *error);

/**
 * Frees an error. NULL is a no-op.
 *
 * # Safety
 * `error` is NULL or an error from this library, freed only once.
 */
void epx_error_free(struct EpxError *error);

/**
 * Frees a string this library returned through a `char **`. NULL is a no-op.
 *
 * # Safety
 * `s` is NULL or such a string, freed only once.
 */
void epx_string_free(char *s);

/**
 * A new, empty option set: no EPs (the CPU EP always runs what is left), not strict.
 */
struct EpxSessionOptions *epx_session_options_new(void);

/**
 * Makes the creation of sessions with these options cancellable: once `run_options`' terminate
 * flag is set ([`epx_run_options_set_terminate`](crate::epx_run_options_set_terminate), from
 * any thread), creation stops at its next step and fails with `EPX_ERROR_CODE_CANCELLED`
 * (ONNX Runtime's load cancellation flag). NULL stops watching.
 *
 * Pointers: `options` is a live option set; `run_options` NULL or live run options.
 */
struct EpxError *epx_session_options_set_cancellation(struct EpxSessionOptions *options,
                                                      const struct EpxRunOptions *run_options);

/**
 * Frees an option set. NULL, or a set freed already, is a no-op.
 *
 * Pointers: `options` is NULL or from [`epx_session_options_new`].
 */
void epx_session_options_free(struct EpxSessionOptions *options);

/**
 * Appends EP `name` (`ep` or `plugin/ep`, optionally followed by `:DEVICE` to run it on one of
 * the devices it lists, as [`epx_env_devices_json`](crate::epx_env_devices_json)'s `selector`
 * names it: `cuda:1`, `openvino:GPU.0`) with `n_options` options `keys[i] = values[i]`, after
 * the EPs added before it. With `error_on_failure`, a session fails when this EP cannot be set
 * up; without, the EP is skipped and the placement report says why. Unknown option keys are an
 * error when the session is made, naming the valid keys.
 *
 * # Safety
 * `options` is a live option set; `name` a string; `keys` and `values` point at `n_options`
 * strings each (or are NULL when `n_options` is 0).
 */
struct EpxError *epx_session_options_add_provider(struct EpxSessionOptions *options,
                                                  const char *name,
                                                  const char *const *keys,
                                                  const char *const *values,
                                                  size_t n_options,
                                                  bool error_on_failure);

/**
 * Strict placement: making a session fails when any node would fall back to the CPU EP.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_strict(struct EpxSessionOptions *options, bool strict);

/**
 * The threads the CPU EP shares a kernel's work across, for sessions made with these options:
 * 1 runs everything on the calling thread; 0, the default, one per core. It applies to the
 * fallback CPU EP and to a requested `cpu` EP that does not set `intra_op_num_threads` itself.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_intra_op_threads(struct EpxSessionOptions *options,
                                                          size_t threads);

/**
 * The largest tensor (bytes) sessions made with these options allocate, in place of the
 * process's limit ([`epx_set_max_tensor_bytes`](crate::epx_set_max_tensor_bytes)): a model or
 * input asking for more is an error naming the node and the size. 0 goes back to the process's
 * limit.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_max_tensor_bytes(struct EpxSessionOptions *options,
                                                          uint64_t bytes);

/**
 * Whether sessions made with these options use the compiled-kernel cache (default: yes, unless
 * `EPX_KERNEL_CACHE=off`): kernels of EPs that can serialize them (ABI 1.6, e.g. OpenVINO) are
 * rebuilt from `<cache dir>/kernels` (`EPX_CACHE_DIR`, else `$XDG_CACHE_HOME/epx`, else
 * `$HOME/.cache/epx`) instead of compiled, and new ones stored there. The placement JSON's
 * `kernel_cache` says what happened per kernel.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_kernel_cache(struct EpxSessionOptions *options,
                                                      bool enabled);

/**
 * Whether sessions made with these options profile their runs (default: no): the time of
 * each kernel and copy, of each node in EPs that record their kernels' parts (the CPU EP
 * does), and what the EPs' compile passes did. Read it with [`epx_session_profile_json`].
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_profiling(struct EpxSessionOptions *options, bool enabled);

/**
 * Runs every EP of the list in a child process (the `epx` executable beside libepx, at
 * `../bin/epx`, or named by `EPX_PROBE_EXE`, serving the plugin): a crash or hang of a plugin
 * then fails the run it happened in with an error, and the next run starts a new process,
 * instead of ending the calling program. Tensors pass through shared memory; only EPs of plugin
 * libraries whose tensors live in host memory can be isolated (others fail to set up, saying
 * why). A plugin whose `plugin.toml` says `isolate = true` is always isolated.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_isolated(struct EpxSessionOptions *options, bool isolated);

/**
 * Chooses the EPs of sessions made with these options by policy, from the devices the
 * environment's EPs list ([`epx_env_devices_json`](crate::epx_env_devices_json)): `prefer-cpu`,
 * `prefer-gpu`, `prefer-npu`, `max-performance`, `min-power`, or `measure` (times the candidates
 * on the model and remembers the fastest); NULL goes back to the EPs added
 * by name. Naming EPs as well fails the session. The placement JSON's `selection` says what the
 * policy chose and why.
 *
 * # Safety
 * `options` is a live option set; `policy` is NULL or a string.
 */
struct EpxError *epx_session_options_set_selection_policy(struct EpxSessionOptions *options,
                                                          const char *policy);

/**
 * The application's own selection policy: `select(devices_json, model_json, eps, capacity,
 * user_data)` gets the devices (as [`epx_env_devices_json`](crate::epx_env_devices_json)) and
 * the model (`graph_name`, `producer_name`, `op_types`: the distinct `domain:op` of its nodes,
 * `inputs`, `outputs`), writes the EPs to use, in order, into `eps` as a NUL-terminated,
 * comma-separated list of `EP` or `EP:DEVICE` when `capacity` holds it, and returns the list's
 * length without the NUL (it is called again with a larger buffer when that does not fit).
 * Returning `SIZE_MAX` fails the session: the function could not choose. Called on the thread
 * that makes the session, during `epx_session_new`; `user_data` is passed through.
 *
 * Pointers: `options` is a live option set; `select` NULL clears the function.
 */
struct EpxError *epx_session_options_set_selection_function(struct EpxSessionOptions *options,
                                                            EpxSelectionFn select,
                                                            void *user_data);

/**
 * New run options, the terminate flag clear.
 */
struct EpxRunOptions *epx_run_options_new(void);

/**
 * Frees run options. NULL, or options freed already, is a no-op; a run in progress with them
 * keeps its own reference.
 *
 * Pointers: `options` is NULL or from [`epx_run_options_new`].
 */
void epx_run_options_free(struct EpxRunOptions *options);

/**
 * Sets (`true`) or clears the terminate flag, from any thread. Runs in progress with these
 * options stop at their next check (before each kernel; inside EPs that read the flag, such as
 * the CPU EP, before each node and at each loop iteration) and fail with
 * `EPX_ERROR_CODE_CANCELLED`; so does a session creation watching them. While set, runs made
 * with these options fail at once.
 *
 * Pointers: `options` is live run options.
 */
struct EpxError *epx_run_options_set_terminate(const struct EpxRunOptions *options, bool terminate);

/**
 * Runs the model on `n_inputs` inputs given as plain buffers ([`EpxTensorRef`]; the data is
 * copied). `*out` receives every model output in host memory. Sessions may run from several
 * threads at once.
 *
 * # Safety
 * `session` is a live session; `inputs` points at `n_inputs` tensor refs whose pointers are
 * valid as described there; `out` writable.
 */
struct EpxError *epx_session_run(const struct EpxSession *session,
                                 const struct EpxTensorRef *inputs,
                                 size_t n_inputs,
                                 struct EpxOutputs **out);

/**
 * [`epx_session_run`] with run options: `run_options` (NULL for none) lets another thread
 * cancel the run ([`epx_run_options_set_terminate`]).
 *
 * # Safety
 * As for [`epx_session_run`]; `run_options` is NULL or live run options.
 */
struct EpxError *epx_session_run_with_options(const struct EpxSession *session,
                                              const struct EpxTensorRef *inputs,
                                              size_t n_inputs,
                                              const struct EpxRunOptions *run_options,
                                              struct EpxOutputs **out);

/**
 * Runs the model on `n_inputs` DLPack tensors named `input_names[i]`. Each must be in host
 * memory (`kDLCPU`), compact and row-major (`strides` NULL or equal to the compact strides); the
 * data is copied. Read the outputs with [`epx_outputs_dltensor`] or [`epx_outputs_get`].
 *
 * # Safety
 * `session` is a live session; `input_names` and `inputs` point at `n_inputs` strings and
 * DLTensor pointers, each tensor valid per DLPack; `out` writable.
 */
struct EpxError *epx_session_run_dlpack(const struct EpxSession *session,
                                        const char *const *input_names,
                                        const DLTensor *const *inputs,
                                        size_t n_inputs,
                                        struct EpxOutputs **out);

/**
 * The number of outputs (0 for NULL).
 *
 * Pointers: `outputs` is NULL or live outputs.
 */
size_t epx_outputs_count(const struct EpxOutputs *outputs);

/**
 * Output `index` as name, element type, shape and data (valid until `outputs` is freed).
 *
 * Pointers: `outputs` is live outputs; `out` writable.
 */
struct EpxError *epx_outputs_get(const struct EpxOutputs *outputs,
                                 size_t index,
                                 struct EpxTensorRef *out);

/**
 * Output `index` as a DLPack tensor in host memory (valid until `outputs` is freed; do not
 * modify it). `*name` (may be NULL) receives the output's name.
 *
 * # Safety
 * `outputs` is live outputs; `tensor` writable; `name` NULL or writable.
 */
struct EpxError *epx_outputs_dltensor(const struct EpxOutputs *outputs,
                                      size_t index,
                                      const char **name,
                                      const DLTensor **tensor);

/**
 * Frees the outputs of a run. NULL is a no-op.
 *
 * # Safety
 * `outputs` is NULL or from a run, freed only once.
 */
void epx_outputs_free(struct EpxOutputs *outputs);

/**
 * Runs the model on `n_inputs` values of any kind named `input_names[i]` (copied; the caller
 * keeps them). Read the outputs with [`epx_outputs_value`] (every kind) or the tensor getters.
 *
 * # Safety
 * `session` is a live session; `input_names` and `inputs` hold `n_inputs` C strings and live
 * values; `out` writable.
 */
struct EpxError *epx_session_run_values(const struct EpxSession *session,
                                        const char *const *input_names,
                                        const struct EpxHostValue *const *inputs,
                                        size_t n_inputs,
                                        struct EpxOutputs **out);

/**
 * [`epx_session_run_values`] with run options: `run_options` (NULL for none) lets another
 * thread cancel the run ([`epx_run_options_set_terminate`]).
 *
 * # Safety
 * As for [`epx_session_run_values`]; `run_options` is NULL or live run options.
 */
struct EpxError *epx_session_run_values_with_options(const struct EpxSession *session,
                                                     const char *const *input_names,
                                                     const struct EpxHostValue *const *inputs,
                                                     size_t n_inputs,
                                                     const struct EpxRunOptions *run_options,
                                                     struct EpxOutputs **out);

/**
 * Output `index` as a value of any kind (borrowed from `outputs`); `*name` (may be NULL)
 * receives its name.
 *
 * # Safety
 * `outputs` is live outputs; `value` writable; `name` NULL or writable.
 */
struct EpxError *epx_outputs_value(const struct EpxOutputs *outputs,
                                   size_t index,
                                   const char **name,
                                   const struct EpxHostValue **value);

/**
 * Loads the ONNX model at `model_path`, asks the EPs of `options` (may be NULL: the CPU EP
 * alone), then the environment's default EPs, for the nodes they can run, in that order, and
 * compiles the result. Free with [`epx_session_free`].
 *
 * # Safety
 * `env` is a live environment; `model_path` a string; `options` NULL or a live option set;
 * `out` writable.
 */
struct EpxError *epx_session_new(const struct EpxEnv *env,
                                 const char *model_path,
                                 const struct EpxSessionOptions *options,
                                 struct EpxSession **out);

/**
 * As [`epx_session_new`], with the model's bytes in memory (copied; the buffer may be freed
 * when this returns).
 *
 * # Safety
 * `data` points at `len` bytes; the other arguments as for [`epx_session_new`].
 */
struct EpxError *epx_session_new_from_bytes(const struct EpxEnv *env,
                                            const void *data,
                                            size_t len,
                                            const struct EpxSessionOptions *options,
                                            struct EpxSession **out);

/**
 * Releases the caller's session. Runs in flight on other threads finish on their own
 * reference (the session is dropped when the last one ends); any call made with the handle
 * afterwards fails with "the session is closed". NULL, or a session freed already, is a no-op.
 *
 * Pointers: `session` is NULL or from this library.
 */
void epx_session_free(struct EpxSession *session);

/**
 * The number of model inputs (0 for NULL).
 *
 * Pointers: `session` is NULL or a live session.
 */
size_t epx_session_input_count(const struct EpxSession *session);

/**
 * The number of model outputs (0 for NULL).
 *
 * Pointers: `session` is NULL or a live session.
 */
size_t epx_session_output_count(const struct EpxSession *session);

/**
 * Describes model input `index`: name, element type and shape.
 *
 * Pointers: `session` is a live session; `out` writable.
 */
struct EpxError *epx_session_input(const struct EpxSession *session,
                                   size_t index,
                                   struct EpxValueDesc *out);

/**
 * Describes model output `index`: name, element type and shape.
 *
 * Pointers: `session` is a live session; `out` writable.
 */
struct EpxError *epx_session_output(const struct EpxSession *session,
                                    size_t index,
                                    struct EpxValueDesc *out);

/**
 * The placement report as JSON: `nodes` (id, name, op_type, provider, group), `groups` (id,
 * provider, nodes, kernel, inputs, outputs), `copies` (value, from, to, before_group, bytes,
 * last_run_bytes), `fallbacks` (node, name, op_type, reason), `skipped_providers` (name,
 * reason), `isolated_providers` (names of the EPs running in a child process), `devices` (EP,
 * device for EPs on a chosen device), `selection` (null, or the policy, the EPs it `chosen`
 * and its `reasons`), `kernel_cache` (group, kernel, `loaded`, `note`: what the compiled-kernel
 * cache did per kernel of an EP that stores its kernels) and `replayed_capabilities` (EPs whose
 * capability answers came from that cache). Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_placement_json(const struct EpxSession *session, char **json);

/**
 * The profile of a session made with profiling on
 * ([`epx_session_options_set_profiling`](crate::epx_session_options_set_profiling)), as JSON:
 * `runs`, `run_ns` (time in `epx_session_run`, all runs), `kernels` (per kernel: `kernel`,
 * `provider`, `nodes`, `calls`, `ns`, `parts` (`name`, `op`, `calls`, `ns` per node or fused
 * node), `passes` (`name`, `changed`, `note` per compile pass of its EP) and `whole` (null, or
 * why the kernel is timed only whole)) and `copies` (`value`, `from`, `to`, `calls`, `ns`).
 * With `restart` true, the profile then starts again from zero. An `InvalidArgument` error
 * for a session made without profiling. Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_profile_json(const struct EpxSession *session,
                                          bool restart,
                                          char **json);

/**
 * The model's metadata as JSON: `producer_name`, `producer_version`, `domain`,
 * `model_version` (null when the file has none), `description` (the model's doc_string), `graph_name`, `graph_description`,
 * `custom` (metadata_props as an object), `ir_version`, `opsets` (domain to version; `""` is
 * the ONNX domain), `overridable_initializers` (graph inputs with an initializer, constants
 * here), and `inputs` / `outputs`: name and `dims`, each extent a number, its symbol, or null.
 * Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_metadata_json(const struct EpxSession *session,
                                           char **json);

/**
 * The declared type of model input `index` as ONNX spells it (`tensor(float)`,
 * `seq(tensor(int64))`, `map(string,tensor(float))`, `optional(...)`). Free `*type_name` with
 * [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `type_name` writable.
 */
struct EpxError *epx_session_input_type(const struct EpxSession *session,
                                        size_t index,
                                        char **type_name);

/**
 * As [`epx_session_input_type`], for model output `index`.
 *
 * # Safety
 * `session` is a live session; `type_name` writable.
 */
struct EpxError *epx_session_output_type(const struct EpxSession *session,
                                         size_t index,
                                         char **type_name);

/**
 * A new tensor value: a copy of `tensor`'s data (numeric and bool types; `name` is ignored).
 *
 * # Safety
 * `tensor` points at a valid [`EpxTensorRef`]; `out` writable.
 */
struct EpxError *epx_value_new_tensor(const struct EpxTensorRef *tensor, struct EpxHostValue **out);

/**
 * A new string tensor value of `ndim` extents `shape`, from one NUL-terminated UTF-8 string
 * per element (C order), copied.
 *
 * # Safety
 * `strings` holds as many valid C strings as the shape has elements; `shape` holds `ndim`
 * extents; `out` writable.
 */
struct EpxError *epx_value_new_strings(const char *const *strings,
                                       const int64_t *shape,
                                       size_t ndim,
                                       struct EpxHostValue **out);

/**
 * A new sequence of `n_items` values, taken over (freed by it, whatever the outcome).
 * `elem_type` is the `EpxElementType` of its tensors (needed for an empty sequence; 0 for a
 * sequence of maps).
 *
 * # Safety
 * `items` holds `n_items` live values the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_sequence(int32_t elem_type,
                                        struct EpxHostValue *const *items,
                                        size_t n_items,
                                        struct EpxHostValue **out);

/**
 * A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length, both taken
 * over.
 *
 * # Safety
 * `keys` and `values` are live tensor values the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_map(struct EpxHostValue *keys,
                                   struct EpxHostValue *values,
                                   struct EpxHostValue **out);

/**
 * A new optional holding `value` (taken over), or none when `value` is NULL.
 *
 * # Safety
 * `value` is NULL or a live value the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_optional(struct EpxHostValue *value, struct EpxHostValue **out);

/**
 * Frees a value made with an `epx_value_new_*` function and not handed to another. NULL is a
 * no-op. Values read from outputs belong to the outputs; do not free them.
 *
 * # Safety
 * `value` is NULL or a value the caller owns, freed only once.
 */
void epx_value_free(struct EpxHostValue *value);

/**
 * What a value is (an `EpxValueKind` of epx_plugin.h); 0 for NULL.
 *
 * Pointers: `value` is NULL or a live value.
 */
uint32_t epx_value_kind(const struct EpxHostValue *value);

/**
 * A tensor value as element type, shape and data, valid as long as the value (`name` is
 * NULL). For a string tensor `data` is NULL and `byte_len` 0: read its elements with
 * [`epx_value_string`].
 *
 * Pointers: `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_tensor(const struct EpxHostValue *value, struct EpxTensorRef *out);

/**
 * Element `index` (C order) of a string tensor value: `*data` and `*len` receive its bytes
 * (UTF-8, not NUL-terminated), valid as long as the value. `*count` (may be NULL) receives the
 * number of elements.
 *
 * # Safety
 * `value` is a live value; `data` and `len` writable; `count` NULL or writable.
 */
struct EpxError *epx_value_string(const struct EpxHostValue *value,
                                  size_t index,
                                  const char **data,
                                  size_t *len,
                                  size_t *count);

/**
 * The number of items of a sequence value (0 for NULL or another kind).
 *
 * Pointers: `value` is NULL or a live value.
 */
size_t epx_value_sequence_len(const struct EpxHostValue *value);

/**
 * Item `index` of a sequence value, borrowed from it.
 *
 * # Safety
 * `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_sequence_at(const struct EpxHostValue *value,
                                       size_t index,
                                       const struct EpxHostValue **out);

/**
 * A map value's keys and values (two 1-D tensor values of one length), borrowed from it.
 *
 * # Safety
 * `value` is a live value; `keys` and `values` writable.
 */
struct EpxError *epx_value_map(const struct EpxHostValue *value,
                               const struct EpxHostValue **keys,
                               const struct EpxHostValue **values);

/**
 * An optional value's content, borrowed from it: `*out` is NULL when it holds none.
 *
 * # Safety
 * `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_optional(const struct EpxHostValue *value,
                                    const struct EpxHostValue **out);

/**
 * The code of `error` ([`EpxErrorCode::Internal`] for NULL).
 *
 * Pointers: `error` is NULL or an error from this library, not yet freed.
 */
enum EpxErrorCode epx_error_code(const struct EpxError *error);

/**
 * The message of `error`, valid until the error is freed ("" for NULL).
 *
 * Pointers: `error` is NULL or an error from this library, not yet freed.
 */
const char *epx_error_message(const struct EpxError *error);

/**
 * Frees an error. NULL is a no-op.
 *
 * # Safety
 * `error` is NULL or an error from this library, freed only once.
 */
void epx_error_free(struct EpxError *error);

/**
 * Frees a string this library returned through a `char **`. NULL is a no-op.
 *
 * # Safety
 * `s` is NULL or such a string, freed only once.
 */
void epx_string_free(char *s);

/**
 * A new, empty option set: no EPs (the CPU EP always runs what is left), not strict.
 */
struct EpxSessionOptions *epx_session_options_new(void);

/**
 * Makes the creation of sessions with these options cancellable: once `run_options`' terminate
 * flag is set ([`epx_run_options_set_terminate`](crate::epx_run_options_set_terminate), from
 * any thread), creation stops at its next step and fails with `EPX_ERROR_CODE_CANCELLED`
 * (ONNX Runtime's load cancellation flag). NULL stops watching.
 *
 * Pointers: `options` is a live option set; `run_options` NULL or live run options.
 */
struct EpxError *epx_session_options_set_cancellation(struct EpxSessionOptions *options,
                                                      const struct EpxRunOptions *run_options);

/**
 * Frees an option set. NULL, or a set freed already, is a no-op.
 *
 * Pointers: `options` is NULL or from [`epx_session_options_new`].
 */
void epx_session_options_free(struct EpxSessionOptions *options);

/**
 * Appends EP `name` (`ep` or `plugin/ep`, optionally followed by `:DEVICE` to run it on one of
 * the devices it lists, as [`epx_env_devices_json`](crate::epx_env_devices_json)'s `selector`
 * names it: `cuda:1`, `openvino:GPU.0`) with `n_options` options `keys[i] = values[i]`, after
 * the EPs added before it. With `error_on_failure`, a session fails when this EP cannot be set
 * up; without, the EP is skipped and the placement report says why. Unknown option keys are an
 * error when the session is made, naming the valid keys.
 *
 * # Safety
 * `options` is a live option set; `name` a string; `keys` and `values` point at `n_options`
 * strings each (or are NULL when `n_options` is 0).
 */
struct EpxError *epx_session_options_add_provider(struct EpxSessionOptions *options,
                                                  const char *name,
                                                  const char *const *keys,
                                                  const char *const *values,
                                                  size_t n_options,
                                                  bool error_on_failure);

/**
 * Strict placement: making a session fails when any node would fall back to the CPU EP.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_strict(struct EpxSessionOptions *options, bool strict);

/**
 * The threads the CPU EP shares a kernel's work across, for sessions made with these options:
 * 1 runs everything on the calling thread; 0, the default, one per core. It applies to the
 * fallback CPU EP and to a requested `cpu` EP that does not set `intra_op_num_threads` itself.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_intra_op_threads(struct EpxSessionOptions *options,
                                                          size_t threads);

/**
 * The largest tensor (bytes) sessions made with these options allocate, in place of the
 * process's limit ([`epx_set_max_tensor_bytes`](crate::epx_set_max_tensor_bytes)): a model or
 * input asking for more is an error naming the node and the size. 0 goes back to the process's
 * limit.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_max_tensor_bytes(struct EpxSessionOptions *options,
                                                          uint64_t bytes);

/**
 * Whether sessions made with these options use the compiled-kernel cache (default: yes, unless
 * `EPX_KERNEL_CACHE=off`): kernels of EPs that can serialize them (ABI 1.6, e.g. OpenVINO) are
 * rebuilt from `<cache dir>/kernels` (`EPX_CACHE_DIR`, else `$XDG_CACHE_HOME/epx`, else
 * `$HOME/.cache/epx`) instead of compiled, and new ones stored there. The placement JSON's
 * `kernel_cache` says what happened per kernel.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_kernel_cache(struct EpxSessionOptions *options,
                                                      bool enabled);

/**
 * Whether sessions made with these options profile their runs (default: no): the time of
 * each kernel and copy, of each node in EPs that record their kernels' parts (the CPU EP
 * does), and what the EPs' compile passes did. Read it with [`epx_session_profile_json`].
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_profiling(struct EpxSessionOptions *options, bool enabled);

/**
 * Runs every EP of the list in a child process (the `epx` executable beside libepx, at
 * `../bin/epx`, or named by `EPX_PROBE_EXE`, serving the plugin): a crash or hang of a plugin
 * then fails the run it happened in with an error, and the next run starts a new process,
 * instead of ending the calling program. Tensors pass through shared memory; only EPs of plugin
 * libraries whose tensors live in host memory can be isolated (others fail to set up, saying
 * why). A plugin whose `plugin.toml` says `isolate = true` is always isolated.
 *
 * Pointers: `options` is a live option set.
 */
struct EpxError *epx_session_options_set_isolated(struct EpxSessionOptions *options, bool isolated);

/**
 * Chooses the EPs of sessions made with these options by policy, from the devices the
 * environment's EPs list ([`epx_env_devices_json`](crate::epx_env_devices_json)): `prefer-cpu`,
 * `prefer-gpu`, `prefer-npu`, `max-performance`, `min-power`, or `measure` (times the candidates
 * on the model and remembers the fastest); NULL goes back to the EPs added
 * by name. Naming EPs as well fails the session. The placement JSON's `selection` says what the
 * policy chose and why.
 *
 * # Safety
 * `options` is a live option set; `policy` is NULL or a string.
 */
struct EpxError *epx_session_options_set_selection_policy(struct EpxSessionOptions *options,
                                                          const char *policy);

/**
 * The application's own selection policy: `select(devices_json, model_json, eps, capacity,
 * user_data)` gets the devices (as [`epx_env_devices_json`](crate::epx_env_devices_json)) and
 * the model (`graph_name`, `producer_name`, `op_types`: the distinct `domain:op` of its nodes,
 * `inputs`, `outputs`), writes the EPs to use, in order, into `eps` as a NUL-terminated,
 * comma-separated list of `EP` or `EP:DEVICE` when `capacity` holds it, and returns the list's
 * length without the NUL (it is called again with a larger buffer when that does not fit).
 * Returning `SIZE_MAX` fails the session: the function could not choose. Called on the thread
 * that makes the session, during `epx_session_new`; `user_data` is passed through.
 *
 * Pointers: `options` is a live option set; `select` NULL clears the function.
 */
struct EpxError *epx_session_options_set_selection_function(struct EpxSessionOptions *options,
                                                            EpxSelectionFn select,
                                                            void *user_data);

/**
 * Makes an environment: plugins are searched in `plugin_dirs` (absolute, or relative to the
 * current folder), then in each absolute folder of `EPX_PLUGIN_PATH`, then in the default
 * folder next to libepx (`<prefix>/lib/epx/plugins` when installed) and next to the program.
 * `default_providers` (may be NULL) lists EPs every session tries after its own; its strict flag
 * is ignored. Plugins are loaded when first needed, each opened first in a child process (the
 * `epx` executable beside libepx, when there is one). No Python package is imported unless
 * `EPX_PYTHON_EPS` asks for the search (`1`: every Python environment epx sees, `own`: the one
 * libepx is installed in). Free with [`epx_env_free`].
 *
 * # Safety
 * `plugin_dirs` points at `n_dirs` strings (or is NULL when `n_dirs` is 0);
 * `default_providers` is NULL or a live option set; `out` is writable.
 */
struct EpxError *epx_env_new(const char *const *plugin_dirs,
                             size_t n_dirs,
                             const struct EpxSessionOptions *default_providers,
                             struct EpxEnv **out);

/**
 * Frees an environment. Sessions made from it keep what they need and stay usable; a call
 * in flight on it finishes. NULL, or an environment freed already, is a no-op.
 *
 * Pointers: `env` is NULL or from [`epx_env_new`].
 */
void epx_env_free(struct EpxEnv *env);

/**
 * How many EPs [`epx_env_provider`] lists: those of every plugin found (loading each, after
 * opening it in a child process when an `epx` executable is beside libepx, `../bin/epx` or
 * `EPX_PROBE_EXE`, so that a library that crashes the loader is listed as broken), then the
 * built-in ones. 0 for NULL.
 *
 * Pointers: `env` is NULL or a live environment.
 */
size_t epx_env_provider_count(const struct EpxEnv *env);

/**
 * Describes EP `index` (see [`epx_env_provider_count`]), with its availability and the reason
 * when it is not available. Strings live until `env` is freed.
 *
 * Pointers: `env` is a live environment; `out` is writable.
 */
struct EpxError *epx_env_provider(const struct EpxEnv *env,
                                  size_t index,
                                  struct EpxProviderDesc *out);

/**
 * The doctor report (what `epx doctor` prints): every plugin folder searched, every plugin found
 * with its manifest, ABI and each library it depends on, found or not and where it was looked
 * for. `*all_ok` (may be NULL) says whether every plugin is usable. Plugins are opened in a
 * child process first, as for [`epx_env_provider_count`]. Free `*report` with
 * [`epx_string_free`].
 *
 * # Safety
 * `env` is a live environment; `report` is writable; `all_ok` is NULL or writable.
 */
struct EpxError *epx_env_doctor(const struct EpxEnv *env, bool *all_ok, char **report);

/**
 * Every device the environment's EPs can run on (ABI 1.5), as JSON: an array of `selector`
 * (how a session names the EP on that device: `cuda:1`, `openvino:GPU.0`), `provider`,
 * `plugin`, and `device` (`kind`: cpu, gpu, npu or other; `id`; `id_name`; `vendor`; `name`;
 * `memory_bytes`, null when unknown; `driver_version`; `unusable`, null or why the EP cannot
 * use it). Plugins are opened in a child process first, as for [`epx_env_provider_count`].
 * Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `env` is a live environment; `json` is writable.
 */
struct EpxError *epx_env_devices_json(const struct EpxEnv *env, char **json);

/**
 * Loads the ONNX model at `model_path`, asks the EPs of `options` (may be NULL: the CPU EP
 * alone), then the environment's default EPs, for the nodes they can run, in that order, and
 * compiles the result. Free with [`epx_session_free`].
 *
 * # Safety
 * `env` is a live environment; `model_path` a string; `options` NULL or a live option set;
 * `out` writable.
 */
struct EpxError *epx_session_new(const struct EpxEnv *env,
                                 const char *model_path,
                                 const struct EpxSessionOptions *options,
                                 struct EpxSession **out);

/**
 * As [`epx_session_new`], with the model's bytes in memory (copied; the buffer may be freed
 * when this returns).
 *
 * # Safety
 * `data` points at `len` bytes; the other arguments as for [`epx_session_new`].
 */
struct EpxError *epx_session_new_from_bytes(const struct EpxEnv *env,
                                            const void *data,
                                            size_t len,
                                            const struct EpxSessionOptions *options,
                                            struct EpxSession **out);

/**
 * Releases the caller's session. Runs in flight on other threads finish on their own
 * reference (the session is dropped when the last one ends); any call made with the handle
 * afterwards fails with "the session is closed". NULL, or a session freed already, is a no-op.
 *
 * Pointers: `session` is NULL or from this library.
 */
void epx_session_free(struct EpxSession *session);

/**
 * The number of model inputs (0 for NULL).
 *
 * Pointers: `session` is NULL or a live session.
 */
size_t epx_session_input_count(const struct EpxSession *session);

/**
 * The number of model outputs (0 for NULL).
 *
 * Pointers: `session` is NULL or a live session.
 */
size_t epx_session_output_count(const struct EpxSession *session);

/**
 * Describes model input `index`: name, element type and shape.
 *
 * Pointers: `session` is a live session; `out` writable.
 */
struct EpxError *epx_session_input(const struct EpxSession *session,
                                   size_t index,
                                   struct EpxValueDesc *out);

/**
 * Describes model output `index`: name, element type and shape.
 *
 * Pointers: `session` is a live session; `out` writable.
 */
struct EpxError *epx_session_output(const struct EpxSession *session,
                                    size_t index,
                                    struct EpxValueDesc *out);

/**
 * The placement report as JSON: `nodes` (id, name, op_type, provider, group), `groups` (id,
 * provider, nodes, kernel, inputs, outputs), `copies` (value, from, to, before_group, bytes,
 * last_run_bytes), `fallbacks` (node, name, op_type, reason), `skipped_providers` (name,
 * reason), `isolated_providers` (names of the EPs running in a child process), `devices` (EP,
 * device for EPs on a chosen device), `selection` (null, or the policy, the EPs it `chosen`
 * and its `reasons`), `kernel_cache` (group, kernel, `loaded`, `note`: what the compiled-kernel
 * cache did per kernel of an EP that stores its kernels) and `replayed_capabilities` (EPs whose
 * capability answers came from that cache). Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_placement_json(const struct EpxSession *session, char **json);

/**
 * The profile of a session made with profiling on
 * ([`epx_session_options_set_profiling`](crate::epx_session_options_set_profiling)), as JSON:
 * `runs`, `run_ns` (time in `epx_session_run`, all runs), `kernels` (per kernel: `kernel`,
 * `provider`, `nodes`, `calls`, `ns`, `parts` (`name`, `op`, `calls`, `ns` per node or fused
 * node), `passes` (`name`, `changed`, `note` per compile pass of its EP) and `whole` (null, or
 * why the kernel is timed only whole)) and `copies` (`value`, `from`, `to`, `calls`, `ns`).
 * With `restart` true, the profile then starts again from zero. An `InvalidArgument` error
 * for a session made without profiling. Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_profile_json(const struct EpxSession *session,
                                          bool restart,
                                          char **json);

/**
 * The model's metadata as JSON: `producer_name`, `producer_version`, `domain`,
 * `model_version` (null when the file has none), `description` (the model's doc_string), `graph_name`, `graph_description`,
 * `custom` (metadata_props as an object), `ir_version`, `opsets` (domain to version; `""` is
 * the ONNX domain), `overridable_initializers` (graph inputs with an initializer, constants
 * here), and `inputs` / `outputs`: name and `dims`, each extent a number, its symbol, or null.
 * Free `*json` with [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `json` writable.
 */
struct EpxError *epx_session_metadata_json(const struct EpxSession *session,
                                           char **json);

/**
 * The declared type of model input `index` as ONNX spells it (`tensor(float)`,
 * `seq(tensor(int64))`, `map(string,tensor(float))`, `optional(...)`). Free `*type_name` with
 * [`epx_string_free`].
 *
 * # Safety
 * `session` is a live session; `type_name` writable.
 */
struct EpxError *epx_session_input_type(const struct EpxSession *session,
                                        size_t index,
                                        char **type_name);

/**
 * As [`epx_session_input_type`], for model output `index`.
 *
 * # Safety
 * `session` is a live session; `type_name` writable.
 */
struct EpxError *epx_session_output_type(const struct EpxSession *session,
                                         size_t index,
                                         char **type_name);

/**
 * New run options, the terminate flag clear.
 */
struct EpxRunOptions *epx_run_options_new(void);

/**
 * Frees run options. NULL, or options freed already, is a no-op; a run in progress with them
 * keeps its own reference.
 *
 * Pointers: `options` is NULL or from [`epx_run_options_new`].
 */
void epx_run_options_free(struct EpxRunOptions *options);

/**
 * Sets (`true`) or clears the terminate flag, from any thread. Runs in progress with these
 * options stop at their next check (before each kernel; inside EPs that read the flag, such as
 * the CPU EP, before each node and at each loop iteration) and fail with
 * `EPX_ERROR_CODE_CANCELLED`; so does a session creation watching them. While set, runs made
 * with these options fail at once.
 *
 * Pointers: `options` is live run options.
 */
struct EpxError *epx_run_options_set_terminate(const struct EpxRunOptions *options, bool terminate);

/**
 * Runs the model on `n_inputs` inputs given as plain buffers ([`EpxTensorRef`]; the data is
 * copied). `*out` receives every model output in host memory. Sessions may run from several
 * threads at once.
 *
 * # Safety
 * `session` is a live session; `inputs` points at `n_inputs` tensor refs whose pointers are
 * valid as described there; `out` writable.
 */
struct EpxError *epx_session_run(const struct EpxSession *session,
                                 const struct EpxTensorRef *inputs,
                                 size_t n_inputs,
                                 struct EpxOutputs **out);

/**
 * [`epx_session_run`] with run options: `run_options` (NULL for none) lets another thread
 * cancel the run ([`epx_run_options_set_terminate`]).
 *
 * # Safety
 * As for [`epx_session_run`]; `run_options` is NULL or live run options.
 */
struct EpxError *epx_session_run_with_options(const struct EpxSession *session,
                                              const struct EpxTensorRef *inputs,
                                              size_t n_inputs,
                                              const struct EpxRunOptions *run_options,
                                              struct EpxOutputs **out);

/**
 * Runs the model on `n_inputs` DLPack tensors named `input_names[i]`. Each must be in host
 * memory (`kDLCPU`), compact and row-major (`strides` NULL or equal to the compact strides); the
 * data is copied. Read the outputs with [`epx_outputs_dltensor`] or [`epx_outputs_get`].
 *
 * # Safety
 * `session` is a live session; `input_names` and `inputs` point at `n_inputs` strings and
 * DLTensor pointers, each tensor valid per DLPack; `out` writable.
 */
struct EpxError *epx_session_run_dlpack(const struct EpxSession *session,
                                        const char *const *input_names,
                                        const DLTensor *const *inputs,
                                        size_t n_inputs,
                                        struct EpxOutputs **out);

/**
 * The number of outputs (0 for NULL).
 *
 * Pointers: `outputs` is NULL or live outputs.
 */
size_t epx_outputs_count(const struct EpxOutputs *outputs);

/**
 * Output `index` as name, element type, shape and data (valid until `outputs` is freed).
 *
 * Pointers: `outputs` is live outputs; `out` writable.
 */
struct EpxError *epx_outputs_get(const struct EpxOutputs *outputs,
                                 size_t index,
                                 struct EpxTensorRef *out);

/**
 * Output `index` as a DLPack tensor in host memory (valid until `outputs` is freed; do not
 * modify it). `*name` (may be NULL) receives the output's name.
 *
 * # Safety
 * `outputs` is live outputs; `tensor` writable; `name` NULL or writable.
 */
struct EpxError *epx_outputs_dltensor(const struct EpxOutputs *outputs,
                                      size_t index,
                                      const char **name,
                                      const DLTensor **tensor);

/**
 * Frees the outputs of a run. NULL is a no-op.
 *
 * # Safety
 * `outputs` is NULL or from a run, freed only once.
 */
void epx_outputs_free(struct EpxOutputs *outputs);

/**
 * Runs the model on `n_inputs` values of any kind named `input_names[i]` (copied; the caller
 * keeps them). Read the outputs with [`epx_outputs_value`] (every kind) or the tensor getters.
 *
 * # Safety
 * `session` is a live session; `input_names` and `inputs` hold `n_inputs` C strings and live
 * values; `out` writable.
 */
struct EpxError *epx_session_run_values(const struct EpxSession *session,
                                        const char *const *input_names,
                                        const struct EpxHostValue *const *inputs,
                                        size_t n_inputs,
                                        struct EpxOutputs **out);

/**
 * [`epx_session_run_values`] with run options: `run_options` (NULL for none) lets another
 * thread cancel the run ([`epx_run_options_set_terminate`]).
 *
 * # Safety
 * As for [`epx_session_run_values`]; `run_options` is NULL or live run options.
 */
struct EpxError *epx_session_run_values_with_options(const struct EpxSession *session,
                                                     const char *const *input_names,
                                                     const struct EpxHostValue *const *inputs,
                                                     size_t n_inputs,
                                                     const struct EpxRunOptions *run_options,
                                                     struct EpxOutputs **out);

/**
 * Output `index` as a value of any kind (borrowed from `outputs`); `*name` (may be NULL)
 * receives its name.
 *
 * # Safety
 * `outputs` is live outputs; `value` writable; `name` NULL or writable.
 */
struct EpxError *epx_outputs_value(const struct EpxOutputs *outputs,
                                   size_t index,
                                   const char **name,
                                   const struct EpxHostValue **value);

/**
 * A new tensor value: a copy of `tensor`'s data (numeric and bool types; `name` is ignored).
 *
 * # Safety
 * `tensor` points at a valid [`EpxTensorRef`]; `out` writable.
 */
struct EpxError *epx_value_new_tensor(const struct EpxTensorRef *tensor, struct EpxHostValue **out);

/**
 * A new string tensor value of `ndim` extents `shape`, from one NUL-terminated UTF-8 string
 * per element (C order), copied.
 *
 * # Safety
 * `strings` holds as many valid C strings as the shape has elements; `shape` holds `ndim`
 * extents; `out` writable.
 */
struct EpxError *epx_value_new_strings(const char *const *strings,
                                       const int64_t *shape,
                                       size_t ndim,
                                       struct EpxHostValue **out);

/**
 * A new sequence of `n_items` values, taken over (freed by it, whatever the outcome).
 * `elem_type` is the `EpxElementType` of its tensors (needed for an empty sequence; 0 for a
 * sequence of maps).
 *
 * # Safety
 * `items` holds `n_items` live values the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_sequence(int32_t elem_type,
                                        struct EpxHostValue *const *items,
                                        size_t n_items,
                                        struct EpxHostValue **out);

/**
 * A new map from 1-D `keys` (int64 or string) to 1-D `values` of the same length, both taken
 * over.
 *
 * # Safety
 * `keys` and `values` are live tensor values the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_map(struct EpxHostValue *keys,
                                   struct EpxHostValue *values,
                                   struct EpxHostValue **out);

/**
 * A new optional holding `value` (taken over), or none when `value` is NULL.
 *
 * # Safety
 * `value` is NULL or a live value the caller owns; `out` writable.
 */
struct EpxError *epx_value_new_optional(struct EpxHostValue *value, struct EpxHostValue **out);

/**
 * Frees a value made with an `epx_value_new_*` function and not handed to another. NULL is a
 * no-op. Values read from outputs belong to the outputs; do not free them.
 *
 * # Safety
 * `value` is NULL or a value the caller owns, freed only once.
 */
void epx_value_free(struct EpxHostValue *value);

/**
 * What a value is (an `EpxValueKind` of epx_plugin.h); 0 for NULL.
 *
 * Pointers: `value` is NULL or a live value.
 */
uint32_t epx_value_kind(const struct EpxHostValue *value);

/**
 * A tensor value as element type, shape and data, valid as long as the value (`name` is
 * NULL). For a string tensor `data` is NULL and `byte_len` 0: read its elements with
 * [`epx_value_string`].
 *
 * Pointers: `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_tensor(const struct EpxHostValue *value, struct EpxTensorRef *out);

/**
 * Element `index` (C order) of a string tensor value: `*data` and `*len` receive its bytes
 * (UTF-8, not NUL-terminated), valid as long as the value. `*count` (may be NULL) receives the
 * number of elements.
 *
 * # Safety
 * `value` is a live value; `data` and `len` writable; `count` NULL or writable.
 */
struct EpxError *epx_value_string(const struct EpxHostValue *value,
                                  size_t index,
                                  const char **data,
                                  size_t *len,
                                  size_t *count);

/**
 * The number of items of a sequence value (0 for NULL or another kind).
 *
 * Pointers: `value` is NULL or a live value.
 */
size_t epx_value_sequence_len(const struct EpxHostValue *value);

/**
 * Item `index` of a sequence value, borrowed from it.
 *
 * # Safety
 * `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_sequence_at(const struct EpxHostValue *value,
                                       size_t index,
                                       const struct EpxHostValue **out);

/**
 * A map value's keys and values (two 1-D tensor values of one length), borrowed from it.
 *
 * # Safety
 * `value` is a live value; `keys` and `values` writable.
 */
struct EpxError *epx_value_map(const struct EpxHostValue *value,
                               const struct EpxHostValue **keys,
                               const struct EpxHostValue **values);

/**
 * An optional value's content, borrowed from it: `*out` is NULL when it holds none.
 *
 * # Safety
 * `value` is a live value; `out` writable.
 */
struct EpxError *epx_value_optional(const struct EpxHostValue *value,
                                    const struct EpxHostValue **out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* EPX_H */
