// The ranks of a launch agree on their intent (launch.h).
#define _POSIX_C_SOURCE 200809L // open_memstream

#include "train/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t moe_launch_config_hash(const moe_train_config *cfg) {
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f || moe_train_config_write(cfg, f) || fclose(f)) moe_fatal("launch: out of memory");
    uint64_t h = 1469598103934665603ull; // FNV-1a over the text
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    free(text);
    return h;
}

// What a train intent does with its run directory, in words.
static void describe_mode(char *buf, size_t size, const moe_launch_intent *x) {
    const char *dry = x->dry_run ? " (--dry-run)" : "";
    if (x->resume[0])
        snprintf(buf, size, "resume from %s (step %lld)%s", x->resume, (long long)x->resume_step,
                 dry);
    else
        snprintf(buf, size, "%s%s",
                 x->overwrite ? "overwrite the run (--overwrite)" : "start a run", dry);
}

// The first field in which a differs from b, as "rank r ... , rank 0 ...".
static moe_status differs(int r, const moe_launch_intent *a, const moe_launch_intent *b) {
    const char *what = "the ranks were told different things";
    if (strcmp(a->command, b->command))
        return moe_error(MOE_EINVAL,
                         "%s: rank %d runs `moe %s`, rank 0 `moe %s` (one command for "
                         "every rank)",
                         what, r, a->command, b->command);
    if (a->config_hash != b->config_hash)
        return moe_error(MOE_EINVAL,
                         "the ranks were given different configs: rank %d's resolved config "
                         "differs from rank 0's (the same file and --set on every rank)",
                         r);
    if (strcmp(a->resume, b->resume) || a->resume_step != b->resume_step ||
        a->overwrite != b->overwrite || a->dry_run != b->dry_run) {
        char ma[MOE_PATH_MAX + 160], mb[MOE_PATH_MAX + 160];
        describe_mode(ma, sizeof ma, a), describe_mode(mb, sizeof mb, b);
        return moe_error(MOE_EINVAL,
                         "%s: rank %d would %s, rank 0 %s (the same --resume, --overwrite and "
                         "--dry-run on every rank)",
                         what, r, ma, mb);
    }
    return moe_error(MOE_EINVAL, "%s: rank %d reads %s, rank 0 %s (the same options on every rank)",
                     what, r, a->inputs, b->inputs);
}

moe_status moe_launch_agree(moe_comm *w, const moe_launch_intent *mine) {
    if (!w || w->size <= 1) return MOE_OK;
    moe_launch_intent me, *all = calloc((size_t)w->size, sizeof *all);
    if (!all) moe_fatal("launch: out of memory");
    memset(&me, 0, sizeof me); // every byte defined: the records are compared whole
    memcpy(me.command, mine->command, strnlen(mine->command, sizeof me.command - 1));
    memcpy(me.resume, mine->resume, strnlen(mine->resume, sizeof me.resume - 1));
    memcpy(me.inputs, mine->inputs, strnlen(mine->inputs, sizeof me.inputs - 1));
    me.config_hash = mine->config_hash, me.resume_step = mine->resume_step;
    me.overwrite = mine->overwrite, me.dry_run = mine->dry_run;
    w->allgather(w, all, &me, sizeof me);
    moe_status st = MOE_OK;
    for (int r = 1; r < w->size && !st; r++)
        if (memcmp(&all[r], &all[0], sizeof me)) st = differs(r, &all[r], &all[0]);
    free(all);
    return st;
}
