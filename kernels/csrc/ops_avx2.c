/* Small ops compiled with AVX2+FMA flags from the generic source (compiler-vectorised where it can: the
 * activations call libm and stay scalar), see ops_impl.h. */
#define SEQ_SUFFIX _avx2
#define SEQ_TAG 1
#include "ops_impl.h"
