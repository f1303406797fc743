// y = x @ W^T for W stored as the GGUF file's own blocks of 32 weights along the input
// dimension, row after row, byte for byte as in the file:
//   Q4_0: f16 d, 16 bytes of nibbles           w = d * (q - 8)
//   Q4_1: f16 d, f16 m, 16 bytes of nibbles    w = d * q + m
//   Q8_0: f16 d, 32 int8                       w = d * q
// (nibble byte i holds weight i in its low half and weight i + 16 in its high half). A 4-bit
// weight costs 4.5-5 bits of memory traffic, as in llama.cpp; the nibbles are widened only
// in registers.
//
// Two products over the same blocks:
// - exact (``block_linear_f32``): each block is decoded to the float32 weights the gguf
//   package's dequantizer gives (same operations, same roundings) and multiplied with
//   float32 x: the float32 product of the dequantized weights, summation order aside;
// - int8-dot (``block_linear_q8``): x is quantized per 32-block to 8 bits with an f16 scale
//   (and, for Q4_1, an f16 scaled block sum), as llama.cpp's Q8_0/Q8_1, and each block's
//   product is an integer dot (maddubs) scaled once: llama.cpp's arithmetic on AVX2.
//
// Plain C ABI over raw pointers (no PyTorch headers): it builds in about two seconds with g++
// and is called through ctypes; threads come from OpenMP, as many as the caller asks for.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t BLOCK = 32;
// From this many x rows on, the exact product multiplies by a dequantized panel; fewer x rows
// (at most 3, whose 12 accumulators fit the registers) share each block decoded in registers.
constexpr int64_t PANEL_ROWS = 4;
// x rows sharing one loaded weight block in the int8-dot kernel.
constexpr int64_t TILE = 4;

enum Kind { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };

constexpr int64_t block_bytes(int kind) { return kind == Q4_0 ? 18 : kind == Q4_1 ? 20 : 34; }

inline float f16(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float round_f16(float v) {
  return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The eight lanes' sum, added in llama.cpp's order (hsum_float_8), so the int8-dot product
// rounds as llama.cpp's does.
inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// The 32 quants of a 4-bit block as bytes 0..15 (low nibbles) and 16..31 (high nibbles).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// One block's 32 weights as four vectors of floats (w[c] holds weights 8c..8c+7), equal to
// the gguf package's dequantized float32 weights. Each 8 quants are widened straight from an
// 8-byte load (bytes 0..7 give weights 0..7 as low nibbles and 16..23 as high ones, bytes
// 8..15 the rest), and the f16 scale and offset are converted together from one 4-byte load.
// The gguf package computes d * q and then, for Q4_1, adds m: d is an f16 (11 significant
// bits) and q has at most 8, so d * q is exact in float32, and fma(q, d, m) rounds once where
// the package rounds once too: the same float32 weight, one instruction fewer.
template <int KIND>
inline void decode_block(const uint8_t* b, __m256 w[4]) {
  uint32_t scales;  // d, then (Q4_1) m, or d and two quant bytes
  memcpy(&scales, b, 4);
  const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(scales)));
  const __m256 d = _mm256_broadcastss_ps(dm);
  if (KIND == Q8_0) {
    for (int c = 0; c < 4; ++c)
      w[c] = _mm256_mul_ps(
          widen8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * c))), d);
    return;
  }
  const uint8_t* qs = b + (KIND == Q4_1 ? 4 : 2);
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i hi =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i mask = _mm256_set1_epi32(0x0F);
  const __m256i q[4] = {_mm256_and_si256(lo, mask), _mm256_and_si256(hi, mask),
                        _mm256_srli_epi32(lo, 4), _mm256_srli_epi32(hi, 4)};
  if (KIND == Q4_1) {
    const __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    for (int c = 0; c < 4; ++c) w[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[c]), d, m);
  } else {
    const __m256i eight = _mm256_set1_epi32(8);
    for (int c = 0; c < 4; ++c)
      w[c] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[c], eight)), d);
  }
}

// Every exact path sums in one order, so a row's product never depends on the rows beside it
// (a request decodes to the same logits alone or in a batch, up to GEMM_ROWS rows): four
// vector accumulators per output, accumulator c taking weights 8c..8c+7 of every block, block
// after block; then (a0 + a1) + (a2 + a3), then the eight lanes.
inline float finish(const __m256 a[4]) {
  return hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
}

// T x rows against one weight row, each block decoded in registers and used at once. The
// four accumulators per x row are four independent FMA chains: one chain would wait on the
// FMA's latency every 8 weights. (At one x row, two or four weight rows per x load measured
// no faster: the decode, not the x loads, is the work.)
template <int KIND, int T>
void exact_tile(const float* x, int64_t K, const uint8_t* row, float* y, int64_t ldy) {
  __m256 acc[T][4];
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < 4; ++c) acc[t][c] = _mm256_setzero_ps();
  const int64_t nblocks = K / BLOCK;
  for (int64_t j = 0; j < nblocks; ++j) {
    __m256 w[4];
    decode_block<KIND>(row + j * block_bytes(KIND), w);
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < 4; ++c)
        acc[t][c] =
            _mm256_fmadd_ps(w[c], _mm256_loadu_ps(x + t * K + j * BLOCK + 8 * c), acc[t][c]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = finish(acc[t]);
}

template <int KIND>
void dequantize_rows(const uint8_t* data, int64_t rows, int64_t K, float* out) {
  const int64_t nblocks = K / BLOCK, stride = nblocks * block_bytes(KIND);
  __m256 w[4];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nblocks; ++j) {
      decode_block<KIND>(data + r * stride + j * block_bytes(KIND), w);
      float* ob = out + r * K + j * BLOCK;
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(ob + 8 * i, w[i]);
    }
}

// Batched inputs: dequantize R weight rows into an L1-resident panel once, then multiply
// it with the x rows T at a time. The sums keep the order above with R * T * G accumulators:
// G of the four chains per output at a time (all four for one x row, where R * T chains
// alone would wait on the FMA latency), the K axis walked in L1-sized stretches so that the
// 4 / G passes over a stretch find it in L1.
template <int R, int T, int G>
void panel_tile(const float* panel, const float* x, int64_t K, float* y, int64_t ldy) {
  constexpr int64_t STRETCH = 24 * BLOCK;
  __m256 part[R][T][4];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < 4; ++c) part[r][t][c] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += STRETCH) {
    const int64_t k1 = std::min(K, k0 + STRETCH);
    for (int c0 = 0; c0 < 4; c0 += G) {
      __m256 acc[R][T][G];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
          for (int g = 0; g < G; ++g) acc[r][t][g] = part[r][t][c0 + g];
      for (int64_t k = k0 + 8 * c0; k < k1; k += BLOCK)
        for (int g = 0; g < G; ++g) {
          __m256 xv[T];
          for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * K + k + 8 * g);
          for (int r = 0; r < R; ++r) {
            const __m256 w = _mm256_loadu_ps(panel + r * K + k + 8 * g);
            for (int t = 0; t < T; ++t) acc[r][t][g] = _mm256_fmadd_ps(w, xv[t], acc[r][t][g]);
          }
        }
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t)
          for (int g = 0; g < G; ++g) part[r][t][c0 + g] = acc[r][t][g];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = finish(part[r][t]);
}

template <int R>
void panel_rows(const float* panel, const float* x, int64_t B, int64_t K, float* y,
                int64_t ldy) {
  int64_t b = 0;
  for (; b + 3 <= B; b += 3) panel_tile<R, 3, 1>(panel, x + b * K, K, y + b * ldy, ldy);
  if (B - b == 2) panel_tile<R, 2, 2>(panel, x + b * K, K, y + b * ldy, ldy);
  else if (B - b == 1) panel_tile<R, 1, 4>(panel, x + b * K, K, y + b * ldy, ldy);
}

template <int KIND>
void exact_linear(const float* x, int64_t B, int64_t K, const uint8_t* data, int64_t N,
                  float* y, int threads) {
  const int64_t stride = K / BLOCK * block_bytes(KIND);
  if (B >= PANEL_ROWS) {
    constexpr int64_t R = 3;
    const int64_t panels = (N + R - 1) / R;
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> panel(R * K);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < panels; ++p) {
        const int64_t n = p * R, rows = std::min<int64_t>(R, N - n);
        dequantize_rows<KIND>(data + n * stride, rows, K, panel.data());
        // The panel's multiply takes long enough that the hardware prefetcher falls behind
        // the next rows' bytes; asking for them now saved ~15 % at 8 x rows.
        if (n + R < N) {
          const char* next = reinterpret_cast<const char*>(data + (n + R) * stride);
          const int64_t ahead = std::min<int64_t>(R, N - n - R) * stride;
          for (int64_t i = 0; i < ahead; i += 64) _mm_prefetch(next + i, _MM_HINT_T0);
        }
        if (rows == 3) panel_rows<3>(panel.data(), x, B, K, y + n, N);
        else if (rows == 2) panel_rows<2>(panel.data(), x, B, K, y + n, N);
        else panel_rows<1>(panel.data(), x, B, K, y + n, N);
      }
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = data + n * stride;
    if (B == 3) exact_tile<KIND, 3>(x, K, row, y + n, N);
    else if (B == 2) exact_tile<KIND, 2>(x, K, row, y + n, N);
    else exact_tile<KIND, 1>(x, K, row, y + n, N);
  }
}

// -- int8-dot ------------------------------------------------------------------------------

// x quantized per 32-block: quants, the f16-rounded scale d, and the f16-rounded d * sum(q)
// (llama.cpp's block_q8_1 ``s``; used only against Q4_1's offsets).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

void quantize_rows(const float* x, int64_t B, int64_t K, QuantizedRows& out) {
  const int64_t nblocks = B * K / BLOCK;
  out.q.resize(B * K);
  out.d.resize(nblocks);
  out.s.resize(nblocks);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t j = 0; j < nblocks; ++j) {
    const float* xb = x + j * BLOCK;
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float max_abs = _mm_cvtss_f32(m);
    const float d = max_abs / 127.0f;
    const __m256 inv = _mm256_set1_ps(max_abs != 0.0f ? 127.0f / max_abs : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[i], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    const int total = _mm_cvtsi128_si32(s4);
    // int32 -> int8 in order: packs interleave 128-bit lanes, the permute puts them back.
    __m256i q01 = _mm256_packs_epi32(q[0], q[1]), q23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i bytes = _mm256_packs_epi16(q01, q23);
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + j * BLOCK), bytes);
    out.d[j] = round_f16(d);
    out.s[j] = round_f16(d * static_cast<float>(total));
  }
}

// Eight int32 partial sums of the 32 products of signed bytes a and b (a's sign moved onto
// b so maddubs, unsigned x signed, applies).
inline __m256i dot_signed(__m256i a, __m256i b) {
  const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  return _mm256_madd_epi16(prod, _mm256_set1_epi16(1));
}

inline __m256i dot_unsigned(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

template <int KIND, int T>
void q8_tile(const QuantizedRows& xr, int64_t b0, int64_t K, const uint8_t* row, float* y,
             int64_t ldy) {
  __m256 acc[T];
  float offsets[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm256_setzero_ps();
    offsets[t] = 0.0f;
  }
  const int64_t nblocks = K / BLOCK;
  for (int64_t j = 0; j < nblocks; ++j) {
    const uint8_t* b = row + j * block_bytes(KIND);
    const float dw = f16(b);
    __m256i qw;
    if (KIND == Q8_0) {
      qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    } else {
      qw = nibbles(b + (KIND == Q4_1 ? 4 : 2));
      if (KIND == Q4_0) qw = _mm256_sub_epi8(qw, _mm256_set1_epi8(8));
    }
    const float m = KIND == Q4_1 ? f16(b + 2) : 0.0f;
    for (int t = 0; t < T; ++t) {
      const int64_t xj = (b0 + t) * nblocks + j;
      const __m256i qx =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr.q.data() + xj * BLOCK));
      const __m256i p = KIND == Q4_1 ? dot_unsigned(qw, qx) : dot_signed(qw, qx);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xr.d[xj]), _mm256_cvtepi32_ps(p), acc[t]);
      if (KIND == Q4_1) offsets[t] += m * xr.s[xj];
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]) + offsets[t];
}

template <int KIND>
void q8_linear(const float* x, int64_t B, int64_t K, const uint8_t* data, int64_t N, float* y,
               int threads) {
  QuantizedRows xr;
  quantize_rows(x, B, K, xr);
  const int64_t stride = K / BLOCK * block_bytes(KIND);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = data + n * stride;
    int64_t b = 0;
    for (; b + TILE <= B; b += TILE) q8_tile<KIND, TILE>(xr, b, K, row, y + b * N + n, N);
    switch (B - b) {
      case 3: q8_tile<KIND, 3>(xr, b, K, row, y + b * N + n, N); break;
      case 2: q8_tile<KIND, 2>(xr, b, K, row, y + b * N + n, N); break;
      case 1: q8_tile<KIND, 1>(xr, b, K, row, y + b * N + n, N); break;
      default: break;
    }
  }
}

}  // namespace

// kind: 0 Q4_0, 1 Q4_1, 2 Q8_0 (the caller checked it and the shapes).
extern "C" void block_linear_f32(const float* x, int64_t B, int64_t K, const uint8_t* data,
                                 int kind, int64_t N, float* y, int threads) {
  if (kind == Q4_0) exact_linear<Q4_0>(x, B, K, data, N, y, threads);
  else if (kind == Q4_1) exact_linear<Q4_1>(x, B, K, data, N, y, threads);
  else exact_linear<Q8_0>(x, B, K, data, N, y, threads);
}

extern "C" void block_linear_q8(const float* x, int64_t B, int64_t K, const uint8_t* data,
                                int kind, int64_t N, float* y, int threads) {
  if (kind == Q4_0) q8_linear<Q4_0>(x, B, K, data, N, y, threads);
  else if (kind == Q4_1) q8_linear<Q4_1>(x, B, K, data, N, y, threads);
  else q8_linear<Q8_0>(x, B, K, data, N, y, threads);
}

extern "C" void block_dequantize(const uint8_t* data, int kind, int64_t N, int64_t K, float* out,
                                 int threads) {
  const int64_t stride = K / BLOCK * block_bytes(kind);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (kind == Q4_0) dequantize_rows<Q4_0>(data + n * stride, 1, K, out + n * K);
    else if (kind == Q4_1) dequantize_rows<Q4_1>(data + n * stride, 1, K, out + n * K);
    else dequantize_rows<Q8_0>(data + n * stride, 1, K, out + n * K);
  }
}
