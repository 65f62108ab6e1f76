/*-------------------------------------------------------------------------
 *
 * test_pause.h
 *	  Pause points for the concurrency tests, compiled in only when the
 *	  extension is built with IDEM_TEST_PAUSE=1 (scripts/test.sh does).
 *
 * A pause point holds the backend at a place where another transaction's
 * commit must not change the answer, so that an isolation spec can commit
 * one exactly there instead of hoping a stress run hits the window.  In
 * other builds IDEM_TEST_PAUSE(name) is nothing at all.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TEST_PAUSE_H
#define IDEM_TEST_PAUSE_H

#ifdef IDEM_TEST_PAUSE_POINTS
extern void idem_test_pause_init(void);
extern void idem_test_pause(const char *name);
#define IDEM_TEST_PAUSE(name) idem_test_pause(name)
#else
#define idem_test_pause_init() ((void) 0)
#define IDEM_TEST_PAUSE(name) ((void) 0)
#endif

#endif							/* IDEM_TEST_PAUSE_H */
