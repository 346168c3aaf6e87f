/* device.h - the vTPU chips: configuration, count, properties, current device.
 *
 * Chips are virtual: TPU_NUM_DEVICES (default 1) of them, each with
 * TPU_HBM_BYTES (default 16 GiB) of device memory reserved lazily. The
 * environment is read once and strictly (README "Environment"): a bad value
 * fails tpu_init() and every call that needs a chip, never a silent default.
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
    TPU_MXU_PORTABLE = 0, /* plain C */
    TPU_MXU_AVX512_BF16,  /* vdpbf16ps */
    TPU_MXU_AMX,          /* AMX-BF16 tiles */
    TPU_MXU_AVX2_FMA,     /* vfmadd231ps on ymm; bf16 / f16 widened to fp32 when packed */
    TPU_MXU_COUNT
} tpu_mxu_kind;

typedef struct tpu_device_props {
    char name[64];
    size_t hbm_bytes; /* capacity of device memory */
    tpu_mxu_kind mxu; /* matrix unit found on this host */
    int num_workers;  /* compute threads a kernel may use */
    int index;
} tpu_device_props;

/* Validate the configuration (once; later calls repeat the answer). On a bad
 * environment variable: TPU_ERROR_INVALID_VALUE, the message naming each bad
 * variable, its value and what is accepted. */
tpu_status tpu_init(void);
/* Number of chips (TPU_NUM_DEVICES). Never fails: 0 if tpu_init() fails. */
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
