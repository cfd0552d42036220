/* sparkcluster's NCCL tuner plugin: a choice of algorithm, protocol and channels per message size (issue 50).
 *
 * NCCL takes a choice per size only through a tuner plugin (NCCL_TUNER_PLUGIN=this .so). This one reads the table
 * `verify --tune` measured, from NCCL_TUNER_CONFIG_FILE, in the CSV format of NCCL's own example tuner plugin
 * (plugins/tuner/example in NVIDIA/nccl), so that a table written for one reads the same in the other:
 *
 *     collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
 *
 * e.g. `allreduce,0,16384,ring,ll,-1,2,2`. The first line that matches the collective, the size (inclusive range),
 * the communicator's nodes and ranks (-1: any) and, where given, the pipelined ops and buffer registration, wins.
 * Its algorithm/protocol pair gets cost 0 in NCCL's cost table where NCCL offers that pair at all (a pair NCCL
 * marks ignored, -1, stays ignored: the plugin never enables what NCCL ruled out); channels > 0 sets the count.
 * No line: NCCL's own choice. `ll128` is never forced (NCCL's maintainers: a forced LL128 can corrupt data
 * silently): such a line is skipped and logged.
 *
 * The ABI is NCCL's tuner interface v4 (NCCL 2.24 on; 2.28 still loads it), declared here rather than taken from
 * NCCL's headers, which a Spark's system does not ship: `cc -O2 -shared -fPIC sizes_tuner.c -o libnccl-tuner-
 * sparkcluster.so` on the node builds it (nccl/tunerplugin.py does).
 */
#define _DEFAULT_SOURCE /* strsep */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3 } ncclResult_t;
typedef enum { NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3 } ncclDebugLogLevel;
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);
typedef int ncclFunc_t; /* 0 broadcast, 1 reduce, 2 allgather, 3 reducescatter, 4 allreduce */

#define NCCL_TUNING 64 /* NCCL's log subsystem for tuning */
#define ALGO_PROTO_IGNORE -1.0f
#define MAX_LINES 256
#define MAX_LINE 512

/* NCCL's ncclTuner_v4_t, member for member */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

typedef struct {
  int coll;
  unsigned long long minBytes, maxBytes;
  int algo, proto, channels, nNodes, nRanks, numPipeOps, regBuff;
} Line;

typedef struct {
  Line lines[MAX_LINES];
  int count;
  size_t nRanks, nNodes;
} Table;

static const char* const COLLS[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* const ALGOS[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
static const char* const PROTOS[] = {"ll", "ll128", "simple"};
#define PROTO_LL128 1

static int indexOf(const char* word, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcasecmp(word, names[i]) == 0) return i;
  return -1;
}

static char* trim(char* s) {
  while (*s == ' ' || *s == '\t') s++;
  char* end = s + strlen(s);
  while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) *--end = '\0';
  return s;
}

/* One CSV line into `line`; 0 where it is not one (then it is skipped, never half-applied). */
static int parseLine(char* text, Line* line) {
  char* fields[10];
  int n = 0;
  char* f;
  while (n < 10 && (f = strsep(&text, ",")) != NULL) fields[n++] = trim(f); /* an empty field stays a field */
  if (n < 8) return 0;
  char* end;
  line->coll = indexOf(fields[0], COLLS, 5);
  line->minBytes = strtoull(fields[1], &end, 10);
  if (*end || end == fields[1]) return 0;
  line->maxBytes = strtoull(fields[2], &end, 10);
  if (*end || end == fields[2]) return 0;
  line->algo = indexOf(fields[3], ALGOS, 7);
  line->proto = indexOf(fields[4], PROTOS, 3);
  int* ints[] = {&line->channels, &line->nNodes, &line->nRanks, &line->numPipeOps, &line->regBuff};
  line->numPipeOps = line->regBuff = -1;
  for (int i = 5; i < n; i++) {
    *ints[i - 5] = (int)strtol(fields[i], &end, 10);
    if (*end || end == fields[i]) return 0; /* a number, never an empty field read as 0 */
  }
  return line->coll >= 0 && line->algo >= 0 && line->proto >= 0 && line->minBytes <= line->maxBytes;
}

static ncclResult_t tunerInit(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void** context) {
  Table* table = calloc(1, sizeof(Table));
  if (!table) return ncclSystemError;
  table->nRanks = nRanks;
  table->nNodes = nNodes;
  *context = table;
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  FILE* f = path ? fopen(path, "r") : NULL;
  if (!f) {
    if (log) log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__,
                 "sparkcluster tuner: cannot read NCCL_TUNER_CONFIG_FILE=%s: NCCL's own choices apply",
                 path ? path : "(unset)");
    return ncclSuccess;
  }
  char text[MAX_LINE];
  int number = 0;
  while (fgets(text, sizeof text, f) && table->count < MAX_LINES) {
    number++;
    char* s = trim(text);
    if (!*s || *s == '#') continue;
    Line line;
    if (!parseLine(s, &line)) {
      if (log) log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__, "sparkcluster tuner: %s:%d is no table line: "
                   "skipped", path, number);
      continue;
    }
    if (line.proto == PROTO_LL128) {
      if (log) log(NCCL_LOG_WARN, NCCL_TUNING, __FILE__, __LINE__, "sparkcluster tuner: %s:%d forces LL128, which "
                   "can corrupt data silently: skipped", path, number);
      continue;
    }
    if ((line.nNodes == -1 || (size_t)line.nNodes == nNodes) && (line.nRanks == -1 || (size_t)line.nRanks == nRanks))
      table->lines[table->count++] = line;
  }
  fclose(f);
  if (log) log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__, "sparkcluster tuner: %d line(s) of %s apply to "
               "%zu ranks on %zu nodes", table->count, path, nRanks, nNodes);
  return ncclSuccess;
}

static ncclResult_t tunerGetCollInfo(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                     float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels) {
  const Table* table = context;
  float* cost = (float*)collCostTable; /* NCCL's table: float[numAlgo][numProto], passed as float** */
  for (int i = 0; table && i < table->count; i++) {
    const Line* l = &table->lines[i];
    if (l->coll != collType || nBytes < l->minBytes || nBytes > l->maxBytes) continue;
    if ((l->numPipeOps != -1 && l->numPipeOps != numPipeOps) || (l->regBuff != -1 && l->regBuff != regBuff)) continue;
    if (l->algo < numAlgo && l->proto < numProto && cost[l->algo * numProto + l->proto] != ALGO_PROTO_IGNORE) {
      cost[l->algo * numProto + l->proto] = 0.0f;
      if (l->channels > 0) *nChannels = l->channels;
    }
    return ncclSuccess; /* the first matching line decides; where NCCL ruled its pair out, NCCL's choice stands */
  }
  return ncclSuccess;
}

static ncclResult_t tunerDestroy(void* context) {
  free(context);
  return ncclSuccess;
}

const ncclTuner_v4_t ncclTunerPlugin_v4 = {"sparkcluster-sizes", tunerInit, tunerGetCollInfo, tunerDestroy};
