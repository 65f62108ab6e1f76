/*-------------------------------------------------------------------------
 *
 * canonical.h
 *	  Canonical JSON (RFC 8785 with exact numbers) and the request
 *	  fingerprint built on it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CANONICAL_H
#define IDEM_CANONICAL_H

#include "common/sha2.h"
#include "utils/jsonb.h"

#define IDEM_FINGERPRINT_LEN	PG_SHA256_DIGEST_LENGTH

/* The canonical text of a jsonb value, palloc'd in the current context. */
extern char *idem_canonical_cstring(Jsonb *jb, int *len);

/* SHA-256 of the canonical text of a jsonb value, into digest. */
extern void idem_fingerprint_jsonb(Jsonb *jb, uint8 *digest);

/*
 * The same digest for the JSON value a text holds, without building a
 * jsonb value; text that jsonb refuses raises jsonb_in's error.
 */
extern void idem_fingerprint_json_text(text *json, uint8 *digest);

#endif							/* IDEM_CANONICAL_H */
