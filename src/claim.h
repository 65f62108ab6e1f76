/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  The claims' settings: the per-call defaults of idem_claim and its
 *	  relatives (idem_heartbeat takes the default lease too).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLAIM_H
#define IDEM_CLAIM_H

/* idempotency.default_ttl, idempotency.default_lease, idempotency.claim_wait */
extern int	idem_default_ttl_s;
extern int	idem_default_lease_ms;
extern int	idem_claim_wait_ms;

extern void idem_claim_init(void);

#endif							/* IDEM_CLAIM_H */
