/* Gated DeltaNet compiled with AVX2+FMA flags from the generic source (compiler-vectorised, no intrinsics): see gdn_impl.h. */
#define SEQ_SUFFIX _avx2
#define SEQ_TAG 1
#include "gdn_impl.h"
