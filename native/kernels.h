/*
 * agentmem codec kernels: ggml q8_0 / q4_0 block quantization of f16 rows, an
 * optional normalized Hadamard rotation, and a fast 64-bit checksum.
 *
 * Every function exists in two builds that give IDENTICAL bytes:
 *   - a portable C build (any architecture, any compiler), and
 *   - an x86-64 AVX2 + F16C build selected at run time by a cpuid check.
 * The numpy implementation in agentmem/codec/kernels.py produces the same bytes as
 * well; the test suite compares all three bit for bit.
 *
 * Exactness rules (shared with the numpy code):
 *   - all arithmetic is IEEE binary32, no fused multiply-add (built with
 *     -ffp-contract=off), f32 -> f16 conversions round to nearest even;
 *   - non-finite f16 inputs (inf, NaN) are quantized as 0 (ggml leaves them
 *     undefined); for finite inputs the blocks equal ggml's quantize_row_q8_0_ref
 *     and quantize_row_q4_0_ref bit for bit;
 *   - elements are processed in groups of G = max(32, rot) values, the last group
 *     zero-padded; with rot = 32 or 64 each group is multiplied by the Sylvester
 *     Hadamard matrix H_rot scaled by 1/sqrt(rot) (a fixed butterfly order) before
 *     quantization, and again (its own inverse) after dequantization.
 */
#ifndef AGENTMEM_KERNELS_H
#define AGENTMEM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AM_QK 32          /* elements per ggml q8_0 / q4_0 block */
#define AM_Q8_0_BYTES 34  /* f16 scale + 32 int8 */
#define AM_Q4_0_BYTES 18  /* f16 scale + 16 bytes of nibbles */

/* ggml type ids, also used as codec ids in the encoded format */
#define AM_TYPE_F16 1
#define AM_TYPE_Q4_0 2
#define AM_TYPE_Q8_0 8

/* Number of encoded bytes for n f16 elements (0 for an unknown type / rot). */
size_t am_encoded_size(int type, size_t n, int rot);

/* Quantize n f16 values (little-endian, any alignment) into
 * am_encoded_size(type, n, rot) bytes. type is AM_TYPE_Q8_0 or AM_TYPE_Q4_0;
 * rot is 0, 32 or 64. Returns 0 on success, -1 on a bad argument. */
int am_quantize(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot);

/* Inverse of am_quantize: writes exactly n f16 values. */
int am_dequantize(int type, const uint8_t *src, size_t n, uint8_t *dst, int rot);

/* In-place normalized Hadamard transform of n float32 values in groups of
 * `block` (32 or 64); n must be a multiple of block. Returns 0 or -1. */
int am_hadamard_f32(float *x, size_t n, int block);

/* A transcode plan is n_steps rows of AM_PLAN_COLS int64:
 *   op, type, src_off, src_len, dst_off, dst_len
 * op AM_OP_COPY copies src_len == dst_len bytes; AM_OP_QUANTIZE turns src_len / 2
 * f16 values into dst_len == am_encoded_size(type, src_len / 2, rot) bytes;
 * AM_OP_DEQUANTIZE turns src_len == am_encoded_size(type, dst_len / 2, rot) bytes
 * into dst_len / 2 f16 values. Every step is checked against the buffer bounds
 * before any is run. Returns 0, or -1 with *bad set to the first invalid step. */
#define AM_PLAN_COLS 6
#define AM_OP_COPY 0
#define AM_OP_QUANTIZE 1
#define AM_OP_DEQUANTIZE 2
int am_run_plan(const int64_t *plan, size_t n_steps, const uint8_t *src, size_t src_size, uint8_t *dst,
                size_t dst_size, int rot, size_t *bad);

/* The "mulfold64" checksum of n bytes (see codec.py for the definition). */
uint64_t am_checksum(const uint8_t *p, size_t n);

/* 1 when the AVX2+F16C kernels are in use, 0 for the portable ones. */
int am_simd_active(void);
/* 1 when the CPU (and this build) supports the AVX2+F16C kernels. */
int am_simd_available(void);
/* Enable (1) or disable (0) the SIMD kernels; returns the previous setting.
 * Enabling has no effect where they are unavailable. Meant for tests. */
int am_simd_set(int enabled);

#ifdef __cplusplus
}
#endif

#endif /* AGENTMEM_KERNELS_H */
