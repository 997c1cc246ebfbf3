// Shared by the fuzz targets (tests/fuzz/README.md). Every reader under test takes a path,
// so a target writes its input into this process's scratch folder and reads it from there.
#ifndef MOE_FUZZ_H
#define MOE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FUZZ_PATH_MAX 1024

// The libFuzzer entry point, defined by each target; the replay main() calls it too.
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// dir = <scratch>/<sub>, created on first use. The scratch folder is made once per process
// (under /dev/shm when it exists, else /tmp) and removed at exit.
void fuzz_dir(char *dir, size_t n, const char *sub);

// Writes data to <dir>/<name>; path receives the file's path.
void fuzz_write(char *path, size_t n, const char *dir, const char *name, const uint8_t *data,
                size_t size);

// Removes the regular files of dir (the previous input's), keeping the folder.
void fuzz_clear(const char *dir);

// A FILE* on /dev/null for output nobody reads (opened once, closed at exit).
FILE *fuzz_devnull(void);

// A broken invariant of the code under test: prints what and aborts, which libFuzzer and
// the replay both report as a crash. Also used when the scratch folder cannot be written,
// since every input would then go untested.
_Noreturn void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
