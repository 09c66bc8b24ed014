// The emulated GPU's switches and reports, for tests. Each switch also has an environment
// variable, read at the first use, so that a whole program (nf-launch) runs under it:
//
//   NF_EMU_DEVICES=4                 the number of GPUs (default 2); CUDA_VISIBLE_DEVICES
//                                    selects among them by index or UUID, as on a machine
//   NF_EMU_DEVICE_MEMORY_MIB=2048    each GPU's memory (default 4096)
//   NF_EMU_THREAD_ORDER=reverse      forward (default), reverse, shuffle:<seed>
//   NF_EMU_STREAM_DELAYS=<seed>      random pauses before stream operations (streams.h)
//   NF_EMU_SERIAL_KERNELS=1          one kernel at a time per device, in issue order
//   NF_EMU_NCCL_ABORT_HANGS=1        ncclCommAbort never returns (NCCL issue 992)
//   NF_EMU_KERNEL_LOG=<file>         the kernels launched, appended at exit
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/emulation/kernel_threads.h"

namespace nf::emu {

struct Settings {
  int devices = 2;
  uint64_t device_memory_bytes = uint64_t{4096} << 20;
  OrderSetting thread_order;
  uint64_t stream_delay_seed = 0;  // 0: no delays
  bool serial_kernels = false;
  // The hazard check between streams (streams.h). It cannot tell atomics from plain writes, so
  // kernels that share memory across streams only through atomics (legal, and none of
  // core/cuda's do) need it off.
  bool hazard_checks = true;
};

// The current settings (from the environment at the first call, then as set).
Settings CurrentSettings();
void SetThreadOrder(const OrderSetting& order);
void SetStreamDelays(uint64_t seed);
void SetSerialKernels(bool on);
void SetHazardChecks(bool on);

// Host threads of this process blocked inside ncclGroupEnd, connecting to a peer that has not
// come yet.
int NcclHostsConnecting();
// Streams whose next kernel waits for its turn in the serial-kernels order.
int SerialTurnWaits();

// Every rule violation, hazard and deadlock reported so far, one line each.
std::vector<std::string> Reports();
// Forgets the reports and the devices' sticky errors (a test that provoked one goes on).
void ClearReportsAndErrors();

}  // namespace nf::emu
