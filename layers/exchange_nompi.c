// The world of a build without MPI (MOE_MPI=OFF): one rank; an mpirun launch of R > 1 ranks
// is refused, since every rank would train alone and write the same run.
#include "layers/exchange.h"

moe_status moe_comm_world(moe_comm **out) {
    *out = NULL;
    const int n = moe_launch_size();
    if (n > 1)
        return moe_error(MOE_EINVAL,
                         "exchange: started as one of %d ranks (mpirun), but this "
                         "build has no MPI: configure with -DMOE_MPI=ON (Debian: libopenmpi-dev) "
                         "or run one process",
                         n);
    return moe_comm_single(out);
}
