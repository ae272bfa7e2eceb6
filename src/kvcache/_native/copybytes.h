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

/* Copies shorter than this never take `rep movsb`. */
#define ALIASED_COPY_MIN_BYTES 256

static inline void copy_bytes(char *to, const char *from, size_t length) {
#if defined(__x86_64__)
    if (length >= ALIASED_COPY_MIN_BYTES && (((uintptr_t)to - (uintptr_t)from - 1) & 4095) < 63) {
        size_t done = 0;
        for (; done + 64 <= length; done += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(from + done));
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(from + done + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(from + done + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(from + done + 48));
            _mm_storeu_si128((__m128i *)(void *)(to + done), a);
            _mm_storeu_si128((__m128i *)(void *)(to + done + 16), b);
            _mm_storeu_si128((__m128i *)(void *)(to + done + 32), c);
            _mm_storeu_si128((__m128i *)(void *)(to + done + 48), d);
        }
        memcpy(to + done, from + done, length - done);
        return;
    }
#endif
    memcpy(to, from, length);
}

#endif
