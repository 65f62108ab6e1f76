/*-------------------------------------------------------------------------
 *
 * response_seal.h
 *	  Encryption at rest of stored responses (AES-256-GCM).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RESPONSE_SEAL_H
#define IDEM_RESPONSE_SEAL_H

#include "utils/guc.h"
#include "utils/jsonb.h"

/* idempotency.encryption_key and idempotency.encryption_key_previous */
extern char *idem_encryption_key_text;
extern char *idem_encryption_key_previous_text;

extern void idem_seal_init(bool shared_preload);
extern bool idem_check_encryption_key(char **newval, void **extra,
									  GucSource source);
extern void idem_assign_encryption_key(const char *newval, void *extra);
extern void idem_assign_encryption_key_previous(const char *newval, void *extra);
extern const char *idem_show_encryption_key(void);
extern const char *idem_show_encryption_key_previous(void);

extern bool idem_sealing_enabled(void);
extern bytea *idem_seal_response(int64 record_id, const Jsonb *headers,
								 const Jsonb *body, const bytea *raw_body);
extern void idem_open_response(int64 record_id, const bytea *sealed,
							   Jsonb **headers, Jsonb **body, bytea **raw_body);

#endif							/* IDEM_RESPONSE_SEAL_H */
