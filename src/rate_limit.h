/*-------------------------------------------------------------------------
 *
 * rate_limit.h
 *	  idempotency.max_new_keys_per_second: a token bucket per database and
 *	  role in shared memory, spent by claims that create a record.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RATE_LIMIT_H
#define IDEM_RATE_LIMIT_H

/* idempotency.max_new_keys_per_second */
extern int	idem_max_new_keys_per_second;

extern void idem_rate_limit_init(void);
extern void idem_rate_limit_install_hooks(void);
extern bool idem_rate_limit_take(Oid dboid, Oid roleid, int32 *retry_after);
extern void idem_rate_limit_give_back(Oid dboid, Oid roleid);

#endif							/* IDEM_RATE_LIMIT_H */
