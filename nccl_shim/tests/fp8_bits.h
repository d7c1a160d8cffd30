/* fp8 bit conversions for the shim's C test programs and the mock NCCL (C11, no libm). */
#ifndef NCCL_SHIM_TEST_FP8_BITS_H
#define NCCL_SHIM_TEST_FP8_BITS_H

#include <stdint.h>
#include <string.h>

/* OCP fp8 (NCCL's ncclFloat8e4m3: 4 exponent bits, bias 7, no infinities, 0x7f NaN; ncclFloat8e5m2: 5 exponent
 * bits, bias 15, IEEE-like) from a float, rounded to nearest even and saturating to the largest finite value as
 * NCCL and braid convert; and back. By hand on the bits, as for float16: C has no such types. */
static inline uint8_t f32_to_fp8(float f, int e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, emin = 1 - bias;
  const uint32_t max_finite = e5m2 ? 0x7bu : 0x7eu;
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  const uint32_t bexp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
  if (bexp == 0xff) return (uint8_t)(sign | (mant ? 0x7fu : max_finite)); /* NaN stays NaN; infinity saturates */
  if (bexp == 0) return sign;                                               /* zero (float subnormals: far below) */
  int exp = (int)bexp - 127;
  const uint32_t m = mant | 0x800000u;
  int shift = 23 - mbits + (exp < emin ? emin - exp : 0);
  if (shift > 24) return sign; /* below half the smallest subnormal */
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;
  uint32_t code;
  if (exp < emin) {
    code = q; /* a subnormal, or the smallest normal when rounding carried into bit mbits */
  } else {
    if (q == (2u << mbits)) q >>= 1, ++exp;
    code = ((uint32_t)(exp + bias) << mbits) | (q & ((1u << mbits) - 1));
  }
  return (uint8_t)(sign | (code > max_finite ? max_finite : code));
}

static inline float fp8_to_f32(uint8_t b, int e5m2) {
  const int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, ebits = e5m2 ? 5 : 4;
  const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  const uint32_t e = (b >> mbits) & ((1u << ebits) - 1), m = b & ((1u << mbits) - 1);
  uint32_t x;
  if (e5m2 && e == 31) {
    x = sign | 0x7f800000u | (m ? 0x400000u : 0);
  } else if (!e5m2 && e == 15 && m == 7) {
    x = sign | 0x7fc00000u;
  } else if (e == 0) {
    /* m * 2^(1 - bias - mbits): a float with that exponent times m, exact */
    const uint32_t scale_bits = (uint32_t)(1 - bias - mbits + 127) << 23;
    float scale;
    memcpy(&scale, &scale_bits, 4);
    float v = (float)m * scale;
    memcpy(&x, &v, 4);
    x |= sign;
  } else {
    x = sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits));
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

#endif
