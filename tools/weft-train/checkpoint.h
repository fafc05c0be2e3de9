// weft-train's checkpoints: every rank's shard of the parameters and Adam moments, and a
// manifest naming the mesh, the model and the step, so that a run can restart from them on
// the same mesh (bitwise) or on fewer data-parallel ranks (re-sharded).
//
// Layout: DIR/step-NNNNNNNN/rank-R.bin (one per rank of the mesh that wrote it) and
// DIR/step-NNNNNNNN/manifest, which rank 0 writes once every rank's file is in place; a
// step directory without a manifest is incomplete and ignored. Every file is written to a
// temporary name, synced and renamed, so a killed writer leaves no partial file behind.
// The data loader needs no state of its own: make_batch(config, step) depends on the seed
// and the step alone, so the manifest's step is its position and the seed its RNG state.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed.h"
#include "model.h"

namespace weft::train {

// A checkpoint that cannot be written or used; the message names the option and the file.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The mesh a checkpoint was written on (its world is dp × tp × cp × pp).
struct CheckpointMesh {
  int dp = 1, tp = 1, cp = 1, pp = 1, zero = 0;
  bool sp = false;
  int ep = 1;
};

// One rank's optimizer state: per parameter (param_specs order) its tp slice of the values
// and of Adam's first and second moments, with the shard it slices; NaN where the rank
// holds none of it (another ZeRO shard's elements, another pipeline stage's layers).
struct ShardState {
  int step = 0;  // Adam steps taken (the next step's bias correction is step + 1)
  Shard shard;
  std::vector<std::vector<float>> values, m, v;
};

// The whole model's state in the global (unsharded) layout, from all ranks' shards.
struct GlobalState {
  int step = 0;
  std::vector<std::vector<float>> values, m, v;
};

// Writes this rank's shard for `step` (before the barrier that precedes the manifest).
void save_shard(const std::string& dir, int rank, const ShardState& state);
// Rank 0, after every rank's save_shard: makes the step's checkpoint complete.
void save_manifest(const std::string& dir, int step, int world, const CheckpointMesh& mesh,
                   const Config& config);

// The newest complete checkpoint's step in dir, if any.
std::optional<int> newest_checkpoint(const std::string& dir);

// Reads the checkpoint of `step`: checks that its model is config's and its mesh is mesh
// but for dp (which may differ: every element is read from the ranks that hold it), reads every
// rank's shard (the dead ones' too), checks that the replicas agree bit for bit and that every
// element is present, and returns the global state.
GlobalState load_checkpoint(const std::string& dir, int step, const Config& config,
                            const CheckpointMesh& mesh);

}  // namespace weft::train
