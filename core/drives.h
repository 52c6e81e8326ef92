/* SPDX-License-Identifier: MIT
 *
 * core/drives.h: the one rule for the pipelined NVMe optimizer step's bound,
 * shared by the time model (planner/cost.c), the simulator
 * (planner/sim.c) and `stowage bench swapper`.  A drive's reads
 * and writes share its queue (on the virtio disk we measured, 1 GiB read
 * and 1 GiB written at once take the sum of the two alone), so a drive is
 * busy for its read time plus its write time; data striped evenly over
 * several drives waits for the busiest of them; the CPU update of the
 * shards overlaps the I/O.  Pure arithmetic on seconds: no I/O here.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* One drive's share of a step: seconds reading and seconds writing, each
 * alone. */
typedef struct
{
  double read_s;
  double write_s;
} StowDriveSeconds;

/* The busiest drive's read + write: the step's I/O time.  0 for n = 0.
 * @busiest (may be NULL) gets its index (0 for n = 0). */
double stow_drives_io_s (const StowDriveSeconds *drives, guint n,
                         guint *busiest);

/* The pipelined step's bound: max (busiest drive's read + write, update).
 * With one drive, max (read + write, Adam). */
double stow_drives_step_bound_s (const StowDriveSeconds *drives, guint n,
                                 double update_s, guint *busiest);

G_END_DECLS
