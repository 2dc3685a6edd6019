// Reference tokens and logits from llama.cpp for one GGUF file, for Starling's architecture
// tests (`models/tests/reference_logits.rs`). Built and run by `benches/llm/ref_logits.sh`.
//
// Usage: ref_logits MODEL.gguf TEXT_FILE N_EVAL
// Prints one JSON object: the tokens of the text (no special tokens added or parsed), and
// the logits at every one of the first N_EVAL positions, computed in one batch on one
// thread with an f32 KV cache and flash attention off, so that nothing but the model's own
// arithmetic (and its 8-bit activations, as in any Q8_0 product) is in the numbers.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    } else if (getenv("REF_LOGITS_VERBOSE")) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf TEXT_FILE N_EVAL\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 2;
    }
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    const int n_eval = std::stoi(argv[3]);

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    // The plain CPU path: the repacked AMX kernels crash on matrices this small.
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);

    std::vector<llama_token> tokens(text.size() + 16);
    const int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), tokens.data(),
                                 (int32_t) tokens.size(), false, false);
    if (n < 0 || n < n_eval) {
        fprintf(stderr, "tokenising gave %d tokens, need at least %d\n", n, n_eval);
        return 1;
    }
    tokens.resize(n);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 128;
    cp.n_batch = 128;
    cp.n_ubatch = 128;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    llama_batch batch = llama_batch_init(n_eval, 0, 1);
    for (int i = 0; i < n_eval; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_eval;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    printf("{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        printf(i ? ",%d" : "%d", tokens[i]);
    }
    printf("],\"logits\":[");
    for (int i = 0; i < n_eval; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        printf(i ? ",[" : "[");
        for (int j = 0; j < n_vocab; j++) {
            printf(j ? ",%.5g" : "%.5g", l[j]);
        }
        printf("]");
    }
    printf("]}\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
