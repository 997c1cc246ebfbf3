// The fuzz input format of a folder: a sequence of entries
//
//   u8 name_len, name_len bytes of name, u32 little-endian size, size bytes of content
//
// unpacked into files of one folder. A truncated entry keeps the bytes that are there.
// Names are sanitised so that every file stays inside the folder: bytes outside
// [A-Za-z0-9._-] become '_', and "", "." and ".." are skipped. A later entry of the same
// name replaces the earlier one. At most ARCHIVE_MAX_FILES entries are unpacked.
#ifndef MOE_FUZZ_ARCHIVE_H
#define MOE_FUZZ_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

#define ARCHIVE_MAX_FILES 32

// Writes the entries of data into dir (which exists); returns the files written.
int archive_unpack(const char *dir, const uint8_t *data, size_t size);

#endif
