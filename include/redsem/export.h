/* redsem - distributed counting semaphores and locks on Redis.
 * export.h: symbol visibility and function attributes used by the public headers. */
#ifndef REDSEM_EXPORT_H
#define REDSEM_EXPORT_H

/* The library is built with -fvisibility=hidden; only declarations marked REDSEM_API are
 * exported from the shared object, and every one of them starts with redsem_. */
#if defined(__GNUC__) || defined(__clang__)
#define REDSEM_API __attribute__((visibility("default")))
#define REDSEM_WUR __attribute__((warn_unused_result))
#else
#define REDSEM_API
#define REDSEM_WUR
#endif

#endif /* REDSEM_EXPORT_H */
