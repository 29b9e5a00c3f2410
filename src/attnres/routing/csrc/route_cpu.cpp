// Fused CPU routing: S static queries over n sources, forward and backward, one pass over memory.
//
// The contract is lean.route_sources's (see attnres/routing/fused_cpu.py for the Python side):
//   logits[s, t, i] = inv_i[t] * <q_s, v_i[t]>,  weights = softmax_i,  lse = logsumexp_i,
//   mixed[s, t] = sum_i weights[s, t, i] * v_i[t],
// with tokens t = the sources' leading dims flattened. Statistics and accumulation are in the
// compute type A (float, or double when a source is float64).
//
// Why it is fast: tokens are processed in tiles whose rows of all n sources fit in L2. A tile's
// rows are read from memory once, for the logits; the mixture (and, in backward, d queries) reads
// them again from cache. Each (router, token) output row is accumulated in registers (a chunk of
// vectors over all n sources) and written once, so no (S, tokens, D) accumulator goes through
// memory once per source; up to 4 routers share each chunk of a row loaded (`dots`, `combine`).
// With no inv given, each row's inverse RMS is computed in the same pass. bf16/fp16 sources are
// converted a tile at a time into a per-thread buffer, never into full-size fp32 copies.
//
// Phase 2 of two-phase routing (merging one router's result with later sources, `merge_forward` /
// `merge_backward`, at the end) reuses the same tiles, conversions and vector helpers.
//
// Inner loops use GCC vector types of one register (see Simd); the conversions are plain `omp simd` loops.
// The extension is built with -march=native, for the build machine's instruction set.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;
using c10::ScalarType;

// A tile's source rows must stay in cache between the logits and the mixture: about this many bytes
// of rows (all n sources together) per tile, well inside L2 (512 KiB to 2 MiB per core on current
// x86 CPUs) with the staging buffer beside it. Measured here (9 sources of 256 fp32), tiles of 1 to
// 16 tokens ran alike, larger ones up to 15% slower: a small tile also stays in L1.
constexpr int64_t kTileBytes = 64 * 1024;
constexpr int64_t kMaxTileTokens = 16;

inline float bf16_to_float(uint16_t bits) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even, NaN kept a (quiet) NaN: what at::BFloat16(float) does, in a loop gcc vectorises.
inline uint16_t float_to_bf16(float value) {
  uint32_t bits = __builtin_bit_cast(uint32_t, value);
  uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return value != value ? static_cast<uint16_t>(0x7FC0) : static_cast<uint16_t>(rounded);
}

// Read `count` elements of dtype `type` at `src` as A into `dst`.
template <typename A>
void load_as(const void* src, ScalarType type, int64_t count, A* dst) {
  switch (type) {
    case ScalarType::Float: {
      const float* p = static_cast<const float*>(src);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) dst[k] = static_cast<A>(p[k]);
      break;
    }
    case ScalarType::Double: {
      const double* p = static_cast<const double*>(src);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) dst[k] = static_cast<A>(p[k]);
      break;
    }
    case ScalarType::BFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) dst[k] = static_cast<A>(bf16_to_float(p[k]));
      break;
    }
    case ScalarType::Half: {
      const c10::Half* p = static_cast<const c10::Half*>(src);
      for (int64_t k = 0; k < count; ++k) dst[k] = static_cast<A>(static_cast<float>(p[k]));
      break;
    }
    default:
      TORCH_CHECK(false, "attnres fused routing: unsupported dtype ", type);
  }
}

// Write `count` values of A at `src` to `dst` in dtype `type` (rounded to nearest even).
template <typename A>
void store_as(const A* src, ScalarType type, int64_t count, void* dst) {
  switch (type) {
    case ScalarType::Float: {
      float* p = static_cast<float*>(dst);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) p[k] = static_cast<float>(src[k]);
      break;
    }
    case ScalarType::Double: {
      double* p = static_cast<double*>(dst);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) p[k] = static_cast<double>(src[k]);
      break;
    }
    case ScalarType::BFloat16: {
      uint16_t* p = static_cast<uint16_t*>(dst);
#pragma omp simd
      for (int64_t k = 0; k < count; ++k) p[k] = float_to_bf16(static_cast<float>(src[k]));
      break;
    }
    case ScalarType::Half: {
      c10::Half* p = static_cast<c10::Half*>(dst);
      for (int64_t k = 0; k < count; ++k) p[k] = c10::Half(static_cast<float>(src[k]));
      break;
    }
    default:
      TORCH_CHECK(false, "attnres fused routing: unsupported dtype ", type);
  }
}

template <typename A>
constexpr ScalarType scalar_type_of() {
  return std::is_same_v<A, double> ? ScalarType::Double : ScalarType::Float;
}

// Explicit vectors (GCC vector extensions) of one register: 64 bytes (16 floats) where the build
// machine has AVX-512, else 32 (8 floats, AVX). With plain loops gcc kept one running sum per dot
// product (every FMA waiting 4-5 cycles for the last) and, on the mixture, fell back to scalar code
// for fear of aliasing; both made the kernel compute-bound. AVX-512's width made both passes about
// a quarter faster (S = 8 routers over 25 sources of 4 x 256 x 256, 2 threads, native-bf16 Xeon).
// On a CPU without AVX the compiler splits each vector into two SSE registers.
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif

template <typename A>
struct Simd {
  typedef A V __attribute__((vector_size(kVectorBytes)));
  static constexpr int64_t W = kVectorBytes / sizeof(A);
  static V load(const A* p) {
    V v;
    __builtin_memcpy(&v, p, sizeof(V));  // an unaligned load
    return v;
  }
  static void store(A* p, V v) { __builtin_memcpy(p, &v, sizeof(V)); }
  static V splat(A x) { return V{} + x; }
  static A sum(V v) {
    A s = 0;
    for (int64_t j = 0; j < W; ++j) s += v[j];
    return s;
  }
};

// <a, b> with four independent vector sums.
template <typename A>
inline A dot(const A* a, const A* b, int64_t count) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  typename S::V s0{}, s1{}, s2{}, s3{};
  int64_t k = 0;
  for (; k + 4 * W <= count; k += 4 * W) {
    s0 += S::load(a + k) * S::load(b + k);
    s1 += S::load(a + k + W) * S::load(b + k + W);
    s2 += S::load(a + k + 2 * W) * S::load(b + k + 2 * W);
    s3 += S::load(a + k + 3 * W) * S::load(b + k + 3 * W);
  }
  for (; k + W <= count; k += W) s0 += S::load(a + k) * S::load(b + k);
  A sum = S::sum((s0 + s1) + (s2 + s3));
  for (; k < count; ++k) sum += a[k] * b[k];
  return sum;
}

// <a, v> and <b, v> in one sweep over v (merge backward's <q, v_i> and <g, v_i>).
template <typename A>
inline void dot2(const A* a, const A* b, const A* v, int64_t count, A& av, A& bv) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  typename S::V a0{}, a1{}, b0{}, b1{};
  int64_t k = 0;
  for (; k + 2 * W <= count; k += 2 * W) {
    const typename S::V v0 = S::load(v + k), v1 = S::load(v + k + W);
    a0 += S::load(a + k) * v0;
    a1 += S::load(a + k + W) * v1;
    b0 += S::load(b + k) * v0;
    b1 += S::load(b + k + W) * v1;
  }
  for (; k + W <= count; k += W) {
    const typename S::V v0 = S::load(v + k);
    a0 += S::load(a + k) * v0;
    b0 += S::load(b + k) * v0;
  }
  A sa = S::sum(a0 + a1), sb = S::sum(b0 + b1);
  for (; k < count; ++k) {
    sa += a[k] * v[k];
    sb += b[k] * v[k];
  }
  av = sa;
  bv = sb;
}

// out[0:count] = sum_i w[i] * rows[i][offset + 0:count]: a chunk of 4 vectors of `out` stays in
// registers while all n rows are added into it, so `out` is written once and never re-read.
// With tokens > 1 the sum runs over tokens t too, w[t * w_stride + i] weighting rows[i][offset +
// t * row_stride + ...]; with accumulate, out's own values are the starting point.
template <typename A>
void weighted_sum(const A* w, const A* const* rows, int64_t offset, int64_t n, int64_t count, A* out,
                  int64_t tokens = 1, int64_t w_stride = 0, int64_t row_stride = 0, bool accumulate = false) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  int64_t k = 0;
  for (; k + 4 * W <= count; k += 4 * W) {
    typename S::V o0{}, o1{}, o2{}, o3{};
    if (accumulate) {
      o0 = S::load(out + k);
      o1 = S::load(out + k + W);
      o2 = S::load(out + k + 2 * W);
      o3 = S::load(out + k + 3 * W);
    }
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < n; ++i) {
        const A* r = rows[i] + offset + t * row_stride + k;
        const typename S::V wi = S::splat(w[t * w_stride + i]);
        o0 += wi * S::load(r);
        o1 += wi * S::load(r + W);
        o2 += wi * S::load(r + 2 * W);
        o3 += wi * S::load(r + 3 * W);
      }
    S::store(out + k, o0);
    S::store(out + k + W, o1);
    S::store(out + k + 2 * W, o2);
    S::store(out + k + 3 * W, o3);
  }
  for (; k + W <= count; k += W) {
    typename S::V o0 = accumulate ? S::load(out + k) : typename S::V{};
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < n; ++i)
        o0 += S::splat(w[t * w_stride + i]) * S::load(rows[i] + offset + t * row_stride + k);
    S::store(out + k, o0);
  }
  for (; k < count; ++k) {
    A o = accumulate ? out[k] : A(0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < n; ++i) o += w[t * w_stride + i] * rows[i][offset + t * row_stride + k];
    out[k] = o;
  }
}

// Register blocks over routers. Routing is a small matrix product per token (S queries by n source
// rows of D), and with one dot product or one output row at a time every FMA loaded a row chunk
// from L2. A block of up to 4 x 4 dot products (or 4 output rows) loads each chunk of a row once
// and uses it up to 4 times from registers.

// out[x * ldo + y] = <a[x], b[y]> for x < MA, y < NB: one chunk of each row per step.
template <typename A, int MA, int NB>
inline void dots_block(const A* const* a, const A* const* b, int64_t width, A* out, int64_t ldo) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  typename S::V acc[MA][NB] = {};
  int64_t k = 0;
  for (; k + W <= width; k += W) {
    typename S::V bv[NB];
    for (int y = 0; y < NB; ++y) bv[y] = S::load(b[y] + k);
    for (int x = 0; x < MA; ++x) {
      const typename S::V av = S::load(a[x] + k);
      for (int y = 0; y < NB; ++y) acc[x][y] += av * bv[y];
    }
  }
  for (int x = 0; x < MA; ++x)
    for (int y = 0; y < NB; ++y) {
      A sum = S::sum(acc[x][y]);
      for (int64_t m = k; m < width; ++m) sum += a[x][m] * b[y][m];
      out[x * ldo + y] = sum;
    }
}

template <typename A, int MA>
inline void dots_row(int64_t nb, const A* const* a, const A* const* b, int64_t width, A* out, int64_t ldo) {
  int64_t y = 0;
  for (; y + 4 <= nb; y += 4) dots_block<A, MA, 4>(a, b + y, width, out + y, ldo);
  switch (nb - y) {
    case 3: dots_block<A, MA, 3>(a, b + y, width, out + y, ldo); break;
    case 2: dots_block<A, MA, 2>(a, b + y, width, out + y, ldo); break;
    case 1: dots_block<A, MA, 1>(a, b + y, width, out + y, ldo); break;
    default: break;
  }
}

// out[x * ldo + y] = <a[x], b[y]> for x < ma, y < nb, rows of `width`.
template <typename A>
void dots(int64_t ma, const A* const* a, int64_t nb, const A* const* b, int64_t width, A* out, int64_t ldo) {
  int64_t x = 0;
  for (; x + 4 <= ma; x += 4) dots_row<A, 4>(nb, a + x, b, width, out + x * ldo, ldo);
  switch (ma - x) {
    case 3: dots_row<A, 3>(nb, a + x, b, width, out + x * ldo, ldo); break;
    case 2: dots_row<A, 2>(nb, a + x, b, width, out + x * ldo, ldo); break;
    case 1: dots_row<A, 1>(nb, a + x, b, width, out + x * ldo, ldo); break;
    default: break;
  }
}

// What `combine` starts each output row x from: zero, plus e[x] * rows[x] where rows is given, plus
// the output's own values where add[x].
template <typename A>
struct RowStart {
  const A* const* rows = nullptr;
  const A* e = nullptr;
  const char* add = nullptr;
};

// Outputs x < MB, NV vectors of each at k: the weighted sum over nr input rows, in input order.
template <typename A, int MB, int NV>
inline void combine_chunk(int64_t k, int64_t nr, const A* w, int64_t ldw, const A* const* rows, A* const* out,
                          const RowStart<A>& start) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  typename S::V acc[MB][NV];
  for (int x = 0; x < MB; ++x)
    for (int v = 0; v < NV; ++v) {
      acc[x][v] = start.rows ? S::splat(start.e[x]) * S::load(start.rows[x] + k + v * W) : typename S::V{};
      if (start.add && start.add[x]) acc[x][v] += S::load(out[x] + k + v * W);
    }
  for (int64_t j = 0; j < nr; ++j) {
    typename S::V r[NV];
    for (int v = 0; v < NV; ++v) r[v] = S::load(rows[j] + k + v * W);
    for (int x = 0; x < MB; ++x) {
      const typename S::V wx = S::splat(w[x * ldw + j]);
      for (int v = 0; v < NV; ++v) acc[x][v] += wx * r[v];
    }
  }
  for (int x = 0; x < MB; ++x)
    for (int v = 0; v < NV; ++v) S::store(out[x] + k + v * W, acc[x][v]);
}

template <typename A, int MB>
inline void combine_block(int64_t nr, const A* w, int64_t ldw, const A* const* rows, int64_t width, A* const* out,
                          const RowStart<A>& start) {
  constexpr int64_t W = Simd<A>::W;
  constexpr int NV = std::max(1, (kVectorBytes == 64 ? 16 : 8) / MB);  // accumulators: half the registers
  int64_t k = 0;
  for (; k + NV * W <= width; k += NV * W) combine_chunk<A, MB, NV>(k, nr, w, ldw, rows, out, start);
  for (; k + W <= width; k += W) combine_chunk<A, MB, 1>(k, nr, w, ldw, rows, out, start);
  for (; k < width; ++k)
    for (int x = 0; x < MB; ++x) {
      A o = (start.rows ? start.e[x] * start.rows[x][k] : A(0)) + (start.add && start.add[x] ? out[x][k] : A(0));
      for (int64_t j = 0; j < nr; ++j) o += w[x * ldw + j] * rows[j][k];
      out[x][k] = o;
    }
}

// out[x][0:width] = start_x + sum_j w[x * ldw + j] * rows[j][0:width] for x < m (see RowStart).
template <typename A>
void combine(int64_t m, int64_t nr, const A* w, int64_t ldw, const A* const* rows, int64_t width, A* const* out,
             RowStart<A> start = {}) {
  int64_t x = 0;
  auto shifted = [&](int64_t by) {
    RowStart<A> s = start;
    if (s.rows) s.rows += by, s.e += by;
    if (s.add) s.add += by;
    return s;
  };
  for (; x + 4 <= m; x += 4) combine_block<A, 4>(nr, w + x * ldw, ldw, rows, width, out + x, shifted(x));
  switch (m - x) {
    case 3: combine_block<A, 3>(nr, w + x * ldw, ldw, rows, width, out + x, shifted(x)); break;
    case 2: combine_block<A, 2>(nr, w + x * ldw, ldw, rows, width, out + x, shifted(x)); break;
    case 1: combine_block<A, 1>(nr, w + x * ldw, ldw, rows, width, out + x, shifted(x)); break;
    default: break;
  }
}

// Backward's pass 2 for one (source, token): out = sum_s (a[s] g_s + c[s] q_s) (the g term only
// when g_rows is given) + self_coef v, added to what out holds when `accumulate` (a gradient sink),
// for rows of `width`; q is (S, width). A chunk of `out` stays in registers across the S routers.
// (d q_s, the sum of c[s] v over rows, is added per tile by weighted_sum.)
template <typename A>
void source_grad(int64_t S_, const A* a, const A* c, const A* const* g_rows, int64_t g_offset, const A* q,
                 const A* v, int64_t width, A self_coef, A* out, bool accumulate) {
  using S = Simd<A>;
  constexpr int64_t W = S::W;
  int64_t k = 0;
  for (; k + 2 * W <= width; k += 2 * W) {
    const typename S::V v0 = S::load(v + k), v1 = S::load(v + k + W), e = S::splat(self_coef);
    typename S::V o0 = e * v0, o1 = e * v1;
    if (accumulate) {
      o0 += S::load(out + k);
      o1 += S::load(out + k + W);
    }
    for (int64_t s = 0; s < S_; ++s) {
      const typename S::V cs = S::splat(c[s]);
      const A* qs = q + s * width + k;
      o0 += cs * S::load(qs);
      o1 += cs * S::load(qs + W);
      if (g_rows) {
        const typename S::V as = S::splat(a[s]);
        const A* gs = g_rows[s] + g_offset + k;
        o0 += as * S::load(gs);
        o1 += as * S::load(gs + W);
      }
    }
    S::store(out + k, o0);
    S::store(out + k + W, o1);
  }
  for (; k < width; ++k) {
    A o = self_coef * v[k] + (accumulate ? out[k] : A(0));
    for (int64_t s = 0; s < S_; ++s) {
      o += c[s] * q[s * width + k] + (g_rows ? a[s] * g_rows[s][g_offset + k] : A(0));
    }
    out[k] = o;
  }
}

// The inputs both passes share, checked and made contiguous in the compute dtype (the sources
// keep theirs), with raw pointers to their rows. Conversions and checks live here rather than in
// Python: there they cost microseconds per source, which decoding one token at a time would feel.
struct Inputs {
  Tensor queries;                 // (S, D) contiguous, compute dtype
  std::vector<Tensor> sources;    // contiguous (a copy only of a non-contiguous one)
  std::vector<Tensor> inv;        // (tokens,) contiguous, compute dtype; empty when own_inv
  bool own_inv;                   // no inv given: the kernels compute rsqrt(mean(v^2) + eps) from the rows
  double eps;
  std::vector<const void*> data;  // each source's first element
  std::vector<ScalarType> type;
  std::vector<int64_t> elem;
  ScalarType out_type, compute;   // the sources' promoted dtype, and that promoted with fp32
  int64_t S, D, n, tokens;
};

bool readable(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::BFloat16 || t == ScalarType::Half;
}

// mixed_type: merge's phase-1 mixture, promoted into the output dtype with the sources; stats_type:
// its lse, promoted into the compute dtype.
Inputs prepare(const Tensor& queries, const std::vector<Tensor>& sources, const std::vector<Tensor>& inv, double eps,
               std::optional<ScalarType> mixed_type = std::nullopt, ScalarType stats_type = ScalarType::Float) {
  TORCH_CHECK_VALUE(!sources.empty(), "attnres fused routing: needs at least one source, got none");
  TORCH_CHECK_VALUE(inv.empty() || sources.size() == inv.size(), "attnres fused routing: needs one inv per source, got ",
                    inv.size(), " for ", sources.size(), " sources");
  const auto shape = sources[0].sizes();
  TORCH_CHECK_VALUE(queries.dim() == 2 && shape.size() >= 1 && queries.size(1) == shape.back(),
                    "attnres fused routing: queries must be (S, ", shape.back(), "), got ", queries.sizes());
  Inputs in;
  in.S = queries.size(0);
  in.D = queries.size(1);
  in.n = static_cast<int64_t>(sources.size());
  in.tokens = in.D == 0 ? 0 : sources[0].numel() / in.D;
  in.own_inv = inv.empty();
  in.eps = eps;
  in.out_type = sources[0].scalar_type();
  for (size_t i = 0; i < sources.size(); ++i) {
    const Tensor& v = sources[i];
    const auto inv_shape = in.own_inv ? shape.slice(0, shape.size() - 1) : inv[i].sizes();
    TORCH_CHECK_VALUE(v.sizes() == shape && inv_shape == shape.slice(0, shape.size() - 1),
                      "attnres fused routing: every source must be ", shape, " and every inv ",
                      shape.slice(0, shape.size() - 1), "; source ", i, " is ", v.sizes(), ", its inv ", inv_shape);
    TORCH_CHECK_TYPE(readable(v.scalar_type()), "attnres fused routing: source ", i, " has dtype ", v.scalar_type(),
                     "; it reads float32, float64, bfloat16 and float16");
    TORCH_CHECK_VALUE(v.device().is_cpu() && (in.own_inv || inv[i].device().is_cpu()),
                      "attnres fused routing: runs on CPU tensors, source ", i, " is on ", v.device());
    in.out_type = c10::promoteTypes(in.out_type, v.scalar_type());
  }
  if (mixed_type) in.out_type = c10::promoteTypes(in.out_type, *mixed_type);
  in.compute = c10::promoteTypes(c10::promoteTypes(in.out_type, ScalarType::Float), stats_type);
  in.queries = queries.to(in.compute).contiguous();
  for (size_t i = 0; i < sources.size(); ++i) {
    in.sources.push_back(sources[i].contiguous());
    if (!in.own_inv) in.inv.push_back(inv[i].to(in.compute).contiguous());
    in.data.push_back(in.sources.back().data_ptr());
    in.type.push_back(sources[i].scalar_type());
    in.elem.push_back(sources[i].element_size());
  }
  return in;
}

template <typename A>
std::vector<const A*> inv_rows(const Inputs& in) {
  std::vector<const A*> out;
  for (const Tensor& r : in.inv) out.push_back(r.data_ptr<A>());
  return out;
}

// rt[t * n + i] = inv_i of the tile's token t: given, or rsqrt(mean(v^2) + eps) of the row, as
// lean.inv_rms computes it (the sum of squares in the compute dtype). Computing it here reads the
// rows into cache, which the logits pass would do anyway: inv costs no extra pass over memory.
template <typename A>
void tile_inv(const Inputs& src, const std::vector<const A*>& inv, const std::vector<const A*>& rows, int64_t t0,
              int64_t count, A* rt) {
  for (int64_t i = 0; i < src.n; ++i)
    for (int64_t t = 0; t < count; ++t) {
      if (src.own_inv) {
        const A* v = rows[i] + t * src.D;
        rt[t * src.n + i] = A(1) / std::sqrt(dot<A>(v, v, src.D) / static_cast<A>(src.D) + static_cast<A>(src.eps));
      } else {
        rt[t * src.n + i] = inv[i][t0 + t];
      }
    }
}

// Sizes of a (S, leading..., last) result: the sources' leading dims between S and `last`.
std::vector<int64_t> result_shape(const Inputs& in, std::optional<int64_t> last) {
  std::vector<int64_t> out{in.S};
  const auto shape = in.sources[0].sizes();
  out.insert(out.end(), shape.begin(), shape.end() - 1);
  if (last) out.push_back(*last);
  return out;
}

int64_t tile_tokens(const Inputs& in, int64_t compute_elem) {
  int64_t row_bytes = 0;
  for (int64_t i = 0; i < in.n; ++i) row_bytes += in.D * std::max<int64_t>(in.elem[i], compute_elem);
  return std::clamp<int64_t>(kTileBytes / std::max<int64_t>(row_bytes, 1), 1, kMaxTileTokens);
}

// Rows t0 .. t0 + count of a (rows, width) array of dtype `type` as A: a pointer into it when it is
// already A, else the rows converted into `slot` (count * width elements).
template <typename A>
const A* rows_as(const void* data, ScalarType type, int64_t elem, int64_t t0, int64_t count, int64_t width,
                 A* slot) {
  const char* base = static_cast<const char*>(data) + t0 * width * elem;
  if (type == scalar_type_of<A>()) return reinterpret_cast<const A*>(base);
  load_as<A>(base, type, count * width, slot);
  return slot;
}

// The tile's rows of every source as A (one slot of tile * width per source in `stage`).
template <typename A>
void tile_rows(const Inputs& src, int64_t t0, int64_t count, int64_t tile, std::vector<A>& stage,
               std::vector<const A*>& rows) {
  for (int64_t i = 0; i < src.n; ++i)
    rows[i] = rows_as<A>(src.data[i], src.type[i], src.elem[i], t0, count, src.D, stage.data() + i * tile * src.D);
}

bool all_of_type(const Inputs& src, ScalarType type) {
  return std::all_of(src.type.begin(), src.type.end(), [type](ScalarType t) { return t == type; });
}

// run(A(0)) with A the compute type: double or float.
template <typename F>
void with_compute(ScalarType compute, F&& run) {
  if (compute == ScalarType::Double) {
    run(double(0));
  } else {
    run(float(0));
  }
}

// Gradient sinks (eager training; fused_cpu.collect_source). A source collected into a sink gets
// its gradient from every routing call added into that one buffer, in the compute dtype, by the
// kernels themselves; its `collect` node hands the sum on once. Without sinks autograd adds one
// gradient per call, each written, read back and added in the source's dtype (for bf16 sources
// that was about a quarter of Full AttnRes's routing cost). Per source: the sink's rows (null: none)
// and whether they already hold a gradient (add) or are empty until this call (write). A sink is
// used only where inv is computed in the kernel (its gradient then lies in d sources) and its dtype
// is the compute dtype.
template <typename A>
struct Sinks {
  std::vector<A*> rows;
  std::vector<char> add;
  bool aliased = false;  // two entries share a sink (a source listed twice)
  Sinks(const Inputs& in, const std::vector<Tensor>& into) : rows(in.n, nullptr), add(in.n, 0) {
    if (!in.own_inv) return;
    for (int64_t i = 0; i < std::min<int64_t>(in.n, into.size()); ++i) {
      const Tensor& sink = into[i];
      if (!sink.defined() || sink.scalar_type() != in.compute) continue;
      if (sink.numel() == 0) {
        sink.resize_(in.sources[i].sizes());  // a source listed twice: its second entry then adds
      } else {
        TORCH_CHECK_VALUE(sink.numel() == in.tokens * in.D, "attnres fused routing: the gradient sink of source ",
                          i, " has ", sink.numel(), " elements, expected ", in.tokens * in.D);
        add[i] = 1;
      }
      rows[i] = sink.data_ptr<A>();
      aliased = aliased || std::find(rows.begin(), rows.begin() + i, rows[i]) != rows.begin() + i;
    }
  }
};

// Backward's d sources (each in its source's dtype and shape; none for a source with a sink) and
// d inv ((tokens,) in the compute dtype, none when inv is computed in the kernel), to fill.
template <typename A>
void alloc_source_grads(const Inputs& in, std::vector<Tensor>& grad_sources, std::vector<Tensor>& grad_inv,
                        const Sinks<A>& sinks) {
  for (int64_t i = 0; i < in.n; ++i) {
    grad_sources.push_back(sinks.rows[i] ? Tensor() : at::empty(in.sources[i].sizes(), in.sources[i].options()));
    if (!in.own_inv) grad_inv.push_back(at::empty({in.tokens}, in.queries.options()));
  }
}

// d inv in each inv's shape and dtype.
void finish_inv_grads(std::vector<Tensor>& grad_inv, const std::vector<Tensor>& inv) {
  for (size_t i = 0; i < grad_inv.size(); ++i) grad_inv[i] = grad_inv[i].view(inv[i].sizes()).to(inv[i].scalar_type());
}

// ------------------------------------------------------------------------------------- forward

// mixed_out[s]: router s's (tokens, D) mixture of dtype out_type; lse_out[s]: its (tokens,) log-sum-exp
// (one stacked tensor's slices, or one tensor per router).
template <typename A>
void forward_kernel(const Inputs& src, const std::vector<char*>& mixed_out, ScalarType out_type,
                    const std::vector<A*>& lse_out, Tensor& weights) {
  const int64_t S = src.S, D = src.D, n = src.n, tokens = src.tokens;
  const std::vector<const A*> inv = inv_rows<A>(src);
  const A* q = src.queries.data_ptr<A>();
  A* w_out = weights.data_ptr<A>();
  const int64_t out_elem = c10::elementSize(out_type);
  const bool direct_out = out_type == scalar_type_of<A>();
  const bool staged = !all_of_type(src, scalar_type_of<A>());
  const int64_t tile = tile_tokens(src, sizeof(A));
  const int64_t num_tiles = (tokens + tile - 1) / tile;

  std::vector<const A*> q_rows(S);
  for (int64_t s = 0; s < S; ++s) q_rows[s] = q + s * D;

  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> stage(staged ? n * tile * D : 0);
    std::vector<const A*> rows(n), token_rows(n);  // token_rows: one token's row of each source
    std::vector<A> logit(tile * S * n);  // (t, s, i), then the weights in place
    std::vector<A> rt(tile * n);         // (t, i): the tile's inv
    std::vector<A> acc(direct_out ? 0 : S * D);
    std::vector<A*> out_rows(S);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * tile, count = std::min(tile, tokens - t0);
      tile_rows<A>(src, t0, count, tile, stage, rows);
      tile_inv<A>(src, inv, rows, t0, count, rt.data());
      // Pass 1: logits. This is the pass that brings the tile's rows into cache.
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t i = 0; i < n; ++i) token_rows[i] = rows[i] + t * D;
        A* l = logit.data() + t * S * n;
        dots<A>(S, q_rows.data(), n, token_rows.data(), D, l, n);
        for (int64_t s = 0; s < S; ++s)
          for (int64_t i = 0; i < n; ++i) l[s * n + i] *= rt[t * n + i];
      }
      // Softmax over the n sources of each (token, router): per-token scalars.
      for (int64_t t = 0; t < count; ++t)
        for (int64_t s = 0; s < S; ++s) {
          A* l = logit.data() + (t * S + s) * n;
          A m = -std::numeric_limits<A>::infinity();
          for (int64_t i = 0; i < n; ++i) m = std::max(m, l[i]);
          // All -inf (or NaN): let exp/log produce what torch's softmax and logsumexp give.
          const A shift = std::isfinite(m) ? m : A(0);
          A total = 0;
          for (int64_t i = 0; i < n; ++i) total += (l[i] = std::exp(l[i] - shift));
          const int64_t st = s * tokens + t0 + t;
          lse_out[s][t0 + t] = shift + std::log(total);
          for (int64_t i = 0; i < n; ++i) w_out[st * n + i] = (l[i] /= total);
        }
      // Pass 2: the mixtures, from the cached rows; each output row accumulated in registers, written once.
      for (int64_t t = 0; t < count; ++t) {
        for (int64_t i = 0; i < n; ++i) token_rows[i] = rows[i] + t * D;
        for (int64_t s = 0; s < S; ++s)
          out_rows[s] = direct_out ? reinterpret_cast<A*>(mixed_out[s] + (t0 + t) * D * out_elem) : acc.data() + s * D;
        combine<A>(S, n, logit.data() + t * S * n, n, token_rows.data(), D, out_rows.data());
        for (int64_t s = 0; s < S && !direct_out; ++s)
          store_as<A>(acc.data() + s * D, out_type, D, mixed_out[s] + (t0 + t) * D * out_elem);
      }
    }
  });
}

// Router s's slice of a stacked (S, ...) tensor, as a pointer to its first element (T: its dtype, or char).
template <typename T = char>
std::vector<T*> slices(const Tensor& stacked, int64_t S) {
  std::vector<T*> out;
  const int64_t bytes = S == 0 ? 0 : stacked.numel() / S * stacked.element_size();
  for (int64_t s = 0; s < S; ++s)
    out.push_back(reinterpret_cast<T*>(static_cast<char*>(stacked.data_ptr()) + s * bytes));
  return out;
}

// One mixture per router, each a tensor of its own shaped like a source.
std::vector<Tensor> own_mixtures(const Inputs& in) {
  std::vector<Tensor> mixed;
  for (int64_t s = 0; s < in.S; ++s)
    mixed.push_back(at::empty(in.sources[0].sizes(), in.queries.options().dtype(in.out_type)));
  return mixed;
}

// The first element of each tensor of a list (one buffer per router), as T*.
template <typename T>
std::vector<T*> starts(at::TensorList tensors) {
  std::vector<T*> out;
  for (const Tensor& t : tensors) out.push_back(static_cast<T*>(t.data_ptr()));
  return out;
}

// lse (S, ...) and weights (S, ..., n) in the compute dtype, to fill.
std::pair<Tensor, Tensor> alloc_stats(const Inputs& in) {
  auto options = in.queries.options();
  return {at::empty(result_shape(in, std::nullopt), options), at::empty(result_shape(in, in.n), options)};
}

// mixed (S, ..., D) in the sources' promoted dtype, lse (S, ...) and weights (S, ..., n) in the compute dtype.
std::tuple<Tensor, Tensor, Tensor> route_forward(const Tensor& queries, const std::vector<Tensor>& sources,
                                                 const std::vector<Tensor>& inv, double eps) {
  const Inputs in = prepare(queries, sources, inv, eps);
  Tensor mixed = at::empty(result_shape(in, in.D), in.queries.options().dtype(in.out_type));
  auto [lse, weights] = alloc_stats(in);
  with_compute(in.compute, [&](auto zero) {
    using A = decltype(zero);
    forward_kernel<A>(in, slices(mixed, in.S), in.out_type, slices<A>(lse, in.S), weights);
  });
  return {mixed, lse, weights};
}

// route_forward with each router's mixture a tensor of its own, shaped like a source: a router's
// input then holds no other router's memory, and its gradient comes back alone (no stacking).
std::tuple<std::vector<Tensor>, Tensor, Tensor> route_forward_each(const Tensor& queries,
                                                                   const std::vector<Tensor>& sources,
                                                                   const std::vector<Tensor>& inv, double eps) {
  const Inputs in = prepare(queries, sources, inv, eps);
  std::vector<Tensor> mixed = own_mixtures(in);
  auto [lse, weights] = alloc_stats(in);
  with_compute(in.compute, [&](auto zero) {
    using A = decltype(zero);
    forward_kernel<A>(in, starts<char>(mixed), in.out_type, slices<A>(lse, in.S), weights);
  });
  return {mixed, lse, weights};
}

// route_forward writing each router's mixture and log-sum-exp into buffers of their own, given by the caller
// (each contiguous, shaped like a source and like its tokens, in the output and compute dtypes) -> the
// weights (no autograd; a compiled step without gradients). A router's results then start at offset 0
// of their own buffers, so the code inductor generates around every router of a group is the same
// and compiles once. Its one tensor result lets inductor's C++ wrapper call it without Python.
Tensor route_forward_into(const Tensor& queries, const std::vector<Tensor>& sources, const std::vector<Tensor>& inv,
                          double eps, at::TensorList mixed, at::TensorList lse) {
  const Inputs in = prepare(queries, sources, inv, eps);
  TORCH_CHECK_VALUE(static_cast<int64_t>(mixed.size()) == in.S && static_cast<int64_t>(lse.size()) == in.S,
                    "attnres fused routing: needs one mixture and one lse buffer per router (", in.S, "), got ",
                    mixed.size(), " and ", lse.size());
  const auto shape = in.sources[0].sizes();
  for (int64_t s = 0; s < in.S; ++s) {
    TORCH_CHECK_VALUE(mixed[s].sizes() == shape && mixed[s].scalar_type() == in.out_type && mixed[s].is_contiguous() &&
                          lse[s].sizes() == shape.slice(0, shape.size() - 1) && lse[s].scalar_type() == in.compute &&
                          lse[s].is_contiguous(),
                      "attnres fused routing: router ", s, "'s buffers must be contiguous ", shape, " ", in.out_type,
                      " and ", shape.slice(0, shape.size() - 1), " ", in.compute);
  }
  Tensor weights = alloc_stats(in).second;
  with_compute(in.compute, [&](auto zero) {
    using A = decltype(zero);
    forward_kernel<A>(in, starts<char>(mixed), in.out_type, starts<A>(lse), weights);
  });
  return weights;
}

// ------------------------------------------------------------------------------------- backward

// A (rows, D) array read a tile at a time (`rows_as`): its first element (null: absent), dtype, element size.
struct RowArray {
  const void* data = nullptr;
  ScalarType type = ScalarType::Float;
  int64_t elem = 0;
  RowArray() = default;
  explicit RowArray(const Tensor& t) : data(t.data_ptr()), type(t.scalar_type()), elem(t.element_size()) {}
  RowArray(const void* first, ScalarType dtype) : data(first), type(dtype), elem(c10::elementSize(dtype)) {}
};

template <typename A>
struct Upstream {  // the incoming gradients; null pointers for the absent ones
  std::vector<RowArray> mixed;  // per router, its (tokens, D) rows; empty when absent
  const A* lse = nullptr;
  const A* weights = nullptr;
};

template <typename A>
void backward_kernel(const Inputs& src, const A* alpha, const Upstream<A>& up, bool centered, const Sinks<A>& sinks,
                     std::vector<Tensor>& grad_sources, std::vector<Tensor>& grad_inv, Tensor& grad_queries) {
  const int64_t S = src.S, D = src.D, n = src.n, tokens = src.tokens;
  const std::vector<const A*> inv = inv_rows<A>(src);
  const A* q = src.queries.data_ptr<A>();
  const ScalarType self = scalar_type_of<A>();
  const bool staged = !all_of_type(src, self);
  const bool has_g = !up.mixed.empty();
  const bool stage_g =
      std::any_of(up.mixed.begin(), up.mixed.end(), [self](const RowArray& g) { return g.type != self; });
  const int64_t tile = tile_tokens(src, sizeof(A));
  const int64_t num_tiles = (tokens + tile - 1) / tile;
  std::vector<char*> dsrc(n);
  std::vector<A*> dinv(n);
  for (int64_t i = 0; i < n; ++i) {
    dsrc[i] = sinks.rows[i] ? nullptr : static_cast<char*>(grad_sources[i].data_ptr());
    dinv[i] = src.own_inv ? nullptr : grad_inv[i].data_ptr<A>();
  }
  // d queries sums over all tokens: one partial per group of tiles, added in a fixed order at the
  // end, so the result does not depend on how threads were scheduled.
  const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(num_tiles, at::get_num_threads()));
  std::vector<A> partial(groups * S * D, A(0));

  std::vector<const A*> q_rows(S);
  for (int64_t s = 0; s < S; ++s) q_rows[s] = q + s * D;
  const int64_t inputs = has_g ? 2 * S : S;  // pass 2's rows per token: q_s (and g_s) for each router

  at::parallel_for(0, groups, 1, [&](int64_t group_begin, int64_t group_end) {
    std::vector<A> stage(staged ? n * tile * D : 0);
    std::vector<const A*> rows(n), token_rows(n), tile_rows_ti(tile * n);  // tile_rows_ti[t * n + i]: v_i[t]
    std::vector<A> g_stage(stage_g ? S * tile * D : 0);
    std::vector<const A*> g_rows(S), g_token(S);  // g_rows[s]: the tile's (count, D) rows of grad_mixed[s]
    std::vector<A> qv(tile * S * n), gv(has_g ? tile * S * n : 0), coef(tile * S * n);
    std::vector<A> rt(tile * n), drt(tile * n);  // (t, i): the tile's inv and d inv
    std::vector<A> w_in(n * inputs), self_coef(n), dv_stage(n * D), w_dq(S * tile * n);
    std::vector<const A*> in_rows(inputs);
    std::vector<A*> out_rows(n), dq_rows(S);
    std::vector<char> add(n), add_all(S, 1);
    for (int64_t i = 0; i < n; ++i) add[i] = sinks.rows[i] && sinks.add[i];
    for (int64_t s = 0; s < S; ++s) in_rows[has_g ? 2 * s : s] = q_rows[s];
    for (int64_t group = group_begin; group < group_end; ++group) {
      A* dq = partial.data() + group * S * D;
      for (int64_t s = 0; s < S; ++s) dq_rows[s] = dq + s * D;
      const int64_t tile_begin = group * num_tiles / groups, tile_end = (group + 1) * num_tiles / groups;
      for (int64_t b = tile_begin; b < tile_end; ++b) {
        const int64_t t0 = b * tile, count = std::min(tile, tokens - t0);
        tile_rows<A>(src, t0, count, tile, stage, rows);
        tile_inv<A>(src, inv, rows, t0, count, rt.data());
        for (int64_t s = 0; s < S && has_g; ++s)
          g_rows[s] = rows_as<A>(up.mixed[s].data, up.mixed[s].type, up.mixed[s].elem, t0, count, D,
                                 g_stage.data() + s * tile * D);
        // Pass 1: recompute <q_s, v_i> and <g_s, v_i> (the pass that reads the rows from memory).
        for (int64_t t = 0; t < count; ++t) {
          for (int64_t i = 0; i < n; ++i) token_rows[i] = tile_rows_ti[t * n + i] = rows[i] + t * D;
          dots<A>(S, q_rows.data(), n, token_rows.data(), D, qv.data() + t * S * n, n);
          if (!has_g) continue;
          for (int64_t s = 0; s < S; ++s) g_token[s] = g_rows[s] + t * D;
          dots<A>(S, g_token.data(), n, token_rows.data(), D, gv.data() + t * S * n, n);
        }
        // Per-token scalars: d logits, d inv, and coef = d logit * inv (the weight of q_s in d v_i
        // and of v_i in d q_s).
        for (int64_t t = 0; t < count; ++t) {
          const int64_t tok = t0 + t;
          A* dr = drt.data() + t * n;
          std::fill(dr, dr + n, A(0));
          for (int64_t s = 0; s < S; ++s) {
            const int64_t st = s * tokens + tok, base = (t * S + s) * n;
            const A* a = alpha + st * n;
            const A* gw = up.weights ? up.weights + st * n : nullptr;
            const A gl = up.lse ? up.lse[st] : A(0);
            // The softmax backward of the recorded weights is always centred; the mixture's part is
            // centred too unless `centered` is false (then d logit_i = alpha_i <g, v_i> + ...).
            A centre_w = 0, centre_g = 0;
            for (int64_t i = 0; i < n; ++i) {
              if (gw) centre_w += a[i] * gw[i];
              if (has_g) centre_g += a[i] * gv[base + i];
            }
            const A centre = centered ? centre_w + centre_g : centre_w;
            for (int64_t i = 0; i < n; ++i) {
              const A dalpha = (has_g ? gv[base + i] : A(0)) + (gw ? gw[i] : A(0));
              const A dlogit = a[i] * (dalpha - centre + gl);
              dr[i] += dlogit * qv[base + i];
              coef[base + i] = dlogit * rt[t * n + i];
            }
          }
          if (!src.own_inv)
            for (int64_t i = 0; i < n; ++i) dinv[i][tok] = dr[i];
        }
        // Pass 2: d v_i = sum_s (coef q_s + alpha g_s), from the cached rows, all n sources of a token
        // at once. With inv computed here, d v_i also gets d inv * d inv / d v = d inv * (-inv^3 / D) v_i.
        for (int64_t t = 0; t < count; ++t) {
          const int64_t tok = t0 + t;
          for (int64_t s = 0; s < S && has_g; ++s) in_rows[2 * s + 1] = g_rows[s] + t * D;
          for (int64_t i = 0; i < n; ++i) {
            A* w = w_in.data() + i * inputs;
            for (int64_t s = 0; s < S; ++s) {
              const A c = coef[(t * S + s) * n + i];
              if (has_g) {
                w[2 * s] = c;
                w[2 * s + 1] = alpha[(s * tokens + tok) * n + i];
              } else {
                w[s] = c;
              }
            }
            const A r = rt[t * n + i];
            self_coef[i] = src.own_inv ? -drt[t * n + i] * r * r * r / static_cast<A>(D) : A(0);
            A* sink = sinks.rows[i];
            out_rows[i] = sink ? sink + tok * D
                          : src.type[i] == self ? reinterpret_cast<A*>(dsrc[i]) + tok * D
                                                : dv_stage.data() + i * D;
          }
          const RowStart<A> start{src.own_inv ? tile_rows_ti.data() + t * n : nullptr, self_coef.data(), add.data()};
          if (!sinks.aliased) {
            combine<A>(n, inputs, w_in.data(), inputs, in_rows.data(), D, out_rows.data(), start);
          } else {  // a source listed twice shares one sink: its entries add in turn
            for (int64_t i = 0; i < n; ++i)
              combine<A>(1, inputs, w_in.data() + i * inputs, inputs, in_rows.data(), D, out_rows.data() + i,
                         RowStart<A>{start.rows ? start.rows + i : nullptr, start.e + i, start.add + i});
          }
          for (int64_t i = 0; i < n; ++i)
            if (!sinks.rows[i] && src.type[i] != self)
              store_as<A>(dv_stage.data() + i * D, src.type[i], D, dsrc[i] + tok * D * src.elem[i]);
        }
        // d q_s += sum over the tile's (token, source) rows of coef v_i, d q_s read and written once per tile.
        for (int64_t s = 0; s < S; ++s)
          for (int64_t t = 0; t < count; ++t)
            for (int64_t i = 0; i < n; ++i) w_dq[s * count * n + t * n + i] = coef[(t * S + s) * n + i];
        combine<A>(S, count * n, w_dq.data(), count * n, tile_rows_ti.data(), D, dq_rows.data(),
                   RowStart<A>{nullptr, nullptr, add_all.data()});
      }
    }
  });
  A* dq_out = grad_queries.data_ptr<A>();
  std::fill(dq_out, dq_out + S * D, A(0));
  for (int64_t group = 0; group < groups; ++group)
    for (int64_t k = 0; k < S * D; ++k) dq_out[k] += partial[group * S * D + k];
}

// A per-token tensor in the compute dtype, contiguous, checked to have `numel` elements.
Tensor scalars(const Tensor& t, int64_t numel, ScalarType compute, const char* what) {
  TORCH_CHECK_VALUE(t.numel() == numel, "attnres fused routing: ", what, " has ", t.numel(), " elements, expected ",
                    numel);
  return t.to(compute).contiguous();
}

// A (rows, D) tensor such as an upstream gradient, contiguous in its own dtype (a bf16 one is
// converted a tile at a time in the kernels); absent stays absent.
std::optional<Tensor> rows_arg(const std::optional<Tensor>& t, int64_t numel, const char* what) {
  if (!t.has_value()) return std::nullopt;
  TORCH_CHECK_VALUE(t->numel() == numel, "attnres fused routing: ", what, " has ", t->numel(), " elements, expected ",
                    numel);
  TORCH_CHECK_TYPE(readable(t->scalar_type()), "attnres fused routing: ", what, " has dtype ", t->scalar_type());
  return t->contiguous();
}

// route_backward's grad_mixed: absent, one stacked (S, ..., D) gradient, or one per router (an absent
// one is zero).
struct MixedGrads {
  std::optional<Tensor> stacked;
  std::vector<Tensor> each;
};

// (d queries (S, D) in the queries' dtype, d sources each in its source's dtype and shape, d inv each
// in its inv's dtype and shape). weights: forward's output; any of the upstream gradients may be absent.

std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>> route_backward(
    const Tensor& queries, const Tensor& weights, const std::vector<Tensor>& sources, const std::vector<Tensor>& inv,
    const MixedGrads& grad_mixed, const std::optional<Tensor>& grad_lse,
    const std::optional<Tensor>& grad_weights, bool centered, double eps, const std::vector<Tensor>& into = {}) {
  const Inputs in = prepare(queries, sources, inv, eps);
  const int64_t per_token = in.S * in.tokens;
  const Tensor alpha = scalars(weights, per_token * in.n, in.compute, "weights");
  // Each router's gradient rows: slices of the stacked one, or the routers' own (contiguous; zeros
  // for an absent one beside present ones).
  const std::optional<Tensor> g_mixed = rows_arg(grad_mixed.stacked, per_token * in.D, "grad_mixed");
  std::vector<Tensor> g_each;
  const bool any_each = std::any_of(grad_mixed.each.begin(), grad_mixed.each.end(),
                                    [](const Tensor& g) { return g.defined(); });
  for (int64_t s = 0; any_each && s < in.S; ++s) {
    const Tensor& g = grad_mixed.each[s];
    g_each.push_back(g.defined() ? *rows_arg(g, in.tokens * in.D, "grad_mixed")
                                 : at::zeros(in.sources[0].sizes(), in.queries.options()));
  }
  std::optional<Tensor> g_lse, g_weights;
  if (grad_lse.has_value()) g_lse = scalars(*grad_lse, per_token, in.compute, "grad_lse");
  if (grad_weights.has_value()) g_weights = scalars(*grad_weights, per_token * in.n, in.compute, "grad_weights");

  std::vector<Tensor> grad_sources, grad_inv;
  Tensor grad_queries = at::empty({in.S, in.D}, in.queries.options());
  auto run = [&](auto zero) {
    using A = decltype(zero);
    const Sinks<A> sinks(in, into);
    alloc_source_grads<A>(in, grad_sources, grad_inv, sinks);
    Upstream<A> up;
    if (g_mixed)
      for (char* first : slices(*g_mixed, in.S)) up.mixed.emplace_back(first, g_mixed->scalar_type());
    for (const Tensor& g : g_each) up.mixed.emplace_back(g);
    if (g_lse) up.lse = g_lse->data_ptr<A>();
    if (g_weights) up.weights = g_weights->data_ptr<A>();
    backward_kernel<A>(in, alpha.data_ptr<A>(), up, centered, sinks, grad_sources, grad_inv, grad_queries);
  };
  with_compute(in.compute, run);
  finish_inv_grads(grad_inv, inv);
  return {grad_queries.to(queries.scalar_type()), grad_sources, grad_inv};
}

// ------------------------------------------------------------------------------------- merge (phase 2)
//
// Two-phase routing's phase 2 (attnres/routing/two_phase.py): one router's phase-1 result (mixture
// m (tokens, D), log-sum-exp lse) merged with j later sources by online softmax,
//   l_i = inv_i <q, v_i>,  total = logaddexp(lse, logsumexp_i l_i),
//   keep = exp(lse - total),  take_i = exp(l_i - total),  out = keep m + sum_i take_i v_i.
// Per token row, the dot products read m's and the v_i's rows from memory and the weighted sum (or,
// in backward, d v_i and d q) reads them again from L1: each goes through memory once.

// A (rows, D) output written a row at a time: in place when its dtype is A, else through `acc`.
template <typename A>
struct RowSink {
  char* data;
  ScalarType type;
  int64_t elem, D;
  bool direct;
  std::vector<A> acc;
  RowSink(Tensor& t, int64_t width)
      : data(static_cast<char*>(t.data_ptr())), type(t.scalar_type()), elem(t.element_size()), D(width),
        direct(t.scalar_type() == scalar_type_of<A>()), acc(direct ? 0 : width) {}
  RowSink(A* rows, int64_t width)  // a gradient sink's rows, in A
      : data(reinterpret_cast<char*>(rows)), type(scalar_type_of<A>()), elem(sizeof(A)), D(width), direct(true) {}
  A* row(int64_t r) { return direct ? reinterpret_cast<A*>(data) + r * D : acc.data(); }
  void done(int64_t r) {
    if (!direct) store_as<A>(acc.data(), type, D, data + r * D * elem);
  }
};

template <typename A>
void merge_forward_kernel(const Inputs& src, const RowArray& mixed, const A* lse, Tensor& out, A* total, A* keep,
                          A* take) {
  const int64_t D = src.D, n = src.n, tokens = src.tokens;
  const std::vector<const A*> inv = inv_rows<A>(src);
  const A* q = src.queries.data_ptr<A>();
  const bool staged = !all_of_type(src, scalar_type_of<A>()), stage_m = mixed.type != scalar_type_of<A>();
  const int64_t tile = tile_tokens(src, sizeof(A));
  const int64_t num_tiles = (tokens + tile - 1) / tile;

  at::parallel_for(0, num_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> stage(staged ? n * tile * D : 0), m_stage(stage_m ? tile * D : 0);
    std::vector<const A*> rows(n), token_rows(n + 1);  // token_rows: one token's m, v_1 .. v_j
    std::vector<A> rt(tile * n), w(n + 1);              // w: the token's logits, then (keep, take_1 .. take_j)
    RowSink<A> sink(out, D);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * tile, count = std::min(tile, tokens - t0);
      tile_rows<A>(src, t0, count, tile, stage, rows);
      tile_inv<A>(src, inv, rows, t0, count, rt.data());
      const A* m = rows_as<A>(mixed.data, mixed.type, mixed.elem, t0, count, D, m_stage.data());
      for (int64_t t = 0; t < count; ++t) {
        const int64_t tok = t0 + t;
        A top = lse[tok];
        for (int64_t i = 0; i < n; ++i) {
          w[1 + i] = rt[t * n + i] * dot<A>(q, rows[i] + t * D, D);
          top = std::max(top, w[1 + i]);
        }
        // All -inf (or NaN): let exp/log give what torch's logaddexp and logsumexp give.
        const A shift = std::isfinite(top) ? top : A(0);
        A sum = std::exp(lse[tok] - shift);
        for (int64_t i = 0; i < n; ++i) sum += std::exp(w[1 + i] - shift);
        const A all = shift + std::log(sum);
        total[tok] = all;
        keep[tok] = w[0] = std::exp(lse[tok] - all);
        for (int64_t i = 0; i < n; ++i) take[tok * n + i] = w[1 + i] = std::exp(w[1 + i] - all);
        token_rows[0] = m + t * D;
        for (int64_t i = 0; i < n; ++i) token_rows[1 + i] = rows[i] + t * D;
        weighted_sum<A>(w.data(), token_rows.data(), 0, n + 1, D, sink.row(tok));
        sink.done(tok);
      }
    }
  });
}

// Merge's inputs, checked: query (D,), sources and `rows` (mixed or out) (..., D), `stats` (lse or keep) (...).
Inputs prepare_merge(const Tensor& query, const std::vector<Tensor>& sources, const std::vector<Tensor>& inv,
                     double eps, const Tensor& rows, const Tensor& stats, const char* rows_name) {
  TORCH_CHECK_VALUE(query.dim() == 1, "attnres fused merge: query must be (D,), got ", query.sizes());
  Inputs in = prepare(query.unsqueeze(0), sources, inv, eps, rows.scalar_type(), stats.scalar_type());
  const auto shape = in.sources[0].sizes();
  TORCH_CHECK_VALUE(rows.sizes() == shape && stats.sizes() == shape.slice(0, shape.size() - 1),
                    "attnres fused merge: ", rows_name, " must be ", shape, " and its per-token statistics ",
                    shape.slice(0, shape.size() - 1), ", got ", rows.sizes(), " and ", stats.sizes());
  TORCH_CHECK_TYPE(readable(rows.scalar_type()), "attnres fused merge: ", rows_name, " has dtype ", rows.scalar_type());
  TORCH_CHECK_VALUE(rows.device().is_cpu() && stats.device().is_cpu(), "attnres fused merge: runs on CPU tensors");
  return in;
}

// (out (..., D) in the promoted dtype of mixed and the sources; total, keep (...) and take (..., j)
// in the compute dtype). inv = []: computed from the rows with eps.
std::tuple<Tensor, Tensor, Tensor, Tensor> merge_forward(const Tensor& mixed, const Tensor& lse, const Tensor& query,
                                                         const std::vector<Tensor>& sources,
                                                         const std::vector<Tensor>& inv, double eps) {
  const Inputs in = prepare_merge(query, sources, inv, eps, mixed, lse, "mixed");
  const Tensor m = mixed.contiguous(), stats = scalars(lse, in.tokens, in.compute, "lse");
  auto options = in.queries.options();
  std::vector<int64_t> take_shape(lse.sizes().begin(), lse.sizes().end());
  take_shape.push_back(in.n);
  Tensor out = at::empty(mixed.sizes(), options.dtype(in.out_type));
  Tensor total = at::empty(lse.sizes(), options), keep = at::empty(lse.sizes(), options);
  Tensor take = at::empty(take_shape, options);
  auto run = [&](auto zero) {
    using A = decltype(zero);
    merge_forward_kernel<A>(in, RowArray(m), stats.data_ptr<A>(), out, total.data_ptr<A>(), keep.data_ptr<A>(),
                            take.data_ptr<A>());
  };
  with_compute(in.compute, run);
  return {out, total, keep, take};
}

template <typename A>
struct MergeUpstream {  // the incoming gradients; absent ones null
  RowArray out;
  const A* total = nullptr;
  const A* keep = nullptr;
  const A* take = nullptr;
};

// d logits of one token: from <g, out> and <g, v_i> (gv, when has_g), then g_total and the softmax
// backward of the recorded (keep, take). Returns d lse; dl[i] = d l_i.
template <typename A>
A merge_logit_grads(int64_t n, A keep, const A* take, bool has_g, A g_out, const A* gv, const MergeUpstream<A>& up,
                    int64_t tok, A* dl) {
  A d_lse = 0;
  for (int64_t i = 0; i < n; ++i) {
    dl[i] = has_g ? take[i] * (gv[i] - g_out) : A(0);
    d_lse -= dl[i];  // a softmax's logit gradients sum to zero: lse takes the rest
  }
  if (up.total) {
    const A gt = up.total[tok];
    d_lse += keep * gt;
    for (int64_t i = 0; i < n; ++i) dl[i] += take[i] * gt;
  }
  if (up.keep || up.take) {
    const A gk = up.keep ? up.keep[tok] : A(0);
    const A* gw = up.take ? up.take + tok * n : nullptr;
    A centre = keep * gk;
    for (int64_t i = 0; i < n; ++i) centre += gw ? take[i] * gw[i] : A(0);
    d_lse += keep * (gk - centre);
    for (int64_t i = 0; i < n; ++i) dl[i] += take[i] * ((gw ? gw[i] : A(0)) - centre);
  }
  return d_lse;
}

template <typename A>
void merge_backward_kernel(const Inputs& src, const RowArray& out, const A* keep, const A* take,
                           const MergeUpstream<A>& up, const Sinks<A>& into, Tensor* grad_mixed, A* grad_lse,
                           std::vector<Tensor>& grad_sources, std::vector<Tensor>& grad_inv, Tensor& grad_query) {
  const int64_t D = src.D, n = src.n, tokens = src.tokens;
  const std::vector<const A*> inv = inv_rows<A>(src);
  const A* q = src.queries.data_ptr<A>();
  const ScalarType self = scalar_type_of<A>();
  const bool staged = !all_of_type(src, self), has_g = up.out.data != nullptr;
  const bool stage_g = has_g && up.out.type != self, stage_o = has_g && out.type != self;
  const int64_t tile = tile_tokens(src, sizeof(A));
  const int64_t num_tiles = (tokens + tile - 1) / tile;
  std::vector<A*> dinv(n);
  for (int64_t i = 0; i < n; ++i) dinv[i] = src.own_inv ? nullptr : grad_inv[i].data_ptr<A>();
  // d q sums over all tokens: one partial per group of tiles, added in a fixed order (as route_backward).
  const int64_t groups = std::max<int64_t>(1, std::min<int64_t>(num_tiles, at::get_num_threads()));
  std::vector<A> partial(groups * D, A(0));

  at::parallel_for(0, groups, 1, [&](int64_t group_begin, int64_t group_end) {
    std::vector<A> stage(staged ? n * tile * D : 0), g_stage(stage_g ? tile * D : 0), o_stage(stage_o ? tile * D : 0);
    std::vector<const A*> rows(n);
    std::vector<A> rt(tile * n), qv(n), gv(n), dl(n), cq(tile * n);  // cq (t, i): d l_i inv_i, v_i's weight in d q
    std::vector<RowSink<A>> sinks;
    for (int64_t i = 0; i < n; ++i) {
      if (into.rows[i]) {
        sinks.emplace_back(into.rows[i], D);
      } else {
        sinks.emplace_back(grad_sources[i], D);
      }
    }
    std::optional<RowSink<A>> mixed_sink;
    if (grad_mixed) mixed_sink.emplace(*grad_mixed, D);
    for (int64_t group = group_begin; group < group_end; ++group) {
      A* dq = partial.data() + group * D;
      const int64_t tile_begin = group * num_tiles / groups, tile_end = (group + 1) * num_tiles / groups;
      for (int64_t b = tile_begin; b < tile_end; ++b) {
        const int64_t t0 = b * tile, count = std::min(tile, tokens - t0);
        tile_rows<A>(src, t0, count, tile, stage, rows);
        tile_inv<A>(src, inv, rows, t0, count, rt.data());
        const A* g = has_g ? rows_as<A>(up.out.data, up.out.type, up.out.elem, t0, count, D, g_stage.data()) : nullptr;
        const A* o = has_g ? rows_as<A>(out.data, out.type, out.elem, t0, count, D, o_stage.data()) : nullptr;
        for (int64_t t = 0; t < count; ++t) {
          const int64_t tok = t0 + t;
          const A* gt = has_g ? g + t * D : nullptr;
          const A* tk = take + tok * n;
          for (int64_t i = 0; i < n; ++i) {
            if (has_g) {
              dot2<A>(q, gt, rows[i] + t * D, D, qv[i], gv[i]);
            } else {
              qv[i] = dot<A>(q, rows[i] + t * D, D);
            }
          }
          const A g_out = has_g ? dot<A>(gt, o + t * D, D) : A(0);
          grad_lse[tok] = merge_logit_grads<A>(n, keep[tok], tk, has_g, g_out, gv.data(), up, tok, dl.data());
          // d v_i = d l_i inv_i q + take_i g (+ with inv computed here, d inv_i * (-inv_i^3 / D) v_i);
          // d q += d l_i inv_i v_i: summed over the tile after the loop.
          for (int64_t i = 0; i < n; ++i) {
            const A r = rt[t * n + i], c = dl[i] * r, d_inv = dl[i] * qv[i];
            cq[t * n + i] = c;
            if (!src.own_inv) dinv[i][tok] = d_inv;
            const A self_coef = src.own_inv ? -d_inv * r * r * r / static_cast<A>(D) : A(0);
            source_grad<A>(1, tk + i, &c, has_g ? &gt : nullptr, 0, q, rows[i] + t * D, D, self_coef,
                           sinks[i].row(tok), into.add[i]);
            sinks[i].done(tok);
          }
          if (mixed_sink) {
            A* dm = mixed_sink->row(tok);
            const A k = keep[tok];
#pragma omp simd
            for (int64_t m = 0; m < D; ++m) dm[m] = k * gt[m];
            mixed_sink->done(tok);
          }
        }
        weighted_sum<A>(cq.data(), rows.data(), 0, n, D, dq, count, n, D, true);  // d q += the tile's d l_i inv_i v_i
      }
    }
  });
  A* dq_out = grad_query.data_ptr<A>();
  std::fill(dq_out, dq_out + D, A(0));
  for (int64_t group = 0; group < groups; ++group)
    for (int64_t k = 0; k < D; ++k) dq_out[k] += partial[group * D + k];
}

// ([d mixed] in mixed_dtype, or [] without grad_out; d lse in the compute dtype; d query in its
// dtype; d sources each in its dtype; d inv each in its dtype, [] when inv is []). From forward's
// out, keep and take; any upstream gradient may be absent.
std::tuple<std::vector<Tensor>, Tensor, Tensor, std::vector<Tensor>, std::vector<Tensor>> merge_backward(
    const Tensor& query, const Tensor& out, const Tensor& keep, const Tensor& take, const std::vector<Tensor>& sources,
    const std::vector<Tensor>& inv, const std::optional<Tensor>& grad_out, const std::optional<Tensor>& grad_total,
    const std::optional<Tensor>& grad_keep, const std::optional<Tensor>& grad_take, ScalarType mixed_dtype,
    double eps, const std::vector<Tensor>& into = {}) {
  const Inputs in = prepare_merge(query, sources, inv, eps, out, keep, "out");
  const Tensor o = out.contiguous(), k = scalars(keep, in.tokens, in.compute, "keep");
  const Tensor w = scalars(take, in.tokens * in.n, in.compute, "take");
  const std::optional<Tensor> g_out = rows_arg(grad_out, in.tokens * in.D, "grad_out");
  std::optional<Tensor> g_total, g_keep, g_take;
  if (grad_total.has_value()) g_total = scalars(*grad_total, in.tokens, in.compute, "grad_total");
  if (grad_keep.has_value()) g_keep = scalars(*grad_keep, in.tokens, in.compute, "grad_keep");
  if (grad_take.has_value()) g_take = scalars(*grad_take, in.tokens * in.n, in.compute, "grad_take");

  auto options = in.queries.options();
  std::vector<Tensor> grad_mixed, grad_sources, grad_inv;
  if (g_out) grad_mixed.push_back(at::empty(out.sizes(), options.dtype(mixed_dtype)));
  Tensor grad_lse = at::empty(keep.sizes(), options), grad_query = at::empty({in.D}, options);
  auto run = [&](auto zero) {
    using A = decltype(zero);
    const Sinks<A> sinks(in, into);
    alloc_source_grads<A>(in, grad_sources, grad_inv, sinks);
    MergeUpstream<A> up;
    if (g_out) up.out = RowArray(*g_out);
    if (g_total) up.total = g_total->data_ptr<A>();
    if (g_keep) up.keep = g_keep->data_ptr<A>();
    if (g_take) up.take = g_take->data_ptr<A>();
    merge_backward_kernel<A>(in, RowArray(o), k.data_ptr<A>(), w.data_ptr<A>(), up, sinks,
                             grad_mixed.empty() ? nullptr : &grad_mixed[0], grad_lse.data_ptr<A>(), grad_sources,
                             grad_inv, grad_query);
  };
  with_compute(in.compute, run);
  finish_inv_grads(grad_inv, inv);
  return {grad_mixed, grad_lse, grad_query.to(query.scalar_type()), grad_sources, grad_inv};
}

// ---------------------------------------------------------------- autograd in C++ (eager mode)
//
// `route` and `merge` are route_forward / merge_forward with their backward attached here, as C++
// autograd nodes: eager training then runs no Python per routing call in either direction (a
// Python autograd.Function cost about 0.1 ms a call each way, about a third of Block AttnRes's
// overhead at 24 x 256). What they save is what the Python functions save: the per-token weights
// (and merge's output) with references to the inputs. Under torch.compile the Python custom ops
// (fused_cpu.py) are used instead, since tracing needs their fake implementations.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::optional<Tensor> maybe(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

using SinkList = c10::List<std::optional<Tensor>>;

// The sinks a node's backward adds into: none unless this backward runs every node of the graph
// (loss.backward()), for only then is each source's `collect` node, which hands a sink's sum on,
// sure to run after it. A backward limited to some inputs (autograd.grad, backward(inputs=...))
// returns d sources as usual.
std::vector<Tensor> sinks_for_backward(AutogradContext* ctx) {
  std::vector<Tensor> into;
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info != nullptr && !exec_info->empty()) return into;
  for (const std::optional<Tensor>& sink : ctx->saved_data["into"].to<SinkList>())
    into.push_back(sink.value_or(Tensor()));
  return into;
}

// Both nodes save a few tensors of their own (`head`), then references to the sources and their inv.
void save_inputs(AutogradContext* ctx, variable_list head, at::TensorList sources, at::TensorList inv) {
  ctx->saved_data["head"] = static_cast<int64_t>(head.size());
  ctx->saved_data["n"] = static_cast<int64_t>(sources.size());
  head.insert(head.end(), sources.begin(), sources.end());
  head.insert(head.end(), inv.begin(), inv.end());
  ctx->save_for_backward(head);
  ctx->set_materialize_grads(false);
}

struct SavedInputs {
  variable_list head;
  std::vector<Tensor> sources, inv;
};

SavedInputs saved_inputs(AutogradContext* ctx) {
  const variable_list saved = ctx->get_saved_variables();
  const auto head = saved.begin() + ctx->saved_data["head"].toInt();
  const auto sources_end = head + ctx->saved_data["n"].toInt();
  return {variable_list(saved.begin(), head), std::vector<Tensor>(head, sources_end),
          std::vector<Tensor>(sources_end, saved.end())};
}

// One gradient per forward input, in order: `head`'s, d sources, d inv, then `trailing` undefined
// ones for the non-tensor arguments.
variable_list input_grads(variable_list head, const std::vector<Tensor>& grad_sources,
                          const std::vector<Tensor>& grad_inv, size_t trailing) {
  head.insert(head.end(), grad_sources.begin(), grad_sources.end());
  head.insert(head.end(), grad_inv.begin(), grad_inv.end());
  head.resize(head.size() + trailing);
  return head;
}

// Outputs: (mixed, lse, weights), or with `each` (route_each) the S routers' mixtures, then lse, weights.
struct RouteFunction : public torch::autograd::Function<RouteFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& queries, at::TensorList sources,
                               at::TensorList inv, double eps, bool centered, const SinkList& into, bool each) {
    variable_list out;
    Tensor weights;
    if (each) {
      auto [mixed, lse, w] = route_forward_each(queries, sources.vec(), inv.vec(), eps);
      out = mixed;
      out.push_back(lse);
      weights = w;
    } else {
      auto [mixed, lse, w] = route_forward(queries, sources.vec(), inv.vec(), eps);
      out = {mixed, lse};
      weights = w;
    }
    out.push_back(weights);
    save_inputs(ctx, {queries, weights}, sources, inv);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["centered"] = centered;
    ctx->saved_data["into"] = into;
    ctx->saved_data["each"] = each;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedInputs in = saved_inputs(ctx);
    MixedGrads grad_mixed;
    const size_t stats = grads.size() - 2;  // lse's and weights' gradients come last
    if (ctx->saved_data["each"].toBool()) {
      grad_mixed.each.assign(grads.begin(), grads.begin() + stats);
    } else {
      grad_mixed.stacked = maybe(grads[0]);
    }
    auto [grad_q, grad_sources, grad_inv] =
        route_backward(in.head[0], in.head[1], in.sources, in.inv, grad_mixed, maybe(grads[stats]),
                       maybe(grads[stats + 1]), ctx->saved_data["centered"].toBool(),
                       ctx->saved_data["eps"].toDouble(), sinks_for_backward(ctx));
    return input_grads({grad_q}, grad_sources, grad_inv, 4);  // eps, centered, into, each
  }
};

struct MergeFunction : public torch::autograd::Function<MergeFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& mixed, const Tensor& lse, const Tensor& query,
                               at::TensorList sources, at::TensorList inv, double eps, const SinkList& into) {
    auto [out, total, keep, take] = merge_forward(mixed, lse, query, sources.vec(), inv.vec(), eps);
    save_inputs(ctx, {query, out, keep, take}, sources, inv);  // never the mixture
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["into"] = into;
    ctx->saved_data["mixed_dtype"] = static_cast<int64_t>(mixed.scalar_type());
    return {out, total, keep, take};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedInputs in = saved_inputs(ctx);
    auto [grad_mixed, grad_lse, grad_q, grad_sources, grad_inv] = merge_backward(
        in.head[0], in.head[1], in.head[2], in.head[3], in.sources, in.inv, maybe(grads[0]), maybe(grads[1]),
        maybe(grads[2]), maybe(grads[3]), static_cast<ScalarType>(ctx->saved_data["mixed_dtype"].toInt()),
        ctx->saved_data["eps"].toDouble(), sinks_for_backward(ctx));
    return input_grads({grad_mixed.empty() ? Tensor() : grad_mixed[0], grad_lse, grad_q}, grad_sources, grad_inv,
                       2);  // eps, into
  }
};

// collect(source, sink): the source as a view whose backward hands on, once, the gradient the routing
// nodes added into `sink` (empty until one does), plus the view's own incoming gradient, in the
// source's dtype; it then releases the sink's memory.
struct CollectFunction : public torch::autograd::Function<CollectFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& source, const Tensor& sink) {
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["dtype"] = static_cast<int64_t>(source.scalar_type());
    ctx->set_materialize_grads(false);
    return {source.view_as(source)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Tensor sink = ctx->saved_data["sink"].toTensor();
    if (sink.numel() == 0) return {grads[0], Tensor()};
    if (grads[0].defined()) sink.add_(grads[0]);
    // detach(): a new tensor on the same memory, so that emptying the sink (whose handle the routing
    // nodes still hold) leaves the gradient alone when no conversion copied it.
    Tensor grad = sink.detach().to(static_cast<ScalarType>(ctx->saved_data["dtype"].toInt()));
    sink.set_();
    return {grad, Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> route_autograd(const Tensor& queries, at::TensorList sources, at::TensorList inv,
                                                  double eps, bool centered, const SinkList& into) {
  const variable_list out = RouteFunction::apply(queries, sources, inv, eps, centered, into, false);
  return {out[0], out[1], out[2]};
}

std::tuple<std::vector<Tensor>, Tensor, Tensor> route_each_autograd(const Tensor& queries, at::TensorList sources,
                                                                    at::TensorList inv, double eps, bool centered,
                                                                    const SinkList& into) {
  const variable_list out = RouteFunction::apply(queries, sources, inv, eps, centered, into, true);
  return {variable_list(out.begin(), out.end() - 2), out[out.size() - 2], out.back()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> merge_autograd(const Tensor& mixed, const Tensor& lse, const Tensor& query,
                                                          at::TensorList sources, at::TensorList inv, double eps,
                                                          const SinkList& into) {
  const variable_list out = MergeFunction::apply(mixed, lse, query, sources, inv, eps, into);
  return {out[0], out[1], out[2], out[3]};
}

Tensor collect_autograd(const Tensor& source, const Tensor& sink) { return CollectFunction::apply(source, sink)[0]; }

std::tuple<Tensor, Tensor, Tensor> route_plain(const Tensor& queries, at::TensorList sources, at::TensorList inv,
                                               double eps, bool, const SinkList&) {
  return route_forward(queries, sources.vec(), inv.vec(), eps);
}

std::tuple<std::vector<Tensor>, Tensor, Tensor> route_each_plain(const Tensor& queries, at::TensorList sources,
                                                                 at::TensorList inv, double eps, bool,
                                                                 const SinkList&) {
  return route_forward_each(queries, sources.vec(), inv.vec(), eps);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> merge_plain(const Tensor& mixed, const Tensor& lse, const Tensor& query,
                                                       at::TensorList sources, at::TensorList inv, double eps,
                                                       const SinkList&) {
  return merge_forward(mixed, lse, query, sources.vec(), inv.vec(), eps);
}

Tensor collect_plain(const Tensor& source, const Tensor&) { return source.alias(); }

// The backward ops (torch.compile's custom ops call them) take no sinks.
std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>> route_backward_op(
    const Tensor& queries, const Tensor& weights, const std::vector<Tensor>& sources, const std::vector<Tensor>& inv,
    const std::optional<Tensor>& grad_mixed, const std::optional<Tensor>& grad_lse,
    const std::optional<Tensor>& grad_weights, bool centered, double eps) {
  return route_backward(queries, weights, sources, inv, {grad_mixed, {}}, grad_lse, grad_weights, centered, eps);
}

std::tuple<std::vector<Tensor>, Tensor, Tensor, std::vector<Tensor>, std::vector<Tensor>> merge_backward_op(
    const Tensor& query, const Tensor& out, const Tensor& keep, const Tensor& take, const std::vector<Tensor>& sources,
    const std::vector<Tensor>& inv, const std::optional<Tensor>& grad_out, const std::optional<Tensor>& grad_total,
    const std::optional<Tensor>& grad_keep, const std::optional<Tensor>& grad_take, ScalarType mixed_dtype,
    double eps) {
  return merge_backward(query, out, keep, take, sources, inv, grad_out, grad_total, grad_keep, grad_take, mixed_dtype,
                        eps);
}

}  // namespace

TORCH_LIBRARY(attnres_fused_cpu, m) {
  // inv = []: the kernels compute each source's inverse RMS with `eps` (and its gradient flows into
  // d sources); otherwise eps is unused and d inv is returned.
  m.def("route_forward(Tensor queries, Tensor[] sources, Tensor[] inv, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("route_backward(Tensor queries, Tensor weights, Tensor[] sources, Tensor[] inv, Tensor? grad_mixed, "
        "Tensor? grad_lse, Tensor? grad_weights, bool centered, float eps) -> (Tensor, Tensor[], Tensor[])");
  // Two-phase routing's phase 2 (the same inv / eps convention); merge_backward's first result is
  // [d mixed], or [] without grad_out.
  m.def("merge_forward(Tensor mixed, Tensor lse, Tensor query, Tensor[] sources, Tensor[] inv, float eps) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def("merge_backward(Tensor query, Tensor out, Tensor keep, Tensor take, Tensor[] sources, Tensor[] inv, "
        "Tensor? grad_out, Tensor? grad_total, Tensor? grad_keep, Tensor? grad_take, ScalarType mixed_dtype, "
        "float eps) -> (Tensor[], Tensor, Tensor, Tensor[], Tensor[])");
  // route_forward and merge_forward with their backward as C++ autograd nodes (eager training); `into`:
  // per source, a gradient sink made by `collect` (or None), which backward adds d source into.
  m.def("route(Tensor queries, Tensor[] sources, Tensor[] inv, float eps, bool centered, Tensor?[] into) -> "
        "(Tensor, Tensor, Tensor)");
  m.def("merge(Tensor mixed, Tensor lse, Tensor query, Tensor[] sources, Tensor[] inv, float eps, Tensor?[] into) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def("collect(Tensor(a) source, Tensor sink) -> Tensor(a)");
  // route_forward into each router's own mixture and lse buffers (compiled steps without gradients).
  m.def("route_forward_into(Tensor queries, Tensor[] sources, Tensor[] inv, float eps, Tensor(a!)[] mixed, "
        "Tensor(b!)[] lse) -> Tensor");
  // route with each router's mixture a tensor of its own (two-phase routing's phase 1 in eager training).
  m.def("route_each(Tensor queries, Tensor[] sources, Tensor[] inv, float eps, bool centered, Tensor?[] into) -> "
        "(Tensor[], Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(attnres_fused_cpu, CPU, m) {
  m.impl("route_forward", &route_forward);
  m.impl("route_forward_into", &route_forward_into);
  m.impl("route_backward", &route_backward_op);
  m.impl("merge_forward", &merge_forward);
  m.impl("merge_backward", &merge_backward_op);
  m.impl("route", &route_plain);  // reached only without autograd (inference-mode tensors)
  m.impl("merge", &merge_plain);
  m.impl("collect", &collect_plain);
  m.impl("route_each", &route_each_plain);
}

TORCH_LIBRARY_IMPL(attnres_fused_cpu, Autograd, m) {
  m.impl("route", &route_autograd);
  m.impl("merge", &merge_autograd);
  m.impl("collect", &collect_autograd);
  m.impl("route_each", &route_each_autograd);
}
