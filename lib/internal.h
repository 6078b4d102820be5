/*
 * internal.h - every layer's internal header, for the tests that reach
 * inside the library (they link the static half). The library's own files
 * include only the headers of their layer and the layers below
 * (docs/design.md, "The layers").
 */
#ifndef BKV_INTERNAL_H
#define BKV_INTERNAL_H

#include "base/base.h"
#include "kv/kv.h"
#include "pool/pool.h"
#include "sched/sched.h"
#include "sched/batch.h"
#include "decide/decide.h"

#endif /* BKV_INTERNAL_H */
