/* redsem - distributed counting semaphores and locks on Redis.
 *
 * The only header applications include. See README.md for a tour, docs/api.md for the
 * reference (these header comments are its source of truth) and docs/design.md for the
 * algorithms and the key layout.
 *
 * Thread rules in one line: one client (and everything made from it) per thread at a time;
 * distinct clients are independent; see client.h for the details, fork and signals.
 */
#ifndef REDSEM_REDSEM_H
#define REDSEM_REDSEM_H

#include "export.h"
#include "version.h"
#include "error.h"
#include "client.h"
#include "permit.h"
#include "semaphore.h"
#include "lock.h"
#include "renew.h"
#include "rate.h"

#endif /* REDSEM_REDSEM_H */
