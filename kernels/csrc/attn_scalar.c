/* Attention and RoPE, portable C: see attn_impl.h. */
#define SEQ_SUFFIX _scalar
#define SEQ_TAG 0
#include "attn_impl.h"
