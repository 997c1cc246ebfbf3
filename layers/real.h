// The floating-point type of every kernel and layer.
// fp32 everywhere; the same sources are compiled once more with MOE_REAL_DOUBLE
// so that finite-difference gradient checks can run in double precision.
#ifndef MOE_REAL_H
#define MOE_REAL_H

#include <math.h>

#ifdef MOE_REAL_DOUBLE
typedef double real;
#define MOE_REAL_NAME "f64"
#define real_exp exp
#define real_log log
#define real_sqrt sqrt
#else
typedef float real;
#define MOE_REAL_NAME "f32"
#define real_exp expf
#define real_log logf
#define real_sqrt sqrtf // correctly rounded, as (float)sqrt((double)x)
#endif

#endif
