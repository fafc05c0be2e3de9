// Rank, size and rendezvous from the launcher's environment: weftrun
// (WEFT_*), torchrun (RANK/WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*), PMIx
// (PMIX_RANK) or Slurm (SLURM_PROCID/SLURM_NTASKS), with the root from
// WEFT_ROOT or MASTER_ADDR/MASTER_PORT (MASTER_PORT+1 under torchrun, whose
// store holds MASTER_PORT).
#pragma once

#include "common/status.h"
#include "core/bootstrap.h"
#include "core/communicator.h"

namespace weft {

struct LaunchInfo {
  int rank = -1;
  int nranks = -1;
  RootAddress root;         // where rank 0 listens, and the secret all present
  const char* source = "";  // which launcher's variables were used
};

Status read_launch_env(LaunchInfo* out);
// The wildcard address of the same family and port as `root`, for rank 0's listener.
Status listen_address_for(const SocketAddress& root, SocketAddress* out);

}  // namespace weft
