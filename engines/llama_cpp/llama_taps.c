/*
 * llama_taps: runs a schedule of model calls through llama.cpp's C API (the libllama shipped in
 * node-llama-cpp's prebuilt CPU package, which node-llama-cpp's own API does not expose at this
 * depth) and writes, per call, the raw logits of every position and the tensors the engine's eval
 * callback sees under the names of the residual stream: "inp_scaled" (the scaled embeddings),
 * "l_out-<i>" (layer i's output), "result_norm" (the final norm). Built on demand by
 * engines/llama_cpp/engine.ts with the system C compiler against the headers of the same llama.cpp
 * release (the package's git bundle); used only for the level-1 dumps.
 *
 * usage: llama_taps MODEL.gguf BACKEND_DIR OUT_DIR CALL...
 *   CALL: comma-separated token ids fed as one llama_decode, or "G": the greedy token (argmax of
 *   the logits) of the previous call's last position.
 * Settings: CPU only, 1 thread, F32 K and V caches, flash attention off, full-size SWA cache, one
 * ubatch per call (n_ubatch = n_batch = n_ctx).
 * Output: OUT_DIR/c<k>.<name>.f32 (raw little-endian float32, ggml order: ne[0] fastest) and one
 * JSON line per tensor on stdout: {"call":k,"name":"l_out-3","ne":[64,16]}; then
 * {"greedy":[...]} (the argmax of each call's last position). Exit 0, or 1 with a message.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

struct taps_state {
    const char * out_dir;
    int call;
    int failed;
};

static int wanted(const char * name) {
    return strcmp(name, "inp_scaled") == 0 || strcmp(name, "result_norm") == 0 || strncmp(name, "l_out-", 6) == 0;
}

static bool on_tensor(struct ggml_tensor * t, bool ask, void * user_data) {
    struct taps_state * st = (struct taps_state *) user_data;
    if (ask) return wanted(t->name);
    if (!wanted(t->name)) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        fprintf(stderr, "llama_taps: %s is not a contiguous float32 tensor\n", t->name);
        st->failed = 1;
        return true;
    }
    size_t n = ggml_nbytes(t);
    float * buf = (float *) malloc(n);
    if (!buf) { st->failed = 1; return true; }
    ggml_backend_tensor_get(t, buf, 0, n);
    char path[4096];
    snprintf(path, sizeof path, "%s/c%d.%s.f32", st->out_dir, st->call, t->name);
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) { fprintf(stderr, "llama_taps: cannot write %s\n", path); st->failed = 1; }
    if (f) fclose(f);
    free(buf);
    printf("{\"call\":%d,\"name\":\"%s\",\"ne\":[%lld,%lld,%lld,%lld]}\n", st->call, t->name,
           (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3]);
    return true;
}

static bool no_progress(float progress, void * user_data) {
    (void) progress;
    (void) user_data;
    return true;
}

static void quiet(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: llama_taps MODEL.gguf BACKEND_DIR OUT_DIR CALL...\n");
        return 1;
    }
    const char * model_path = argv[1];
    int n_calls = argc - 4;
    int * lens = calloc(n_calls, sizeof(int));
    llama_token ** calls = calloc(n_calls, sizeof(llama_token *));
    int total = 0;
    for (int k = 0; k < n_calls; k++) {
        const char * s = argv[4 + k];
        if (strcmp(s, "G") == 0) { lens[k] = 1; calls[k] = NULL; total += 1; continue; }
        int n = 1;
        for (const char * p = s; *p; p++) n += *p == ',';
        calls[k] = calloc(n, sizeof(llama_token));
        char * end = (char *) s;
        for (int i = 0; i < n; i++) {
            calls[k][i] = (llama_token) strtol(end, &end, 10);
            if (*end == ',') end++;
        }
        lens[k] = n;
        total += n;
    }

    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(argv[2]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.progress_callback = no_progress;
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "llama_taps: cannot load %s\n", model_path); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct taps_state st = { argv[3], 0, 0 };
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = total < 32 ? 32 : total;
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.swa_full = true;
    cp.offload_kqv = false;
    cp.op_offload = false;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = &st;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_taps: cannot create a context\n"); return 1; }

    int pos = 0;
    llama_token prev_greedy = -1;
    llama_token * greedy = calloc(n_calls, sizeof(llama_token));
    for (int k = 0; k < n_calls; k++) {
        st.call = k;
        struct llama_batch b = llama_batch_init(lens[k], 0, 1);
        for (int i = 0; i < lens[k]; i++) {
            b.token[i] = calls[k] ? calls[k][i] : prev_greedy;
            b.pos[i] = pos + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = lens[k];
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "llama_taps: llama_decode failed on call %d\n", k); return 1; }
        char path[4096];
        snprintf(path, sizeof path, "%s/c%d.logits.f32", argv[3], k);
        FILE * f = fopen(path, "wb");
        if (!f) { fprintf(stderr, "llama_taps: cannot write %s\n", path); return 1; }
        for (int i = 0; i < lens[k]; i++) {
            const float * row = llama_get_logits_ith(ctx, i);
            if (!row || fwrite(row, sizeof(float), n_vocab, f) != (size_t) n_vocab) { fprintf(stderr, "llama_taps: no logits for call %d row %d\n", k, i); return 1; }
            if (i == lens[k] - 1) {
                int best = 0;
                for (int v = 1; v < n_vocab; v++) if (row[v] > row[best]) best = v;
                greedy[k] = prev_greedy = best;
            }
        }
        fclose(f);
        printf("{\"call\":%d,\"name\":\"logits\",\"ne\":[%d,%d,1,1]}\n", k, n_vocab, lens[k]);
        pos += lens[k];
        llama_batch_free(b);
        if (st.failed) return 1;
    }
    printf("{\"greedy\":[");
    for (int k = 0; k < n_calls; k++) printf("%s%d", k ? "," : "", greedy[k]);
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
