// serve_http for a build without libmicrohttpd (MOE_SERVE=OFF): moe serve says what is missing.
#include "infer/serve_http.h"
#include "layers/status.h"

serve_http *serve_http_start(const serve_http_opts *o, serve_engine *e, serve_metrics *mt) {
    (void)o, (void)e, (void)mt;
    moe_error(MOE_EINVAL, "this build has no HTTP server: install libmicrohttpd (Debian: "
                          "libmicrohttpd-dev) and configure again (MOE_SERVE)");
    return NULL;
}
int serve_http_port(const serve_http *h) {
    (void)h;
    return -1;
}
void serve_http_drain(serve_http *h) { (void)h; }
void serve_http_stop(serve_http *h) { (void)h; }
