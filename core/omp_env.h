/* core/omp_env.h — OpenMP environment defaults that must be set before the OpenMP runtime starts. */
#ifndef CORE_OMP_ENV_H
#define CORE_OMP_ENV_H

/* Makes idle OpenMP threads sleep instead of spin (OMP_WAIT_POLICY=passive) unless the user set OMP_WAIT_POLICY.
 * libgomp reads its environment when the program loads, so the only way to change it is to set the variable and
 * re-execute the program (/proc/self/exe with the same argv); on failure the program just goes on. Why: vgrpo's
 * processes (and a test spawning vgrpo) share the cores; spinning threads of one process slowed another 3-100x in
 * our measurements on 2 cores. Call first thing in main(). Returns only when no re-exec happened. */
void core_omp_env_defaults(char **argv);

#endif
