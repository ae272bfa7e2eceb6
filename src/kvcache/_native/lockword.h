/* The pool lock's word (header word ``lock_word``; its layout in poollock.c): what the
 * lock's module and a put that takes the word itself (put.c) share. */
#ifndef KVCACHE_LOCKWORD_H
#define KVCACHE_LOCKWORD_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WAITERS (UINT64_C(1) << 31) /* a waiter sleeps on the word (the futex is the low half) */

/* Free the word (a release store) and wake one sleeper if any is marked. */
static void lock_word_free(_Atomic uint64_t *word) {
    uint64_t was = atomic_exchange_explicit(word, 0, memory_order_release);
    if (was & WAITERS) syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

#endif
