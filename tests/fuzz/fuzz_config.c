// moe_train_config_load (config/config.h) on an arbitrary libconfig file. A config it
// accepts must write out (moe_train_config_write) and load back to the same text: the
// resolved config of a run is reloaded that way (RUN_DIR/config.cfg, --resume).
#define _POSIX_C_SOURCE 200809L // open_memstream

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> // strncasecmp

#include "fuzz.h"
#include "config/config.h"

// libconfig opens what an @include names, relative to the config's folder: "/dev/stdin"
// would block and "../../etc/x" would read the machine's files, neither of which is the
// parser. Such inputs are skipped; an @include of a plain name in the scratch folder stays.
static int includes_outside(const uint8_t *data, size_t size) {
    static const char key[] = "@include";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; i + k <= size; i++) {
        if (strncasecmp((const char *)data + i, key, k)) continue;
        size_t j = i + k;
        while (j < size && (data[j] == ' ' || data[j] == '\t')) j++;
        if (j < size && data[j] == '"') j++;
        for (size_t start = j; j < size && data[j] != '"'; j++) {
            const int c = data[j];
            if (!isalnum(c) && c != '_' && c != '-' && !(c == '.' && j > start)) return 1;
        }
    }
    return 0;
}

// The config written as text (malloc'd), or NULL when the writer refuses it.
static char *config_text(const moe_train_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) fuzz_fail("open_memstream failed");
    const moe_status st = moe_train_config_write(cfg, f);
    fclose(f);
    if (st != MOE_OK) {
        free(text);
        return NULL;
    }
    return text;
}

static void check_round_trip(const moe_train_config *cfg, const char *dir, const char *input) {
    char *text = config_text(cfg);
    if (!text)
        fuzz_fail("%s: accepted, but moe_train_config_write refuses it: %s", input,
                  moe_last_error());
    char path[FUZZ_PATH_MAX];
    fuzz_write(path, sizeof path, dir, "written.cfg", (const uint8_t *)text, strlen(text));
    moe_train_config back;
    if (moe_train_config_load(&back, path, 0, NULL) != MOE_OK)
        fuzz_fail("%s: the written config does not load: %s\n%s", input, moe_last_error(), text);
    char *again = config_text(&back);
    if (!again || strcmp(text, again))
        fuzz_fail("%s: written, loaded and written again, the config differs:\n%s\n----\n%s", input,
                  text, again ? again : "(refused)");
    free(again);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (includes_outside(data, size)) return 0;
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "config");
    fuzz_write(path, sizeof path, dir, "input.cfg", data, size);
    moe_train_config cfg;
    if (moe_train_config_load(&cfg, path, 0, NULL) == MOE_OK) check_round_trip(&cfg, dir, path);
    return 0;
}
