/* kvstored._copy: copy a buffer and compute its CRC-32C in one pass.
 *
 * A same-host read copies each object out of the node's mapped DRAM segment into the
 * caller's buffer and then checks the copy's CRC-32C. Done as two passes (a memoryview
 * copy at memcpy speed, then the crc32c package over the copy) a batch of 1 MiB objects
 * ran at about half of memcpy's speed on the 2-vCPU dev machine: the second pass reads
 * every byte again, from L3 or memory once the batch outgrows L2. Here each 8-byte word
 * is loaded once, fed to the CRC and stored, so the check costs what the CRC instruction
 * adds to a copy that is bound by memory anyway.
 *
 * copy_crc32c(dst, src, value=0) copies all of src into the start of dst (which must
 * hold at least as many bytes; the two must not overlap) and returns the CRC-32C of the
 * bytes copied, continuing the finished CRC ``value`` as the crc32c package does: so the
 * CRC of an object in pieces is chained over them. The bytes checked are the bytes
 * stored: each word goes through one register on its way. The GIL is released for large
 * copies.
 *
 * The CRC: three streams of the SSE4.2 crc32 instruction over adjacent blocks (one stream
 * is bound by the instruction's latency, three by its throughput), joined by shifting a
 * stream's CRC over the length of the blocks after it (a table per block length, built
 * at import, as in Mark Adler's crc32c.c); slicing by 8 and memcpy where SSE4.2 is
 * missing. tests/test_checksum.py holds it to the crc32c package.
 *
 * The stable ABI of 3.11 (PyObject_GetBuffer), like batch.c.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "../sdk/crc32c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

/* The blocks of the three streams: long ones for most of an object, short ones for its
   tail. A block of LONG bytes fits L1 three times over. */
#define LONG 8192
#define SHORT 256
/* Copies at least this large release the GIL (below it the hand-off costs more). */
#define RELEASE_GIL 65536

static uint32_t long_shift[4][256], short_shift[4][256];

/* -- operators over GF(2): what feeding zero bytes does to a CRC register ------------- */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1)
            sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++)
        square[n] = gf2_times(mat, mat[n]);
}

/* The operator that feeds `len` zero bytes (a power of two) through the register. */
static void zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    odd[0] = CRC32C_POLY; /* one zero bit */
    uint32_t row = 1;
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    do {
        gf2_square(even, odd);
        len >>= 1;
        if (len == 0)
            return;
        gf2_square(odd, even);
        len >>= 1;
    } while (len);
    memcpy(even, odd, sizeof odd);
}

static void make_shift(uint32_t shift[4][256], size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 0; k < 4; k++)
            shift[k][n] = gf2_times(op, n << (8 * k));
}

static inline uint32_t apply(uint32_t shift[4][256], uint32_t crc)
{
    return shift[0][crc & 0xff] ^ shift[1][(crc >> 8) & 0xff] ^ shift[2][(crc >> 16) & 0xff]
         ^ shift[3][crc >> 24];
}

static void make_table(void)
{
    crc32c_make_table();
    make_shift(long_shift, LONG);
    make_shift(short_shift, SHORT);
}

/* -- the copies (on the register: no inversion here) ----------------------------------- */

/* memcpy, then slicing by 8 (sdk/crc32c.h): the portable fallback. */
static uint32_t copy_crc_soft(uint32_t crc, unsigned char *dst, const unsigned char *src,
                              size_t n)
{
    memcpy(dst, src, n);
    return crc32c_soft(crc, dst, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1

/* Three streams over the three blocks of `block` bytes at src, copied as they go. */
#define THREE_STREAMS(block, shift)                                                        \
    while (n >= 3 * (block)) {                                                             \
        uint64_t c1 = 0, c2 = 0;                                                           \
        const unsigned char *end = src + (block);                                          \
        do {                                                                               \
            uint64_t a, b, d;                                                              \
            memcpy(&a, src, 8);                                                            \
            memcpy(&b, src + (block), 8);                                                  \
            memcpy(&d, src + 2 * (block), 8);                                              \
            c0 = __builtin_ia32_crc32di(c0, a);                                            \
            c1 = __builtin_ia32_crc32di(c1, b);                                            \
            c2 = __builtin_ia32_crc32di(c2, d);                                            \
            memcpy(dst, &a, 8);                                                            \
            memcpy(dst + (block), &b, 8);                                                  \
            memcpy(dst + 2 * (block), &d, 8);                                              \
            src += 8;                                                                      \
            dst += 8;                                                                      \
        } while (src < end);                                                               \
        c0 = apply(shift, (uint32_t)c0) ^ (uint32_t)c1;                                    \
        c0 = apply(shift, (uint32_t)c0) ^ (uint32_t)c2;                                    \
        src += 2 * (block);                                                                \
        dst += 2 * (block);                                                                \
        n -= 3 * (block);                                                                  \
    }

__attribute__((target("sse4.2")))
static uint32_t copy_crc_hw(uint32_t crc, unsigned char *dst, const unsigned char *src,
                            size_t n)
{
    uint64_t c0 = crc;
    THREE_STREAMS(LONG, long_shift)
    THREE_STREAMS(SHORT, short_shift)
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, src, 8);
        c0 = __builtin_ia32_crc32di(c0, w);
        memcpy(dst, &w, 8);
        src += 8;
        dst += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c0;
    while (n--) {
        unsigned char byte = *src++;
        c32 = __builtin_ia32_crc32qi(c32, byte);
        *dst++ = byte;
    }
    return c32;
}

/* Folding with VPCLMULQDQ (AVX-512): 256 bytes a step in four 512-bit accumulators, each
   lane of 128 bits multiplied forward over the distance it moves (carry-less, modulo the
   polynomial: "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Intel),
   then the four folded into one 128-bit value and that fed to the crc32 instruction,
   which reduces it. Bound by memory, not by the CRC: the copy and the check of a batch
   come close to a plain copy's speed. */
#define HAVE_FOLD 1

static uint64_t fold_2048[2], fold_512[2], fold_128[2];

/* x^n modulo the CRC-32C polynomial, as the 64-bit bit-reflected operand of a carry-less
   multiply (the coefficient of x^d in bit 63 - d). */
static uint64_t xpow_reflected(unsigned n)
{
    uint32_t r = 1;
    for (unsigned i = 0; i < n; i++)
        r = (r & 0x80000000u) ? (r << 1) ^ 0x1EDC6F41u : r << 1;
    uint64_t out = 0;
    for (int d = 0; d < 32; d++)
        if (r >> d & 1)
            out |= 1ull << (63 - d);
    return out;
}

/* The constants that move a 128-bit lane forward by `bits`: its first 64 bits (the low
   quadword) by x^(bits + 64), its last by x^bits, each one less for the product's shift. */
static void fold_constants(uint64_t k[2], unsigned bits)
{
    k[0] = xpow_reflected(bits + 63);
    k[1] = xpow_reflected(bits - 1);
}

#define FOLD512(a, k, next)                                                                \
    _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128((a), (k), 0x00),                   \
                              _mm512_clmulepi64_epi128((a), (k), 0x11), (next), 0x96)
#define FOLD128(a, k, next)                                                                \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128((a), (k), 0x00),                      \
                                _mm_clmulepi64_si128((a), (k), 0x11)), (next))

/* The register after the first n - n % 256 bytes (n >= 256), copied to dst if not NULL;
   advances the pointers and the count past them. */
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))
static uint32_t fold_hw(uint32_t crc, unsigned char **pdst, const unsigned char **psrc,
                        size_t *pn)
{
    const unsigned char *src = *psrc;
    unsigned char *dst = *pdst;
    size_t n = *pn;
    const __m512i k2048 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)fold_2048[1], (long long)fold_2048[0]));
    const __m512i k512 = _mm512_broadcast_i32x4(
        _mm_set_epi64x((long long)fold_512[1], (long long)fold_512[0]));
    const __m128i k128 = _mm_set_epi64x((long long)fold_128[1], (long long)fold_128[0]);
    __m512i a0 = _mm512_loadu_si512(src), a1 = _mm512_loadu_si512(src + 64),
            a2 = _mm512_loadu_si512(src + 128), a3 = _mm512_loadu_si512(src + 192);
    if (dst) {
        _mm512_storeu_si512(dst, a0);
        _mm512_storeu_si512(dst + 64, a1);
        _mm512_storeu_si512(dst + 128, a2);
        _mm512_storeu_si512(dst + 192, a3);
        dst += 256;
    }
    /* The register's 32 bits enter as the message's first 32. */
    a0 = _mm512_xor_si512(a0, _mm512_maskz_set1_epi32(1, (int)crc));
    src += 256;
    n -= 256;
    while (n >= 256) {
        __m512i b0 = _mm512_loadu_si512(src), b1 = _mm512_loadu_si512(src + 64),
                b2 = _mm512_loadu_si512(src + 128), b3 = _mm512_loadu_si512(src + 192);
        if (dst) {
            _mm512_storeu_si512(dst, b0);
            _mm512_storeu_si512(dst + 64, b1);
            _mm512_storeu_si512(dst + 128, b2);
            _mm512_storeu_si512(dst + 192, b3);
            dst += 256;
        }
        a0 = FOLD512(a0, k2048, b0);
        a1 = FOLD512(a1, k2048, b1);
        a2 = FOLD512(a2, k2048, b2);
        a3 = FOLD512(a3, k2048, b3);
        src += 256;
        n -= 256;
    }
    a1 = FOLD512(a0, k512, a1);
    a2 = FOLD512(a1, k512, a2);
    a3 = FOLD512(a2, k512, a3);
    __m128i x = _mm512_extracti32x4_epi32(a3, 0);
    x = FOLD128(x, k128, _mm512_extracti32x4_epi32(a3, 1));
    x = FOLD128(x, k128, _mm512_extracti32x4_epi32(a3, 2));
    x = FOLD128(x, k128, _mm512_extracti32x4_epi32(a3, 3));
    uint64_t c = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = __builtin_ia32_crc32di(c, (uint64_t)_mm_extract_epi64(x, 1));
    *psrc = src;
    if (*pdst)
        *pdst = dst;
    *pn = n;
    return (uint32_t)c;
}
#endif

static int hw_crc, hw_fold;

/* What crc32c(data, value) of the crc32c package gives for the bytes copied. */
static uint32_t copy_crc32c_c(uint32_t value, void *dst, const void *src, size_t n)
{
#ifdef HAVE_HW_CRC
    uint32_t crc = ~value;
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (hw_fold && n >= 256)
        crc = fold_hw(crc, &d, &s, &n);
    if (hw_crc)
        return ~copy_crc_hw(crc, d, s, n);
    return ~copy_crc_soft(crc, d, s, n);
#else
    return ~copy_crc_soft(~value, dst, src, n);
#endif
}

/* crc32c(data, value) of the crc32c package, without a copy; 0 (and *ok 0) where the
   folding instructions are missing: the caller then uses the package. */
static uint32_t crc32c_c(uint32_t value, const void *data, size_t n, int *ok)
{
#ifdef HAVE_FOLD
    if (hw_fold) {
        uint32_t crc = ~value;
        unsigned char *none = NULL;
        const unsigned char *p = data;
        if (n >= 256)
            crc = fold_hw(crc, &none, &p, &n);
        *ok = 1;
        return ~crc32c_hw(crc, p, n);
    }
#endif
    (void)value, (void)data, (void)n;
    *ok = 0;
    return 0;
}

/* -- Python ------------------------------------------------------------------------------ */

static PyObject *copy_crc32c(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer dst, src;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "w*y*|k:copy_crc32c", &dst, &src, &value))
        return NULL;
    PyObject *result = NULL;
    if (src.len > dst.len) {
        PyErr_Format(PyExc_ValueError,
                     "copy_crc32c: the destination holds %zd bytes, the source %zd",
                     dst.len, src.len);
        goto done;
    }
    const char *d = dst.buf, *s = src.buf;
    if (src.len && d < s + src.len && s < d + src.len) {
        PyErr_SetString(PyExc_ValueError, "copy_crc32c: the buffers overlap");
        goto done;
    }
    uint32_t crc;
    if (src.len >= RELEASE_GIL) {
        Py_BEGIN_ALLOW_THREADS
        crc = copy_crc32c_c((uint32_t)value, dst.buf, src.buf, (size_t)src.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = copy_crc32c_c((uint32_t)value, dst.buf, src.buf, (size_t)src.len);
    }
    result = PyLong_FromUnsignedLong(crc);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *crc(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer data;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k:crc32c", &data, &value))
        return NULL;
    int ok;
    uint32_t result;
    if (data.len >= RELEASE_GIL) {
        Py_BEGIN_ALLOW_THREADS
        result = crc32c_c((uint32_t)value, data.buf, (size_t)data.len, &ok);
        Py_END_ALLOW_THREADS
    } else {
        result = crc32c_c((uint32_t)value, data.buf, (size_t)data.len, &ok);
    }
    PyBuffer_Release(&data);
    if (!ok)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(result);
}

static PyMethodDef methods[] = {
    {"crc32c", crc, METH_VARARGS,
     "crc32c(data, value=0) -> the CRC-32C of data by folding (see copy.c), or None where "
     "this CPU lacks the instructions (use the crc32c package then)."},
    {"copy_crc32c", copy_crc32c, METH_VARARGS,
     "copy_crc32c(dst, src, value=0) -> the CRC-32C of src, copied into the start of dst "
     "(see copy.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copy",
    "A copy and its CRC-32C in one pass (see copy.c).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__copy(void)
{
    make_table();
#ifdef HAVE_HW_CRC
    hw_crc = __builtin_cpu_supports("sse4.2");
    hw_fold = hw_crc && __builtin_cpu_supports("avx512f")
              && __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("pclmul");
    fold_constants(fold_2048, 2048);
    fold_constants(fold_512, 512);
    fold_constants(fold_128, 128);
#endif
    return PyModule_Create(&module);
}
