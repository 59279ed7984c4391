/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests on machines without GPUs. It implements
 * the few NVML entry points tau calls, with the documented signatures, and reports TAU_FAKE_NVML_GPUS
 * devices (default 2). The scenario-driven test NVML of the GPU health work grows from this. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  unsigned long long total, free, used;
} FakeMemory;

static unsigned gpu_count(void) {
  const char* n = getenv("TAU_FAKE_NVML_GPUS");
  return n ? (unsigned)atoi(n) : 2u;
}

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  snprintf(buf, len, "%s", "999.99-fake");
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = gpu_count();
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned idx, void** dev) {
  if (idx >= gpu_count()) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *dev = (void*)(unsigned long)(idx + 1);
  return 0;
}
int nvmlDeviceGetUUID(void* dev, char* buf, unsigned len) {
  snprintf(buf, len, "GPU-fake-%04lu", (unsigned long)dev - 1);
  return 0;
}
int nvmlDeviceGetName(void* dev, char* buf, unsigned len) {
  (void)dev;
  snprintf(buf, len, "%s", "Fake H200");
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* dev, FakeMemory* mem) {
  (void)dev;
  mem->total = 141ull << 30;
  mem->free = mem->total;
  mem->used = 0;
  return 0;
}
