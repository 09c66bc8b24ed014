#include "tests/emulation/nccl_fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>

namespace nf::emu {
namespace {

constexpr uint32_t kMagic = 0x4e46454e;  // "NFEN"
constexpr size_t kHeaderBytes = (sizeof(FabricHeader) + 4095) / 4096 * 4096;
constexpr size_t kSegmentBytes = kHeaderBytes + kMaxNcclRanks * kNcclChunkBytes +
                                 kMaxNcclRanks * kMaxNcclRanks * kNcclChunkBytes;

void* Map(int fd) {
  void* base = mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return base == MAP_FAILED ? nullptr : base;
}

}  // namespace

bool Fabric::Create(std::string* name) {
  std::random_device random;
  char text[64];
  std::snprintf(text, sizeof(text), "/nf-emu-nccl-%d-%08x%08x", getpid(), random(), random());
  const int fd = shm_open(text, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;
  // Sparse: only the pages a transfer touches take memory.
  void* base = ftruncate(fd, kSegmentBytes) == 0 ? Map(fd) : nullptr;
  close(fd);
  if (base == nullptr) {
    shm_unlink(text);
    return false;
  }
  auto* header = static_cast<FabricHeader*>(base);
  std::memset(header, 0, sizeof(FabricHeader));
  pthread_mutexattr_t mutex_attributes;
  pthread_mutexattr_init(&mutex_attributes);
  pthread_mutexattr_setpshared(&mutex_attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&mutex_attributes, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&header->mutex, &mutex_attributes);
  pthread_condattr_t cond_attributes;
  pthread_condattr_init(&cond_attributes);
  pthread_condattr_setpshared(&cond_attributes, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&cond_attributes, CLOCK_MONOTONIC);
  pthread_cond_init(&header->changed, &cond_attributes);
  header->slot.ticket = 0;
  __atomic_store_n(&header->magic, kMagic, __ATOMIC_RELEASE);
  munmap(base, kSegmentBytes);
  *name = text;
  return true;
}

Fabric* Fabric::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* base = Map(fd);
  close(fd);
  if (base == nullptr) return nullptr;
  if (__atomic_load_n(&static_cast<FabricHeader*>(base)->magic, __ATOMIC_ACQUIRE) != kMagic) {
    munmap(base, kSegmentBytes);
    return nullptr;
  }
  return new Fabric(name, base);  // mapped for the process's life: handles may outlive comms
}

unsigned char* Fabric::region(int rank) {
  return reinterpret_cast<unsigned char*>(header_) + kHeaderBytes + rank * kNcclChunkBytes;
}

unsigned char* Fabric::channel_buffer(int from, int to) {
  return reinterpret_cast<unsigned char*>(header_) + kHeaderBytes +
         kMaxNcclRanks * kNcclChunkBytes + (from * kMaxNcclRanks + to) * kNcclChunkBytes;
}

void Fabric::Lock() {
  // A rank that died holding the lock leaves the segment as it was: each step below keeps
  // the shared state consistent at every release, so the next owner goes on.
  if (pthread_mutex_lock(&header_->mutex) == EOWNERDEAD) pthread_mutex_consistent(&header_->mutex);
}

void Fabric::Unlock() { pthread_mutex_unlock(&header_->mutex); }

void Fabric::Wait() {
  timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_nsec += 20'000'000;
  if (deadline.tv_nsec >= 1'000'000'000) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1'000'000'000;
  }
  if (pthread_cond_timedwait(&header_->changed, &header_->mutex, &deadline) == EOWNERDEAD) {
    pthread_mutex_consistent(&header_->mutex);
  }
}

void Fabric::Broadcast() { pthread_cond_broadcast(&header_->changed); }

void Fabric::Unlink() { shm_unlink(name_.c_str()); }

}  // namespace nf::emu
