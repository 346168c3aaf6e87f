/* tpu.h - the vTPU runtime's public C API (umbrella header). */
#ifndef TPU_TPU_H
#define TPU_TPU_H
#include "status.h"
#include "device.h"
#include "mem.h"
#include "stream.h"
#include "ops.h"
#include "rng.h"
#include "graph.h"
#include "coll.h"
#endif
