// Folder archives for the fuzz targets (archive.h).
#include "archive.h"

#include <string.h>

#include "fuzz.h"

// name (n bytes) made safe as a file name in out; 0 when it must be skipped.
static int safe_name(char *out, const uint8_t *name, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int c = name[i];
        const int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '_' || c == '-';
        out[i] = ok ? (char)c : '_';
    }
    out[n] = 0;
    return n && strcmp(out, ".") && strcmp(out, "..");
}

int archive_unpack(const char *dir, const uint8_t *data, size_t size) {
    size_t at = 0;
    int files = 0;
    while (at < size && files < ARCHIVE_MAX_FILES) {
        size_t name_len = data[at++];
        if (name_len > size - at) name_len = size - at;
        char name[256];
        const int ok = safe_name(name, data + at, name_len);
        at += name_len;
        uint32_t len = 0;
        for (int b = 0; b < 4 && at < size; b++) len |= (uint32_t)data[at++] << (8 * b);
        const size_t n = len < size - at ? len : size - at;
        if (ok) {
            char path[FUZZ_PATH_MAX];
            fuzz_write(path, sizeof path, dir, name, data + at, n);
            files++;
        }
        at += n;
    }
    return files;
}
