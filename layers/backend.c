// Backends by name: the registry of layers/backend.h. Every backend of the build is listed
// once, by the generated moe_backends.h (CMake, layers/backends.h.in): the CPU's constructors
// always, optional ones (CUDA) when the build compiles them. So this file names no
// implementation, includes no backend's header and has no #ifdef for any.
#include <stdio.h>
#include <string.h>

#include "layers/backend.h"
#include "moe_backends.h"

static const struct {
    const char *name;
    moe_status (*create)(moe_backend **out, const moe_backend_options *opt);
} backends[] = {MOE_BACKENDS};

const char *moe_backend_names(void) {
    static char names[128];
    if (!names[0])
        for (size_t i = 0, at = 0; i < sizeof backends / sizeof backends[0]; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                   backends[i].name);
    return names;
}

moe_status moe_backend_create(moe_backend **out, const char *name, const moe_backend_options *opt) {
    *out = NULL;
    if (!name || !*name) name = "cpu";
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(name, backends[i].name) == 0) return backends[i].create(out, opt);
    return moe_error(MOE_EINVAL, "unknown device '%s' (this build has: %s)", name,
                     moe_backend_names());
}

void moe_backend_destroy(moe_backend *be) {
    if (be) be->destroy(be);
}
