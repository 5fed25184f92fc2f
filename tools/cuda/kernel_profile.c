/*
 * kernel_profile.c: a tiny CUPTI kernel profiler to LD_PRELOAD into any CUDA process (our
 * Candle/cudarc `train_step`, PyTorch's `python3 train_step.py`, ...).
 *
 *   SSL_KERNEL_PROFILE=out.json LD_PRELOAD=/path/libkernel_profile.so CMD ...
 *
 * libcupti.so.13 must be findable (LD_LIBRARY_PATH; PyTorch's cu13 wheels bring one), or the
 * preloaded process will not start at all. With the variable unset the library does nothing.
 * With it set, CUPTI's Activity API records every kernel (CONCURRENT_KERNEL), memcpy and memset;
 * the records are summed per kernel name (as launched, often mangled), per copy direction and
 * for memsets, and at exit the sums go to the file as JSON (kernels sorted by total time,
 * descending):
 *
 *   {"pid":..., "kernels":[{"name":..., "count":..., "total_ns":...}, ...],
 *    "memcpy":[{"kind":"HtoD"|"DtoH"|"DtoD"|"other", "count":..., "bytes":..., "total_ns":...}],
 *    "memset":{"count":..., "total_ns":...}, "gpu_total_ns":..., "span_ns":...,
 *    "dropped_records":..., "incomplete_records":...}
 *
 * gpu_total_ns sums every record's duration (kernels on concurrent streams overlap, so it can
 * exceed wall time); span_ns is last end minus first start. Everything from process start to
 * exit is recorded (warm-up included): divide by step counts, or diff two runs.
 * A "%p" in the path is replaced by the pid. A process that recorded nothing (a helper child
 * that inherited the environment, e.g. a pyenv shim) writes no file, and a forked child never
 * writes, so neither clobbers the parent's profile.
 *
 * CUPTI adds its overhead to every kernel launch: compare profiles with profiles, and time the
 * steps in runs without it. Setting CUDA_INJECTION64_PATH to this library instead of
 * LD_PRELOAD also works (the driver then calls InitializeInjection at cuInit).
 */
#define _GNU_SOURCE
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF_SIZE (8u << 20)
#define BUF_ALIGN 8

/* ---- aggregation (plain functions under one mutex; no CUPTI calls) ---- */

typedef struct {
  char *name; /* owned copy; NULL marks an empty slot */
  uint64_t hash, count, ns;
} kernel_entry;

enum { CPY_HTOD, CPY_DTOH, CPY_DTOD, CPY_OTHER, CPY_N };
static const char *const cpy_names[CPY_N] = {"HtoD", "DtoH", "DtoD", "other"};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kernel_entry *table;  /* open addressing, linear probing, power-of-two capacity */
static size_t table_cap, table_len;
static uint64_t cpy_count[CPY_N], cpy_bytes[CPY_N], cpy_ns[CPY_N];
static uint64_t set_count, set_ns;
static uint64_t first_start = UINT64_MAX, last_end;
static uint64_t n_records, n_dropped, n_incomplete;

static uint64_t hash_str(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int table_grow(void) {
  size_t cap = table_cap ? table_cap * 2 : 4096;
  kernel_entry *t = calloc(cap, sizeof *t);
  if (!t) return -1;
  for (size_t i = 0; i < table_cap; i++) {
    if (!table[i].name) continue;
    size_t j = table[i].hash & (cap - 1);
    while (t[j].name) j = (j + 1) & (cap - 1);
    t[j] = table[i];
  }
  free(table);
  table = t;
  table_cap = cap;
  return 0;
}

/* Records one activity's [start, end); returns its duration, 0 for an incomplete record. */
static uint64_t span(uint64_t start, uint64_t end) {
  n_records++;
  if (start == 0 || end < start) {
    n_incomplete++;
    return 0;
  }
  if (start < first_start) first_start = start;
  if (end > last_end) last_end = end;
  return end - start;
}

/* Caller holds mu. */
static void add_kernel(const char *name, uint64_t start, uint64_t end) {
  uint64_t ns = span(start, end);
  if (!name) name = "<unnamed>";
  if (2 * (table_len + 1) > table_cap && table_grow()) return;
  uint64_t h = hash_str(name);
  size_t i = h & (table_cap - 1);
  for (; table[i].name; i = (i + 1) & (table_cap - 1))
    if (table[i].hash == h && !strcmp(table[i].name, name)) break;
  if (!table[i].name) {
    if (!(table[i].name = strdup(name))) return;
    table[i].hash = h;
    table_len++;
  }
  table[i].count++;
  table[i].ns += ns;
}

/* Caller holds mu. copy_kind is a CUpti_ActivityMemcpyKind. */
static void add_memcpy(unsigned copy_kind, uint64_t bytes, uint64_t start, uint64_t end) {
  int k = copy_kind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? CPY_HTOD
          : copy_kind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? CPY_DTOH
          : copy_kind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? CPY_DTOD
                                                         : CPY_OTHER;
  cpy_count[k]++;
  cpy_bytes[k] += bytes;
  cpy_ns[k] += span(start, end);
}

/* Caller holds mu. */
static void add_memset(uint64_t start, uint64_t end) {
  set_count++;
  set_ns += span(start, end);
}

static int by_ns_desc(const void *a, const void *b) {
  const kernel_entry *x = a, *y = b;
  if (x->ns != y->ns) return x->ns < y->ns ? 1 : -1;
  return strcmp(x->name, y->name);
}

static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* Caller holds mu. Writes the summary to path (via a temporary file and rename). */
static int write_json(const char *path) {
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid()) >= sizeof tmp) return -1;
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  /* Compact the table into its first table_len slots and sort them. */
  size_t n = 0;
  for (size_t i = 0; i < table_cap; i++)
    if (table[i].name) table[n++] = table[i];
  for (size_t i = n; i < table_cap; i++) table[i].name = NULL;
  if (n) qsort(table, n, sizeof *table, by_ns_desc);
  uint64_t total = 0;
  fprintf(f, "{\"pid\":%d,\"kernels\":[", (int)getpid());
  for (size_t i = 0; i < n; i++) {
    fprintf(f, "%s\n{\"name\":", i ? "," : "");
    put_json_string(f, table[i].name);
    fprintf(f, ",\"count\":%llu,\"total_ns\":%llu}", (unsigned long long)table[i].count,
            (unsigned long long)table[i].ns);
    total += table[i].ns;
  }
  fputs("],\n\"memcpy\":[", f);
  for (int k = 0; k < CPY_N; k++) {
    fprintf(f, "%s\n{\"kind\":\"%s\",\"count\":%llu,\"bytes\":%llu,\"total_ns\":%llu}",
            k ? "," : "", cpy_names[k], (unsigned long long)cpy_count[k],
            (unsigned long long)cpy_bytes[k], (unsigned long long)cpy_ns[k]);
    total += cpy_ns[k];
  }
  total += set_ns;
  fprintf(f,
          "],\n\"memset\":{\"count\":%llu,\"total_ns\":%llu},\n\"gpu_total_ns\":%llu,"
          "\"span_ns\":%llu,\"dropped_records\":%llu,\"incomplete_records\":%llu}\n",
          (unsigned long long)set_count, (unsigned long long)set_ns, (unsigned long long)total,
          (unsigned long long)(last_end > first_start ? last_end - first_start : 0),
          (unsigned long long)n_dropped, (unsigned long long)n_incomplete);
  int bad = ferror(f);
  if (fclose(f) || bad || rename(tmp, path)) {
    remove(tmp);
    return -1;
  }
  return 0;
}

/* ---- CUPTI glue ---- */

static int active;            /* CUPTI set up in this process */
static int finished;          /* summary written (or given up) */
static int late_atexit;       /* second atexit registered */
static pid_t owner;           /* the process that set CUPTI up */
static char out_path[4096];

static void cupti_err(const char *what, CUptiResult r, const char *consequence) {
  const char *s = NULL;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown error";
  fprintf(stderr, "kernel_profile: %s failed (%d: %s); %s\n", what, (int)r, s, consequence);
}

static void finish(void);

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  /* The first request comes with the first GPU activity, so after CUDA (and the CUDA runtime
   * with its exit handlers) is initialized: an atexit registered now runs before those
   * handlers, so the final flush should find CUDA alive. The constructor's atexit and the
   * destructor remain as fallbacks; finish() runs once. */
  if (!__atomic_exchange_n(&late_atexit, 1, __ATOMIC_ACQ_REL)) atexit(finish);
  void *p = NULL;
  *buf = posix_memalign(&p, BUF_ALIGN, BUF_SIZE) ? NULL : p;
  *size = *buf ? BUF_SIZE : 0;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                      size_t valid) {
  (void)size;
  CUpti_Activity *rec = NULL;
  size_t dropped = 0;
  pthread_mutex_lock(&mu);
  while (valid && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: { /* CUDA 13 CUPTI: CUpti_ActivityKernel10 */
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
      add_kernel(k->name, k->start, k->end);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
      add_memcpy(m->copyKind, m->bytes, m->start, m->end);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
      add_memset(m->start, m->end);
      break;
    }
    default:
      break;
    }
  }
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS)
    n_dropped += dropped;
  pthread_mutex_unlock(&mu);
  free(buf);
}

static void finish(void) {
  if (!active || getpid() != owner) return; /* forked children inherit this state: skip */
  if (__atomic_exchange_n(&finished, 1, __ATOMIC_ACQ_REL)) return;
  CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (r != CUPTI_SUCCESS) cupti_err("cuptiActivityFlushAll", r, "the last records may be missing");
  pthread_mutex_lock(&mu);
  if (!n_records) {
    if (late_atexit) /* CUDA work started yet nothing came back; silent in non-CUDA helpers */
      fprintf(stderr, "kernel_profile: pid %d recorded no GPU activity; %s not written\n",
              (int)getpid(), out_path);
  } else if (write_json(out_path))
    fprintf(stderr, "kernel_profile: cannot write %s\n", out_path);
  pthread_mutex_unlock(&mu);
}

/* Expands "%p" in the path to the pid. */
static void set_out_path(const char *p) {
  size_t o = 0;
  for (; *p && o + 12 < sizeof out_path; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      o += (size_t)snprintf(out_path + o, sizeof out_path - o, "%d", (int)getpid());
      p++;
    } else {
      out_path[o++] = *p;
    }
  }
  out_path[o] = 0;
}

static void start(void) {
  static int started;
  const char *path = getenv("SSL_KERNEL_PROFILE");
  if (!path || !*path || __atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL)) return;
  set_out_path(path);
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    cupti_err("cuptiActivityRegisterCallbacks", r, "not profiling");
    return;
  }
  static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                             CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET};
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    if ((r = cuptiActivityEnable(kinds[i])) != CUPTI_SUCCESS) {
      cupti_err("cuptiActivityEnable", r, "not profiling");
      for (size_t j = 0; j < i; j++) cuptiActivityDisable(kinds[j]);
      return;
    }
  }
  owner = getpid();
  active = 1;
  atexit(finish);
}

__attribute__((constructor)) static void kernel_profile_init(void) { start(); }
__attribute__((destructor)) static void kernel_profile_fini(void) { finish(); }

/* Entry point when loaded through CUDA_INJECTION64_PATH instead of LD_PRELOAD. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
  start();
  return 1;
}
