/* device.h - the vTPU chips: count, properties, current device.
 *
 * Chips are virtual: TPU_NUM_DEVICES (default 1) of them, each with
 * TPU_HBM_BYTES (default 16 GiB) of device memory reserved lazily.
 * Thread safety: all functions are thread-safe; the current device is per thread. */
#ifndef TPU_DEVICE_H
#define TPU_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_mxu_kind {
    TPU_MXU_PORTABLE = 0,   /* plain C */
    TPU_MXU_AVX512_BF16,    /* vdpbf16ps */
    TPU_MXU_AMX,            /* AMX-BF16 tiles */
    TPU_MXU_COUNT
} tpu_mxu_kind;

typedef struct tpu_device_props {
    char name[64];
    size_t hbm_bytes;        /* capacity of device memory */
    tpu_mxu_kind mxu;        /* matrix unit found on this host */
    int num_workers;         /* compute threads a kernel may use */
    int index;
} tpu_device_props;

/* Number of chips (reads TPU_NUM_DEVICES once). Never fails; >= 1. */
int tpu_device_count(void);
tpu_status tpu_device_get_props(int dev, tpu_device_props *out);
/* Current device of the calling thread (default 0). */
int tpu_device_current(void);
tpu_status tpu_device_set(int dev);
/* Wait for all streams of `dev`; returns the first sticky error found. */
tpu_status tpu_device_synchronize(int dev);
/* Name of an MXU kind ("AMX", "AVX512-BF16", "portable"). */
const char *tpu_mxu_name(tpu_mxu_kind k);
/* True once any chip has been brought up in this process. */
bool tpu_is_initialized(void);
/* True if this process is a fork of one that had initialized the runtime. */
bool tpu_is_forked_child(void);

#ifdef __cplusplus
}
#endif
#endif
