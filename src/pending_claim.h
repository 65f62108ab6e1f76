/*-------------------------------------------------------------------------
 *
 * pending_claim.h
 *	  A new key claimed in a transaction block whose record is written
 *	  once: finished at its completion, or processing before commit.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_PENDING_CLAIM_H
#define IDEM_PENDING_CLAIM_H

#include "storage/lock.h"

#include "records.h"

extern void idem_pending_install_hooks(void);
extern bool idem_pending_claim_new(const IdemScope *scope,
								   const IdemAttemptStart *start,
								   bool may_stay_pending, const LOCKTAG *lock,
								   int64 *id, TransactionId *writer);
extern bool idem_pending_write(void);
extern bool idem_pending_finish(const IdemToken *token,
								const IdemResponse *response,
								text **operation);

#endif							/* IDEM_PENDING_CLAIM_H */
