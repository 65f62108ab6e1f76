/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *	  The two maintenance passes over idem_records (lease expiry and
 *	  cleanup of expired records), shared by the background worker and the
 *	  SQL functions idem_expire_leases() and idem_cleanup().
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_MAINTENANCE_H
#define IDEM_MAINTENANCE_H

extern Oid	idem_installed_extension(void);
extern void idem_maintenance_prepare(Oid extoid);
extern void idem_maintenance_forget(void);
extern int64 idem_expire_leases_batch(int max_rows);
extern int64 idem_cleanup_batch(int batch_size);

#endif							/* IDEM_MAINTENANCE_H */
