/* transfer_main.c - `moonlet-bench-transfer`: runs the transfer benchmark on
 * its own (moonlet-bench dispatches the same function as a subcommand). */
#include "transfer.h"

int main(int argc, char **argv)
{
    return moonlet_bench_transfer(argc, argv);
}
