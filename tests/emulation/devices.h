// The emulated GPUs a process sees: NF_EMU_DEVICES physical devices, of which
// CUDA_VISIBLE_DEVICES selects and orders the visible ones, by index or UUID, as the CUDA
// runtime does (the list ends at the first entry that names no device; an entry naming a
// device twice hides every device). Device properties are an H100's where code reads them.
#pragma once

#include <cuda_runtime.h>

namespace nf::emu {

// The devices this process sees.
int VisibleDeviceCount();
// The calling host thread's current device (cudaSetDevice), 0 at first.
int& CurrentDevice();
// The physical device behind visible device `device` (its UUID's last byte).
int PhysicalDevice(int device);
void FillProperties(int device, cudaDeviceProp* properties);

}  // namespace nf::emu
