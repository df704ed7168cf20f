/*
 * drain.c - `moonlet-inspect drain TARGET` and `undrain TARGET`: the Drain /
 * Undrain admin calls (master/store/repair.c).  A draining segment takes no new
 * replica, and the master re-replicates its objects on other hosts; its
 * OBJECTS count in `moonlet-inspect segments` falls to 0 when the drain is
 * done, and stopping its node then loses nothing.  TARGET is a segment id, a
 * segment name, an endpoint or a store node's client id.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>

#include "inspect.h"
#include "moonlet/error.h"

static int drain_cmd(const inspect_opts *o, const char *target, bool on)
{
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex)
        return ex;
    uint32_t n = 0;
    int rc = moonlet_mc_drain(mc, target, on, &n);
    moonlet_mc_destroy(mc);
    if (rc)
        return inspect_rpc_failed(on ? "Drain" : "Undrain", rc);
    if (o->json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "target", target);
        cJSON_AddBoolToObject(doc, "draining", on);
        inspect_json_add_u64(doc, "changed_segments", n);
        return inspect_json_print(stdout, doc) ? INSPECT_EXIT_RUNTIME : INSPECT_EXIT_OK;
    }
    printf("%s: %" PRIu32 " segment%s %s\n", target, n, n == 1 ? "" : "s",
           on ? "now draining (see `moonlet-inspect segments` for progress)"
              : "no longer draining");
    return INSPECT_EXIT_OK;
}

int inspect_cmd_drain(const inspect_opts *o, int argc, char **argv)
{
    (void)argc;
    return drain_cmd(o, argv[0], true);
}

int inspect_cmd_undrain(const inspect_opts *o, int argc, char **argv)
{
    (void)argc;
    return drain_cmd(o, argv[0], false);
}
