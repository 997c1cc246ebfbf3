// Tokenizer folders (data/tokenizer.h): the byte tokenizer's HF files are well-formed JSON with
// 256 entries mapping the GPT-2 byte symbols to 0..255; copying, comparing, special token ids,
// generation_config.json, the run's tokenizer; the script runner's pipes and error messages
// (with /bin/sh standing in for python, so no python package is needed).
// Usage: test_data_tokenizer SCRATCH_DIR
#define _POSIX_C_SOURCE 200809L // setenv

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "tests/data/data_test.h"

static const char *dir;

static cJSON *read_json(const char *path) {
    char *text = test_read_file(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static const cJSON *get(const cJSON *j, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(j, key);
}

static void byte_files(void) {
    printf("byte tokenizer files\n");
    const char *d = test_path(dir, "byte");
    test_mkdirs(d);
    check_true("moe_tokenizer_write_byte_hf", moe_tokenizer_write_byte_hf(d) == MOE_OK);
    cJSON *tok = read_json(test_path(d, "tokenizer.json"));
    check_true("tokenizer.json parses (cJSON)", cJSON_IsObject(tok));
    const cJSON *model = get(tok, "model"), *vocab = get(model, "vocab"), *e;
    check_true("model BPE, no merges", cJSON_IsString(get(model, "type")) &&
                                           !strcmp(get(model, "type")->valuestring, "BPE") &&
                                           cJSON_IsArray(get(model, "merges")) &&
                                           cJSON_GetArraySize(get(model, "merges")) == 0);
    int seen[256] = {0}, n = 0, ok = 1;
    cJSON_ArrayForEach(e, vocab) {
        n++;
        if (!cJSON_IsNumber(e) || e->valueint < 0 || e->valueint > 255 || seen[e->valueint]++)
            ok = 0;
    }
    check_true("256 vocabulary entries", n == 256);
    check_true("ids are 0..255, each once", ok);
    // a few symbols of GPT-2's bytes_to_unicode: printable bytes are themselves, the rest
    // U+0100.. in order (NUL = U+0100 "Ā", space = U+0120 "Ġ", '\n' = U+010A "Ċ")
    const char *sym[][2] = {{"A", "65"},         {"\"", "34"},        {"\\", "92"},
                            {"\xc4\x80", "0"},   {"\xc4\xa0", "32"},  {"\xc4\x8a", "10"},
                            {"\xc3\xbf", "255"}, {"\xc2\xa1", "161"}, {"\xc5\x83", "173"}};
    ok = 1;
    for (size_t i = 0; i < sizeof sym / sizeof *sym; i++) {
        const cJSON *id = get(vocab, sym[i][0]);
        ok &= cJSON_IsNumber(id) && id->valueint == atoi(sym[i][1]);
    }
    check_true("GPT-2 byte symbols map to their byte", ok);
    const cJSON *pre = get(tok, "pre_tokenizer"), *dec = get(tok, "decoder");
    check_true(
        "ByteLevel pre-tokenizer, no regex, no prefix space",
        cJSON_IsString(get(pre, "type")) && !strcmp(get(pre, "type")->valuestring, "ByteLevel") &&
            cJSON_IsFalse(get(pre, "use_regex")) && cJSON_IsFalse(get(pre, "add_prefix_space")));
    check_true("ByteLevel decoder", cJSON_IsString(get(dec, "type")) &&
                                        !strcmp(get(dec, "type")->valuestring, "ByteLevel"));
    check_true("no special tokens", cJSON_IsArray(get(tok, "added_tokens")) &&
                                        cJSON_GetArraySize(get(tok, "added_tokens")) == 0 &&
                                        cJSON_IsNull(get(tok, "post_processor")));
    cJSON_Delete(tok);
    cJSON *cfg = read_json(test_path(d, "tokenizer_config.json"));
    check_true("tokenizer_config.json: PreTrainedTokenizerFast, no space clean-up",
               cJSON_IsString(get(cfg, "tokenizer_class")) &&
                   !strcmp(get(cfg, "tokenizer_class")->valuestring, "PreTrainedTokenizerFast") &&
                   cJSON_IsFalse(get(cfg, "clean_up_tokenization_spaces")) &&
                   cJSON_IsNumber(get(cfg, "model_max_length")));
    cJSON_Delete(cfg);

    check_true("recognised as the byte tokenizer",
               moe_tokenizer_is_byte_hf(d) && moe_tokenizer_has_hf(d));
    const char *other = test_path(dir, "other");
    test_mkdirs(other);
    remove(test_path(other, "tokenizer.json")); // a previous run's
    remove(test_path(other, "tokenizer_config.json"));
    check_true("a folder without tokenizer.json is not",
               !moe_tokenizer_is_byte_hf(other) && !moe_tokenizer_has_hf(other));
    int copied = -1, same = 0;
    check_true("copy", moe_tokenizer_copy_hf(d, other, &copied) == MOE_OK && copied == 2);
    check_true("the copy is the same tokenizer",
               moe_tokenizer_same_hf(d, other, &same) == MOE_OK && same);
    char *text = test_read_file(test_path(other, "tokenizer.json"));
    if (text) text[strlen(text) / 2] ^= 1;
    if (text) test_write_file(test_path(other, "tokenizer.json"), text, strlen(text));
    free(text);
    check_true("one changed byte: another tokenizer",
               !moe_tokenizer_is_byte_hf(other) &&
                   moe_tokenizer_same_hf(d, other, &same) == MOE_OK && !same);
    int bos, eos, pad;
    check_true("the byte tokenizer has no special ids",
               moe_tokenizer_special_ids(d, 256, &bos, &eos, &pad) == MOE_OK && bos == -1 &&
                   eos == -1 && pad == -1);
    check_true("generation_config.json without a source",
               moe_tokenizer_write_generation_config(NULL, d, 256, d) == MOE_OK);
    cJSON *gen = read_json(test_path(d, "generation_config.json"));
    check_true("  has transformers_version and no token ids",
               cJSON_IsString(get(gen, "transformers_version")) && !get(gen, "eos_token_id") &&
                   !get(gen, "bos_token_id") && !get(gen, "pad_token_id"));
    cJSON_Delete(gen);
}

// A hand-made tokenizer folder with special tokens (string and {"content"} forms).
static const char *special_folder(void) {
    const char *d = test_path(dir, "special");
    test_mkdirs(d);
    const char *tok = "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\"}, {\"id\": 1, "
                      "\"content\": \"</s>\"}],"
                      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"</s>\": 1, "
                      "\"<pad>\": 7, \"a\": 2}}}";
    const char *cfg =
        "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"pad_token\": null}";
    const char *map = "{\"pad_token\": \"<pad>\"}";
    test_write_file(test_path(d, "tokenizer.json"), tok, strlen(tok));
    test_write_file(test_path(d, "tokenizer_config.json"), cfg, strlen(cfg));
    test_write_file(test_path(d, "special_tokens_map.json"), map, strlen(map));
    return d;
}

static void special_ids(void) {
    printf("special tokens, generation_config.json, the run's tokenizer\n");
    const char *d = special_folder();
    int bos, eos, pad;
    check_true("bos/eos from tokenizer_config.json, pad from special_tokens_map.json",
               moe_tokenizer_special_ids(d, 8, &bos, &eos, &pad) == MOE_OK && bos == 0 &&
                   eos == 1 && pad == 7);
    const char *out = test_path(dir, "export");
    test_mkdirs(out);
    check_true("generation_config.json from the tokenizer",
               moe_tokenizer_write_generation_config(NULL, d, 0, out) == MOE_OK);
    cJSON *gen = read_json(test_path(out, "generation_config.json"));
    check_true("  bos 0, eos 1, pad 7", cJSON_IsNumber(get(gen, "bos_token_id")) &&
                                            get(gen, "bos_token_id")->valueint == 0 &&
                                            get(gen, "eos_token_id")->valueint == 1 &&
                                            get(gen, "pad_token_id")->valueint == 7);
    cJSON_Delete(gen);
    const char *hf = test_path(dir, "hfmodel");
    test_mkdirs(hf);
    test_write_file(test_path(hf, "generation_config.json"), "{\"eos_token_id\": 2}\n", 20);
    check_true("an HF folder's own generation_config.json is copied",
               moe_tokenizer_write_generation_config(hf, d, 0, out) == MOE_OK);
    char *text = test_read_file(test_path(out, "generation_config.json"));
    check_true("  verbatim", text && !strcmp(text, "{\"eos_token_id\": 2}\n"));
    free(text);

    char tok[1024];
    int from_init = -1;
    check_true("no data.tokenizer, no init_from: byte",
               moe_tokenizer_for_run(tok, sizeof tok, "", "", &from_init) == MOE_OK && !tok[0] &&
                   !from_init);
    check_true("data.tokenizer",
               moe_tokenizer_for_run(tok, sizeof tok, d, "", &from_init) == MOE_OK &&
                   !strcmp(tok, d) && !from_init);
    check_refused("data.tokenizer without tokenizer.json",
                  moe_tokenizer_for_run(tok, sizeof tok, hf, "", NULL), hf, "tokenizer.json");
    check_true("data.tokenizer = a byte tokenizer folder: byte",
               moe_tokenizer_for_run(tok, sizeof tok, test_path(dir, "byte"), "", NULL) == MOE_OK &&
                   !tok[0]);
    check_true("init_from's tokenizer",
               moe_tokenizer_for_run(tok, sizeof tok, "", d, &from_init) == MOE_OK &&
                   !strcmp(tok, d) && from_init == 1);
    test_write_file(test_path(dir, "latest"), "special\n", 8);
    check_true("init_from = a latest file naming the folder",
               moe_tokenizer_for_run(tok, sizeof tok, "", test_path(dir, "latest"), &from_init) ==
                       MOE_OK &&
                   !strcmp(tok, d) && from_init == 1);
    check_true("init_from with the byte tokenizer: byte",
               moe_tokenizer_for_run(tok, sizeof tok, "", test_path(dir, "byte"), &from_init) ==
                       MOE_OK &&
                   !tok[0] && !from_init);
    check_true("init_from without a tokenizer: byte",
               moe_tokenizer_for_run(tok, sizeof tok, "", hf, NULL) == MOE_OK && !tok[0]);
}

// Special-token ids outside [0, vocab_size) (issue 28, item 8), and a key twice in a file
// (item 9): refused naming the file, the token and the id (or the key).
static void special_refusals(void) {
    printf("special token ids out of range, duplicate keys\n");
    const char *d = special_folder();
    int bos, eos, pad;
    check_refused("pad <pad> = 7 with a vocabulary of 7",
                  moe_tokenizer_special_ids(d, 7, &bos, &eos, &pad), "tokenizer.json",
                  "pad_token \"<pad>\" has id 7, not an integer in [0, 7)");
    const char *tok = "{\"added_tokens\": [{\"id\": 4e9, \"content\": \"<s>\"}], \"model\": "
                      "{\"vocab\": {}}}";
    test_write_file(test_path(d, "tokenizer.json"), tok, strlen(tok));
    check_refused("an added token of id 4e9, vocabulary unknown",
                  moe_tokenizer_special_ids(d, 0, &bos, &eos, &pad), "tokenizer.json",
                  "added token \"<s>\" has id 4000000000, not an integer in [0, 2147483647]");
    const char *out = test_path(dir, "export_bad");
    test_mkdirs(out);
    check_refused("  generation_config.json is not written from it",
                  moe_tokenizer_write_generation_config(NULL, d, 0, out), "tokenizer.json", "<s>");
    tok = "{\"added_tokens\": [{\"id\": -1, \"content\": \"<unused>\"}], \"model\": {}}";
    test_write_file(test_path(d, "tokenizer.json"), tok, strlen(tok));
    check_refused("a negative id, even of a token no special id names",
                  moe_tokenizer_special_ids(d, 0, &bos, &eos, &pad), "tokenizer.json",
                  "added token \"<unused>\" has id -1");
    special_folder();
    const char *cfg = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"bos_token\": \"a\"}";
    test_write_file(test_path(d, "tokenizer_config.json"), cfg, strlen(cfg));
    check_refused("tokenizer_config.json with bos_token twice",
                  moe_tokenizer_special_ids(d, 0, &bos, &eos, &pad), "tokenizer_config.json",
                  "key \"bos_token\" appears twice in the top level");
    special_folder(); // as it was, for what follows
}

// The runner, with a shell script in place of hf_tokenizer.py.
static void runner(void) {
    printf("script runner (/bin/sh as the interpreter)\n");
    const char *script = test_path(dir, "fake.sh");
    const char *body = "case \"$1\" in\n"
                       "encode) cat > /dev/null; echo '5 6 7' ;;\n"
                       "decode) printf 'ids:'; cat ;;\n"
                       "early) echo start; cat ;;\n" // writes before it reads its input
                       "warn) echo 'a warning' >&2; echo ok ;;\n"
                       "fail) echo 'line one' >&2; echo 'the last line' >&2; exit 3 ;;\n"
                       "esac\n";
    test_write_file(script, body, strlen(body));
    setenv("MOE_TOKENIZER_SCRIPT", script, 1);
    setenv("MOE_PYTHON", "/bin/sh", 1);
    char found[1024];
    check_true("MOE_TOKENIZER_SCRIPT is the script",
               moe_hf_tokenizer_script(found, sizeof found) == MOE_OK && !strcmp(found, script));
    int *ids = NULL, n = 0;
    check_true("encode: ids parsed",
               moe_hf_tokenizer_encode("TOK", "hello", 5, &ids, &n) == MOE_OK && n == 3 &&
                   ids[0] == 5 && ids[1] == 6 && ids[2] == 7);
    free(ids);
    int in[3] = {1, 20, 300};
    char *text = NULL;
    size_t len = 0;
    check_true("decode: ids sent on stdin, text back",
               moe_hf_tokenizer_decode("TOK", in, 3, &text, &len) == MOE_OK && text &&
                   !strcmp(text, "ids:1 20 300 ") && len == strlen(text));
    free(text);
    // 4 MiB in both directions through a child that answers before it reads: no deadlock
    size_t big = 4u << 20;
    char *data = malloc(big);
    for (size_t i = 0; i < big; i++) data[i] = (char)('a' + i % 26);
    const char *early[] = {"early"};
    moe_status st = moe_hf_tokenizer_run(early, 1, data, big, &text, &len);
    check_true("4 MiB through pipes, output before input", st == MOE_OK && len == big + 6 &&
                                                               !memcmp(text, "start\n", 6) &&
                                                               !memcmp(text + 6, data, big));
    free(text), free(data);
    const char *warn[] = {"warn"};
    check_true("a successful run's stderr is passed on",
               moe_hf_tokenizer_run(warn, 1, NULL, 0, &text, &len) == MOE_OK &&
                   !strcmp(text, "ok\n"));
    free(text);
    const char *fail[] = {"fail"};
    st = moe_hf_tokenizer_run(fail, 1, "x", 1, &text, &len);
    check_refused("a failing script: its status and last stderr line", st, "fake.sh",
                  "exit status 3");
    check_true("  the message ends with the last line",
               strstr(moe_last_error(), ": the last line") != NULL);
    check_true("  no output on failure", text == NULL);
    setenv("MOE_PYTHON", "/nonexistent/python3", 1);
    st = moe_hf_tokenizer_run(warn, 1, NULL, 0, NULL, NULL);
    check_refused("a missing python", st, "/nonexistent/python3", "MOE_PYTHON");
    setenv("MOE_TOKENIZER_SCRIPT", "/nonexistent/hf_tokenizer.py", 1);
    check_refused("a missing script", moe_hf_tokenizer_script(found, sizeof found),
                  "/nonexistent/hf_tokenizer.py", "MOE_TOKENIZER_SCRIPT");
    unsetenv("MOE_TOKENIZER_SCRIPT");
    unsetenv("MOE_PYTHON");
    check_true("without the variable: the source tree's scripts/hf_tokenizer.py",
               moe_hf_tokenizer_script(found, sizeof found) == MOE_OK &&
                   strstr(found, "scripts/hf_tokenizer.py"));
}

int main(int argc, char **argv) {
    dir = test_scratch_dir(argc, argv);
    byte_files();
    special_ids();
    special_refusals();
    runner();
    return test_result();
}
