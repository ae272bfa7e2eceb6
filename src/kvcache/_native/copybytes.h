/* memcpy for a value's bytes, without glibc's slow case.
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
#include <emmintrin.h> /* SSE2: in every x86-64 */
#endif

/* Copies shorter than the first never take `rep movsb`; from the second up glibc copies
 * by its own loop, which handles the case and beats ours (here `rep movsb` stops
 * between 256 and 512 KiB; at 4 MiB that loop took 138 us where ours took 197). */
#define ALIASED_COPY_MIN_BYTES 256
#define ALIASED_COPY_MAX_BYTES (512 << 10)

#if defined(__x86_64__)
/* Whole 64-byte blocks by four 16-byte loads, then four stores, and the tail by memcpy:
 * plain stores here; ``streamed``, round the cache (copysum.c's streamed copy, whose
 * target is then line-aligned). */
static inline void copy_blocks_sse2(char *to, const char *from, size_t length, int streamed) {
    size_t done = 0;
    for (; done + 64 <= length; done += 64) {
        __m128i block[4];
        for (int i = 0; i < 4; i++)
            block[i] = _mm_loadu_si128((const __m128i *)(const void *)(from + done + 16 * i));
        for (int i = 0; i < 4; i++) {
            __m128i *at = (__m128i *)(void *)(to + done + 16 * i);
            if (streamed) _mm_stream_si128(at, block[i]);
            else _mm_storeu_si128(at, block[i]);
        }
    }
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

#endif
