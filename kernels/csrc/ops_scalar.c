/* Small ops, portable C: see ops_impl.h. */
#define SEQ_SUFFIX _scalar
#define SEQ_TAG 0
#include "ops_impl.h"
