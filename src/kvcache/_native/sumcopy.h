/* XXH3-64 over bytes while copying them, each line loaded once: the sum of a verified
 * read or a put costs about nothing beside the copy of a value from memory.
 *
 * Summing a 16 KiB stretch and then copying it from the cache left the memory idle while
 * it copied: a verified 1 MiB read from memory took 1.45x the raw copy. Here the copy of
 * each 64-byte stripe rides in xxh3's own stripe loop (its accumulate step, the same
 * arithmetic as XXH3_64bits_update, so the sums agree with the xxhash module's), with
 * the source prefetched 2 KiB ahead: 0.95-1.02x the raw copy at 1 and 4 MiB, 1.08x
 * prefetching 384 bytes ahead (xxh3's own distance), 1.17x not at all (measured on this
 * 2-core AMD EPYC VM, docs/performance.md "Copy and checksum in one pass").
 *
 * It follows XXH3_update of the vendored xxhash.h (0.8.x; the digest reads the same
 * state), with the stripes taken straight from the input copied as they are summed;
 * bytes that pass through the state's buffer are copied by copy_bytes. */
#ifndef KVCACHE_SUMCOPY_H
#define KVCACHE_SUMCOPY_H

#include "copybytes.h"

#if defined(__x86_64__) || defined(__i386__)
/* xxhash inline, its long-input sums picking SSE2, AVX2 or AVX-512 at run time: a
 * verified 64 KiB get sums at twice the speed of the SSE2 build (measured) */
#include "xxh_x86dispatch.c"
#include "xxh_x86dispatch.h"
#else
#define XXH_INLINE_ALL /* NEON on aarch64, chosen when compiling */
#include "xxhash.h"
#endif

/* Bytes summed and then copied per step where the copy cannot ride in the sum (a copy
 * streamed round the cache, a CPU without the stripe loop here): small enough to stay in
 * L1 between the sum and the copy. */
#define STRETCH ((size_t)16384)

#if defined(__x86_64__)
#define SUM_COPY_PREFETCH 2048

/* Where the copy reads next: the input up to ``end``, then the ``next_length`` bytes at
 * ``next`` (the piece the caller copies after this one, a value's next page: prefetching
 * on into it keeps the memory busy across the pieces, 10% of a paged read). */
typedef struct {
    const xxh_u8 *end, *next;
    size_t next_length;
} Ahead;

XXH_FORCE_INLINE void prefetch_ahead(const Ahead *ahead, const xxh_u8 *in) {
    const xxh_u8 *at = in + SUM_COPY_PREFETCH;
    if (at < ahead->end)
        _mm_prefetch((const char *)at, _MM_HINT_T0);
    else if ((size_t)(at - ahead->end) < ahead->next_length)
        _mm_prefetch((const char *)ahead->next + (at - ahead->end), _MM_HINT_T0);
}

/* The stripe loop for one instruction set: xxh3's accumulate for ``stripes`` stripes of
 * ``from`` (secret stepping by XXH_SECRET_CONSUME_RATE), each stripe stored to ``to`` from
 * the registers its sum just loaded it into (copybytes.h's copy_line: the compiler keeps
 * one load), prefetching ``ahead``. */
#define DEFINE_SUM_COPY(suffix, target)                                                       \
    XXH_FORCE_INLINE target void accumulate_copying_##suffix(                                \
        xxh_u64 *acc, const xxh_u8 *from, char *to, const xxh_u8 *secret, size_t stripes,    \
        const Ahead *ahead) {                                                                 \
        for (size_t n = 0; n < stripes; n++) {                                                \
            const xxh_u8 *in = from + n * XXH_STRIPE_LEN;                                     \
            prefetch_ahead(ahead, in);                                                        \
            XXH3_accumulate_512_##suffix(acc, in, secret + n * XXH_SECRET_CONSUME_RATE);      \
            copy_line_##suffix(to + n * XXH_STRIPE_LEN, (const char *)in, 0);                \
        }                                                                                     \
    }                                                                                         \
                                                                                              \
    /* XXH3_consumeStripes, copying: whole blocks scramble the accumulators after them. */   \
    XXH_FORCE_INLINE target const xxh_u8 *consume_copying_##suffix(                          \
        XXH3_state_t *state, xxh_u64 *acc, const xxh_u8 *from, char **to, size_t stripes,    \
        const xxh_u8 *secret, const Ahead *ahead) {                                           \
        size_t per_block = state->nbStripesPerBlock, so_far = state->nbStripesSoFar;          \
        while (stripes > 0) {                                                                 \
            size_t take = per_block - so_far < stripes ? per_block - so_far : stripes;        \
            accumulate_copying_##suffix(acc, from, *to,                                       \
                                        secret + so_far * XXH_SECRET_CONSUME_RATE, take, ahead); \
            from += take * XXH_STRIPE_LEN;                                                    \
            *to += take * XXH_STRIPE_LEN;                                                     \
            stripes -= take;                                                                  \
            so_far += take;                                                                   \
            if (so_far == per_block) {                                                        \
                XXH3_scrambleAcc_##suffix(acc, secret + state->secretLimit);                  \
                so_far = 0;                                                                   \
            }                                                                                 \
        }                                                                                     \
        state->nbStripesSoFar = so_far;                                                       \
        return from;                                                                          \
    }                                                                                         \
                                                                                              \
    /* XXH3_update(state, from, length) copying ``from`` to ``to`` meanwhile. */              \
    static target void sum_copy_##suffix(XXH3_state_t *state, const char *source, char *to,  \
                                         size_t length, const char *next, size_t next_length) { \
        const xxh_u8 *from = (const xxh_u8 *)source, *end = from + length;                    \
        const Ahead ahead = {end, (const xxh_u8 *)next, next ? next_length : 0};              \
        if (length <= XXH3_INTERNALBUFFER_SIZE - state->bufferedSize) { /* buffered only */  \
            XXH3_64bits_update(state, from, length);                                          \
            copy_bytes(to, source, length);                                                   \
            return;                                                                           \
        }                                                                                     \
        const xxh_u8 *secret =                                                                \
            state->extSecret == NULL ? state->customSecret : state->extSecret;                \
        XXH_ALIGN(XXH_ACC_ALIGN) xxh_u64 acc[XXH_ACC_NB];                                     \
        memcpy(acc, state->acc, sizeof acc);                                                  \
        state->totalLen += length;                                                            \
        if (state->bufferedSize) { /* fill the buffer and sum it as XXH3_update does */      \
            size_t fill = XXH3_INTERNALBUFFER_SIZE - state->bufferedSize;                     \
            memcpy(state->buffer + state->bufferedSize, from, fill);                          \
            copy_bytes(to, (const char *)from, fill);                                         \
            from += fill;                                                                     \
            to += fill;                                                                       \
            XXH3_consumeStripes(acc, &state->nbStripesSoFar, state->nbStripesPerBlock,        \
                                state->buffer, XXH3_INTERNALBUFFER_SIZE / XXH_STRIPE_LEN,    \
                                secret, state->secretLimit, XXH3_accumulate_##suffix,         \
                                XXH3_scrambleAcc_##suffix);                                   \
            state->bufferedSize = 0;                                                          \
        }                                                                                     \
        if (end - from > XXH3_INTERNALBUFFER_SIZE) { /* all but the last stripe's bytes */   \
            size_t stripes = (size_t)(end - 1 - from) / XXH_STRIPE_LEN;                       \
            from = consume_copying_##suffix(state, acc, from, &to, stripes, secret, &ahead);  \
            memcpy(state->buffer + sizeof state->buffer - XXH_STRIPE_LEN, from - XXH_STRIPE_LEN, \
                   XXH_STRIPE_LEN);                                                           \
        }                                                                                     \
        size_t rest = (size_t)(end - from); /* buffered for the next update or the digest */ \
        memcpy(state->buffer, from, rest);                                                    \
        copy_bytes(to, (const char *)from, rest);                                             \
        state->bufferedSize = (XXH32_hash_t)rest;                                             \
        memcpy(state->acc, acc, sizeof acc);                                                  \
    }

DEFINE_SUM_COPY(sse2, XXH_TARGET_SSE2)
DEFINE_SUM_COPY(avx2, XXH_TARGET_AVX2)

/* The CPU's best, chosen when the module loads (KVCACHE_NO_AVX2: SSE2 always, which the
 * tests build to run both). */
static void (*sum_copy)(XXH3_state_t *, const char *, char *, size_t, const char *,
                        size_t) = sum_copy_sse2;

static void choose_sum_copy(void) {
#ifndef KVCACHE_NO_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) sum_copy = sum_copy_avx2;
#endif
}
#else
static void sum_copy(XXH3_state_t *state, const char *from, char *to, size_t length,
                     const char *next, size_t next_length) {
    (void)next;
    (void)next_length;
    for (size_t done = 0; done < length; done += STRETCH) {
        size_t step = length - done < STRETCH ? length - done : STRETCH;
        XXH3_64bits_update(state, from + done, step);
        copy_bytes(to + done, from + done, step);
    }
}

static void choose_sum_copy(void) {}
#endif

#endif
