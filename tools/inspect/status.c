/*
 * status.c - `moonlet-inspect status`: the HA state of every master named
 * by --master (a list with HA): each one's role (single, standby, leader),
 * whether it serves, its epoch and the leader it names, from one Hello per
 * master, sent to exactly that master (no following), and its replication
 * (a leader: its hot standby, in sync or not, the lag; a standby: the leader
 * it follows, records applied, whether its state is consistent).  Then one
 * line: the leader and its epoch.  Exit 0 when at least one master answered.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "log.h"
#include "moonlet/error.h"
#include "tls.h"
#include "token.h"

static const inspect_col STATUS_COLS[] = {
    {"MASTER", INSPECT_LEFT, 15, true, false}, {"ROLE", INSPECT_LEFT, 0, false, false},
    {"SERVING", INSPECT_LEFT, 0, false, false}, {"EPOCH", INSPECT_RIGHT, 0, false, false},
    {"TERMS", INSPECT_RIGHT, 0, false, true},  {"LEADER", INSPECT_LEFT, 15, true, false},
    {"REPLICATION", INSPECT_LEFT, 20, true, false},
};
#define NSTATUS_COLS ((int)(sizeof(STATUS_COLS) / sizeof(STATUS_COLS[0])))

int inspect_cmd_status(const inspect_opts *o, int argc, char **argv)
{
    char *token = NULL;
    if (o->token_file && moonlet_token_read(o->token_file, &token) != MOONLET_OK) {
        inspect_error("--auth-token-file %s: no token in its first line", o->token_file);
        return INSPECT_EXIT_USAGE;
    }
    moonlet_tls_ctx *tls = NULL;
    int tex = inspect_tls(o, &tls);
    if (tex) {
        moonlet_token_free(token);
        return tex;
    }
    char *list = strdup(o->master), *save = NULL;
    cJSON *doc = cJSON_CreateObject();
    cJSON *arr = doc ? cJSON_AddArrayToObject(doc, "masters") : NULL;
    inspect_table *t = o->json ? NULL : inspect_table_new(STATUS_COLS, NSTATUS_COLS,
                                                          inspect_term_width(stdout));
    if (!list || !arr || (!o->json && !t)) {
        free(list);
        cJSON_Delete(doc);
        inspect_table_free(t);
        moonlet_token_free(token);
        moonlet_tls_ctx_unref(tls);
        inspect_error("out of memory");
        return INSPECT_EXIT_RUNTIME;
    }
    moonlet_master_client_opts mo = {.timeout_ms = 3000, .auth_token = token, .tls = tls};
    unsigned answered = 0;
    uint64_t leader_epoch = 0;
    char leader[256] = "";
    for (char *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        cJSON *h = NULL;
        int rc = moonlet_mc_hello_at(a, &mo, &h);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "master", a);
        char epoch[24] = "-", terms[24] = "-", repl[320] = "-";
        const char *role = "-", *serving = "-", *named = "";
        if (rc == MOONLET_OK) {
            answered++;
            role = inspect_json_str(h, "role");
            bool sv = cJSON_IsTrue(cJSON_GetObjectItem(h, "serving"));
            serving = sv ? "yes" : "no";
            named = inspect_json_str(h, "leader");
            uint64_t ep = inspect_json_u64(h, "epoch");
            snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long)ep);
            snprintf(terms, sizeof(terms), "%llu", (unsigned long long)inspect_json_u64(h, "terms"));
            cJSON_AddStringToObject(m, "role", role);
            cJSON_AddBoolToObject(m, "serving", sv);
            inspect_json_add_u64(m, "epoch", ep);
            inspect_json_add_u64(m, "terms", inspect_json_u64(h, "terms"));
            cJSON_AddStringToObject(m, "leader", named);
            cJSON_AddStringToObject(m, "advertise", inspect_json_str(h, "advertise"));
            if (*named && ep >= leader_epoch) {
                leader_epoch = ep;
                snprintf(leader, sizeof(leader), "%s", named);
            }
            const cJSON *r = cJSON_GetObjectItem(h, "replication");
            const cJSON *fl = cJSON_GetObjectItem(h, "following");
            if (cJSON_IsObject(r) && !strcmp(role, "leader")) {
                const char *sb = inspect_json_str(r, "standby");
                bool in = cJSON_IsTrue(cJSON_GetObjectItem(r, "in_sync"));
                snprintf(repl, sizeof(repl), "%s %s, lag %llu ms", *sb ? sb : "no standby",
                         !*sb ? "" : in ? "in sync" : "OUT OF SYNC",
                         (unsigned long long)inspect_json_u64(r, "lag_ms"));
                cJSON_AddItemToObject(m, "replication", cJSON_Duplicate(r, true));
            }
            if (cJSON_IsObject(fl)) {
                snprintf(repl, sizeof(repl), "following %s: %llu/%llu records%s",
                         inspect_json_str(fl, "leader"),
                         (unsigned long long)inspect_json_u64(fl, "applied"),
                         (unsigned long long)inspect_json_u64(fl, "leader_next"),
                         cJSON_IsTrue(cJSON_GetObjectItem(fl, "consistent")) ? "" : " (catching up)");
                cJSON_AddItemToObject(m, "following", cJSON_Duplicate(fl, true));
            }
            if (!strcmp(role, "single") && !*leader) {
                snprintf(leader, sizeof(leader), "%s", a);
            }
        } else {
            cJSON_AddStringToObject(m, "error", rc == MOONLET_ERR_INVALID_PARAMS
                                                    ? "no Hello (a master older than HA)"
                                                    : moonlet_strerror(rc));
            role = rc == MOONLET_ERR_INVALID_PARAMS ? "old" : "unreachable";
        }
        cJSON_AddItemToArray(arr, m);
        if (t) {
            const char *cells[] = {a, role, serving, epoch, terms, *named ? named : "-", repl};
            inspect_table_add(t, cells);
        }
        cJSON_Delete(h);
    }
    free(list);
    moonlet_token_free(token);
    moonlet_tls_ctx_unref(tls);
    cJSON_AddStringToObject(doc, "leader", leader);
    inspect_json_add_u64(doc, "epoch", leader_epoch);
    int ret = answered ? INSPECT_EXIT_OK : INSPECT_EXIT_RUNTIME;
    if (o->json) {
        int jr = inspect_json_print(stdout, doc);
        return ret ? ret : jr;
    }
    cJSON_Delete(doc);
    inspect_table_flush(t, stdout);
    inspect_table_free(t);
    if (*leader)
        printf("leader %s, epoch %llu\n", leader, (unsigned long long)leader_epoch);
    else
        printf("no leader known\n");
    if (!answered)
        inspect_error("no master answered");
    return ret;
}
