/* launch_cost.c - what the runtime alone costs per small op, layer by layer:
 * the same loop PyTorch's `c = a + b` makes the glue run (allocate the
 * output, launch an add of 16 float32 elements, free the previous output),
 * timed with the pieces added one at a time, then with a synchronize after
 * each op. No torch, no Python: `make launch-cost`. */
#define _GNU_SOURCE
#include "tpu/device.h"
#include "tpu/mem.h"
#include "tpu/ops.h"
#include "tpu/stream.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define OK(x)                                            \
  do {                                                   \
    if ((x) != TPU_OK) {                                 \
      fprintf(stderr, "%s: %s\n", #x, tpu_last_error()); \
      exit(1);                                           \
    }                                                    \
  } while (0)

/* One `c = a + b`: allocate c, launch the add into it, free c (t[1], t[2] set). */
static void add_op(tpu_stream_t s, tpu_tensor* t, const tpu_params* p) {
  int64_t sz[1] = {16};
  void* o;
  OK(tpu_malloc(0, 64, NULL, &o));
  tpu_tensor_contiguous(&t[0], o, TPU_F32, 1, sz);
  OK(tpu_launch(s, TPU_OP_ADD, t, 3, p));
  OK(tpu_free(o));
}

int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  OK(tpu_init());
  int64_t sz[1] = {16};
  void *pa, *pb;
  OK(tpu_malloc(0, 64, NULL, &pa));
  OK(tpu_malloc(0, 64, NULL, &pb));
  tpu_tensor t[3];
  tpu_tensor_contiguous(&t[1], pa, TPU_F32, 1, sz);
  tpu_tensor_contiguous(&t[2], pb, TPU_F32, 1, sz);
  tpu_params p = {0};
  p.compute_dtype = TPU_F32;
  tpu_stream_t s = tpu_stream_default(0);
  for (int pass = 0; pass < 2; pass++) {
    double t0 = now();
    for (long i = 0; i < n; i++) {
      void* o;
      OK(tpu_malloc(0, 64, NULL, &o));
      OK(tpu_free(o));
    }
    double t1 = now();
    void* o;
    OK(tpu_malloc(0, 64, NULL, &o));
    tpu_tensor_contiguous(&t[0], o, TPU_F32, 1, sz);
    for (long i = 0; i < n; i++) OK(tpu_launch(s, TPU_OP_ADD, t, 3, &p));
    OK(tpu_stream_synchronize(s));
    double t2 = now();
    OK(tpu_free(o));
    for (long i = 0; i < n; i++) {
      add_op(s, t, &p);
    }
    OK(tpu_stream_synchronize(s));
    double t3 = now();
    for (long i = 0; i < n / 4; i++) {
      add_op(s, t, &p);
      OK(tpu_stream_synchronize(s));
    }
    double t4 = now();
    for (long i = 0; i < n; i++) OK(tpu_stream_synchronize(s));
    double t5 = now();
    double tl = 0;
    for (long i = 0; i < n / 256; i++) {
      double a0 = now();
      for (int j = 0; j < 256; j++) {
        add_op(s, t, &p);
      }
      tl += now() - a0;
      OK(tpu_stream_synchronize(s));
    }
    double t6 = now();
    if (pass)
      printf(
          "per op, ns: malloc+free %.0f | launch %.0f | malloc+launch+free %.0f | + sync %.0f | idle sync "
          "%.0f | batches of 256: launching %.0f, all %.0f\n",
          (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, (t3 - t2) / n * 1e9, (t4 - t3) / (n / 4) * 1e9, (t5 - t4) / n * 1e9,
          tl / (n / 256 * 256) * 1e9, (t6 - t5) / (n / 256 * 256) * 1e9);
  }
  return 0;
}
