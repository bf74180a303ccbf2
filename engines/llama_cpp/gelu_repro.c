/*
 * gelu_repro: llama.cpp's CPU GELU (ggml_gelu through the CPU backend shipped in node-llama-cpp)
 * on a few float32 values, against the exact tanh-approximation GELU computed in double, and
 * against a float16 lookup written here from the description in ggml-cpu/vec.h (round x to
 * float16, look up gelu(x) rounded to float16; x <= -10 gives 0, x >= 10 gives x).
 *
 * usage: gelu_repro BACKEND_DIR      (prints one JSON line per value)
 * Built and run by engines/llama_cpp/gelu_repro.ts; exit 0, or 1 with a message.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

static double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(0.79788456080286535587989211986876 * x * (1.0 + 0.044715 * x * x)));
}

static float gelu_tanh_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
}

/* the float16 lookup: both roundings through ggml's own float16 conversions */
static float gelu_lookup(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    float h = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x));
    return ggml_fp16_to_fp32(ggml_fp32_to_fp16(gelu_tanh_f32(h)));
}

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: gelu_repro BACKEND_DIR\n"); return 1; }
    /* the last two straddle the float16 rounding midpoint between 1.0 and 1.0009765625: float32
       neighbours 1 ulp apart (a difference two float32 implementations make all the time) */
    const float mid = 1.00048828125f;
    float xs[] = { 0.1f, 0.5f, 1.0f, 1.2345678f, -0.3f, 2.5f, 3.14159265f, -1.7f, nextafterf(mid, 0.0f), nextafterf(mid, 2.0f) };
    const int n = (int) (sizeof xs / sizeof xs[0]);

    ggml_backend_load_all_from_path(argv[1]);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    if (!cpu) { fprintf(stderr, "gelu_repro: no CPU backend in %s\n", argv[1]); return 1; }
    struct ggml_init_params ip = { ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_tensor * y = ggml_gelu(ctx, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, cpu);
    if (!buf) { fprintf(stderr, "gelu_repro: cannot allocate\n"); return 1; }
    ggml_backend_tensor_set(x, xs, 0, sizeof xs);
    if (ggml_backend_graph_compute(cpu, gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "gelu_repro: compute failed\n"); return 1; }
    float ys[sizeof xs / sizeof xs[0]];
    ggml_backend_tensor_get(y, ys, 0, sizeof ys);
    for (int i = 0; i < n; i++) {
        double exact = gelu_tanh((double) xs[i]);
        printf("{\"x\":%.9g,\"llama_cpp\":%.9g,\"exact\":%.17g,\"rel_err\":%.3e,\"equals_f16_lookup\":%s}\n", xs[i], ys[i], exact,
               fabs(ys[i] - exact) / fabs(exact), ys[i] == gelu_lookup(xs[i]) ? "true" : "false");
    }
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(cpu);
    return 0;
}
