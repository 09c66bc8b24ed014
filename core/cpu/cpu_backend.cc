#include "core/cpu/cpu_backend.h"

#include "core/cpu/blas.h"

namespace nf::cpu {

CpuBackend::CpuBackend() { UseSingleThreadedBlas(); }

}  // namespace nf::cpu
