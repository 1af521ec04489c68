/*
 * Force-included (-include) into the fuzz build by scripts/fuzz.sh only when
 * clang rejects __builtin_cpu_supports("f16c") (clang 14 does; see
 * kernels/cpu/cpu_backend.c): every ISA probe answers "no", so the CPU
 * backend runs its scalar path in the fuzz build. The fuzzers target the
 * codecs; the vector kernels are tested by tests/kernels.
 */
#ifndef LNORM_FUZZ_NO_CPU_PROBE_H
#define LNORM_FUZZ_NO_CPU_PROBE_H
#define __builtin_cpu_supports(feature) 0
#endif
