/* clock.c - monotonic lease clock with a test override; see clock.h. */
#include "clock.h"
#include "monotime.h"

#include <stdatomic.h>
#include <time.h>

static _Atomic uint64_t g_fake_ns; /* 0: use the real clock */

uint64_t moonlet_clock_real_ns(void)
{
    return moonlet_mono_ns();
}

uint64_t moonlet_clock_now_ns(void)
{
    uint64_t fake = atomic_load_explicit(&g_fake_ns, memory_order_relaxed);
    return fake ? fake : moonlet_clock_real_ns();
}

void moonlet_clock_set_fake(uint64_t ns) { atomic_store(&g_fake_ns, ns); }

void moonlet_clock_advance(uint64_t delta_ns) { atomic_fetch_add(&g_fake_ns, delta_ns); }
