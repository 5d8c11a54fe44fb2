/*
 * agentmem codec kernels (see kernels.h for the contract).
 *
 * Layout of this file:
 *   1. scalar helpers: exact f16 <-> f32 conversion, the Hadamard butterfly, the
 *      ggml reference block quantizers;
 *   2. the portable group loops (any CPU);
 *   3. the AVX2 + F16C group loops (x86-64 with GCC or Clang, chosen at run time);
 *   4. the checksum (portable and AVX2);
 *   5. dispatch.
 *
 * The SIMD code performs exactly the same IEEE operations on every element as the
 * scalar code (same operands, same order, no FMA), so both give identical bytes.
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define AM_HAVE_X86_SIMD 1
#include <immintrin.h>
#else
#define AM_HAVE_X86_SIMD 0
#endif

/* 1/sqrt(32) rounded to binary32 (bits 0x3e3504f3); 1/sqrt(64) = 0.125 is exact. */
#define AM_HSCALE_32 0x1.6a09e6p-3f
#define AM_HSCALE_64 0.125f
/* The largest finite f16; anything with a larger magnitude (inf, NaN) becomes 0. */
#define AM_F16_MAX 65504.0f

/* ------------------------------------------------------------------------- */
/* 1. scalar helpers                                                          */
/* ------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t load_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void store_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* Exact f16 -> f32 and f32 -> f16 (round to nearest even) without branches, so the
 * portable loops vectorize on any target (Marat Dukhan's FP16 library, as in ggml).
 * They use float arithmetic on normal numbers only and so do not depend on
 * flush-to-zero modes. NaN inputs keep their payload here but are quieted by F16C;
 * the codec never lets a NaN reach a stored value (inputs are sanitized, outputs
 * saturated), so the SIMD and portable paths still give identical bytes. */
static inline float h2f(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t den = 0u - (uint32_t)(two_w < (1u << 27)); /* all ones for zero/subnormal */
    return f32_from_bits(sign | (f32_bits(denormalized) & den) | (f32_bits(normalized) & ~den));
}

static inline uint16_t f2h(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t e = shl1_w & 0xFF000000u;
    const uint32_t small = 0u - (uint32_t)(e < 0x71000000u);
    const uint32_t bias = (0x71000000u & small) | (e & ~small);
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    const uint32_t nan = 0u - (uint32_t)(shl1_w > 0xFF000000u);
    return (uint16_t)((sign >> 16) | (0x7E00u & nan) | (nonsign & ~nan));
}

/* Saturate to the finite f16 range: a value that rounds past 65504 (possible for
 * inputs near the f16 limit) comes back as +/-65504 instead of infinity. */
static inline float clamp_f16(float v) {
    /* same as _mm256_max_ps(_mm256_min_ps(v, MAX), -MAX): a NaN (only from a crafted
     * scale) becomes +65504 on every path; written with masks so the loop vectorizes */
    const uint32_t lo = 0u - (uint32_t)(v < AM_F16_MAX);
    const float a = f32_from_bits((f32_bits(v) & lo) | (f32_bits(AM_F16_MAX) & ~lo));
    const uint32_t hi = 0u - (uint32_t)(a > -AM_F16_MAX);
    return f32_from_bits((f32_bits(a) & hi) | (f32_bits(-AM_F16_MAX) & ~hi));
}

static inline float sanitize(float v) {
    const uint32_t keep = 0u - (uint32_t)(fabsf(v) <= AM_F16_MAX); /* false for inf and NaN */
    return f32_from_bits(f32_bits(v) & keep);
}

/* In-place normalized Hadamard transform of one group of R = 32 or 64 floats. */
static void fwht_scalar(float *x, int R) {
    for (int h = 1; h < R; h <<= 1) {
        for (int i = 0; i < R; i += 2 * h) {
            for (int j = i; j < i + h; j++) {
                const float a = x[j];
                const float b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    const float s = R == 64 ? AM_HSCALE_64 : AM_HSCALE_32;
    for (int j = 0; j < R; j++) {
        x[j] = x[j] * s;
    }
}

/* ggml quantize_row_q8_0_ref for one block. */
static void q8_0_block_scalar(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int j = 0; j < AM_QK; j++) {
        const float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const float id2 = id + id;
    store_u16(out, f2h(d));
    for (int j = 0; j < AM_QK; j++) {
        /* roundf(x * id) computed from w = x * 2id == 2 * (x * id) (exact):
         * floor(|v| + 0.5) == (floor(|2v|) + 1) >> 1; |v| <= 127 for finite input */
        const float w = x[j] * id2;
        const int r = ((int)fabsf(w) + 1) >> 1;
        out[2 + j] = (uint8_t)(int8_t)(w < 0.0f ? -r : r);
    }
}

/* ggml quantize_row_q4_0_ref for one block. */
static void q4_0_block_scalar(const float *x, uint8_t *out) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < AM_QK; j++) {
        const float v = x[j];
        if (amax < fabsf(v)) {
            amax = fabsf(v);
            max = v;
        }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f2h(d));
    for (int j = 0; j < AM_QK / 2; j++) {
        const float x0 = x[j] * id;
        const float x1 = x[AM_QK / 2 + j] * id;
        int i0 = (int)(x0 + 8.5f); /* in [0, 16] for finite input */
        int i1 = (int)(x1 + 8.5f);
        i0 = i0 > 15 ? 15 : (i0 < 0 ? 0 : i0);
        i1 = i1 > 15 ? 15 : (i1 < 0 ? 0 : i1);
        out[2 + j] = (uint8_t)(i0 | (i1 << 4));
    }
}

static void q8_0_deblock_scalar(const uint8_t *in, float *y) {
    const float d = h2f(load_u16(in));
    for (int j = 0; j < AM_QK; j++) {
        y[j] = (float)(int8_t)in[2 + j] * d;
    }
}

static void q4_0_deblock_scalar(const uint8_t *in, float *y) {
    const float d = h2f(load_u16(in));
    for (int j = 0; j < AM_QK / 2; j++) {
        y[j] = (float)((int)(in[2 + j] & 0x0f) - 8) * d;
        y[j + AM_QK / 2] = (float)((int)(in[2 + j] >> 4) - 8) * d;
    }
}

size_t am_encoded_size(int type, size_t n, int rot) {
    size_t bb;
    if (type == AM_TYPE_Q8_0) {
        bb = AM_Q8_0_BYTES;
    } else if (type == AM_TYPE_Q4_0) {
        bb = AM_Q4_0_BYTES;
    } else {
        return 0;
    }
    if (rot != 0 && rot != 32 && rot != 64) {
        return 0;
    }
    const size_t G = rot ? (size_t)rot : AM_QK;
    return (n + G - 1) / G * (G / AM_QK) * bb;
}

/* ------------------------------------------------------------------------- */
/* 2. portable group loops                                                    */
/* ------------------------------------------------------------------------- */

/* m little-endian f16 values between bytes and host uint16 (memcpy on little-endian hosts). */
static inline void load_f16s(uint16_t *h, const uint8_t *p, size_t m) {
#if defined(__BYTE_ORDER__) && (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    for (size_t i = 0; i < m; i++) {
        h[i] = load_u16(p + 2 * i);
    }
#else
    memcpy(h, p, 2 * m);
#endif
}

static inline void store_f16s(uint8_t *p, const uint16_t *h, size_t m) {
#if defined(__BYTE_ORDER__) && (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
    for (size_t i = 0; i < m; i++) {
        store_u16(p + 2 * i, h[i]);
    }
#else
    memcpy(p, h, 2 * m);
#endif
}

static void quantize_portable(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    const size_t G = rot ? (size_t)rot : AM_QK;
    const size_t bb = type == AM_TYPE_Q8_0 ? AM_Q8_0_BYTES : AM_Q4_0_BYTES;
    float buf[64];
    uint16_t h[64];
    for (size_t g0 = 0; g0 < n; g0 += G) {
        const size_t m = n - g0 < G ? n - g0 : G;
        load_f16s(h, src + 2 * g0, m);
        for (size_t i = m; i < G; i++) {
            h[i] = 0;
        }
        for (size_t i = 0; i < G; i++) {
            buf[i] = sanitize(h2f(h[i]));
        }
        if (rot) {
            fwht_scalar(buf, rot);
        }
        for (size_t b = 0; b < G / AM_QK; b++) {
            if (type == AM_TYPE_Q8_0) {
                q8_0_block_scalar(buf + b * AM_QK, dst);
            } else {
                q4_0_block_scalar(buf + b * AM_QK, dst);
            }
            dst += bb;
        }
    }
}

static void dequantize_portable(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    const size_t G = rot ? (size_t)rot : AM_QK;
    const size_t bb = type == AM_TYPE_Q8_0 ? AM_Q8_0_BYTES : AM_Q4_0_BYTES;
    float buf[64];
    uint16_t h[64];
    for (size_t g0 = 0; g0 < n; g0 += G) {
        const size_t m = n - g0 < G ? n - g0 : G;
        for (size_t b = 0; b < G / AM_QK; b++) {
            if (type == AM_TYPE_Q8_0) {
                q8_0_deblock_scalar(src, buf + b * AM_QK);
            } else {
                q4_0_deblock_scalar(src, buf + b * AM_QK);
            }
            src += bb;
        }
        if (rot) {
            fwht_scalar(buf, rot);
        }
        for (size_t i = 0; i < G; i++) {
            h[i] = f2h(clamp_f16(buf[i]));
        }
        store_f16s(dst + 2 * g0, h, m);
    }
}

/* ------------------------------------------------------------------------- */
/* 3. AVX2 + F16C group loops                                                 */
/* ------------------------------------------------------------------------- */

#if AM_HAVE_X86_SIMD
#define AM_TARGET __attribute__((target("avx2,f16c")))
#define AM_ALIGN32 __attribute__((aligned(32)))

/* Butterfly stages h = 1, 2, 4 inside one register: out = lo + (hi with sign flips),
 * i.e. a + b in the first half of each pair and a + (-b) == a - b in the second. */
AM_TARGET static inline __m256 fwht8(__m256 v) {
    const __m256 s1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, (int)0x80000000, 0, (int)0x80000000, 0,
                                                             (int)0x80000000, 0, (int)0x80000000));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, (int)0x80000000, (int)0x80000000, 0, 0,
                                                             (int)0x80000000, (int)0x80000000));
    const __m256 s4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, (int)0x80000000, (int)0x80000000,
                                                             (int)0x80000000, (int)0x80000000));
    __m256 lo = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(2, 2, 0, 0));
    __m256 hi = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(3, 3, 1, 1));
    v = _mm256_add_ps(lo, _mm256_xor_ps(hi, s1));
    lo = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 1, 0));
    hi = _mm256_shuffle_ps(v, v, _MM_SHUFFLE(3, 2, 3, 2));
    v = _mm256_add_ps(lo, _mm256_xor_ps(hi, s2));
    lo = _mm256_permute2f128_ps(v, v, 0x00);
    hi = _mm256_permute2f128_ps(v, v, 0x11);
    return _mm256_add_ps(lo, _mm256_xor_ps(hi, s4));
}

/* Normalized Hadamard on nreg = 4 (R = 32) or 8 (R = 64) registers. */
AM_TARGET static inline void fwht_avx2(__m256 *v, int nreg) {
    for (int r = 0; r < nreg; r++) {
        v[r] = fwht8(v[r]);
    }
    for (int hr = 1; hr < nreg; hr <<= 1) { /* h = 8, 16, 32 */
        for (int i = 0; i < nreg; i += 2 * hr) {
            for (int j = i; j < i + hr; j++) {
                const __m256 a = v[j];
                const __m256 b = v[j + hr];
                v[j] = _mm256_add_ps(a, b);
                v[j + hr] = _mm256_sub_ps(a, b);
            }
        }
    }
    const __m256 s = _mm256_set1_ps(nreg == 8 ? AM_HSCALE_64 : AM_HSCALE_32);
    for (int r = 0; r < nreg; r++) {
        v[r] = _mm256_mul_ps(v[r], s);
    }
}

AM_TARGET static inline __m256 abs8(__m256 v) {
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* roundf(v) from w = 2v (|v| < 2^22): for v >= 0, floor(v + 0.5) == (floor(2v) + 1) >> 1
 * (floor(2v) is exact: truncation of an exactly doubled value), mirrored for v < 0.
 * Integer-only after one conversion, so cheaper than roundf8. */
AM_TARGET static inline __m256i roundf8_2x(__m256 w) {
    const __m256i t = _mm256_cvttps_epi32(abs8(w));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(t, _mm256_set1_epi32(1)), 1);
    return _mm256_sign_epi32(r, _mm256_castps_si256(w));
}

AM_TARGET static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Load G = 8 * nreg f16 values, widen, sanitize. */
AM_TARGET static inline void load_group(const uint8_t *src, __m256 *v, int nreg) {
    const __m256 lim = _mm256_set1_ps(AM_F16_MAX);
    for (int r = 0; r < nreg; r++) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16 * r)));
        const __m256 ok = _mm256_cmp_ps(abs8(x), lim, _CMP_LE_OQ);
        v[r] = _mm256_and_ps(x, ok);
    }
}

/* Load G = 8 * nreg f16 values, widen, no sanitizing (caller checked they are finite). */
AM_TARGET static inline void load_group_finite(const uint8_t *src, __m256 *v, int nreg) {
    for (int r = 0; r < nreg; r++) {
        v[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16 * r)));
    }
}

/* 1 when all of the 256 f16 values at src are finite (exponent field not all ones). */
AM_TARGET static inline int all_finite_256(const uint8_t *src) {
    const __m256i mag = _mm256_set1_epi16(0x7fff);
    __m256i m = _mm256_setzero_si256();
    for (int i = 0; i < 16; i++) {
        m = _mm256_max_epu16(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(src + 32 * i)), mag));
    }
    const __m256i bad = _mm256_cmpeq_epi16(_mm256_max_epu16(m, _mm256_set1_epi16(0x7c00)), m);
    return _mm256_testz_si256(bad, bad);
}

AM_TARGET static inline void store_group(uint8_t *dst, const __m256 *v, int nreg) {
    const __m256 hi = _mm256_set1_ps(AM_F16_MAX);
    const __m256 lo = _mm256_set1_ps(-AM_F16_MAX);
    for (int r = 0; r < nreg; r++) {
        const __m256 c = _mm256_max_ps(_mm256_min_ps(v[r], hi), lo);
        _mm_storeu_si128((__m128i *)(dst + 16 * r), _mm256_cvtps_ph(c, _MM_FROUND_TO_NEAREST_INT));
    }
}

AM_TARGET static inline void q8_0_block_avx2(const __m256 *v, uint8_t *out) {
    const __m256 m = _mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3])));
    const float amax = hmax8(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 vid2 = _mm256_set1_ps(id + id);
    __m256i q[4];
    for (int r = 0; r < 4; r++) {
        q[r] = roundf8_2x(_mm256_mul_ps(v[r], vid2));
    }
    const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i b = _mm256_packs_epi16(p01, p23);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(out + 2), b);
}

AM_TARGET static inline void q4_0_block_avx2(const __m256 *v, uint8_t *out) {
    const __m256 a0 = abs8(v[0]), a1 = abs8(v[1]), a2 = abs8(v[2]), a3 = abs8(v[3]);
    const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
    float max = 0.0f;
    if (amax != 0.0f) { /* the first element whose magnitude is amax, as ggml's strict '<' scan picks */
        const __m256 vm = _mm256_set1_ps(amax);
        const uint32_t mask = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a0, vm, _CMP_EQ_OQ)) |
                              ((uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a1, vm, _CMP_EQ_OQ)) << 8) |
                              ((uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a2, vm, _CMP_EQ_OQ)) << 16) |
                              ((uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a3, vm, _CMP_EQ_OQ)) << 24);
        const int j = __builtin_ctz(mask);
        float tmp[8];
        _mm256_storeu_ps(tmp, v[j >> 3]);
        max = tmp[j & 7];
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 off = _mm256_set1_ps(8.5f);
    const __m256i lo = _mm256_setzero_si256();
    const __m256i hi = _mm256_set1_epi32(15);
    __m256i q[4];
    for (int r = 0; r < 4; r++) {
        const __m256 x = _mm256_add_ps(_mm256_mul_ps(v[r], vid), off);
        q[r] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(x), hi), lo);
    }
    const __m256i c0 = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4)); /* bytes 0..7 */
    const __m256i c1 = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4)); /* bytes 8..15 */
    __m256i p = _mm256_packs_epi32(c0, c1);
    p = _mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0));
    const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    _mm_storeu_si128((__m128i *)(out + 2), bytes);
}

AM_TARGET static inline void q8_0_deblock_avx2(const uint8_t *in, __m256 *v) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(in)));
    for (int r = 0; r < 4; r++) {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(in + 2 + 8 * r));
        v[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
    }
}

AM_TARGET static inline void q4_0_deblock_avx2(const uint8_t *in, __m256 *v) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(in)));
    const __m128i raw = _mm_loadu_si128((const __m128i *)(in + 2));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, m4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    const __m256i eight = _mm256_set1_epi32(8);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int r = 0; r < 4; r++) {
        const __m256i q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[r]), eight);
        v[r] = _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
    }
}

/* Reduce eight vectors to one: lane b of the result is OP over all lanes of m[b]
 * (OP is max or min, which are exact, so the order does not matter). */
#define AM_DEFINE_HREDUCE8(fname, OP)                                                                    \
    AM_TARGET static inline __m256 fname(const __m256 *m) {                                              \
        const __m256 a01 = OP(_mm256_unpacklo_ps(m[0], m[1]), _mm256_unpackhi_ps(m[0], m[1]));            \
        const __m256 a23 = OP(_mm256_unpacklo_ps(m[2], m[3]), _mm256_unpackhi_ps(m[2], m[3]));            \
        const __m256 a45 = OP(_mm256_unpacklo_ps(m[4], m[5]), _mm256_unpackhi_ps(m[4], m[5]));            \
        const __m256 a67 = OP(_mm256_unpacklo_ps(m[6], m[7]), _mm256_unpackhi_ps(m[6], m[7]));            \
        const __m256 b03 = OP(_mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(1, 0, 1, 0)),                       \
                              _mm256_shuffle_ps(a01, a23, _MM_SHUFFLE(3, 2, 3, 2)));                      \
        const __m256 b47 = OP(_mm256_shuffle_ps(a45, a67, _MM_SHUFFLE(1, 0, 1, 0)),                       \
                              _mm256_shuffle_ps(a45, a67, _MM_SHUFFLE(3, 2, 3, 2)));                      \
        return OP(_mm256_permute2f128_ps(b03, b47, 0x20), _mm256_permute2f128_ps(b03, b47, 0x31));        \
    }
AM_DEFINE_HREDUCE8(hmax8x8, _mm256_max_ps)
AM_DEFINE_HREDUCE8(hmin8x8, _mm256_min_ps)

/* id = d != 0 ? 1/d : 0, lane-wise (d is never NaN: inputs are sanitized). */
AM_TARGET static inline __m256 inv_or_zero(__m256 d) {
    const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    return _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nz);
}

/* Eight q8_0 blocks from 256 floats (m[b]: lane-wise |x| maxima of block b):
 * scales computed 8 at a time. */
AM_TARGET static void q8_0_chunk_avx2(const float *buf, const __m256 *m, uint8_t *dst) {
    const __m256 d = _mm256_div_ps(hmax8x8(m), _mm256_set1_ps(127.0f));
    AM_ALIGN32 float ids[8];
    AM_ALIGN32 uint16_t ds[8];
    /* 2/d: x * (2/d) == 2 * (x * (1/d)) exactly (scaling by a power of two), see roundf8_2x */
    _mm256_store_ps(ids, _mm256_add_ps(inv_or_zero(d), inv_or_zero(d)));
    _mm_store_si128((__m128i *)ds, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < 8; b++) {
        const __m256 vid = _mm256_set1_ps(ids[b]);
        uint8_t *out = dst + AM_Q8_0_BYTES * b;
        __m256i q[4];
        for (int r = 0; r < 4; r++) {
            q[r] = roundf8_2x(_mm256_mul_ps(_mm256_load_ps(buf + 32 * b + 8 * r), vid));
        }
        const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
        const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
        store_u16(out, ds[b]);
        _mm256_storeu_si256((__m256i *)(out + 2), _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm));
    }
}

/* Eight q4_0 blocks from 256 floats (mx/mn: lane-wise maxima/minima per block). The signed value of largest magnitude comes
 * from the block's max and min; only when both have that magnitude (a tie between
 * +a and -a) does the first one in block order have to be found by a scan. */
AM_TARGET static void q4_0_chunk_avx2(const float *buf, const __m256 *mx, const __m256 *mn, uint8_t *dst) {
    const __m256 vmax = hmax8x8(mx);
    const __m256 vmin = hmin8x8(mn);
    const __m256 nmin = _mm256_xor_ps(vmin, _mm256_set1_ps(-0.0f));
    AM_ALIGN32 float sel[8];
    _mm256_store_ps(sel, _mm256_blendv_ps(vmin, vmax, _mm256_cmp_ps(vmax, nmin, _CMP_GT_OQ)));
    int ties = _mm256_movemask_ps(_mm256_cmp_ps(vmax, nmin, _CMP_EQ_OQ));
    while (ties) {
        const int b = __builtin_ctz((unsigned)ties);
        ties &= ties - 1;
        const float *x = buf + 32 * b;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < AM_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        sel[b] = max; /* +0 when the block is all zeros */
    }
    const __m256 d = _mm256_div_ps(_mm256_load_ps(sel), _mm256_set1_ps(-8.0f));
    AM_ALIGN32 float ids[8];
    AM_ALIGN32 uint16_t ds[8];
    _mm256_store_ps(ids, inv_or_zero(d));
    _mm_store_si128((__m128i *)ds, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
    const __m256 off = _mm256_set1_ps(8.5f);
    const __m256i lo = _mm256_setzero_si256();
    const __m256i hi = _mm256_set1_epi32(15);
    for (int b = 0; b < 8; b++) {
        const __m256 vid = _mm256_set1_ps(ids[b]);
        uint8_t *out = dst + AM_Q4_0_BYTES * b;
        __m256i q[4];
        for (int r = 0; r < 4; r++) {
            const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(buf + 32 * b + 8 * r), vid), off);
            q[r] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvttps_epi32(x), hi), lo);
        }
        const __m256i c0 = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4));
        const __m256i c1 = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4));
        __m256i p = _mm256_packs_epi32(c0, c1);
        p = _mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0));
        store_u16(out, ds[b]);
        _mm_storeu_si128((__m128i *)(out + 2),
                         _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
    }
}

/* The quantize loop, inlined below once per (type, rot) so that both are constants. */
AM_TARGET static inline __attribute__((always_inline)) void quantize_avx2_impl(int type, const uint8_t *src,
                                                                               size_t n, uint8_t *dst, int rot) {
    const size_t G = rot ? (size_t)rot : AM_QK;
    const int nreg = (int)(G / 8);
    const size_t bb = type == AM_TYPE_Q8_0 ? AM_Q8_0_BYTES : AM_Q4_0_BYTES;
    AM_ALIGN32 float buf[256];
    uint8_t tail[128];
    __m256 v[8];
    size_t g0 = 0;
    /* whole chunks of 256 values = 8 blocks */
    __m256 m1[8], m2[8];
    for (; g0 + 256 <= n; g0 += 256) {
        const int finite = all_finite_256(src + 2 * g0);
        for (size_t k = 0; k < 256; k += G) {
            if (finite) {
                load_group_finite(src + 2 * (g0 + k), v, nreg);
            } else {
                load_group(src + 2 * (g0 + k), v, nreg);
            }
            if (rot) {
                fwht_avx2(v, nreg);
            }
            for (int r = 0; r < nreg; r++) {
                _mm256_store_ps(buf + k + 8 * r, v[r]);
            }
            for (int b = 0; b < nreg / 4; b++) {
                const __m256 *w = v + 4 * b;
                const size_t ib = k / AM_QK + (size_t)b;
                if (type == AM_TYPE_Q8_0) {
                    m1[ib] = _mm256_max_ps(_mm256_max_ps(abs8(w[0]), abs8(w[1])), _mm256_max_ps(abs8(w[2]), abs8(w[3])));
                } else {
                    m1[ib] = _mm256_max_ps(_mm256_max_ps(w[0], w[1]), _mm256_max_ps(w[2], w[3]));
                    m2[ib] = _mm256_min_ps(_mm256_min_ps(w[0], w[1]), _mm256_min_ps(w[2], w[3]));
                }
            }
        }
        if (type == AM_TYPE_Q8_0) {
            q8_0_chunk_avx2(buf, m1, dst);
        } else {
            q4_0_chunk_avx2(buf, m1, m2, dst);
        }
        dst += 8 * bb;
    }
    /* the rest group by group, the last one zero-padded */
    for (; g0 < n; g0 += G) {
        const uint8_t *s = src + 2 * g0;
        if (n - g0 < G) {
            memset(tail, 0, sizeof tail);
            memcpy(tail, s, 2 * (n - g0));
            s = tail;
        }
        load_group(s, v, nreg);
        if (rot) {
            fwht_avx2(v, nreg);
        }
        for (int b = 0; b < nreg / 4; b++) {
            if (type == AM_TYPE_Q8_0) {
                q8_0_block_avx2(v + 4 * b, dst);
            } else {
                q4_0_block_avx2(v + 4 * b, dst);
            }
            dst += bb;
        }
    }
}

AM_TARGET static void quantize_avx2(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    if (type == AM_TYPE_Q8_0) {
        if (rot == 0) {
            quantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 0);
        } else if (rot == 32) {
            quantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 32);
        } else {
            quantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 64);
        }
    } else {
        if (rot == 0) {
            quantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 0);
        } else if (rot == 32) {
            quantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 32);
        } else {
            quantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 64);
        }
    }
}

/* Dequantize one block straight to f16 when no value can exceed the f16 range, so
 * no saturation is needed: |q| <= 128 and |d| <= 511.75 (f16 bits <= 0x5FFF) for
 * q8_0, |q - 8| <= 8 and |d| <= 8188 (<= 0x6FFF) for q4_0. The test is on the f16
 * bits (inf and NaN fail it); returns 0 and does nothing when it fails. */
AM_TARGET static inline __m256 scale8(const uint8_t *in) {
    return _mm256_cvtph_ps(_mm_set1_epi16((short)load_u16(in)));
}

AM_TARGET static inline void store4_f16(uint8_t *out, __m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    _mm_storeu_si128((__m128i *)out, _mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128((__m128i *)(out + 16), _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128((__m128i *)(out + 32), _mm256_cvtps_ph(v2, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128((__m128i *)(out + 48), _mm256_cvtps_ph(v3, _MM_FROUND_TO_NEAREST_INT));
}

AM_TARGET static inline int q8_0_deblock_store_avx2(const uint8_t *in, uint8_t *out) {
    if ((load_u16(in) & 0x7fffu) > 0x5fffu) {
        return 0;
    }
    const __m256 d = scale8(in);
    /* sign-extending loads of 8 int8 each (vpmovsxbd with a memory operand) */
    const __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 2)))), d);
    const __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 10)))), d);
    const __m256 v2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 18)))), d);
    const __m256 v3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 26)))), d);
    store4_f16(out, v0, v1, v2, v3);
    return 1;
}

AM_TARGET static inline int q4_0_deblock_store_avx2(const uint8_t *in, uint8_t *out) {
    if ((load_u16(in) & 0x7fffu) > 0x6fffu) {
        return 0;
    }
    const __m256 d = scale8(in);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(in + 2));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), eight);                    /* values 0..15 */
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), eight); /* values 16..31 */
    const __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d);
    const __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d);
    const __m256 v2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d);
    const __m256 v3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d);
    store4_f16(out, v0, v1, v2, v3);
    return 1;
}

AM_TARGET static inline __attribute__((always_inline)) void dequantize_avx2_impl(int type, const uint8_t *src,
                                                                                 size_t n, uint8_t *dst, int rot) {
    const size_t G = rot ? (size_t)rot : AM_QK;
    const int nreg = (int)(G / 8);
    const size_t bb = type == AM_TYPE_Q8_0 ? AM_Q8_0_BYTES : AM_Q4_0_BYTES;
    uint8_t tail[128];
    __m256 v[8];
    size_t g0 = 0;
    if (!rot) { /* whole blocks straight to f16; a block that might overflow takes the general path */
        if (type == AM_TYPE_Q8_0) {
            for (; g0 + AM_QK <= n && q8_0_deblock_store_avx2(src, dst + 2 * g0); g0 += AM_QK) {
                src += bb;
            }
        } else {
            for (; g0 + AM_QK <= n && q4_0_deblock_store_avx2(src, dst + 2 * g0); g0 += AM_QK) {
                src += bb;
            }
        }
    }
    for (; g0 < n; g0 += G) {
        for (int b = 0; b < nreg / 4; b++) {
            if (type == AM_TYPE_Q8_0) {
                q8_0_deblock_avx2(src, v + 4 * b);
            } else {
                q4_0_deblock_avx2(src, v + 4 * b);
            }
            src += bb;
        }
        if (rot) {
            fwht_avx2(v, nreg);
        }
        if (n - g0 >= G) {
            store_group(dst + 2 * g0, v, nreg);
        } else {
            store_group(tail, v, nreg);
            memcpy(dst + 2 * g0, tail, 2 * (n - g0));
        }
    }
}

AM_TARGET static void dequantize_avx2(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    if (type == AM_TYPE_Q8_0) {
        if (rot == 0) {
            dequantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 0);
        } else if (rot == 32) {
            dequantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 32);
        } else {
            dequantize_avx2_impl(AM_TYPE_Q8_0, src, n, dst, 64);
        }
    } else {
        if (rot == 0) {
            dequantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 0);
        } else if (rot == 32) {
            dequantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 32);
        } else {
            dequantize_avx2_impl(AM_TYPE_Q4_0, src, n, dst, 64);
        }
    }
}

AM_TARGET static void hadamard_avx2(float *x, size_t n, int block) {
    const int nreg = block / 8;
    __m256 v[8];
    for (size_t g0 = 0; g0 < n; g0 += (size_t)block) {
        for (int r = 0; r < nreg; r++) {
            v[r] = _mm256_loadu_ps(x + g0 + 8 * r);
        }
        fwht_avx2(v, nreg);
        for (int r = 0; r < nreg; r++) {
            _mm256_storeu_ps(x + g0 + 8 * r, v[r]);
        }
    }
}
#endif /* AM_HAVE_X86_SIMD */

/* ------------------------------------------------------------------------- */
/* 4. checksum                                                                */
/* ------------------------------------------------------------------------- */
/*
 * mulfold64: words w_i = little-endian u64 of bytes [8i, 8i+8) (the last one
 * zero-padded), keys k_i = (i + 1) * K1 mod 2^64,
 *   acc = sum_i ( lo32(w_i ^ k_i) * hi32(w_i ^ k_i) + w_i )  mod 2^64,
 *   h = fmix64(acc ^ (n * K2)).
 * A sum is order-free, so 4 SIMD lanes, the scalar loop and numpy agree exactly;
 * the position-dependent key makes swapped words change the sum.
 */
#define AM_K1 0x9E3779B97F4A7C15ull
#define AM_K2 0xC2B2AE3D27D4EB4Full

static inline uint64_t load_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--) {
        v = (v << 8) | p[b];
    }
    return v;
}

static inline uint64_t fold_word(uint64_t w, uint64_t k) {
    const uint64_t dk = w ^ k;
    return (dk & 0xffffffffull) * (dk >> 32) + w;
}

static inline uint64_t fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* Sum of fold_word over words [i0, i1); the key of word i is (i + 1) * K1. */
static uint64_t fold_portable(const uint8_t *p, size_t i0, size_t i1) {
    uint64_t acc = 0;
    uint64_t k = (uint64_t)(i0 + 1) * AM_K1;
    for (size_t i = i0; i < i1; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
#if defined(__BYTE_ORDER__) && (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
        w = load_u64(p + 8 * i);
#endif
        acc += fold_word(w, k);
        k += AM_K1;
    }
    return acc;
}

#if AM_HAVE_X86_SIMD
AM_TARGET static uint64_t fold_avx2(const uint8_t *p, size_t n_words, size_t *done) {
    const __m256i step = _mm256_set1_epi64x((long long)(4 * AM_K1));
    __m256i k = _mm256_setr_epi64x((long long)(1 * AM_K1), (long long)(2 * AM_K1), (long long)(3 * AM_K1),
                                   (long long)(4 * AM_K1));
    __m256i acc0 = _mm256_setzero_si256();
    __m256i acc1 = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n_words; i += 8) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(p + 8 * i));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + 8 * i + 32));
        const __m256i k1 = _mm256_add_epi64(k, step);
        const __m256i d0 = _mm256_xor_si256(w0, k);
        const __m256i d1 = _mm256_xor_si256(w1, k1);
        acc0 = _mm256_add_epi64(acc0, _mm256_add_epi64(_mm256_mul_epu32(d0, _mm256_srli_epi64(d0, 32)), w0));
        acc1 = _mm256_add_epi64(acc1, _mm256_add_epi64(_mm256_mul_epu32(d1, _mm256_srli_epi64(d1, 32)), w1));
        k = _mm256_add_epi64(k1, step);
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(acc0, acc1));
    *done = i;
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

/* ------------------------------------------------------------------------- */
/* 5. dispatch                                                                */
/* ------------------------------------------------------------------------- */

static volatile int g_simd = -1; /* -1: not decided yet */

int am_simd_available(void) {
#if AM_HAVE_X86_SIMD
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

static inline int simd_on(void) {
    int s = g_simd;
    if (s < 0) {
        s = am_simd_available();
        g_simd = s;
    }
    return s;
}

int am_simd_active(void) {
    return simd_on();
}

int am_simd_set(int enabled) {
    const int prev = simd_on();
    g_simd = enabled ? am_simd_available() : 0;
    return prev;
}

int am_quantize(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    if (am_encoded_size(type, 1, rot) == 0) {
        return -1;
    }
#if AM_HAVE_X86_SIMD
    if (simd_on()) {
        quantize_avx2(type, src, n, dst, rot);
        return 0;
    }
#endif
    quantize_portable(type, src, n, dst, rot);
    return 0;
}

int am_dequantize(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot) {
    if (am_encoded_size(type, 1, rot) == 0) {
        return -1;
    }
#if AM_HAVE_X86_SIMD
    if (simd_on()) {
        dequantize_avx2(type, src, n, dst, rot);
        return 0;
    }
#endif
    dequantize_portable(type, src, n, dst, rot);
    return 0;
}

int am_hadamard_f32(float *x, size_t n, int block) {
    if ((block != 32 && block != 64) || n % (size_t)block != 0) {
        return -1;
    }
#if AM_HAVE_X86_SIMD
    if (simd_on()) {
        hadamard_avx2(x, n, block);
        return 0;
    }
#endif
    for (size_t g0 = 0; g0 < n; g0 += (size_t)block) {
        fwht_scalar(x + g0, block);
    }
    return 0;
}

uint64_t am_checksum(const uint8_t *p, size_t n) {
    const size_t n_words = n / 8;
    size_t done = 0;
    uint64_t acc = 0;
#if AM_HAVE_X86_SIMD
    if (simd_on()) {
        acc = fold_avx2(p, n_words, &done);
    }
#endif
    acc += fold_portable(p, done, n_words);
    if (n % 8) {
        uint8_t last[8] = {0};
        memcpy(last, p + 8 * n_words, n % 8);
        acc += fold_word(load_u64(last), (uint64_t)(n_words + 1) * AM_K1);
    }
    return fmix64(acc ^ ((uint64_t)n * AM_K2));
}

static int span_ok(int64_t off, int64_t len, size_t size) {
    return off >= 0 && len >= 0 && (uint64_t)off <= size && (uint64_t)len <= size - (uint64_t)off;
}

int am_run_plan(const int64_t *plan, size_t n_steps, const uint8_t *src, size_t src_size, uint8_t *dst,
                size_t dst_size, int rot, size_t *bad) {
    if (rot != 0 && rot != 32 && rot != 64) {
        *bad = 0;
        return -1;
    }
    for (size_t i = 0; i < n_steps; i++) {
        const int64_t *s = plan + AM_PLAN_COLS * i;
        const int64_t op = s[0], type = s[1];
        int ok = span_ok(s[2], s[3], src_size) && span_ok(s[4], s[5], dst_size);
        if (ok && op == AM_OP_COPY) {
            ok = s[3] == s[5];
        } else if (ok && op == AM_OP_QUANTIZE) {
            ok = (type == AM_TYPE_Q8_0 || type == AM_TYPE_Q4_0) && s[3] % 2 == 0 &&
                 (uint64_t)s[5] == am_encoded_size((int)type, (size_t)s[3] / 2, rot);
        } else if (ok && op == AM_OP_DEQUANTIZE) {
            ok = (type == AM_TYPE_Q8_0 || type == AM_TYPE_Q4_0) && s[5] % 2 == 0 &&
                 (uint64_t)s[3] == am_encoded_size((int)type, (size_t)s[5] / 2, rot);
        } else {
            ok = 0;
        }
        if (!ok) {
            *bad = i;
            return -1;
        }
    }
    for (size_t i = 0; i < n_steps; i++) {
        const int64_t *s = plan + AM_PLAN_COLS * i;
        const uint8_t *from = src + s[2];
        uint8_t *to = dst + s[4];
        if (s[0] == AM_OP_COPY) {
            memmove(to, from, (size_t)s[3]);
        } else if (s[0] == AM_OP_QUANTIZE) {
            am_quantize((int)s[1], from, (size_t)s[3] / 2, to, rot);
        } else {
            am_dequantize((int)s[1], from, (size_t)s[5] / 2, to, rot);
        }
    }
    return 0;
}
