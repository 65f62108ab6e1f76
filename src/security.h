/*-------------------------------------------------------------------------
 *
 * security.h
 *	  Who a call acts for, what its SQL runs as, and whether it may write.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SECURITY_H
#define IDEM_SECURITY_H

#include "fmgr.h"

/* The user and security context to return to after the records' SQL. */
typedef struct IdemUserContext
{
	Oid			saved_userid;
	int			saved_sec_context;
} IdemUserContext;

extern Oid	idem_calling_role(void);
extern Datum idem_role_column(Oid role);
extern bool idem_role_column_is(Datum value, Oid role);
extern Oid	idem_role_column_role(Datum value);
extern text *idem_scope_caller(text *caller);
extern bool idem_calling_role_is_operator(void);
extern void idem_become_owner(IdemUserContext *ctx);
extern void idem_restore_user(const IdemUserContext *ctx);
extern void idem_require_writable(const char *what);
extern char *idem_clip(const char *value, int maxlen);

/* Hex digits of a key's hash prefix: how messages name a key. */
#define IDEM_KEY_HASH_PREFIX_LEN 8
extern char *idem_key_hash_prefix(const char *key, int len);
extern char *idem_redact_key(const char *message, const char *key);

#endif							/* IDEM_SECURITY_H */
