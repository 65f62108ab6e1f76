/*-------------------------------------------------------------------------
 *
 * key_lock.h
 *	  A transaction-scoped lock on the hash of a scope and key.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEY_LOCK_H
#define IDEM_KEY_LOCK_H

#include "storage/lock.h"

#include "records.h"

extern void idem_key_lock_tag(LOCKTAG *tag, const IdemScope *scope);
extern bool idem_key_lock_try(const LOCKTAG *tag);
extern bool idem_key_lock_wait(const LOCKTAG *tag, int timeout_ms);
extern bool idem_xact_wait(TransactionId xid, int timeout_ms);
extern void idem_key_lock_release(const LOCKTAG *tag);

#endif							/* IDEM_KEY_LOCK_H */
