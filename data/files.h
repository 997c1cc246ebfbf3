// Files a user names: the one door every reader of an input file goes through (a regular file
// within a size cap, opened without blocking), whole files read into memory, JSON-lines and
// text files read line by line with NUL bytes refused; files written and fsynced, parsed as a
// JSON object; and folders made on the way (mkdir -p).
#ifndef MOE_DATA_FILES_H
#define MOE_DATA_FILES_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "layers/status.h"

// Opens path for reading when it is a regular file of at most max bytes, else MOE_EIO naming
// it: "PATH: cannot read: why" (errno is left as open() set it, so ENOENT can be told apart;
// errno is 0 after the refusals that follow),
// "PATH: not a regular file (a FIFO): WHAT must be a regular file" (a FIFO is opened without
// waiting for a writer, a device such as /dev/zero is never read), "PATH: is N bytes, more than
// the MAX (H) WHAT file may have". what: a noun phrase ("a config", "a log", "a prompt list").
// *size (may be NULL) receives the size fstat saw.
moe_status moe_file_open_input(const char *path, const char *what, uint64_t max, FILE **out,
                               uint64_t *size);

// The whole of moe_file_open_input's file, NUL-terminated (malloc'd), of at most max bytes (a
// file that grows past max while it is read is refused too); *len its size (may be NULL).
// text != 0: a NUL byte is refused ("PATH: contains a NUL byte at offset N: not WHAT file").
moe_status moe_file_read_input(const char *path, const char *what, size_t max, int text, char **out,
                               size_t *len);

// moe_file_read_input of any file (what: "a file"), NUL bytes allowed.
moe_status moe_file_read_all(const char *path, size_t max, char **out, size_t *len);

// A text file read line by line (moe_file_lines_open ... moe_file_lines_next ... moe_file_lines_close).
// Each line is at most max_line bytes (longer: an error naming the line); a NUL byte in a line
// is an error naming the line and column. The reader keeps its own buffer (reads of 64 KiB),
// so a line costs one copy.
typedef struct {
    FILE *f;
    const char *path;
    size_t max_line;
    char *line;      // the current line, NUL-terminated, without its '\n'
    size_t len, cap; // its length (without the '\n')
    long lineno;     // its number, from 1
    int has_newline; // 0: the last line of the file, without its '\n' (a write in progress?)
    char *block;     // the read buffer
    size_t pos, end; // unread bytes block[pos, end)
} moe_file_lines;

// moe_file_open_input(path, what, max_file) for a line reader; max_line bytes per line.
moe_status moe_file_lines_open(moe_file_lines *r, const char *path, const char *what,
                               uint64_t max_file, size_t max_line);
// The next line: 1 (r->line, r->len, r->lineno, r->has_newline), 0 at the end, -1 on an error
// (*st the status: a read error, a NUL byte, a line longer than max_line).
int moe_file_lines_next(moe_file_lines *r, moe_status *st);
void moe_file_lines_close(moe_file_lines *r);

// Writes n bytes to path (truncating), flushes and fsyncs; every step checked.
moe_status moe_file_write_synced(const char *path, const void *data, size_t n);

// moe_file_read_input (text: NUL bytes refused) of at most max bytes, parsed: MOE_EIO unless it is
// a JSON object in which no object repeats a key (data/json_check.h).
moe_status moe_file_read_json_object(const char *path, size_t max, cJSON **out);

// mkdir -p: creates every missing folder of path (mode 0777 less the umask). MOE_EIO
// "FOLDER: cannot create folder: why" naming the one that failed, or "PATH: exists and is
// not a folder".
moe_status moe_file_make_dirs(const char *path);

#endif
