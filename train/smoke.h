// moe smoke CONFIG [--steps N] [--set group.key=value]...: a short run of a config that
// reports what a launch needs to know, and exits non-zero when an alert fires.
#ifndef MOE_SMOKE_H
#define MOE_SMOKE_H

int smoke_main(int argc, char **argv);

#endif
