/* A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for tests on machines without GPUs (these
 * machines have no driver). It implements the NVML entry points tau calls, with the documented
 * signatures, and plays a scenario: devices, counters, XID events over time, a GPU falling off the
 * bus. The scenario format is documented in docs/fake-nvml.md.
 *
 *   TAU_FAKE_NVML_GPUS      number of devices when no scenario says otherwise (default 2), all
 * healthy TAU_FAKE_NVML_SCENARIO  a scenario file; time in it is measured from the first nvmlInit
 *
 * Built twice: as libnvidia-ml-fake.so, and with TAU_FAKE_NVML_OLD as libnvidia-ml-fake-old.so,
 * which lacks the entry points newer drivers added (so that dlsym fails for them, as with an older
 * driver). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

enum {
  kSuccess = 0,
  kInvalidArgument = 2,
  kNotSupported = 3,
  kNotFound = 6,
  kInsufficientSize = 7,
  kInsufficientPower = 8,
  kTimeout = 10,
  kCorruptedInforom = 14,
  kGpuIsLost = 15,
  kUnknown = 999,
};

#define MAX_GPUS 64
#define MAX_LINKS 18
#define MAX_FAILS 8
#define MAX_SETS 8
#define MAX_QUEUE 1024
#define XID_EVENT 0x8ull

typedef struct {
  char func[96];
  int code;
} Fail;

typedef struct {
  char uuid[96], name[96], bus_id[32];
  unsigned long long mem_total, mem_used;
  unsigned util_gpu, util_mem, temp, temp_slowdown, temp_shutdown;
  unsigned power_mw, power_limit_mw, power_default_mw, sm_clock, mem_clock;
  int pstate;
  unsigned long long clocks_reasons;
  int ecc_current, ecc_pending;
  unsigned long long ecc[2][2]; /* [corrected, uncorrected][volatile, aggregate] */
  unsigned retired[2];
  int retired_pending;
  unsigned remap_cor, remap_unc, remap_pending, remap_failed;
  unsigned pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, pcie_replay;
  unsigned nvlinks;
  int link_active[MAX_LINKS];
  unsigned long long link_err[MAX_LINKS][4];
  unsigned recovery_action;
  int inforom_corrupt, insufficient_power, lost;
  unsigned mig_current, mig_pending, mig_instances, mig_max;
  unsigned long long supported_events;
  Fail fails[MAX_FAILS];
  int nfails;
} Gpu;

typedef struct {
  long long at_ms;
  int line;
  int gpu; /* -1: every GPU; -2: not a GPU line */
  char key[40];
  char args[4][96];
  int nargs;
} Entry;

typedef struct {
  int used;
  unsigned long long mask[MAX_GPUS];
  struct {
    int gpu;
    unsigned long long xid;
  } queue[MAX_QUEUE];
  int head, tail;
} Set;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static struct timespec start;
static Gpu gpus[MAX_GPUS];
static unsigned ngpus;
static char driver_version[96];
static int cuda_version;
static int init_error;
static Entry* entries;
static int nentries, next_entry;
static Set sets[MAX_SETS];

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)(ts.tv_sec - start.tv_sec) * 1000 + (ts.tv_nsec - start.tv_nsec) / 1000000;
}

static void default_gpu(unsigned i) {
  Gpu* g = &gpus[i];
  memset(g, 0, sizeof *g);
  snprintf(g->uuid, sizeof g->uuid, "GPU-fake-%04u", i);
  snprintf(g->name, sizeof g->name, "%s", "Fake H200");
  snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x18 + i * 0x10 % 0xE0);
  g->mem_total = 141ull << 30;
  g->temp = 40;
  g->temp_slowdown = 89;
  g->temp_shutdown = 92;
  g->power_mw = 120000;
  g->power_limit_mw = 700000;
  g->power_default_mw = 700000;
  g->sm_clock = 1980;
  g->mem_clock = 3201;
  g->ecc_current = g->ecc_pending = 1;
  g->pcie_gen = g->pcie_gen_max = 5;
  g->pcie_width = g->pcie_width_max = 16;
  g->nvlinks = MAX_LINKS;
  for (int l = 0; l < MAX_LINKS; ++l) g->link_active[l] = 1;
  g->mig_max = 7;
  g->supported_events = 0x1 | 0x2 | XID_EVENT;
}

/* "2s", "500ms", "1.5s", "1m" → milliseconds; -1 when malformed. */
static long long parse_time(const char* text) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (end == text) return -1;
  if (strcmp(end, "ms") == 0) return (long long)v;
  if (strcmp(end, "s") == 0 || *end == 0) return (long long)(v * 1000);
  if (strcmp(end, "m") == 0) return (long long)(v * 60000);
  return -1;
}

static void fail_parse(const char* path, int line, const char* why) {
  /* A broken scenario is a broken test: say where, and stop. */
  fprintf(stderr, "fake NVML: %s:%d: %s\n", path, line, why);
  abort();
}

static int compare_entries(const void* a, const void* b) {
  const Entry* x = a;
  const Entry* y = b;
  if (x->at_ms != y->at_ms) return x->at_ms < y->at_ms ? -1 : 1;
  return x->line - y->line; /* stable: file order within the same time */
}

static void load_scenario(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) fail_parse(path, 0, strerror(errno));
  char buf[512];
  int line = 0, cap = 0;
  while (fgets(buf, sizeof buf, f)) {
    ++line;
    char* hash = strchr(buf, '#');
    if (hash) *hash = 0;
    char* words[12];
    int n = 0;
    for (char* w = strtok(buf, " \t\r\n"); w && n < 12; w = strtok(NULL, " \t\r\n")) words[n++] = w;
    if (n == 0) continue;
    Entry e;
    memset(&e, 0, sizeof e);
    e.line = line;
    e.gpu = -2;
    int i = 0;
    if (strcmp(words[0], "at") == 0) {
      if (n < 3) fail_parse(path, line, "expected: at TIME ...");
      e.at_ms = parse_time(words[1]);
      if (e.at_ms < 0) fail_parse(path, line, "bad time (use 500ms, 2s, 1.5s, 1m)");
      i = 2;
    }
    if (strcmp(words[i], "gpu") == 0) {
      if (n < i + 3) fail_parse(path, line, "expected: gpu INDEX|* KEY [VALUES]");
      e.gpu = strcmp(words[i + 1], "*") == 0 ? -1 : atoi(words[i + 1]);
      if (e.gpu >= MAX_GPUS) fail_parse(path, line, "GPU index too large");
      i += 2;
    }
    snprintf(e.key, sizeof e.key, "%s", words[i]);
    for (int a = i + 1; a < n && e.nargs < 4; ++a) snprintf(e.args[e.nargs++], 96, "%s", words[a]);
    if (nentries == cap) {
      cap = cap ? cap * 2 : 64;
      entries = realloc(entries, (size_t)cap * sizeof *entries);
    }
    entries[nentries++] = e;
  }
  fclose(f);
  qsort(entries, (size_t)nentries, sizeof *entries, compare_entries);
}

static void push_event(unsigned gpu, unsigned long long xid) {
  for (int s = 0; s < MAX_SETS; ++s) {
    Set* set = &sets[s];
    if (!set->used || !(set->mask[gpu] & XID_EVENT)) continue;
    if ((set->tail + 1) % MAX_QUEUE == set->head)
      continue; /* full: dropped, like a real overflow */
    set->queue[set->tail].gpu = (int)gpu;
    set->queue[set->tail].xid = xid;
    set->tail = (set->tail + 1) % MAX_QUEUE;
  }
}

static unsigned long long num(const Entry* e, int i) {
  if (i >= e->nargs) {
    fprintf(stderr, "fake NVML: scenario line %d: '%s' needs %d value(s)\n", e->line, e->key,
            i + 1);
    abort();
  }
  if (strcmp(e->args[i], "on") == 0 || strcmp(e->args[i], "up") == 0) return 1;
  if (strcmp(e->args[i], "off") == 0 || strcmp(e->args[i], "down") == 0) return 0;
  return strtoull(e->args[i], NULL, 0);
}

static void apply_gpu(const Entry* e, unsigned i) {
  Gpu* g = &gpus[i];
  const char* k = e->key;
#define IS(name) (strcmp(k, name) == 0)
  if (IS("name"))
    snprintf(g->name, sizeof g->name, "%s", e->args[0]);
  else if (IS("uuid"))
    snprintf(g->uuid, sizeof g->uuid, "%s", e->args[0]);
  else if (IS("memory_total"))
    g->mem_total = num(e, 0);
  else if (IS("memory_used"))
    g->mem_used = num(e, 0);
  else if (IS("utilization")) {
    g->util_gpu = (unsigned)num(e, 0);
    g->util_mem = e->nargs > 1 ? (unsigned)num(e, 1) : 0;
  } else if (IS("temperature"))
    g->temp = (unsigned)num(e, 0);
  else if (IS("temperature_slowdown"))
    g->temp_slowdown = (unsigned)num(e, 0);
  else if (IS("temperature_shutdown"))
    g->temp_shutdown = (unsigned)num(e, 0);
  else if (IS("power"))
    g->power_mw = (unsigned)num(e, 0) * 1000;
  else if (IS("power_limit"))
    g->power_limit_mw = (unsigned)num(e, 0) * 1000;
  else if (IS("power_default_limit"))
    g->power_default_mw = (unsigned)num(e, 0) * 1000;
  else if (IS("insufficient_power"))
    g->insufficient_power = (int)num(e, 0);
  else if (IS("pstate"))
    g->pstate = (int)num(e, 0);
  else if (IS("clocks_reasons"))
    g->clocks_reasons = num(e, 0);
  else if (IS("ecc_mode")) {
    g->ecc_current = (int)num(e, 0);
    g->ecc_pending = e->nargs > 1 ? (int)num(e, 1) : g->ecc_current;
  } else if (IS("ecc_sbe_volatile"))
    g->ecc[0][0] = num(e, 0);
  else if (IS("ecc_dbe_volatile"))
    g->ecc[1][0] = num(e, 0);
  else if (IS("ecc_sbe_aggregate"))
    g->ecc[0][1] = num(e, 0);
  else if (IS("ecc_dbe_aggregate"))
    g->ecc[1][1] = num(e, 0);
  else if (IS("retired_sbe"))
    g->retired[0] = (unsigned)num(e, 0);
  else if (IS("retired_dbe"))
    g->retired[1] = (unsigned)num(e, 0);
  else if (IS("retired_pending"))
    g->retired_pending = (int)num(e, 0);
  else if (IS("remap_correctable"))
    g->remap_cor = (unsigned)num(e, 0);
  else if (IS("remap_uncorrectable"))
    g->remap_unc = (unsigned)num(e, 0);
  else if (IS("remap_pending"))
    g->remap_pending = (unsigned)num(e, 0);
  else if (IS("remap_failed"))
    g->remap_failed = (unsigned)num(e, 0);
  else if (IS("pcie_gen")) {
    g->pcie_gen = (unsigned)num(e, 0);
    if (e->nargs > 1) g->pcie_gen_max = (unsigned)num(e, 1);
  } else if (IS("pcie_width")) {
    g->pcie_width = (unsigned)num(e, 0);
    if (e->nargs > 1) g->pcie_width_max = (unsigned)num(e, 1);
  } else if (IS("pcie_replay"))
    g->pcie_replay = (unsigned)num(e, 0);
  else if (IS("nvlinks")) {
    g->nvlinks = (unsigned)num(e, 0);
    if (g->nvlinks > MAX_LINKS) g->nvlinks = MAX_LINKS;
  } else if (IS("nvlink")) {
    unsigned l = (unsigned)num(e, 0);
    if (l < MAX_LINKS) g->link_active[l] = (int)num(e, 1);
  } else if (IS("nvlink_errors")) {
    unsigned l = (unsigned)num(e, 0);
    if (l < MAX_LINKS)
      for (int c = 0; c < 4 && c + 1 < e->nargs; ++c) g->link_err[l][c] = num(e, c + 1);
  } else if (IS("recovery_action"))
    g->recovery_action = (unsigned)num(e, 0);
  else if (IS("inforom_corrupt"))
    g->inforom_corrupt = (int)num(e, 0);
  else if (IS("mig_mode")) {
    g->mig_current = (unsigned)num(e, 0);
    g->mig_pending = e->nargs > 1 ? (unsigned)num(e, 1) : g->mig_current;
  } else if (IS("mig_instances"))
    g->mig_instances = (unsigned)num(e, 0);
  else if (IS("events"))
    g->supported_events = num(e, 0) ? (0x1 | 0x2 | XID_EVENT) : 0;
  else if (IS("xid"))
    push_event(i, num(e, 0));
  else if (IS("lost"))
    g->lost = 1;
  else if (IS("fail") || IS("unsupported")) {
    if (g->nfails < MAX_FAILS) {
      snprintf(g->fails[g->nfails].func, sizeof g->fails[0].func, "%s", e->args[0]);
      g->fails[g->nfails].code = IS("fail") ? (int)num(e, 1) : kNotSupported;
      ++g->nfails;
    }
  } else {
    fprintf(stderr, "fake NVML: scenario line %d: unknown key '%s'\n", e->line, k);
    abort();
  }
#undef IS
}

static void apply(const Entry* e) {
  if (e->gpu == -2) {
    if (strcmp(e->key, "gpus") == 0) {
      unsigned n = (unsigned)num(e, 0);
      ngpus = n > MAX_GPUS ? MAX_GPUS : n;
    } else if (strcmp(e->key, "driver") == 0) {
      snprintf(driver_version, sizeof driver_version, "%s", e->args[0]);
    } else if (strcmp(e->key, "cuda") == 0) {
      cuda_version = (int)num(e, 0);
    } else if (strcmp(e->key, "init_error") == 0) {
      init_error = (int)num(e, 0);
    } else {
      fprintf(stderr, "fake NVML: scenario line %d: unknown key '%s'\n", e->line, e->key);
      abort();
    }
    return;
  }
  if (e->gpu == -1) {
    for (unsigned i = 0; i < ngpus; ++i) apply_gpu(e, i);
  } else if ((unsigned)e->gpu < ngpus) {
    apply_gpu(e, (unsigned)e->gpu);
  }
}

/* Applies every scenario entry whose time has come. Called with mu held. */
static void advance(void) {
  long long t = now_ms();
  while (next_entry < nentries && entries[next_entry].at_ms <= t) apply(&entries[next_entry++]);
}

static void reset_state(void) {
  const char* n = getenv("TAU_FAKE_NVML_GPUS");
  ngpus = n ? (unsigned)atoi(n) : 2u;
  if (ngpus > MAX_GPUS) ngpus = MAX_GPUS;
  for (unsigned i = 0; i < MAX_GPUS; ++i) default_gpu(i);
  snprintf(driver_version, sizeof driver_version, "%s", "999.99-fake");
  cuda_version = 12040;
  init_error = 0;
  memset(sets, 0, sizeof sets);
  free(entries);
  entries = NULL;
  nentries = next_entry = 0;
  const char* path = getenv("TAU_FAKE_NVML_SCENARIO");
  if (path && *path) load_scenario(path);
  clock_gettime(CLOCK_MONOTONIC, &start);
  /* Entries without a time (or "at 0s") are the initial state, including the GPU count. */
  advance();
}

/* Looks up a device; returns its error code, or kSuccess with *out set. Called with mu held. */
static int device(void* handle, const char* func, Gpu** out) {
  uintptr_t i = (uintptr_t)handle;
  if (i == 0 || i > ngpus) return kInvalidArgument;
  Gpu* g = &gpus[i - 1];
  advance();
  if (g->lost) return kGpuIsLost;
  for (int f = 0; f < g->nfails; ++f) {
    if (strcmp(g->fails[f].func, func) == 0) return g->fails[f].code;
  }
  *out = g;
  return kSuccess;
}

/* Every device entry point: lock, find the GPU (or answer its error), run BODY, unlock. */
#define DEVICE_CALL(handle, BODY)        \
  Gpu* g = NULL;                         \
  pthread_mutex_lock(&mu);               \
  int rc = device(handle, __func__, &g); \
  if (rc == kSuccess) {                  \
    BODY                                 \
  }                                      \
  pthread_mutex_unlock(&mu);             \
  return rc;

/* ------------------------------------------------------------------------------------------------
 */
/* System */

EXPORT int nvmlInit_v2(void) {
  pthread_mutex_lock(&mu);
  if (refcount == 0) reset_state();
  int rc = init_error;
  if (rc == 0) ++refcount;
  pthread_mutex_unlock(&mu);
  return rc;
}
EXPORT int nvmlInitWithFlags(unsigned flags) { return nvmlInit_v2(); }
EXPORT int nvmlShutdown(void) {
  pthread_mutex_lock(&mu);
  if (refcount > 0) --refcount;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT const char* nvmlErrorString(int rc) {
  switch (rc) {
    case kSuccess:
      return "Success";
    case kInvalidArgument:
      return "Invalid Argument";
    case kNotSupported:
      return "Not Supported";
    case kNotFound:
      return "Not Found";
    case kInsufficientSize:
      return "Insufficient Size";
    case kInsufficientPower:
      return "Insufficient External Power";
    case 9:
      return "Driver Not Loaded";
    case kTimeout:
      return "Timeout";
    case kCorruptedInforom:
      return "Corrupted infoROM";
    case kGpuIsLost:
      return "GPU is lost";
    case 18:
      return "RM has detected an NVML/RM version mismatch";
    default:
      return "Unknown Error";
  }
}
EXPORT int nvmlSystemGetDriverVersion(char* buf, unsigned len) {
  pthread_mutex_lock(&mu);
  snprintf(buf, len, "%s", driver_version);
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int nvmlSystemGetNVMLVersion(char* buf, unsigned len) {
  snprintf(buf, len, "%s", "12.999.99-fake");
  return kSuccess;
}
EXPORT int nvmlSystemGetCudaDriverVersion(int* v) {
  pthread_mutex_lock(&mu);
  *v = cuda_version;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlSystemGetCudaDriverVersion_v2(int* v) { return nvmlSystemGetCudaDriverVersion(v); }
#endif
EXPORT int nvmlDeviceGetCount_v2(unsigned* count) {
  pthread_mutex_lock(&mu);
  advance();
  *count = ngpus;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned idx, void** dev) {
  pthread_mutex_lock(&mu);
  int rc = idx < ngpus ? kSuccess : kInvalidArgument;
  if (rc == kSuccess) *dev = (void*)(uintptr_t)(idx + 1);
  pthread_mutex_unlock(&mu);
  return rc;
}

/* ------------------------------------------------------------------------------------------------
 */
/* Identity and memory */

typedef struct {
  unsigned long long total, free, used;
} Memory;
typedef struct {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
} PciInfo;

EXPORT int nvmlDeviceGetUUID(void* dev, char* buf, unsigned len) {
  DEVICE_CALL(dev, snprintf(buf, len, "%s", g->uuid);)
}
EXPORT int nvmlDeviceGetName(void* dev, char* buf, unsigned len) {
  DEVICE_CALL(dev, snprintf(buf, len, "%s", g->name);)
}
EXPORT int nvmlDeviceGetMinorNumber(void* dev, unsigned* minor) {
  DEVICE_CALL(dev, *minor = (unsigned)((uintptr_t)dev - 1);)
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlDeviceGetPciInfo_v3(void* dev, PciInfo* pci){
    DEVICE_CALL(dev,
                {
                  memset(pci, 0, sizeof *pci);
                  snprintf(pci->bus_id, sizeof pci->bus_id, "%s", g->bus_id);
                  snprintf(pci->bus_id_legacy, sizeof pci->bus_id_legacy, "%s", g->bus_id + 4);
                  pci->pci_device_id = 0x233510DE;
                })}
#endif
EXPORT int nvmlDeviceGetMemoryInfo(void* dev, Memory* mem){DEVICE_CALL(dev, {
  mem->total = g->mem_total;
  mem->used = g->mem_used;
  mem->free = g->mem_total - g->mem_used;
})} EXPORT int nvmlDeviceGetUtilizationRates(void* dev, unsigned* util) {
  DEVICE_CALL(dev, {
    util[0] = g->util_gpu;
    util[1] = g->util_mem;
  })
}

/* ------------------------------------------------------------------------------------------------
 */
/* Thermal, power, clocks */

typedef struct {
  unsigned version, sensor_type;
  int temperature;
} Temperature;

EXPORT int nvmlDeviceGetTemperature(void* dev, int sensor, unsigned* t) {
  DEVICE_CALL(dev, *t = g->temp;)
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlDeviceGetTemperatureV(void* dev, Temperature* t){
    DEVICE_CALL(dev,
                {
                  if (t->version != (12u | (1u << 24)))
                    rc = kInvalidArgument;
                  else
                    t->temperature = (int)g->temp;
                })}
#endif
EXPORT int nvmlDeviceGetTemperatureThreshold(void* dev, int which, unsigned* t){DEVICE_CALL(dev, {
  if (which == 0)
    *t = g->temp_shutdown;
  else if (which == 1)
    *t = g->temp_slowdown;
  else
    rc = kNotSupported;
})} EXPORT int nvmlDeviceGetPowerUsage(void* dev, unsigned* mw){DEVICE_CALL(dev, {
  if (g->insufficient_power)
    rc = kInsufficientPower;
  else
    *mw = g->power_mw;
})} EXPORT int nvmlDeviceGetEnforcedPowerLimit(void* dev, unsigned* mw) {
  DEVICE_CALL(dev, *mw = g->power_limit_mw;)
}
EXPORT int nvmlDeviceGetPowerManagementDefaultLimit(void* dev, unsigned* mw) {
  DEVICE_CALL(dev, *mw = g->power_default_mw;)
}
EXPORT int nvmlDeviceGetClockInfo(void* dev, int type, unsigned* mhz) {
  DEVICE_CALL(dev, *mhz = type == 2 ? g->mem_clock : g->sm_clock;)
}
EXPORT int nvmlDeviceGetPerformanceState(void* dev, int* p) { DEVICE_CALL(dev, *p = g->pstate;) }
EXPORT int nvmlDeviceGetCurrentClocksThrottleReasons(void* dev, unsigned long long* mask) {
  DEVICE_CALL(dev, *mask = g->clocks_reasons;)
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlDeviceGetCurrentClocksEventReasons(void* dev, unsigned long long* mask) {
  DEVICE_CALL(dev, *mask = g->clocks_reasons;)
}
#endif

/* ------------------------------------------------------------------------------------------------
 */
/* Memory errors */

EXPORT int nvmlDeviceGetEccMode(void* dev, int* current,
                                int* pending){DEVICE_CALL(dev,
                                                          {
                                                            *current = g->ecc_current;
                                                            *pending = g->ecc_pending;
                                                          })} EXPORT
    int nvmlDeviceGetTotalEccErrors(void* dev, int type, int counter, unsigned long long* n){
        DEVICE_CALL(dev,
                    {
                      if (!g->ecc_current || type < 0 || type > 1 || counter < 0 || counter > 1)
                        rc = kNotSupported;
                      else
                        *n = g->ecc[type][counter];
                    })} EXPORT
    int nvmlDeviceGetRetiredPages(void* dev, int cause, unsigned* count,
                                  unsigned long long* addresses){DEVICE_CALL(dev, {
      unsigned have = cause == 1 ? g->retired[1] : g->retired[0];
      if (*count < have)
        rc = have ? kInsufficientSize : kSuccess;
      else if (addresses)
        for (unsigned p = 0; p < have; ++p) addresses[p] = 0x1000ull * (p + 1);
      *count = have;
    })} EXPORT int nvmlDeviceGetRetiredPagesPendingStatus(void* dev, int* pending) {
  DEVICE_CALL(dev, *pending = g->retired_pending;)
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlDeviceGetRemappedRows(void* dev, unsigned* cor, unsigned* unc, unsigned* pending,
                                     unsigned* failed){DEVICE_CALL(dev,
                                                                   {
                                                                     /* Row remapping is not
                                                                      * supported while MIG is on.
                                                                      */
                                                                     if (g->mig_current) {
                                                                       rc = kNotSupported;
                                                                     } else {
                                                                       *cor = g->remap_cor;
                                                                       *unc = g->remap_unc;
                                                                       *pending = g->remap_pending;
                                                                       *failed = g->remap_failed;
                                                                     }
                                                                   })}
#endif
EXPORT int nvmlDeviceValidateInforom(void* dev) {
  DEVICE_CALL(dev, if (g->inforom_corrupt) rc = kCorruptedInforom;)
}

/* ------------------------------------------------------------------------------------------------
 */
/* PCIe and NVLink */

EXPORT int nvmlDeviceGetCurrPcieLinkGeneration(void* dev, unsigned* v) {
  DEVICE_CALL(dev, *v = g->pcie_gen;)
}
EXPORT int nvmlDeviceGetCurrPcieLinkWidth(void* dev, unsigned* v) {
  DEVICE_CALL(dev, *v = g->pcie_width;)
}
EXPORT int nvmlDeviceGetMaxPcieLinkGeneration(void* dev, unsigned* v) {
  DEVICE_CALL(dev, *v = g->pcie_gen_max;)
}
EXPORT int nvmlDeviceGetMaxPcieLinkWidth(void* dev, unsigned* v) {
  DEVICE_CALL(dev, *v = g->pcie_width_max;)
}
EXPORT int nvmlDeviceGetPcieReplayCounter(void* dev, unsigned* v) {
  DEVICE_CALL(dev, *v = g->pcie_replay;)
}
EXPORT int nvmlDeviceGetNvLinkState(void* dev, unsigned link, int* active){
    DEVICE_CALL(dev,
                {
                  if (g->nvlinks == 0)
                    rc = kNotSupported;
                  else if (link >= g->nvlinks)
                    rc = kInvalidArgument;
                  else
                    *active = g->link_active[link];
                })} EXPORT int nvmlDeviceGetNvLinkErrorCounter(void* dev, unsigned link,
                                                               int counter, unsigned long long* v) {
  DEVICE_CALL(dev, {
    if (link >= g->nvlinks || counter < 0 || counter > 3)
      rc = kInvalidArgument;
    else
      *v = g->link_err[link][counter];
  })
}

/* ------------------------------------------------------------------------------------------------
 */
/* MIG, field values (newer drivers only) */

#ifndef TAU_FAKE_NVML_OLD
typedef struct {
  unsigned field_id, scope_id;
  long long timestamp, latency_usec;
  unsigned value_type, nvml_return;
  union {
    double d;
    unsigned ui;
    unsigned long long ull;
  } value;
} FieldValue;

EXPORT int nvmlDeviceGetMigMode(void* dev, unsigned* current, unsigned* pending){DEVICE_CALL(dev, {
  *current = g->mig_current;
  *pending = g->mig_pending;
})} EXPORT int nvmlDeviceGetMaxMigDeviceCount(void* dev, unsigned* count) {
  DEVICE_CALL(dev, *count = g->mig_max;)
}
EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(void* dev, unsigned idx,
                                               void** mig){DEVICE_CALL(dev, {
  if (!g->mig_current)
    rc = kInvalidArgument;
  else if (idx >= g->mig_instances)
    rc = kNotFound;
  else
    *mig = (void*)(uintptr_t)(0x10000 + idx);
})} EXPORT int nvmlDeviceGetFieldValues(void* dev, int count, FieldValue* values) {
  DEVICE_CALL(dev, {
    for (int v = 0; v < count; ++v) {
      values[v].timestamp = now_ms() * 1000;
      values[v].latency_usec = 0;
      if (values[v].field_id == 230) { /* GET_GPU_RECOVERY_ACTION */
        values[v].value_type = 1;
        values[v].value.ui = g->recovery_action;
        values[v].nvml_return = kSuccess;
      } else {
        values[v].nvml_return = kNotSupported;
      }
    }
  })
}
#endif

/* ------------------------------------------------------------------------------------------------
 */
/* Events */

typedef struct {
  void* device;
  unsigned long long event_type, event_data;
  unsigned gpu_instance_id, compute_instance_id;
} EventData;

EXPORT int nvmlEventSetCreate(void** set) {
  pthread_mutex_lock(&mu);
  int rc = kUnknown;
  for (int s = 0; s < MAX_SETS; ++s) {
    if (sets[s].used) continue;
    memset(&sets[s], 0, sizeof sets[s]);
    sets[s].used = 1;
    *set = (void*)(uintptr_t)(s + 1);
    rc = kSuccess;
    break;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
EXPORT int nvmlEventSetFree(void* set) {
  uintptr_t s = (uintptr_t)set;
  if (s == 0 || s > MAX_SETS) return kInvalidArgument;
  pthread_mutex_lock(&mu);
  sets[s - 1].used = 0;
  pthread_mutex_unlock(&mu);
  return kSuccess;
}
EXPORT int nvmlDeviceGetSupportedEventTypes(void* dev, unsigned long long* mask) {
  DEVICE_CALL(dev, *mask = g->supported_events;)
}
EXPORT int nvmlDeviceRegisterEvents(void* dev, unsigned long long types, void* set) {
  uintptr_t s = (uintptr_t)set;
  DEVICE_CALL(dev, {
    if (s == 0 || s > MAX_SETS || !sets[s - 1].used)
      rc = kInvalidArgument;
    else if (types & ~g->supported_events)
      rc = kNotSupported;
    else
      sets[s - 1].mask[(uintptr_t)dev - 1] |= types;
  })
}

/* Waits for an event: wakes when a timed scenario entry is due rather than polling, so that tau's
 * measured XID latency is tau's, not the fake's. */
static int wait_event(void* set, EventData* data, unsigned timeout_ms, int v2) {
  uintptr_t s = (uintptr_t)set;
  if (s == 0 || s > MAX_SETS) return kInvalidArgument;
  pthread_mutex_lock(&mu);
  long long deadline = now_ms() + timeout_ms;
  int rc = kTimeout;
  while (sets[s - 1].used) {
    advance();
    Set* q = &sets[s - 1];
    if (q->head != q->tail) {
      memset(data, 0, v2 ? sizeof *data : offsetof(EventData, gpu_instance_id));
      data->device = (void*)(uintptr_t)(q->queue[q->head].gpu + 1);
      data->event_type = XID_EVENT;
      data->event_data = q->queue[q->head].xid;
      if (v2) data->gpu_instance_id = data->compute_instance_id = 0xFFFFFFFFu;
      q->head = (q->head + 1) % MAX_QUEUE;
      rc = kSuccess;
      break;
    }
    long long t = now_ms();
    if (t >= deadline) break;
    long long wake = deadline;
    if (next_entry < nentries && entries[next_entry].at_ms < wake) wake = entries[next_entry].at_ms;
    /* At most 50 ms at a time: other threads may register devices meanwhile. */
    if (wake > t + 50) wake = t + 50;
    struct timespec until = start;
    until.tv_sec += wake / 1000;
    until.tv_nsec += (wake % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
      until.tv_sec += 1;
      until.tv_nsec -= 1000000000;
    }
    pthread_mutex_unlock(&mu);
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
    pthread_mutex_lock(&mu);
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
EXPORT int nvmlEventSetWait(void* set, EventData* data, unsigned timeout_ms) {
  return wait_event(set, data, timeout_ms, 0);
}
#ifndef TAU_FAKE_NVML_OLD
EXPORT int nvmlEventSetWait_v2(void* set, EventData* data, unsigned timeout_ms) {
  return wait_event(set, data, timeout_ms, 1);
}
#endif
