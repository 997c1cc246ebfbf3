// Checkpoint folders: step_NNNNNNNN names, fsync of a file or folder, removal of a folder of
// plain files, the fresh folder a save or an export writes into, and `latest` resolved to
// the folder it names (moe_checkpoint_resolve).
#define _GNU_SOURCE // fsync, dirent

#include "ckpt/ckpt_internal.h"

#include "data/files.h"
#include "ckpt/path_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// "step_NNNNNNNN" (a checkpoint folder's name) -> N.
int ckpt_parse_step_name(const char *name, long long *step) {
    char tail;
    return strlen(name) == 13 && sscanf(name, "step_%lld%c", step, &tail) == 1 && *step >= 0;
}

moe_status ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moe_error(MOE_EIO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return moe_error(MOE_EIO, "%s: fsync failed: %s", path, strerror(errno));
    return MOE_OK;
}

// Removes a folder of plain files (a checkpoint), then the folder.
void ckpt_remove_folder(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char file[PATH_BUF];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            path_fmt(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
    closedir(d);
    rmdir(path);
}

// An empty folder at path, where a save or an export writes before its rename: the leftover
// of an interrupted one is removed; anything else there (a folder in it) is an error.
moe_status ckpt_fresh_folder(const char *path) {
    ckpt_remove_folder(path);
    if (mkdir(path, 0755) != 0)
        return moe_error(MOE_EIO, "%s: cannot create: %s", path, strerror(errno));
    return MOE_OK;
}

int ckpt_folder_step(const char *folder, long long *step) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s", folder);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;
    const char *base = strrchr(path, '/');
    return ckpt_parse_step_name(base ? base + 1 : path, step);
}

moe_status moe_checkpoint_resolve(char *folder, size_t n, const char *path) {
    if (check_path_arg(path)) return MOE_EINVAL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moe_error(MOE_EIO, "%s: no such checkpoint: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(folder, n, "%s", path);
        return MOE_OK;
    }
    char *text;
    moe_status st = moe_file_read_all(path, SMALL_FILE_MAX, &text, NULL);
    if (st) return st;
    text[strcspn(text, "\r\n")] = 0;
    long long step;
    if (!ckpt_parse_step_name(text, &step)) {
        free(text);
        return moe_error(MOE_EIO, "%s: expected a line 'step_NNNNNNNN'", path);
    }
    char dir[PATH_BUF];
    path_fmt(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        path_fmt(dir, sizeof dir, ".");
    snprintf(folder, n, "%s/%s", dir, text);
    free(text);
    return MOE_OK;
}
