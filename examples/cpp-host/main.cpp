// epx-cpp-host: libepx from C++ with RAII wrappers (no exceptions escape a C callback; errors
// become std::runtime_error carrying libepx's code and message).
//
//     epx-cpp-host MODEL [--ep NAME]...
//
// Runs the model on zero inputs of its declared shapes (dynamic extents become 1) and prints
// each output's shape, its first values, and how many nodes each EP got.
//
// Build (installed epx):   c++ -std=c++17 main.cpp $(pkg-config --cflags --libs epx) -o epx-cpp-host
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "epx.h"

namespace {

// Throws when a libepx call failed, freeing the error.
void check(EpxError *e) {
    if (e == nullptr) {
        return;
    }
    std::string msg = "[code " + std::to_string(static_cast<int>(epx_error_code(e))) + "] " +
                      epx_error_message(e);
    epx_error_free(e);
    throw std::runtime_error(msg);
}

template <typename T, void (*Free)(T *)>
struct Deleter {
    void operator()(T *p) const { Free(p); }
};
using Env = std::unique_ptr<EpxEnv, Deleter<EpxEnv, epx_env_free>>;
using Options = std::unique_ptr<EpxSessionOptions, Deleter<EpxSessionOptions, epx_session_options_free>>;
using Session = std::unique_ptr<EpxSession, Deleter<EpxSession, epx_session_free>>;
using Outputs = std::unique_ptr<EpxOutputs, Deleter<EpxOutputs, epx_outputs_free>>;

size_t element_size(int32_t type) {
    switch (type) {
    case EPX_ELEMENT_TYPE_DOUBLE: case EPX_ELEMENT_TYPE_INT64: case EPX_ELEMENT_TYPE_UINT64: return 8;
    case EPX_ELEMENT_TYPE_FLOAT: case EPX_ELEMENT_TYPE_INT32: case EPX_ELEMENT_TYPE_UINT32: return 4;
    case EPX_ELEMENT_TYPE_FLOAT16: case EPX_ELEMENT_TYPE_BFLOAT16:
    case EPX_ELEMENT_TYPE_INT16: case EPX_ELEMENT_TYPE_UINT16: return 2;
    default: return 1;
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s MODEL [--ep NAME]...\n", argv[0]);
        return 2;
    }
    try {
        Env env;
        {
            EpxEnv *raw = nullptr;
            check(epx_env_new(nullptr, 0, nullptr, &raw));
            env.reset(raw);
        }
        Options options(epx_session_options_new());
        for (int i = 2; i + 1 < argc; i += 2) {
            if (std::string(argv[i]) == "--ep") {
                check(epx_session_options_add_provider(options.get(), argv[i + 1], nullptr, nullptr, 0, true));
            }
        }
        Session session;
        {
            EpxSession *raw = nullptr;
            check(epx_session_new(env.get(), argv[1], options.get(), &raw));
            session.reset(raw);
        }

        // Zero inputs of the declared shapes.
        std::vector<std::vector<int64_t>> shapes;
        std::vector<std::vector<unsigned char>> buffers;
        std::vector<EpxTensorRef> inputs;
        for (size_t i = 0; i < epx_session_input_count(session.get()); i++) {
            EpxValueDesc d;
            check(epx_session_input(session.get(), i, &d));
            std::vector<int64_t> shape;
            size_t count = 1;
            for (int64_t k = 0; k < d.ndim; k++) {
                shape.push_back(d.shape[k] < 0 ? 1 : d.shape[k]);
                count *= static_cast<size_t>(shape.back());
            }
            shapes.push_back(shape);
            buffers.emplace_back(count * element_size(d.elem_type));
        }
        for (size_t i = 0; i < shapes.size(); i++) {
            EpxValueDesc d;
            check(epx_session_input(session.get(), i, &d));
            inputs.push_back(EpxTensorRef{d.name, d.elem_type, shapes[i].data(), shapes[i].size(),
                                          buffers[i].data(), buffers[i].size()});
        }

        Outputs outputs;
        {
            EpxOutputs *raw = nullptr;
            check(epx_session_run(session.get(), inputs.data(), inputs.size(), &raw));
            outputs.reset(raw);
        }
        for (size_t i = 0; i < epx_outputs_count(outputs.get()); i++) {
            EpxTensorRef t;
            check(epx_outputs_get(outputs.get(), i, &t));
            std::printf("output %s: shape [", t.name);
            for (size_t d = 0; d < t.ndim; d++) {
                std::printf("%s%lld", d ? ", " : "", static_cast<long long>(t.shape[d]));
            }
            std::printf("]");
            if (t.elem_type == EPX_ELEMENT_TYPE_FLOAT) {
                const float *v = static_cast<const float *>(t.data);
                for (size_t k = 0; k < t.byte_len / 4 && k < 4; k++) {
                    std::printf(" %g", static_cast<double>(v[k]));
                }
            }
            std::printf("\n");
        }
        char *json = nullptr;
        check(epx_session_placement_json(session.get(), &json));
        std::unique_ptr<char, Deleter<char, epx_string_free>> owned(json);
        std::printf("placement: %zu bytes of JSON\n", std::string(owned.get()).size());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
