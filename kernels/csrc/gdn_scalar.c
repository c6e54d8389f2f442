/* Gated DeltaNet, portable C: see gdn_impl.h. */
#define SEQ_SUFFIX _scalar
#define SEQ_TAG 0
#include "gdn_impl.h"
