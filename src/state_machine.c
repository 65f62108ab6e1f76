/*-------------------------------------------------------------------------
 *
 * state_machine.c
 *	  The record states and their allowed transitions.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
