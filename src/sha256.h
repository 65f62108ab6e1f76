/*-------------------------------------------------------------------------
 *
 * sha256.h
 *	  SHA-256 of a buffer in memory, in one call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SHA256_H
#define IDEM_SHA256_H

#define IDEM_SHA256_LEN 32

extern void idem_sha256(const uint8 *data, size_t len, uint8 *digest);

#endif							/* IDEM_SHA256_H */
