/*
 * log.h - logging to stderr with syslog priority prefixes ("<3>" ...), so
 * that journald keeps the level of each line when the daemon runs under
 * systemd. Safe to call from any thread.
 */
#ifndef QL_LOG_H
#define QL_LOG_H

enum {
  QL_LOG_ERR = 3,
  QL_LOG_WARNING = 4,
  QL_LOG_NOTICE = 5,
  QL_LOG_INFO = 6,
  QL_LOG_DEBUG = 7,
};

/* Lines above this priority number are dropped (default QL_LOG_INFO). */
void ql__log_set_level(int level);
/* Parses "err", "warning", "notice", "info", "debug"; -1 if unknown. */
int ql__log_level_parse(const char *s);

void ql__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define ql__err(...) ql__log(QL_LOG_ERR, __VA_ARGS__)
#define ql__warn(...) ql__log(QL_LOG_WARNING, __VA_ARGS__)
#define ql__notice(...) ql__log(QL_LOG_NOTICE, __VA_ARGS__)
#define ql__info(...) ql__log(QL_LOG_INFO, __VA_ARGS__)
#define ql__debug(...) ql__log(QL_LOG_DEBUG, __VA_ARGS__)

#endif /* QL_LOG_H */
