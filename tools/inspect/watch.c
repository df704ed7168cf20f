/*
 * watch.c - `moonlet-inspect watch stats|segments`: the same snapshot as the
 * one-shot command, refreshed every --interval seconds.
 *
 * On a terminal each refresh moves the cursor home, clears the screen and
 * redraws (cut to the terminal's height, so the redraw never scrolls); the
 * frame is rendered into memory first and written at once, so the screen
 * never shows half a frame.  When stdout is not a terminal (a pipe, a file)
 * the refreshes are plain blocks, each under a "---" header line, with no
 * escape sequences.  With --json each refresh is one JSON document.
 *
 * A failed refresh (the master restarting, say) shows the error in its frame
 * and the watch goes on; MasterClient reconnects on the next call.  SIGINT or
 * SIGTERM ends the watch cleanly (exit 0) at the next refresh or during the
 * wait; --count N ends it after N refreshes.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "inspect.h"
#include "moonlet/error.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* Sleeps up to `seconds`; returns early when a signal asked to stop. */
static void wait_interval(double seconds)
{
    struct timespec left = {.tv_sec = (time_t)seconds,
                            .tv_nsec = (long)((seconds - floor(seconds)) * 1e9)};
    while (!g_stop && nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
}

/* Writes a frame to the terminal: home, clear, then at most rows-1 lines. */
static void draw_tty(const char *frame, size_t len, int rows)
{
    fputs("\033[H\033[2J", stdout);
    size_t lines = 0, cut = len;
    for (size_t i = 0; i < len; i++) {
        if (frame[i] != '\n')
            continue;
        lines++;
        if (rows > 2 && lines == (size_t)rows - 2 && cut == len)
            cut = i + 1;
    }
    if (rows > 2 && lines > (size_t)rows - 1) {
        fwrite(frame, 1, cut, stdout);
        printf("... %zu more lines (enlarge the terminal to see them)\n", lines - (rows - 2));
    } else {
        fwrite(frame, 1, len, stdout);
    }
}

int inspect_cmd_watch(const inspect_opts *o, int argc, char **argv)
{
    inspect_render_fn render = NULL;
    if (argc == 1 && strcmp(argv[0], "stats") == 0)
        render = inspect_render_stats;
    else if (argc == 1 && strcmp(argv[0], "segments") == 0)
        render = inspect_render_segments;
    if (!render) {
        inspect_error("watch: expected 'stats' or 'segments', got '%s'", argc ? argv[0] : "");
        return INSPECT_EXIT_USAGE;
    }
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex)
        return ex;

    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigemptyset(&sa.sa_mask); /* no SA_RESTART: the wait and the RPC return at once */
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    bool tty = isatty(fileno(stdout)) && !o->json;
    int last_rc = MOONLET_OK;
    for (uint64_t n = 1; !g_stop; n++) {
        char *frame = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&frame, &len);
        if (!f) {
            inspect_error("out of memory");
            last_rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
        int width = inspect_term_width(stdout);
        if (!o->json) {
            char when[16];
            time_t now = time(NULL);
            struct tm tm;
            strftime(when, sizeof(when), "%H:%M:%S", localtime_r(&now, &tm));
            fprintf(f, "%s%s every %.1fs, master %s, refresh %llu at %s\n\n",
                    tty ? "" : "--- ", argv[0], o->interval_s, o->master,
                    (unsigned long long)n, when);
        }
        last_rc = render(mc, o, f, width);
        if (last_rc && o->json) /* keep stdout a sequence of JSON documents */
            inspect_error("%s: %s (%d)", argv[0], moonlet_strerror(last_rc), last_rc);
        else if (last_rc)
            fprintf(f, "%s: %s (%d); retrying every %.1fs\n", argv[0],
                    moonlet_strerror(last_rc), last_rc, o->interval_s);
        fclose(f);
        if (g_stop) { /* interrupted mid-refresh: do not draw a half-failed frame */
            free(frame);
            break;
        }
        if (tty)
            draw_tty(frame, len, inspect_term_rows(stdout));
        else
            fprintf(stdout, "%s%s", n > 1 && !o->json ? "\n" : "", frame);
        fflush(stdout);
        free(frame);
        if (o->count && n >= o->count)
            break;
        wait_interval(o->interval_s);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    moonlet_mc_destroy(mc);
    if (g_stop)
        return INSPECT_EXIT_OK;
    return last_rc ? INSPECT_EXIT_RUNTIME : INSPECT_EXIT_OK;
}
