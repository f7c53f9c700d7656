/* CRC-32C (Castagnoli) as the crc32c package computes it, for the C modules that check
 * records and copies: sdk/record_check.c and native/copy.c include this one copy.
 *
 * The functions work on the CRC register (no inversion): a caller turns the crc32c
 * package's finished ``value`` into a register with ~value and back with ~register.
 * crc32c_make_table() must run once (at module import) before crc32c_soft; crc32c_hw
 * needs SSE4.2, which the caller checks with __builtin_cpu_supports("sse4.2").
 *
 * It lives with the SDK, the lowest layer that needs it: the record format and its
 * checksum are the SDK's, and the SDK builds without the rest of kvstored.
 */
#ifndef KVSTORED_CRC32C_H
#define KVSTORED_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[8][256];

static void crc32c_make_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][n] = (crc32c_table[t - 1][n] >> 8)
                                 ^ crc32c_table[0][crc32c_table[t - 1][n] & 0xff];
}

/* Slicing by 8: the portable fallback. */
static uint32_t crc32c_soft(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t (*table)[256] = crc32c_table;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff]
            ^ table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff]
            ^ table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff]
            ^ table[0][(w >> 56) & 0xff];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC32C_HAVE_HW 1
/* One stream of the SSE4.2 crc32 instruction, a word at a time. */
__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

#endif /* KVSTORED_CRC32C_H */
