// y = x @ W^T for W stored as GGUF-style blocks of 32 weights along the input dimension:
// w[n, 32j + i] = scale[n, j] * q[n, 32j + i] + offset[n, j], q int8 (Q4_1: 0..15 plus an
// offset; Q8_0: -127..127 without one). The weights stay 1 byte each plus two floats per 32,
// so a decode step reads about a third of what float32 weights cost; the products are the
// float32 products of the dequantized weights (summation order aside).
//
// AVX2 + FMA: per weight row and block, the 32 int8 values become four vectors of floats
// scaled by the block's scale, then meet up to TILE rows of x, whose accumulators stay in
// registers. The offsets are applied once per block through each x row's block sums.
//
// Plain C ABI over raw pointers (no PyTorch headers): it builds in about a second with g++ and
// is called through ctypes; threads come from OpenMP, as many as the caller asks for.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t BLOCK = 32;
constexpr int64_t TILE = 8;
// From this many x rows on, the panel kernel (weights dequantized once per call) wins.
constexpr int64_t PANEL_ROWS = 6;

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

inline __m256 load8(const int8_t* p) {
  __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

template <int T>
void rows_tile(const float* x, int64_t K, const int8_t* q, const float* scale,
               const float* offset, const float* xsum, int64_t nblocks, float* y,
               int64_t ldy) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  float off[T] = {0};
  for (int64_t j = 0; j < nblocks; ++j) {
    const int8_t* qb = q + j * BLOCK;
    __m256 s = _mm256_set1_ps(scale[j]);
    __m256 w0 = _mm256_mul_ps(load8(qb), s);
    __m256 w1 = _mm256_mul_ps(load8(qb + 8), s);
    __m256 w2 = _mm256_mul_ps(load8(qb + 16), s);
    __m256 w3 = _mm256_mul_ps(load8(qb + 24), s);
    const float o = offset ? offset[j] : 0.0f;
    for (int t = 0; t < T; ++t) {
      const float* xb = x + t * K + j * BLOCK;
      __m256 a = acc[t];
      a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), a);
      a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), a);
      a = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), a);
      a = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), a);
      acc[t] = a;
      if (offset) off[t] += o * xsum[t * nblocks + j];
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + off[t];
}

// Batched inputs: dequantize R weight rows into an L1-resident panel once, then multiply
// it with the x rows T at a time (R*T accumulators): each loaded vector feeds several FMAs,
// and each weight is converted once per call instead of once per x row.
template <int R, int T>
void panel_tile(const float* panel, const float* x, int64_t K, float* y, int64_t ldy) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * K + k);
    for (int r = 0; r < R; ++r) {
      __m256 w = _mm256_loadu_ps(panel + r * K + k);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum(acc[r][t]);
}

template <int R>
void panel_rows(const float* panel, const float* x, int64_t B, int64_t K, float* y,
                int64_t ldy) {
  int64_t b = 0;
  for (; b + 3 <= B; b += 3) panel_tile<R, 3>(panel, x + b * K, K, y + b * ldy, ldy);
  for (; b < B; ++b) panel_tile<R, 1>(panel, x + b * K, K, y + b * ldy, ldy);
}

void dequantize_rows(const int8_t* q, const float* scale, const float* offset, int64_t rows,
                     int64_t K, float* out) {
  const int64_t nblocks = K / BLOCK;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nblocks; ++j) {
      const int8_t* qb = q + r * K + j * BLOCK;
      __m256 s = _mm256_set1_ps(scale[r * nblocks + j]);
      __m256 o = _mm256_set1_ps(offset ? offset[r * nblocks + j] : 0.0f);
      float* ob = out + r * K + j * BLOCK;
      for (int i = 0; i < BLOCK; i += 8)
        _mm256_storeu_ps(ob + i, _mm256_fmadd_ps(load8(qb + i), s, o));
    }
  }
}

}  // namespace

extern "C" void block_linear_f32(const float* xp, int64_t B, int64_t K, const int8_t* qp,
                                 const float* sp, const float* op, const float* xs, int64_t N,
                                 float* yp, int threads) {
  const int64_t nblocks = K / BLOCK;
  if (B >= PANEL_ROWS) {
    constexpr int64_t R = 3;
    const int64_t panels = (N + R - 1) / R;
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> panel(R * K);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n = p * R, rows = std::min<int64_t>(R, N - n);
        dequantize_rows(qp + n * K, sp + n * nblocks, op ? op + n * nblocks : nullptr, rows, K,
                        panel.data());
        if (rows == 3) panel_rows<3>(panel.data(), xp, B, K, yp + n, N);
        else if (rows == 2) panel_rows<2>(panel.data(), xp, B, K, yp + n, N);
        else panel_rows<1>(panel.data(), xp, B, K, yp + n, N);
      }
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* qn = qp + n * K;
    const float* sn = sp + n * nblocks;
    const float* on = op ? op + n * nblocks : nullptr;
    int64_t b = 0;
    for (; b + TILE <= B; b += TILE)
      rows_tile<TILE>(xp + b * K, K, qn, sn, on, xs ? xs + b * nblocks : nullptr, nblocks,
                      yp + b * N + n, N);
    for (; b < B; ++b)
      rows_tile<1>(xp + b * K, K, qn, sn, on, xs ? xs + b * nblocks : nullptr, nblocks,
                   yp + b * N + n, N);
  }
}
