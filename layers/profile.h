// MOE_PROFILE's window over a training run (layers/cpu/profile.c keeps the table).
//
// MOE_PROFILE=1 times every CPU kernel from the process's first to its exit. A profile of the
// steady step should leave out the first steps (the first touch of every buffer: page faults
// worth several steps) and the final evaluation, so with MOE_PROFILE_FROM=N the trainer marks
// its steps and the table counts steps N .. the last one only: it restarts as step N (or, in a
// run resumed past N, its first step) begins and stops when the last step's update ends.
// Without MOE_PROFILE both calls are a test of a flag.
#ifndef MOE_PROFILE_H
#define MOE_PROFILE_H

#include <stdint.h>

void moe_profile_step_begin(int64_t step);         // 1-based: restarts the table from step N
void moe_profile_step_end(int64_t step, int last); // after its update; last: the run's last step

#endif
