// Token file reader and writer; the format is described in token_file.h.
#define _POSIX_C_SOURCE 200809L // fileno, fsync, fstat

#include "data/token_file.h"

#include "data/files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Little-endian encoding, byte by byte, so the format does not depend on the host.
static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

// ---- writer ------------------------------------------------------------------------

moe_status moe_token_file_write(const char *path, const uint32_t *tokens, uint64_t n,
                                uint32_t vocab_size) {
    if (!path || !*path) return moe_error(MOE_EINVAL, "moe_token_file_write: empty path");
    if (n > 0 && !tokens) return moe_error(MOE_EINVAL, "token file '%s': tokens is NULL", path);
    if (vocab_size == 0) return moe_error(MOE_EINVAL, "token file '%s': vocab_size is 0", path);
    for (uint64_t i = 0; i < n; i++) {
        if (tokens[i] >= vocab_size)
            return moe_error(MOE_EINVAL, "token file '%s': token %llu has id %u >= vocab_size %u",
                             path, (unsigned long long)i, tokens[i], vocab_size);
    }
    const uint32_t dtype = vocab_size <= 65536u ? 2u : 4u;

    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return moe_error(MOE_EINVAL, "token file '%s': path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return moe_error(MOE_EIO, "token file '%s': cannot create: %s", tmp, strerror(errno));

    unsigned char header[MOE_TOKEN_FILE_HEADER_BYTES] = {0};
    memcpy(header, MOE_TOKEN_FILE_MAGIC, 8); // includes the NUL
    put_u32(header + 8, MOE_TOKEN_FILE_VERSION);
    put_u32(header + 12, dtype);
    put_u64(header + 16, n);
    put_u32(header + 24, vocab_size);
    put_u32(header + 28, 0);
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;

    // Encode in chunks so memory stays small whatever n is.
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = malloc((size_t)CHUNK * 4);
    if (!buf) {
        fclose(f);
        remove(tmp);
        return moe_error(MOE_ENOMEM, "token file '%s': cannot allocate the write buffer", path);
    }
    for (uint64_t i = 0; ok && i < n; i += CHUNK) {
        size_t m = (size_t)(n - i < CHUNK ? n - i : CHUNK);
        for (size_t j = 0; j < m; j++) {
            uint32_t v = tokens[i + j];
            if (dtype == 2) {
                buf[2 * j] = (unsigned char)v;
                buf[2 * j + 1] = (unsigned char)(v >> 8);
            } else {
                put_u32(buf + 4 * j, v);
            }
        }
        ok = fwrite(buf, dtype, m, f) == m;
    }
    free(buf);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        remove(tmp);
        return moe_error(MOE_EIO, "token file '%s': write failed: %s", tmp, strerror(saved));
    }
    if (rename(tmp, path) != 0) {
        saved = errno;
        remove(tmp);
        return moe_error(MOE_EIO, "token file '%s': cannot rename from '%s': %s", path, tmp,
                         strerror(saved));
    }
    return MOE_OK;
}

// ---- reader ------------------------------------------------------------------------

void moe_token_file_free(moe_token_file *tf) {
    if (!tf) return;
    free(tf->tokens);
    tf->tokens = NULL;
    tf->count = 0;
}

// Reads the header and checks it against the file size. Returns MOE_OK with the fields set.
static moe_status read_header(FILE *f, const char *path, uint64_t file_bytes, uint32_t *dtype,
                              uint64_t *count, uint32_t *vocab_size) {
    unsigned char h[MOE_TOKEN_FILE_HEADER_BYTES];
    if (file_bytes < MOE_TOKEN_FILE_HEADER_BYTES || fread(h, 1, sizeof h, f) != sizeof h)
        return moe_error(MOE_EIO,
                         "token file '%s': %llu bytes, shorter than the %u-byte header "
                         "(not a token file or truncated)",
                         path, (unsigned long long)file_bytes, MOE_TOKEN_FILE_HEADER_BYTES);
    if (memcmp(h, MOE_TOKEN_FILE_MAGIC, 8) != 0)
        return moe_error(MOE_EIO,
                         "token file '%s': wrong magic (expected \"%s\"): not a token file", path,
                         MOE_TOKEN_FILE_MAGIC);
    uint32_t version = get_u32(h + 8);
    if (version != MOE_TOKEN_FILE_VERSION)
        return moe_error(MOE_EIO, "token file '%s': unknown version %u (this build reads %u)", path,
                         version, MOE_TOKEN_FILE_VERSION);
    *dtype = get_u32(h + 12);
    if (*dtype != 2 && *dtype != 4)
        return moe_error(MOE_EIO,
                         "token file '%s': unknown token dtype %u "
                         "(expected 2 for u16 or 4 for u32)",
                         path, *dtype);
    *count = get_u64(h + 16);
    *vocab_size = get_u32(h + 24);
    uint32_t reserved = get_u32(h + 28);
    if (reserved != 0)
        return moe_error(MOE_EIO, "token file '%s': reserved header field is %u, must be 0", path,
                         reserved);
    // Compare sizes without overflowing: a huge count is simply "longer than the file".
    uint64_t payload = file_bytes - MOE_TOKEN_FILE_HEADER_BYTES;
    if (*count > payload / *dtype || *count * *dtype != payload) {
        int truncated = *count > payload / *dtype;
        if (truncated && *count > (UINT64_MAX - MOE_TOKEN_FILE_HEADER_BYTES) / *dtype)
            return moe_error(MOE_EIO,
                             "token file '%s': truncated: header says %llu tokens of %u bytes, "
                             "file has %llu bytes",
                             path, (unsigned long long)*count, *dtype,
                             (unsigned long long)file_bytes);
        return moe_error(MOE_EIO,
                         "token file '%s': %s: header says %llu tokens of %u bytes = %llu bytes "
                         "expected, file has %llu bytes",
                         path, truncated ? "truncated" : "trailing bytes after the tokens",
                         (unsigned long long)*count, *dtype,
                         (unsigned long long)(MOE_TOKEN_FILE_HEADER_BYTES + *count * *dtype),
                         (unsigned long long)file_bytes);
    }
    if (*vocab_size == 0) return moe_error(MOE_EIO, "token file '%s': vocab_size is 0", path);
    return MOE_OK;
}

moe_status moe_token_file_count(const char *path, uint64_t *count) {
    FILE *f;
    uint64_t size;
    *count = 0;
    if (moe_file_open_input(path, "token data", UINT64_MAX, &f, &size))
        return errno ? moe_error(MOE_EIO, "token file '%s': cannot open: %s", path, strerror(errno))
                     : moe_error_context(MOE_EIO, "token file '%s'", path);
    uint32_t dtype = 0, vocab_size = 0;
    moe_status s = read_header(f, path, size, &dtype, count, &vocab_size);
    fclose(f);
    return s;
}

moe_status moe_token_file_read(moe_token_file *tf, const char *path) {
    if (!tf) return moe_error(MOE_EINVAL, "moe_token_file_read: tf is NULL");
    memset(tf, 0, sizeof *tf);
    if (!path || !*path) return moe_error(MOE_EINVAL, "moe_token_file_read: empty path");

    FILE *f; // a regular file (a FIFO would block, /dev/zero never end: data/files.h)
    uint64_t size;
    if (moe_file_open_input(path, "token data", UINT64_MAX, &f, &size))
        return errno ? moe_error(MOE_EIO, "token file '%s': cannot open: %s", path, strerror(errno))
                     : moe_error_context(MOE_EIO, "token file '%s'", path);
    uint32_t dtype = 0, vocab_size = 0;
    uint64_t count = 0;
    moe_status s = read_header(f, path, size, &dtype, &count, &vocab_size);
    if (s != MOE_OK) {
        fclose(f);
        return s;
    }
    if (count > SIZE_MAX / sizeof(uint32_t)) {
        fclose(f);
        return moe_error(MOE_ENOMEM, "token file '%s': %llu tokens do not fit in memory", path,
                         (unsigned long long)count);
    }
    // One allocation of count u32; the file's bytes are read into its front and decoded in
    // place from the back (token i's 4 output bytes only cover input bytes of tokens >= i).
    uint32_t *tokens = malloc(count > 0 ? (size_t)count * sizeof(uint32_t) : 1);
    if (!tokens) {
        fclose(f);
        return moe_error(MOE_ENOMEM, "token file '%s': cannot allocate %llu tokens", path,
                         (unsigned long long)count);
    }
    unsigned char *bytes = (unsigned char *)tokens;
    size_t nbytes = (size_t)count * dtype;
    if (fread(bytes, 1, nbytes, f) != nbytes) {
        int err = ferror(f);
        fclose(f);
        free(tokens);
        return moe_error(MOE_EIO, "token file '%s': %s while reading %llu tokens", path,
                         err ? "read error" : "unexpected end of file", (unsigned long long)count);
    }
    fclose(f);
    for (uint64_t i = count; i-- > 0;) {
        const unsigned char *p = bytes + i * dtype;
        tokens[i] = dtype == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : get_u32(p);
    }
    for (uint64_t i = 0; i < count; i++) {
        if (tokens[i] >= vocab_size) {
            uint32_t v = tokens[i];
            free(tokens);
            return moe_error(MOE_EIO, "token file '%s': token %llu has id %u >= vocab_size %u",
                             path, (unsigned long long)i, v, vocab_size);
        }
    }
    snprintf(tf->path, sizeof tf->path, "%s", path);
    tf->count = count;
    tf->vocab_size = vocab_size;
    tf->dtype = dtype;
    tf->tokens = tokens;
    return MOE_OK;
}
