// The CBLAS header of the BLAS this build links (CMake's MOE_BLAS): MKL names it mkl_cblas.h;
// OpenBLAS's and BLIS's are both <cblas.h>, found through that library's include directory.
#ifndef MOE_CPU_CBLAS_H
#define MOE_CPU_CBLAS_H
#ifdef MOE_BLAS_MKL
#include <mkl_cblas.h>
#else
#include <cblas.h>
#endif
#endif
