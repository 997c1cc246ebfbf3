// Backends by name: the registry of layers/backend.h. Each backend's constructor is listed
// once here; nothing else in the program names an implementation. Optional backends (CUDA)
// come from the generated moe_backends_optional.h (CMake, layers/backends_optional.h.in):
// the build that compiles them lists them, so this file has no #ifdef for any.
#include <stdio.h>
#include <string.h>

#include "layers/backend.h"
#include "layers/cpu/cpu_backend.h"
#include "moe_backends_optional.h"

static moe_status create_cpu(moe_backend **out, const moe_backend_options *opt) {
    return cpu_backend_create(out, opt, 0);
}
static moe_status create_cpu_strict(moe_backend **out, const moe_backend_options *opt) {
    return cpu_backend_create(out, opt, 1);
}

static const struct {
    const char *name;
    moe_status (*create)(moe_backend **out, const moe_backend_options *opt);
} backends[] = {
    {"cpu", create_cpu},
    {"cpu-strict", create_cpu_strict}, // test-only: host access to backend memory faults
    MOE_OPTIONAL_BACKENDS              // "cuda" when built with it
};

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
