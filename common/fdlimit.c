/*
 * fdlimit.c - RLIMIT_NOFILE raising and the log-line rate limit (fdlimit.h).
 * No locks.
 */
#include "fdlimit.h"

#include <sys/resource.h>
#include <time.h>

#include "log.h"
#include "monotime.h"

uint64_t moonlet_fdlimit_raise(uint64_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlim_t to = (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want) ? (rlim_t)want
                                                                         : rl.rlim_max;
        struct rlimit nl = {.rlim_cur = to, .rlim_max = rl.rlim_max};
        if (to > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &nl) == 0)
            rl.rlim_cur = to;
        if (rl.rlim_cur < want)
            ML_WARN("fdlimit", "file descriptor limit is %llu (hard limit %llu), below the %llu "
                    "this configuration needs: connection caps are lowered to fit",
                    (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                    (unsigned long long)want);
    }
    return rl.rlim_cur == RLIM_INFINITY ? want : (uint64_t)rl.rlim_cur;
}

bool moonlet_ratelimit_allow(moonlet_ratelimit *r, uint32_t interval_ms, uint64_t *suppressed)
{
    int64_t now = (int64_t)moonlet_mono_ms();
    int_fast64_t next = atomic_load(&r->next_ms);
    if (now < next || !atomic_compare_exchange_strong(&r->next_ms, &next, now + interval_ms)) {
        atomic_fetch_add(&r->held, 1);
        return false;
    }
    *suppressed = atomic_exchange(&r->held, 0);
    return true;
}
