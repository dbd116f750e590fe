/* redsem - distributed counting semaphores and locks on Redis.
 *
 * The only header applications include. See README.md for a tour, docs/api.md for the
 * reference (these header comments are its source of truth) and docs/design.md for the
 * algorithms and the key layout.
 *
 * Thread rules in one line: one client (and everything made from it) may be used
 * by many threads at once; see client.h (THREADS) for the details, fork and signals, and
 * async.h for the event-loop API.
 */
#ifndef REDSEM_REDSEM_H
#define REDSEM_REDSEM_H

#include "export.h"
#include "redsem/version.h" /* generated: the build tree's include/ or the installed one */
#include "error.h"
#include "client.h"
#include "permit.h"
#include "semaphore.h"
#include "lock.h"
#include "renew.h"
#include "rate.h"
#include "async.h"
#include "metrics.h"

#endif /* REDSEM_REDSEM_H */
