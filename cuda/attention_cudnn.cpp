// cuDNN's fused attention through cudnn-frontend's graph API (header-only C++), behind the C
// interface of cuda/attention_cudnn.h. The one C++ file of the tree: everything else calls
// it through that header (cuda/attention.cu's model.attention = "cudnn" entries).
//
// The layouts are moe.c's own, given to cuDNN as strides, so nothing is transposed or copied:
//   q, k, v: rows qkv [B*S, (H+2KV)*hd] = [q | k | v]: a head's [S, hd] block of batch b
//     starts at b*S*row + h*hd (row = (H+2KV)*hd), rows row apart, so Q is the tensor
//     [B, H, S, hd] with strides [S*row, hd, row, 1]; K and V the same from the k and v parts
//   o, do: [B*S, H*hd] -> [B, H, S, hd] with strides [S*H*hd, hd, H*hd, 1]
//   lse (cuDNN's "Stats"): [B, H, S] fp32 -> [B, H, S, 1], strides [H*S, S, 1, 1]
// The score scale is hd^-1/2, the mask causal (the diagonal band right bound 0, top-left
// aligned: query i sees keys j <= i).
//
// cuDNN is loaded when the first model.attention = "cudnn" backend starts (dlopen of
// libcudnn.so.9, the frontend's NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING), not linked: a build
// with this file runs where cuDNN is not installed, and says so only to a run that asks for it.
// Nothing the frontend throws crosses the C interface: every entry catches and reports.
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#include "cuda/attention_cudnn.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

// the frontend's handle of the loaded library (its calls go through dlsym on it)
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace {

enum : int64_t { Q_UID = 1, K_UID, V_UID, O_UID, STATS_UID, DO_UID, DQ_UID, DK_UID, DV_UID };

using Key = std::tuple<int, int, int, int, int, int>; // backward?, B, S, H, KV, hd

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
};

struct Shape {
    int64_t B, S, H, KV, hd, row;
};

fe::graph::Tensor_attributes qkv_part(const char *name, int64_t uid, const Shape &s,
                                      int64_t heads) {
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({s.B, heads, s.S, s.hd})
        .set_stride({s.S * s.row, s.hd, s.row, 1});
}

fe::graph::Tensor_attributes rows_of_heads(const char *name, int64_t uid, const Shape &s) {
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({s.B, s.H, s.S, s.hd})
        .set_stride({s.S * s.H * s.hd, s.hd, s.H * s.hd, 1});
}

std::shared_ptr<fe::graph::Graph> new_graph() {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const Shape &s) {
    auto g = new_graph();
    auto Q = g->tensor(qkv_part("Q", Q_UID, s, s.H));
    auto K = g->tensor(qkv_part("K", K_UID, s, s.KV));
    auto V = g->tensor(qkv_part("V", V_UID, s, s.KV));
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("moe_attention_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(1.0f / std::sqrt((float)s.hd))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);
    auto [O, Stats] = g->sdpa(Q, K, V, opt);
    O->set_output(true)
        .set_uid(O_UID)
        .set_dim({s.B, s.H, s.S, s.hd})
        .set_stride({s.S * s.H * s.hd, s.hd, s.H * s.hd, 1});
    Stats->set_output(true)
        .set_uid(STATS_UID)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.B, s.H, s.S, 1})
        .set_stride({s.H * s.S, s.S, 1, 1});
    return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Shape &s, bool deterministic) {
    auto g = new_graph();
    auto Q = g->tensor(qkv_part("Q", Q_UID, s, s.H));
    auto K = g->tensor(qkv_part("K", K_UID, s, s.KV));
    auto V = g->tensor(qkv_part("V", V_UID, s, s.KV));
    auto O = g->tensor(rows_of_heads("O", O_UID, s));
    auto dO = g->tensor(rows_of_heads("dO", DO_UID, s));
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(STATS_UID)
                               .set_dim({s.B, s.H, s.S, 1})
                               .set_stride({s.H * s.S, s.S, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("moe_attention_backward")
                   .set_attn_scale(1.0f / std::sqrt((float)s.hd))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opt);
    const auto dq = qkv_part("dQ", DQ_UID, s, s.H), dk = qkv_part("dK", DK_UID, s, s.KV);
    dQ->set_output(true).set_uid(DQ_UID).set_dim(dq.get_dim()).set_stride(dq.get_stride());
    dK->set_output(true).set_uid(DK_UID).set_dim(dk.get_dim()).set_stride(dk.get_stride());
    dV->set_output(true).set_uid(DV_UID).set_dim(dk.get_dim()).set_stride(dk.get_stride());
    return g;
}

} // namespace

struct cudnn_attention {
    cudnnHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
    std::map<Key, Plan> plans;
    void *work = nullptr;
    size_t work_bytes = 0;
    bool warned_nondeterministic = false;
    char line[128] = {0};
};

namespace {

int fail(char *err, size_t n, const char *what, const Shape &s, const std::string &why) {
    std::snprintf(err, n,
                  "cuDNN attention (%s, B=%lld S=%lld H=%lld KV=%lld head_dim=%lld, bf16, causal): "
                  "%s",
                  what, (long long)s.B, (long long)s.S, (long long)s.H, (long long)s.KV,
                  (long long)s.hd, why.c_str());
    return -1;
}

// The plan of this shape: built (cuDNN's heuristics' first supported engine) on first use.
const Plan *plan_of(cudnn_attention *a, bool backward, const Shape &s, char *err, size_t n) {
    const Key key{backward, (int)s.B, (int)s.S, (int)s.H, (int)s.KV, (int)s.hd};
    auto it = a->plans.find(key);
    if (it != a->plans.end()) return &it->second;
    Plan p;
    fe::error_t st;
    for (bool deterministic : {true, false}) {
        if (!backward && !deterministic) break;
        p.graph = backward ? backward_graph(s, deterministic) : forward_graph(s);
        st = p.graph->build(a->handle, {fe::HeurMode_t::A});
        if (st.is_good()) {
            if (!deterministic && !a->warned_nondeterministic) {
                std::fprintf(stderr,
                             "moe: warning: cuDNN %zu has no deterministic attention backward "
                             "here; its dQ sums in a varying order\n",
                             fe::detail::get_backend_version());
                a->warned_nondeterministic = true;
            }
            break;
        }
    }
    if (!st.is_good()) {
        fail(err, n, backward ? "backward" : "forward", s, st.get_message());
        return nullptr;
    }
    st = p.graph->get_workspace_size(p.workspace);
    if (!st.is_good()) {
        fail(err, n, "workspace size", s, st.get_message());
        return nullptr;
    }
    return &(a->plans[key] = p);
}

void *workspace(cudnn_attention *a, int64_t bytes) {
    if ((size_t)bytes <= a->work_bytes) return a->work;
    if (cudaStreamSynchronize(a->stream) != cudaSuccess) return nullptr; // the old one idle
    if (a->work) cudaFree(a->work);
    a->work = nullptr;
    a->work_bytes = 0;
    if (cudaMalloc(&a->work, (size_t)bytes) != cudaSuccess) return nullptr;
    a->work_bytes = (size_t)bytes;
    return a->work;
}

int run_plan(cudnn_attention *a, bool backward, const Shape &s,
             std::unordered_map<int64_t, void *> &pack, char *err, size_t n) {
    const Plan *p = plan_of(a, backward, s, err, n);
    if (!p) return -1;
    void *ws = p->workspace ? workspace(a, p->workspace) : nullptr;
    if (p->workspace && !ws)
        return fail(err, n, "workspace", s,
                    "cannot allocate " + std::to_string(p->workspace) + " bytes of device memory");
    auto st = p->graph->execute(a->handle, pack, ws);
    if (!st.is_good()) return fail(err, n, backward ? "backward" : "forward", s, st.get_message());
    return 0;
}

int run(cudnn_attention *a, bool backward, const Shape &s,
        std::unordered_map<int64_t, void *> &pack, char *err, size_t n) {
    try {
        return run_plan(a, backward, s, pack, err, n);
    } catch (const std::exception &e) {
        return fail(err, n, backward ? "backward" : "forward", s, e.what());
    }
}

Shape shape(int B, int S, int H, int KV, int hd) {
    return Shape{B, S, H, KV, hd, (int64_t)(H + 2 * KV) * hd};
}

// q, k and v of rows qkv (bf16): the k part starts H*hd elements into a row, v (H+KV)*hd
void *part(const void *qkv16, int64_t heads_before, int64_t hd) {
    return (char *)qkv16 + heads_before * hd * 2;
}

} // namespace

// libcudnn.so.9 (cuDNN 9: the graph API's SDPA), once per process
static bool load_cudnn(char *err, size_t n) {
    if (cudnn_frontend::cudnn_dlhandle) return true;
    for (const char *name : {"libcudnn.so.9", "libcudnn.so"}) {
        cudnn_frontend::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
        if (cudnn_frontend::cudnn_dlhandle) return true;
    }
    const char *why = dlerror();
    std::snprintf(err, n,
                  "cannot load cuDNN (libcudnn.so.9: %s); install cuDNN 9 (the libcudnn9-cuda-13 "
                  "package, or pip's nvidia-cudnn-cu13 on LD_LIBRARY_PATH)",
                  why ? why : "not found");
    return false;
}

extern "C" cudnn_attention *cuda_cudnn_attention_create(void *stream, char *err, size_t err_size) {
    if (!load_cudnn(err, err_size)) return nullptr;
    auto *a = new cudnn_attention();
    a->stream = (cudaStream_t)stream;
    try {
        cudnnStatus_t st = fe::detail::create_handle(&a->handle);
        if (st == CUDNN_STATUS_SUCCESS) st = fe::detail::set_stream(a->handle, a->stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            std::snprintf(err, err_size, "cuDNN: cudnnCreate/cudnnSetStream failed: %s",
                          fe::detail::get_error_string(st));
            cuda_cudnn_attention_destroy(a);
            return nullptr;
        }
        const size_t v = fe::detail::get_backend_version(); // 91900 = 9.19.0
        std::snprintf(a->line, sizeof a->line, "cuDNN %zu.%zu.%zu, cudnn-frontend %d.%d.%d",
                      v / 10000, v / 100 % 100, v % 100, CUDNN_FRONTEND_MAJOR_VERSION,
                      CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
    } catch (const std::exception &e) {
        std::snprintf(err, err_size, "cuDNN: %s", e.what());
        cuda_cudnn_attention_destroy(a);
        return nullptr;
    }
    return a;
}

extern "C" void cuda_cudnn_attention_destroy(cudnn_attention *a) {
    if (!a) return;
    a->plans.clear();
    if (a->work) cudaFree(a->work);
    if (a->handle) {
        try {
            fe::detail::destroy_handle(a->handle);
        } catch (const std::exception &) {}
    }
    delete a;
}

extern "C" const char *cuda_cudnn_attention_describe(cudnn_attention *a) { return a->line; }

extern "C" int cuda_cudnn_attention_forward(cudnn_attention *a, void *o16, float *lse,
                                            const void *qkv16, int B, int S, int H, int KV, int hd,
                                            char *err, size_t err_size) {
    const Shape s = shape(B, S, H, KV, hd);
    std::unordered_map<int64_t, void *> pack = {{Q_UID, part(qkv16, 0, hd)},
                                                {K_UID, part(qkv16, H, hd)},
                                                {V_UID, part(qkv16, H + KV, hd)},
                                                {O_UID, o16},
                                                {STATS_UID, lse}};
    return run(a, false, s, pack, err, err_size);
}

extern "C" int cuda_cudnn_attention_backward(cudnn_attention *a, void *dqkv16, const void *do16,
                                             const void *qkv16, const void *o16, const float *lse,
                                             int B, int S, int H, int KV, int hd, char *err,
                                             size_t err_size) {
    const Shape s = shape(B, S, H, KV, hd);
    std::unordered_map<int64_t, void *> pack = {{Q_UID, part(qkv16, 0, hd)},
                                                {K_UID, part(qkv16, H, hd)},
                                                {V_UID, part(qkv16, H + KV, hd)},
                                                {O_UID, (void *)o16},
                                                {DO_UID, (void *)do16},
                                                {STATS_UID, (void *)lse},
                                                {DQ_UID, part(dqkv16, 0, hd)},
                                                {DK_UID, part(dqkv16, H, hd)},
                                                {DV_UID, part(dqkv16, H + KV, hd)}};
    return run(a, true, s, pack, err, err_size);
}
