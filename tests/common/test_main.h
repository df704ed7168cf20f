/*
 * test_main.h - the main() of a cmocka test file that runs one group.
 *
 *     MOONLET_TEST_MAIN("master_alloc", NULL, NULL,
 *                       cmocka_unit_test(test_exhaustion),
 *                       cmocka_unit_test(test_random_churn))
 *
 * defines main(), which runs the listed tests as the group "master_alloc"
 * with the group's setup and teardown (NULL for none) and returns the number
 * of tests that failed; MOONLET_TEST_CASE entries run one function for
 * several cases. A file whose main does more (several groups, a
 * fixture started around them, argv) writes its main out in full.
 */
#ifndef MOONLET_TEST_MAIN_H
#define MOONLET_TEST_MAIN_H

/* One test function run for several cases, each under its own name: a
 * cmocka test entry that runs fn with *state == arg (a pointer or NULL). */
#define MOONLET_TEST_CASE(name, fn, arg) {#name, fn, NULL, NULL, (void *)(arg)}

#define MOONLET_TEST_MAIN(name, setup, teardown, ...)                                      \
    int main(void)                                                                         \
    {                                                                                      \
        const struct CMUnitTest tests[] = {__VA_ARGS__};                                   \
        return cmocka_run_group_tests_name(name, tests, setup, teardown);                  \
    }

#endif
