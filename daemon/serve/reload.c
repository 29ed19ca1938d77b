#include <stdio.h>
#include <stdlib.h>

#include "dispatch/calibrate.h"
#include "conf.h"
#include "dispatch/linear.h"
#include "log.h"
#include "notify.h"
#include "serve/reload.h"
#include "state/devices.h"

/* ql__weight_store_foreach(): a weight to measure now that the config
 * no longer fixes the crossover. */
static void calibrate_each(ql__weight *w, void *arg) {
  ql__calibrate_weight(arg, w);
}

/*
 * SIGHUP and ReloadConfig: read the configuration again from the same
 * sources (the file and the command line, which still override it), apply
 * the options that may change live, and say what needs a restart. All or
 * nothing: a bad file, or device budgets that cannot apply, change
 * nothing and return QL_EINVAL (QL_ENOMEM), with report saying why.
 */
int ql__server_reload(ql__server *s, char *report, size_t len) {
  ql__config *parsed = malloc(sizeof *parsed);
  char err[1024];
  ql__cmdline cl;
  if (parsed == NULL) {
    snprintf(report, len, "out of memory; keeping the running "
             "configuration");
    return QL_ENOMEM;
  }
  /* The budgets are checked (and set) first: the only part that can
   * still fail once the file has parsed. */
  if (ql__config_from_args(s->argc, s->argv, parsed, &cl, err, sizeof err) !=
          0 ||
      ql__devices_set_budgets(s, parsed, err, sizeof err) != 0) {
    ql__err("reload: %s; keeping the running configuration", err);
    snprintf(report, len, "%s; keeping the running configuration", err);
    free(parsed);
    return QL_EINVAL;
  }
  uint32_t fixed_rows = s->cfg.crossover_rows;
  ql__config_reload(&s->cfg, parsed, &s->cfg, report, len);
  free(parsed);
  ql__log_set_level(s->cfg.log_level);
  ql__uploads_set_max(s->uploads, s->cfg.max_upload_bytes);
  ql__uploads_set_share(s->uploads, s->cfg.uid_share);
  ql__weight_store_set_budget(s->weights, s->cfg.cpu_budget_bytes);
  ql__linear_configure(s);
  /* A crossover no longer fixed is measured for the weights already
   * resident too, not only for those loaded from now on. */
  if (fixed_rows != 0 && s->cfg.crossover_rows == 0)
    ql__weight_store_foreach(s->weights, calibrate_each, s);
  ql__notice("reload: %s", report);
  ql__notify_status("reloaded: %s", report);
  return 0;
}

