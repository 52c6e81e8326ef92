/* SPDX-License-Identifier: MIT
 *
 * core/drives.c: the NVMe optimizer step's bound (see drives.h).
 */
#include "core/drives.h"

double
stow_drives_io_s (const StowDriveSeconds *drives, guint n, guint *busiest)
{
  g_return_val_if_fail (drives != NULL || n == 0, 0);
  double worst = 0;
  guint at = 0;
  for (guint i = 0; i < n; i++)
    {
      /* reads and writes share the drive's queue: they add */
      double busy = drives[i].read_s + drives[i].write_s;
      if (busy > worst)
        worst = busy, at = i;
    }
  if (busiest)
    *busiest = at;
  return worst;
}

double
stow_drives_step_bound_s (const StowDriveSeconds *drives, guint n,
                          double update_s, guint *busiest)
{
  /* read i+1 | update i | write i-1: the update hides behind the I/O or
   * the I/O behind the update, whichever is longer */
  return MAX (stow_drives_io_s (drives, n, busiest), update_s);
}
