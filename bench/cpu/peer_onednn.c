/* The oneDNN layer normalization peer (C API, oneDNN 2.x). */
#include "peer_onednn.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <oneapi/dnnl/dnnl.h>

struct bench_onednn {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_t src, dst, scale, shift;
};

/* oneDNN here runs on OpenMP: cap its threads through omp_set_num_threads,
 * found at run time so that nothing links OpenMP explicitly. */
static void set_omp_threads(int n)
{
    void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    if (set)
        set(n);
}

void bench_onednn_destroy(bench_onednn *b)
{
    if (!b)
        return;
    if (b->prim)
        dnnl_primitive_destroy(b->prim);
    if (b->pd)
        dnnl_primitive_desc_destroy(b->pd);
    if (b->src)
        dnnl_memory_destroy(b->src);
    if (b->dst)
        dnnl_memory_destroy(b->dst);
    if (b->scale)
        dnnl_memory_destroy(b->scale);
    if (b->shift)
        dnnl_memory_destroy(b->shift);
    if (b->strm)
        dnnl_stream_destroy(b->strm);
    if (b->eng)
        dnnl_engine_destroy(b->eng);
    free(b);
}

bench_onednn *bench_onednn_create(int dtype, int64_t rows, int64_t hidden, float eps, void *x, void *y,
                                  float *gamma, float *beta, int threads, const char **why)
{
    bench_onednn *b = calloc(1, sizeof *b);
    if (!b) {
        *why = "out of memory";
        return NULL;
    }
    set_omp_threads(threads);
    dnnl_data_type_t dt = dtype == 1 ? dnnl_f32 : dnnl_bf16;
    dnnl_dims_t ddims = {rows, hidden}, pdims = {hidden};
    dnnl_memory_desc_t dmd, pmd;
    dnnl_layer_normalization_desc_t ld;
    *why = "oneDNN setup failed";
    if (dnnl_engine_create(&b->eng, dnnl_cpu, 0) || dnnl_stream_create(&b->strm, b->eng, dnnl_stream_default_flags))
        goto fail;
    if (dnnl_memory_desc_init_by_tag(&dmd, 2, ddims, dt, dnnl_ab) ||
        dnnl_memory_desc_init_by_tag(&pmd, 1, pdims, dnnl_f32, dnnl_a))
        goto fail;
    if (dnnl_layer_normalization_forward_desc_init(&ld, dnnl_forward_inference, &dmd, NULL, eps,
                                                   dnnl_use_scale | dnnl_use_shift)) {
        *why = "layer_normalization_forward_desc_init refused";
        goto fail;
    }
    if (dnnl_primitive_desc_create(&b->pd, &ld, NULL, b->eng, NULL)) {
        *why = "no layer normalization implementation for this configuration";
        goto fail;
    }
    if (dnnl_primitive_create(&b->prim, b->pd))
        goto fail;
    if (dnnl_memory_create(&b->src, &dmd, b->eng, x) || dnnl_memory_create(&b->dst, &dmd, b->eng, y) ||
        dnnl_memory_create(&b->scale, &pmd, b->eng, gamma) || dnnl_memory_create(&b->shift, &pmd, b->eng, beta))
        goto fail;
    *why = NULL;
    return b;
fail:
    bench_onednn_destroy(b);
    return NULL;
}

int bench_onednn_run(bench_onednn *b)
{
    dnnl_exec_arg_t args[] = {
        {DNNL_ARG_SRC, b->src}, {DNNL_ARG_DST, b->dst}, {DNNL_ARG_SCALE, b->scale}, {DNNL_ARG_SHIFT, b->shift}};
    if (dnnl_primitive_execute(b->prim, b->strm, 4, args))
        return -1;
    return dnnl_stream_wait(b->strm) ? -1 : 0;
}

const char *bench_onednn_version(void)
{
    static char buf[32];
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "%d.%d.%d", v->major, v->minor, v->patch);
    return buf;
}
