// moe_json_refuse_duplicates (data/json_check.h): a key twice in any object is refused, named with
// the object's dotted path; 150k distinct keys (a tokenizer.json vocabulary) are checked
// quickly; nesting beyond MOE_JSON_CHECK_MAX_DEPTH is refused, never recursed into.
// Usage: test_data_json_check SCRATCH_DIR
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/files.h"
#include "data/json_check.h"
#include "tests/data/data_test.h"

// moe_json_refuse_duplicates on the text must fail naming `expect` (NULL: must pass).
static void check_text(const char *what, const char *text, const char *expect) {
    cJSON *j = cJSON_Parse(text);
    moe_status st = j ? moe_json_refuse_duplicates(j, "f.json") : MOE_EINVAL;
    const char *msg = moe_last_error();
    if (expect)
        check_true(what, st == MOE_EIO && strstr(msg, "f.json: ") && strstr(msg, expect));
    else
        check_true(what, st == MOE_OK);
    if (st) printf("    -> %s\n", msg);
    cJSON_Delete(j);
}

static void small_cases(void) {
    printf("duplicate keys, named with their object\n");
    check_text("distinct keys pass", "{\"a\": 1, \"b\": {\"a\": 2}, \"c\": [{\"a\": 3}]}", NULL);
    check_text("the same key in two objects passes", "{\"x\": {\"k\": 1}, \"y\": {\"k\": 1}}",
               NULL);
    check_text("a top-level key twice", "{\"hidden_size\": 32, \"n\": 1, \"hidden_size\": 64}",
               "key \"hidden_size\" appears twice in the top level");
    check_text("a nested key twice",
               "{\"rope_parameters\": {\"rope_theta\": 1, \"rope_theta\": 2}}",
               "key \"rope_theta\" appears twice in rope_parameters");
    check_text("deeper: a dotted path", "{\"a\": {\"b\": {\"c\": 1, \"c\": 1}}}",
               "key \"c\" appears twice in a.b");
    check_text("in an array's object",
               "{\"added_tokens\": [{\"id\": 0}, {\"id\": 1, \"content\": \"x\", \"id\": 2}]}",
               "key \"id\" appears twice in added_tokens[1]");
    check_text("keys differing in case are distinct (as in Python)", "{\"A\": 1, \"a\": 2}", NULL);
    check_text("a top-level array", "[{\"k\": 1, \"k\": 2}]", "appears twice in [0]");
}

// A vocabulary object of n keys "t0".."t{n-1}" (plus "t0" again when dup).
static cJSON *vocab(int n, int dup) {
    cJSON *root = cJSON_CreateObject(), *v = cJSON_AddObjectToObject(root, "vocab");
    char key[32];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "t%d", (i * 7919) % n); // not in sorted order
        cJSON_AddItemToObject(v, key, cJSON_CreateNumber(i));
    }
    if (dup) cJSON_AddItemToObject(v, "t0", cJSON_CreateNumber(0));
    return root;
}

static void large_object(void) {
    printf("a vocabulary of 150000 keys\n");
    const int n = 150000; // prime to 7919: every key once
    cJSON *j = vocab(n, 0);
    clock_t t0 = clock();
    moe_status st = moe_json_refuse_duplicates(j, "tokenizer.json");
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    printf("    %.3f s\n", s);
    check_true("150000 distinct keys pass in under 2 s (sorted, not compared pairwise)",
               st == MOE_OK && s < 2);
    cJSON_Delete(j);
    j = vocab(n, 1);
    st = moe_json_refuse_duplicates(j, "tokenizer.json");
    check_true("one key twice among them is found",
               st == MOE_EIO && strstr(moe_last_error(), "key \"t0\" appears twice in vocab"));
    cJSON_Delete(j);
}

static void deep_nesting(void) {
    printf("nesting depth\n");
    cJSON *root = cJSON_CreateArray(), *at = root;
    for (int d = 1; d < MOE_JSON_CHECK_MAX_DEPTH; d++) { // MOE_JSON_CHECK_MAX_DEPTH arrays in all
        cJSON *inner = cJSON_CreateArray();
        cJSON_AddItemToArray(at, inner);
        at = inner;
    }
    check_true("nesting of MOE_JSON_CHECK_MAX_DEPTH levels passes",
               moe_json_refuse_duplicates(root, "deep.json") == MOE_OK);
    cJSON_AddItemToArray(at, cJSON_CreateObject()); // one level more
    moe_status st = moe_json_refuse_duplicates(root, "deep.json");
    check_true("one level more is refused (the walk is bounded)",
               st == MOE_EIO && strstr(moe_last_error(), "deep.json: nested deeper than 1000"));
    cJSON_Delete(root);
}

// moe_file_read_json_object: the file's object, or an error naming the file and nothing to free.
static void read_file(const char *dir) {
    printf("moe_file_read_json_object\n");
    test_mkdirs(dir);
    const char *ok = test_path(dir, "ok.json"), *bad = test_path(dir, "bad.json");
    test_write_file(ok, "{\"a\": 1}", 8);
    test_write_file(bad, "{\"a\": 1, \"a\": 2}", 16);
    cJSON *j = NULL;
    check_true("a file without duplicates reads",
               moe_file_read_json_object(ok, 1 << 20, &j) == MOE_OK && cJSON_IsObject(j));
    cJSON_Delete(j);
    moe_status st = moe_file_read_json_object(bad, 1 << 20, &j);
    check_refused("a file with a key twice", st, "bad.json", "key \"a\" appears twice");
    check_true("  and *out is NULL", st && j == NULL);
}

int main(int argc, char **argv) {
    const char *dir = test_scratch_dir(argc, argv);
    small_cases();
    large_object();
    deep_nesting();
    read_file(dir);
    return test_result();
}
