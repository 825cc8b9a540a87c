// The building blocks of the workload-aware planners, by concept:
// flashcp_pieces.h (SPEC Eq. 3 on ranges and per rank, the document
// order), per_doc.h (the Per-Doc zigzag), whole_doc_place.h (Whole-Doc
// placement and equalization). This header includes all three, for code
// written against it; new code includes the one it uses.
#ifndef FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_
#define FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_

#include "core/internal/flashcp_pieces.h"
#include "core/internal/per_doc.h"
#include "core/internal/whole_doc_place.h"

#endif  // FLASHCP_CORE_INTERNAL_FLASHCP_UTIL_H_
