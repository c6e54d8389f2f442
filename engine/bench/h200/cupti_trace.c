// A GPU timeline of any CUDA program, for machines without Nsight Systems: loaded by the CUDA driver through
// CUDA_INJECTION64_PATH, it records through CUPTI's activity API what `nsys -t cuda` records (every kernel with its
// start and end on the GPU, every copy and memset, and every driver call's span on the host) and writes them as
// tab-separated lines to $EDGEFIT_CUPTI_TRACE when the program exits. `cupti_timeline.py` reads the file.
//
// Build (here, `run_engine.sh prepare` does it): cc -shared -fPIC -O2 -I<cupti include> -I<cuda include>
//   cupti_trace.c -L<cupti lib> -lcupti -o libedgefit_cupti.so
// Use (device): CUDA_INJECTION64_PATH=$PWD/libedgefit_cupti.so EDGEFIT_CUPTI_TRACE=trace.tsv LD_LIBRARY_PATH=<dir of
//   libcupti.so.13> edgefit bench ...
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Activity buffers: CUPTI fills them asynchronously and hands each back when it is full or flushed.
#define BUF_SIZE (8u << 20)

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    // CUPTI requires 8-byte alignment; malloc gives 16.
    *buffer = (uint8_t *)malloc(BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)size;
    CUpti_Activity *rec = NULL;
    while (out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            fprintf(out, "K\t%llu\t%llu\t%u\t%u\t%u\t%d,%d,%d\t%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->correlationId, k->graphId, k->gridX, k->gridY,
                    k->gridZ, k->name ? k->name : "?");
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            fprintf(out, "C\t%llu\t%llu\t%u\t%u\t%u\t%llu\tcopy kind %u\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->correlationId, m->graphId,
                    (unsigned long long)m->bytes, (unsigned)m->copyKind);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
            fprintf(out, "S\t%llu\t%llu\t%u\t%u\t%u\t%llu\tmemset\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, m->correlationId, m->graphId,
                    (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
            const char *name = NULL;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name) != CUPTI_SUCCESS || !name) {
                name = "?";
            }
            fprintf(out, "D\t%llu\t%llu\t%u\t%u\t0\t0\t%s\n", (unsigned long long)a->start,
                    (unsigned long long)a->end, a->threadId, a->correlationId, name);
            break;
        }
        default:
            break;
        }
    }
    // A step with dropped records would read as idle time: say so where the reader sees it.
    size_t dropped = 0;
    if (out && cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped > 0) {
        fprintf(out, "# dropped %zu records\n", dropped);
        fprintf(stderr, "cupti_trace: CUPTI dropped %zu records\n", dropped);
    }
    free(buffer);
}

// Records still in CUPTI's buffers are written before a context goes away (the engine may destroy its own before
// the process exits).
static void CUPTIAPI on_resource(void *user, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data) {
    (void)user;
    (void)data;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) {
        cuptiActivityFlushAll(1);
    }
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) {
        fclose(out);
        out = NULL;
    }
}

// What the driver calls once, at cuInit, in the library CUDA_INJECTION64_PATH names.
int InitializeInjection(void) {
    const char *path = getenv("EDGEFIT_CUPTI_TRACE");
    out = fopen(path ? path : "cupti_trace.tsv", "w");
    if (!out) {
        perror("cupti_trace: cannot open the trace file");
        return 0;
    }
    fprintf(out, "# kind\tstart_ns\tend_ns\tstream_or_thread\tcorrelation\tgraph\tgrid_or_bytes\tname\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: cuptiActivityRegisterCallbacks failed\n");
        return 0;
    }
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_DRIVER};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        CUptiResult r = cuptiActivityEnable(kinds[i]);
        if (r != CUPTI_SUCCESS) {
            const char *msg = NULL;
            cuptiGetResultString(r, &msg);
            fprintf(stderr, "cupti_trace: enabling activity kind %d failed: %s\n", (int)kinds[i], msg ? msg : "?");
        }
    }
    CUpti_SubscriberHandle sub;
    if (cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_resource, NULL) == CUPTI_SUCCESS) {
        cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
    }
    atexit(at_exit);
    return 1;
}
