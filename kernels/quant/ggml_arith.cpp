// The float operations between the int8-dot products, done the way llama.cpp's CPU backend
// (ggml, AVX2 build) does them, rounding for rounding. Quantizing activations to 8 bits makes
// a forward chaotic: one last-bit difference in an input to a product can move a value across
// a rounding boundary and change that block's 8-bit codes, so an int8-dot model that matches
// llama.cpp's products but not the operations around them drifts apart within a few tokens.
// Each function says which of llama.cpp's graph nodes it stands for; every one was checked
// bit for bit against the tensors llama.cpp computes for the default model
// (tests/integration/test_int8_dot_vs_llamacpp.py keeps checking them).
//
// Layout: our model keeps Q and K in transformers' order (the two rotary halves of a head
// apart); llama.cpp's file order interleaves them (pairs). Element j of the first half is
// file element 2j, of the second half 2j + 1. The rotation below works on halves with the
// pairs' arithmetic; the cache keeps K in file order, because the q.k dot product's
// summation order follows it.
//
// Built with -ffp-contract=off: every fused multiply-add is written out where ggml has one,
// and nothing else may be fused.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <vector>

namespace {

// ggml's AVX2 exp(x) for 8 lanes (the polynomial and reduction of its ``ggml_v_expf``):
// n = round(x / ln 2) through the 1.5 * 2^23 shift, b = x - n ln 2 in two parts, then
// 2^n * (1 + poly(b)), with the over/underflow lanes rebuilt from two scale factors.
inline __m256 exp8(__m256 x) {
  const __m256 shift = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
  const __m256 n = _mm256_sub_ps(z, shift);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k =
      _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 high = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                      _mm256_set1_ps(0x1.573e2ep-5f));
  const __m256 low = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                     _mm256_set1_ps(0x1.fffdb6p-2f));
  const __m256 poly = _mm256_fmadd_ps(_mm256_fmadd_ps(high, u, low), u,
                                      _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(big)) return _mm256_fmadd_ps(poly, k, k);
  const __m256i neg = _mm256_and_si256(
      _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
      _mm256_set1_epi32(0x82000000u));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(neg, _mm256_set1_epi32(0x7f000000u)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, neg));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192), _CMP_GT_OQ);
  const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, poly, s2), s1);
  const __m256 normal = _mm256_fmadd_ps(k, poly, k);
  const __m256 mid = _mm256_or_ps(_mm256_and_ps(big, scaled), _mm256_andnot_ps(big, normal));
  return _mm256_or_ps(_mm256_and_ps(huge, _mm256_mul_ps(s1, s1)), _mm256_andnot_ps(huge, mid));
}

// The eight lanes of r summed as (r0+r4 + r2+r6) + (r1+r5 + r3+r7): ggml's float reductions
// after a vector loop (soft_max's block sums, tinyBLAS's dot products).
inline float sum_movehl(const float r[8]) {
  const float u0 = r[0] + r[4], u1 = r[1] + r[5], u2 = r[2] + r[6], u3 = r[3] + r[7];
  return (u0 + u2) + (u1 + u3);
}

// The same eight lanes as (r0+r4 + r1+r5) + (r2+r6 + r3+r7): the two horizontal adds ending
// ggml_vec_dot_f32.
inline float sum_hadd(const float r[8]) {
  const float u0 = r[0] + r[4], u1 = r[1] + r[5], u2 = r[2] + r[6], u3 = r[3] + r[7];
  return (u0 + u1) + (u2 + u3);
}

// ggml_vec_dot_f32 over n (a multiple of 32): four 8-lane accumulators (element i goes to
// accumulator (i / 8) % 4, lane i % 8), folded as (a0 + a2) + (a1 + a3), then the lanes.
inline float dot_f32(const float* x, const float* y, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (int64_t i = 0; i < n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * j), _mm256_loadu_ps(y + i + 8 * j),
                               acc[j]);
  const __m256 r = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
  float lanes[8];
  _mm256_storeu_ps(lanes, r);
  return sum_hadd(lanes);
}

}  // namespace

// ``norm-N`` then ``attn_norm-N``/``ffn_norm-N``: x / sqrt(mean(x^2) + eps), the mean of
// squares summed in double, then times the weight.
extern "C" void ga_rms_norm(const float* x, int64_t rows, int64_t n, const float* weight,
                            float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale) * weight[i];
  }
}

// The rotation angles ggml's RoPE (no scaling) uses at positions 0..positions-1: theta starts
// at the position and is multiplied by base^(-2/dim) once per pair (a running float product,
// not base^(-2i/dim) per pair); cos and sin from libm, as ggml calls them.
extern "C" void ga_rope_table(int64_t positions, int64_t dim, float base, float* cos_out,
                              float* sin_out) {
  const float theta_scale = powf(base, -2.0f / static_cast<float>(dim));
  const int64_t half = dim / 2;
  for (int64_t p = 0; p < positions; ++p) {
    float theta = static_cast<float>(p);
    for (int64_t j = 0; j < half; ++j) {
      cos_out[p * half + j] = cosf(theta);
      sin_out[p * half + j] = sinf(theta);
      theta *= theta_scale;
    }
  }
}

// ``Qcur-N``/``Kcur-N`` ROPE, in place on x [tokens, heads, dim] (rows ``stride`` floats
// apart, heads contiguous) in halves order; cos/sin [tokens, dim / 2]. For the pair (a, b):
// a' = fma(a, cos, -(b * sin)), b' = fma(a, sin, b * cos), as ggml's compiled loop rounds.
extern "C" void ga_rope(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t stride,
                        const float* cos_t, const float* sin_t) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * stride + h * dim;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = fmaf(a, c[j], -(b * s[j]));
        v[j + half] = fmaf(a, s[j], b * c[j]);
      }
    }
  }
}

// ``ffn_swiglu-N``: silu(gate) * up with ggml's exp, gate_up rows [gate (n) | up (n)].
extern "C" void ga_swiglu(const float* gate_up, int64_t rows, int64_t n, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * n;
    const float* u = g + n;
    float* yr = y + r * n;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(g + i);
      const __m256 denom =
          _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_div_ps(x, denom), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; ++i) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  }
}

namespace {

// kqv for one (token, head): out[d] = sum_j p[j] * v_j[d] over the len positions at ``rows``
// (float offsets into the V cache), summed as ggml does: position j goes to accumulator
// j % NACC (NACC 32: ggml_vec_dot_f32's four by eight; 8: tinyBLAS's lanes), each
// accumulator adds its positions in order, then the accumulators fold. DB: dim / 8 vectors,
// kept in registers while one accumulator's positions stream past.
template <int NACC, int DB>
void weighted_sum(const float* p, const int64_t* rows, int64_t len, const float* v_cache,
                  float* acc, float* out) {
  constexpr int64_t dim = 8 * DB;
  for (int64_t s = 0; s < NACC; ++s) {
    __m256 a[DB];
    for (int i = 0; i < DB; ++i) a[i] = _mm256_setzero_ps();
    for (int64_t j = s; j < len; j += NACC) {
      const float* vj = v_cache + rows[j];
      const __m256 w = _mm256_set1_ps(p[j]);
      for (int i = 0; i < DB; ++i) a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(vj + 8 * i), w, a[i]);
    }
    for (int i = 0; i < DB; ++i) _mm256_storeu_ps(acc + s * dim + 8 * i, a[i]);
  }
  for (int64_t d = 0; d < dim; ++d) {
    float r[8];
    if (NACC == 32) {
      for (int l = 0; l < 8; ++l)
        r[l] = (acc[l * dim + d] + acc[(16 + l) * dim + d]) +
               (acc[(8 + l) * dim + d] + acc[(24 + l) * dim + d]);
      out[d] = sum_hadd(r);
    } else {
      for (int l = 0; l < 8; ++l) r[l] = acc[l * dim + d];
      out[d] = sum_movehl(r);
    }
  }
}

template <int NACC>
bool weighted_sum_for(int64_t dim, const float* p, const int64_t* rows, int64_t len,
                      const float* v_cache, float* acc, float* out) {
  switch (dim) {
    case 32: weighted_sum<NACC, 4>(p, rows, len, v_cache, acc, out); return true;
    case 64: weighted_sum<NACC, 8>(p, rows, len, v_cache, acc, out); return true;
    case 96: weighted_sum<NACC, 12>(p, rows, len, v_cache, acc, out); return true;
    case 128: weighted_sum<NACC, 16>(p, rows, len, v_cache, acc, out); return true;
    case 256: weighted_sum<NACC, 32>(p, rows, len, v_cache, acc, out); return true;
    default: return false;
  }
}

}  // namespace

// ``kq-N``, ``kq_soft_max-N`` and ``kqv-N`` of a batch over the paged cache, after writing
// the batch's own K (rotated, halves order; stored in file order) and V at ``slots``.
//
// q [T, H, D] (rows ``q_stride`` floats apart) and k/v [T, Hkv, D] likewise; the cache
// [slots, Hkv, D] per tensor. Token t of sequence b (cu_query_lens) at position positions[t]
// attends to its sequence's first positions[t] + 1 slots (page_table [B, max_pages]).
// ggml's choices, reproduced: q.k is ggml_vec_dot_f32 in file order; the softmax scales,
// takes the max, exponentiates 8 at a time (the tail padded with -inf, whose exp is 0, as
// llama.cpp's 256-padded KV is) summing each 8 in double; kqv is ggml_vec_dot_f32 over
// positions when the batch is one token, else tinyBLAS's one accumulator per lane.
// ``file_order`` 0 (the exact weight path, whose cache torch's attention shares): K cached and
// q.k summed in halves order instead, the rest alike.
// Returns 0, or -1 for a head size the kqv sum has no instance for (32, 64, 96, 128, 256).
extern "C" int ga_attention(const float* q, int64_t q_stride, const float* k, const float* v,
                            int64_t kv_stride, int64_t tokens, int64_t heads, int64_t kv_heads,
                            int64_t dim, float* k_cache, float* v_cache, const int64_t* slots,
                            const int64_t* positions, const int64_t* cu_query_lens,
                            int64_t batch, const int64_t* page_table, int64_t max_pages,
                            int64_t page_size, float scale, float* out, int threads,
                            int file_order) {
  if (dim != 32 && dim != 64 && dim != 96 && dim != 128 && dim != 256) return -1;
  const int64_t half = dim / 2, row = kv_heads * dim;
  for (int64_t t = 0; t < tokens; ++t) {
    float* kc = k_cache + slots[t] * row;
    float* vc = v_cache + slots[t] * row;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* kt = k + t * kv_stride + h * dim;
      if (file_order) {
        for (int64_t j = 0; j < half; ++j) {
          kc[h * dim + 2 * j] = kt[j];
          kc[h * dim + 2 * j + 1] = kt[j + half];
        }
      } else {
        memcpy(kc + h * dim, kt, dim * sizeof(float));
      }
      memcpy(vc + h * dim, v + t * kv_stride + h * dim, dim * sizeof(float));
    }
  }
  // Each sequence's cache rows (in floats, head 0) by position, walked once: token t of it
  // reads the first positions[t] + 1.
  std::vector<int64_t> seq_of(tokens);
  std::vector<std::vector<int64_t>> rows(batch);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = 0;
    for (int64_t t = cu_query_lens[b]; t < cu_query_lens[b + 1]; ++t) {
      seq_of[t] = b;
      len = positions[t] + 1 > len ? positions[t] + 1 : len;
    }
    rows[b].resize(len);
    const int64_t* pages = page_table + b * max_pages;
    for (int64_t j = 0, page = 0, offset = 0; j < len; ++j) {
      rows[b][j] = (pages[page] * page_size + offset) * row;
      if (++offset == page_size) offset = 0, ++page;
    }
  }
  const bool one_token = tokens == 1;
  const int64_t group = heads / kv_heads;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> qf(dim), p, acc(32 * dim);
#pragma omp for schedule(static)
    for (int64_t th = 0; th < tokens * heads; ++th) {
      const int64_t t = th / heads, h = th % heads, kvh = h / group;
      const int64_t len = positions[t] + 1, padded = (len + 31) / 32 * 32;
      const int64_t* at = rows[seq_of[t]].data();
      const float* qt = q + t * q_stride + h * dim;
      if (file_order) {
        for (int64_t j = 0; j < half; ++j) {
          qf[2 * j] = qt[j];
          qf[2 * j + 1] = qt[j + half];
        }
      } else {
        memcpy(qf.data(), qt, dim * sizeof(float));
      }
      p.assign(padded, -INFINITY);
      float max = -INFINITY;
      const float* kh = k_cache + kvh * dim;
      for (int64_t j = 0; j < len; ++j) {
        const float s = dot_f32(kh + at[j], qf.data(), dim) * scale;
        p[j] = s;
        max = s > max ? s : max;
      }
      double sum = 0.0;
      float lanes[8];
      for (int64_t j = 0; j < padded; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.data() + j), _mm256_set1_ps(max)));
        _mm256_storeu_ps(p.data() + j, e);
        _mm256_storeu_ps(lanes, e);
        sum += static_cast<double>(sum_movehl(lanes));
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < len; ++j) p[j] *= inv;
      float* o = out + (t * heads + h) * dim;
      const float* vh = v_cache + kvh * dim;
      if (one_token)
        weighted_sum_for<32>(dim, p.data(), at, len, vh, acc.data(), o);
      else
        weighted_sum_for<8>(dim, p.data(), at, len, vh, acc.data(), o);
    }
  }
  return 0;
}

// One layer's weights for ``ga_decoder``: norms as float32, projections as the file's blocks
// (kind: block_gemm.cpp's code), and the layer's K/V cache.
struct LayerWeights {
  const float* attn_norm;
  const uint8_t* qkv;
  int64_t qkv_kind;
  const uint8_t* o;
  int64_t o_kind;
  const float* ffn_norm;
  const uint8_t* gate_up;
  int64_t gate_up_kind;
  const uint8_t* down;
  int64_t down_kind;
  float* k_cache;
  float* v_cache;
};

// block_gemm.cpp's block_linear_q8 (the int8-dot product, ggml's bit for bit) or
// block_linear_f32 (the exact one).
typedef void (*BlockProduct)(const float* x, int64_t rows, int64_t k, const uint8_t* data, int kind,
                        int64_t n, float* y, int threads);

// Every layer of a llama-style decoder on hidden states h [T, hidden] (in place), as
// llama.cpp's graph computes them: attn_norm, Q/K/V, RoPE, attention, output projection plus
// residual, ffn_norm, gate/up, SwiGLU, down projection plus residual. One call a forward
// instead of a dozen Python-level operations per layer (at decode sizes, their dispatch
// costs as much as the attention). cos/sin: [T, dim / 2] at each token's position.
// ``file_order``: as ``ga_attention``'s (1 with the int8-dot product, 0 with the exact one).
extern "C" int ga_decoder(float* h, int64_t tokens, int64_t num_layers, const LayerWeights* layers,
                          BlockProduct matmul, int64_t hidden, int64_t heads, int64_t kv_heads,
                          int64_t dim, int64_t inter, float eps, const float* cos_t,
                          const float* sin_t, const int64_t* slots, const int64_t* positions,
                          const int64_t* cu_query_lens, int64_t batch, const int64_t* page_table,
                          int64_t max_pages, int64_t page_size, int threads, int file_order) {
  const int64_t width = (heads + 2 * kv_heads) * dim;
  const float scale = 1.0f / sqrtf(static_cast<float>(dim));  // llama.cpp's kq_scale
  std::vector<float> normed(tokens * hidden), qkv(tokens * width), attn(tokens * heads * dim);
  std::vector<float> proj(tokens * hidden), gate_up(tokens * 2 * inter), act(tokens * inter);
  for (int64_t l = 0; l < num_layers; ++l) {
    const LayerWeights& w = layers[l];
    ga_rms_norm(h, tokens, hidden, w.attn_norm, eps, normed.data());
    matmul(normed.data(), tokens, hidden, w.qkv, static_cast<int>(w.qkv_kind), width, qkv.data(),
           threads);
    ga_rope(qkv.data(), tokens, heads + kv_heads, dim, width, cos_t, sin_t);
    const int done = ga_attention(qkv.data(), width, qkv.data() + heads * dim,
                                  qkv.data() + (heads + kv_heads) * dim, width, tokens, heads,
                                  kv_heads, dim, w.k_cache, w.v_cache, slots, positions,
                                  cu_query_lens, batch, page_table, max_pages, page_size, scale,
                                  attn.data(), threads, file_order);
    if (done != 0) return done;
    matmul(attn.data(), tokens, heads * dim, w.o, static_cast<int>(w.o_kind), hidden, proj.data(),
           threads);
    for (int64_t i = 0; i < tokens * hidden; ++i) h[i] = proj[i] + h[i];
    ga_rms_norm(h, tokens, hidden, w.ffn_norm, eps, normed.data());
    matmul(normed.data(), tokens, hidden, w.gate_up, static_cast<int>(w.gate_up_kind), 2 * inter,
           gate_up.data(), threads);
    ga_swiglu(gate_up.data(), tokens, inter, act.data());
    matmul(act.data(), tokens, inter, w.down, static_cast<int>(w.down_kind), hidden, proj.data(),
           threads);
    for (int64_t i = 0; i < tokens * hidden; ++i) h[i] = proj[i] + h[i];
  }
  return 0;
}
