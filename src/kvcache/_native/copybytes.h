/* memcpy for a value's bytes, without glibc's slow case; and a copy round the cache.
 *
 * For copies of a few KiB up to about a megabyte glibc's memcpy uses `rep movsb`, which
 * runs 4-10x slower where the target lies 1-63 bytes past the source modulo a 4 KiB
 * page (4K aliasing: each load seems to depend on a store just made). A value lies
 * key_len + header_len bytes into its page, so a caller's buffer meets that case about
 * once in 64 (measured: a 256 KiB get_into 163 us instead of 26-29 us). There a loop
 * of 16-byte loads and plain stores copies at about the speed of the fast case. */
#ifndef KVCACHE_COPYBYTES_H
#define KVCACHE_COPYBYTES_H

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h> /* SSE2 in every x86-64; AVX2 where the CPU has it */
#endif

/* Copies shorter than the first never take `rep movsb`; from the second up glibc copies
 * by its own loop, which handles the case and beats ours (here `rep movsb` stops
 * between 256 and 512 KiB; at 4 MiB that loop took 138 us where ours took 197). */
#define ALIASED_COPY_MIN_BYTES 256
#define ALIASED_COPY_MAX_BYTES (512 << 10)

/* From this many bytes up a copy lets other Python threads run (the GIL released):
 * below it releasing costs more than the work. */
#define RELEASE_GIL_BYTES 65536

#if defined(__x86_64__)
/* One 64-byte line by the widest loads, then stores, of each instruction set (AVX2's two
 * 32-byte ones: 5-10% faster streamed, 1.2x in sumcopy.h's stripe loop): plain stores,
 * or ``streamed`` round the cache (the target then line-aligned). */
static inline void copy_line_sse2(char *to, const char *from, int streamed) {
    __m128i block[4];
    for (int i = 0; i < 4; i++)
        block[i] = _mm_loadu_si128((const __m128i *)(const void *)(from + 16 * i));
    for (int i = 0; i < 4; i++) {
        __m128i *at = (__m128i *)(void *)(to + 16 * i);
        if (streamed) _mm_stream_si128(at, block[i]);
        else _mm_storeu_si128(at, block[i]);
    }
}

__attribute__((target("avx2"))) static inline void copy_line_avx2(char *to, const char *from,
                                                                  int streamed) {
    __m256i block[2];
    for (int i = 0; i < 2; i++)
        block[i] = _mm256_loadu_si256((const __m256i *)(const void *)(from + 32 * i));
    for (int i = 0; i < 2; i++) {
        __m256i *at = (__m256i *)(void *)(to + 32 * i);
        if (streamed) _mm256_stream_si256(at, block[i]);
        else _mm256_storeu_si256(at, block[i]);
    }
}

/* Whole lines by copy_line_sse2, the tail by memcpy. */
static inline void copy_blocks_sse2(char *to, const char *from, size_t length, int streamed) {
    size_t done = 0;
    for (; done + 64 <= length; done += 64) copy_line_sse2(to + done, from + done, streamed);
    memcpy(to + done, from + done, length - done);
}
#endif

static inline void copy_bytes(char *to, const char *from, size_t length) {
#if defined(__x86_64__)
    if (length >= ALIASED_COPY_MIN_BYTES && length < ALIASED_COPY_MAX_BYTES &&
        (((uintptr_t)to - (uintptr_t)from - 1) & 4095) < 63) {
        copy_blocks_sse2(to, from, length, 0);
        return;
    }
#endif
    memcpy(to, from, length);
}

/* A copy round the CPU's cache (non-temporal stores), for a target not read again soon:
 * it is not read from memory before it is written, and it does not push other data out
 * of the cache. */
#if defined(__x86_64__)
/* Streamed stores write whole cache lines only: a line written in part by them and in
 * part by plain stores is read from memory for the plain ones and flushed in pieces by
 * the streamed ones. So the bytes before the first line boundary go by memcpy (and
 * copy_summing ends its stretches on a line). A key of 2 bytes, leaving the value 2
 * bytes past a line's start, made a 1 MiB put 20% slower when the copy only aligned its
 * target to 16 bytes (docs/performance.md, "Copy and checksum in one pass"). */
static inline size_t copy_to_line(char **to, const char **from, size_t length) {
    size_t skew = (64 - ((uintptr_t)*to & 63)) & 63;
    if (skew > length) skew = length;
    memcpy(*to, *from, skew);
    *to += skew;
    *from += skew;
    return length - skew;
}

static void copy_streaming_sse2(char *to, const char *from, size_t length) {
    length = copy_to_line(&to, &from, length);
    copy_blocks_sse2(to, from, length, 1);
}

__attribute__((target("avx2"))) static void copy_streaming_avx2(char *to, const char *from,
                                                                size_t length) {
    length = copy_to_line(&to, &from, length);
    size_t done = 0;
    for (; done + 64 <= length; done += 64) copy_line_avx2(to + done, from + done, 1);
    memcpy(to + done, from + done, length - done);
}

/* The CPU's best, chosen when the module loads (KVCACHE_NO_AVX2: SSE2 always, which the
 * tests build to run both). */
static void (*copy_streaming)(char *, const char *, size_t) = copy_streaming_sse2;

static void choose_copy(void) {
#ifndef KVCACHE_NO_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) copy_streaming = copy_streaming_avx2;
#endif
}
/* Streamed stores are ordered by nothing else: fence them before the entry is published
 * (or the read that made them answers). */
#define STREAMED_STORES_FENCE() _mm_sfence()
#else
#define copy_streaming(to, from, length) copy_bytes(to, from, length)
#define STREAMED_STORES_FENCE() ((void)0)
static void choose_copy(void) {}
#endif

#endif
