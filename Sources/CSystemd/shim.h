#ifndef STALLMON_CSYSTEMD_SHIM_H
#define STALLMON_CSYSTEMD_SHIM_H

// sd_journal_send and sd_notifyf are variadic and cannot be called from Swift:
// the Swift side uses sd_journal_sendv and sd_notify instead.
#include <systemd/sd-journal.h>
#include <systemd/sd-daemon.h>
#include <sys/uio.h>

#endif
