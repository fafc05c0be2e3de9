// The portable variant: plain C++, one element at a time, for any CPU.
#include "core/reduce/kernels.h"

namespace weft::reduce {

namespace {
struct ScalarIsa {
  static constexpr int kBytes = 0;
};
}  // namespace

constinit const KernelTable kScalarKernels = Kernels<ScalarIsa>::table();

}  // namespace weft::reduce
