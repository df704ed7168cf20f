/*
 * keepalive.c - the miss counting of the RDMA keepalive (see keepalive.h).
 * Pure functions of the caller's state; no locks.
 */
#include "keepalive.h"

uint64_t moonlet_keepalive_interval(uint32_t period_ms)
{
    uint64_t i = period_ms / MOONLET_KEEPALIVE_MISSES;
    return i ? i : 1;
}

void moonlet_keepalive_init(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms)
{
    k->due_ms = now_ms + period_ms;
    k->outstanding = 0;
    k->misses = 0;
}

moonlet_keepalive_action moonlet_keepalive_tick(moonlet_keepalive *k, uint64_t now_ms,
                                                uint32_t period_ms)
{
    if (now_ms < k->due_ms)
        return MOONLET_KEEPALIVE_WAIT;
    if (k->outstanding == 0)
        return MOONLET_KEEPALIVE_PROBE; /* idle period over */
    /* an interval passed with no acknowledgement: one miss.  The next is
     * due an interval after this one's deadline (a late tick does not push
     * the schedule back), but never before an interval from now: however
     * late the call (a stalled caller), it counts one miss. */
    if (++k->misses >= MOONLET_KEEPALIVE_MISSES)
        return MOONLET_KEEPALIVE_GONE;
    uint64_t iv = moonlet_keepalive_interval(period_ms);
    k->due_ms = k->due_ms + iv > now_ms ? k->due_ms + iv : now_ms + iv;
    return k->outstanding < MOONLET_KEEPALIVE_MISSES ? MOONLET_KEEPALIVE_PROBE
                                                     : MOONLET_KEEPALIVE_WAIT;
}

void moonlet_keepalive_posted(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms)
{
    if (k->outstanding++ == 0)
        k->due_ms = now_ms + moonlet_keepalive_interval(period_ms); /* the first miss deadline */
}

void moonlet_keepalive_acked(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms)
{
    if (k->outstanding)
        k->outstanding--;
    k->misses = 0;
    /* with probes still in flight (their acknowledgements follow at once on
     * RC) the next miss is an interval away; idle, the next probe a period */
    k->due_ms = now_ms + (k->outstanding ? moonlet_keepalive_interval(period_ms) : period_ms);
}
